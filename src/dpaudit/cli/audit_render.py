"""Rendering of ``dpaudit audit`` results (rich tables, verdict lines, the trade-off figure)."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..audit_outputs import shareable_audit
from ..audits.power import power_line
from ..audits.sequential import sequential_line
from ..reports import tradeoff
from .common import console, emit_json, print_table


def show(results: list, out_dirs: list, *, json_out: bool) -> None:
    """Print an audit (one JSON object, or its tables) and write its figures; a second result is
    the final-model audit run beside a trajectory audit (in ``out_dirs[1]``)."""
    if json_out:
        # what audit.json holds; the rest is in audit_local.json
        d = shareable_audit(results[0].to_dict())
        d["audit_dir"] = str(out_dirs[0])
        if len(results) > 1:
            d["final_model"] = {
                "audit_dir": str(out_dirs[1]),
                "epsilon_lower_bound": results[1].epsilon_lower_bound,
                "statistic": getattr(results[1], "statistic", "clopper-pearson"),
            }
        return emit_json(d)
    render(results[0], Path(out_dirs[0]))
    if len(results) > 1:
        render_threat_models(results[0], results[1], Path(out_dirs[1]))
    # the trade-off figure beside audit.json; none without a claimed event
    for r, out in zip(results, out_dirs):
        path = tradeoff.write_tradeoff_png(r.to_dict(), Path(out))
        if path is not None:
            console.print(f"wrote {path}")


def render_one_run(result, out: Path) -> None:
    b = result.bounds
    title = f"one-run audit: {result.mechanism}, {b['canaries']} {b['kind']} canaries "
    title += f"({b['included']} included), {b['confidence']:.0%} confidence"
    table = Table("analysis", "eps_LB", "claim", "ceiling", "guesses", "correct", title=title)
    st, fdp, claim = b["steinke"], b.get("fdp"), _fmt(b.get("claimed_epsilon"))
    quiet = "" if result.noise else ", no noise"
    guesses = (str(st["guesses"]), str(st["correct"]))
    cells = (_fmt(st["epsilon_lower_bound"]), claim, _fmt(st["ceiling"]), *guesses)
    table.add_row(f"steinke (eps, delta){quiet}", *cells)
    if fdp and fdp.get("epsilon_lower_bound") is not None:
        cells = (_fmt(fdp["epsilon_lower_bound"]), claim, _fmt(fdp.get("ceiling")), "", "")
        table.add_row(f"f-DP (claimed curve){quiet}", *cells)
    print_table(table)
    console.print(
        f"deciding statistic: {result.statistic}"
        + ("" if fdp else " (no claimed event: the (eps, delta) analysis decides)")
    )
    if fdp and fdp.get("unavailable"):
        console.print(f"f-DP analysis not computed: {fdp['unavailable']}.")
    lb = f"{result.epsilon_lower_bound:.3f}"
    if result.violated:
        console.print(f"[bold red]VIOLATION:[/] eps_LB {lb} > claimed {claim}")
    elif result.noise:
        console.print(f"no evidence of a violation: eps_LB {lb} <= claimed {claim}")
    console.print(escape(power_line(result.power)))
    console.print(
        f"wrote {out / 'one_run.json'} (shareable) and {out / 'one_run_local.json'} (not for publication)"
    )


def render_threat_models(trajectory, final, final_dir: Path) -> None:
    """Both threat models' eps_LB, side by side."""
    for name, r in (("trajectory", trajectory), ("final-model", final)):
        console.print(f"{name}: {_verdict_line(r)}")
    console.print(f"wrote the final-model audit to {final_dir / 'audit.json'}")


#: What each abbreviation of the audit table and verdict lines means, printed under the table.
LEGEND = (
    "eps_LB: a lower bound on epsilon, valid for any mechanism.",
    "CP eps_LB: the Clopper-Pearson lower bound of the rule chosen on SELECT trials, bounded on EVAL trials.",
    "CP ceiling: the largest CP eps_LB these trials can give (perfectly separated scores).",
    "TPR@FPR, AUROC [CI]: descriptive attack success on EVAL trials (bootstrap interval).",
    "GDP est.: a Gaussian-DP estimate of epsilon, not a bound.",
    "ruled out: the claim's trade-off curve lies above what the audit measured, so the claim is false.",
)


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def _statistic_line(result) -> str:
    """Which statistic decided, in the claim's own units (audit.json ``statistic``, ``claim_family_bound``)."""
    fam = result.claim_family_bound
    if result.statistic != "claimed-curve" or not fam:
        return (
            "statistic: clopper-pearson (no claimed event): the verdict is eps_LB > claimed epsilon; eps_LB bounds any "
            "mechanism (the SELECT rule's EVAL counts and every threshold on all trials)"
        )
    acc = (result.claimed_curve or {}).get("accountant", "")
    family = fam.get("family_epsilon")
    family = _fmt(None if family is None else float(family))
    return (
        f"statistic: claimed-curve: {fam['statement']}, decides the verdict (family epsilon "
        f"{family}, {acc} accountant: a statement about the claim's family only); "
        "eps_LB bounds any mechanism"
    )


def _verdict_line(result) -> str:
    """The one verdict (:func:`dpaudit.audits.verdicts.violated`), and what decided it."""
    fam = result.claim_family_bound if result.statistic == "claimed-curve" else None
    lb, claim = result.epsilon_lower_bound, _fmt(result.claimed_epsilon)
    if fam:
        if result.violated:
            return f"[bold red]VIOLATION:[/] the claimed event is ruled out: {fam['statement']}; eps_LB {_fmt(lb)} (claimed {claim})"
        return f"no evidence of a violation: the claimed event is not ruled out ({fam['statement']}); eps_LB {_fmt(lb)} (claimed {claim})"
    if result.violated:
        return f"[bold red]VIOLATION:[/] eps_LB {_fmt(lb)} > claimed {claim} ({result.statistic})"
    return f"no evidence of a violation: eps_LB {_fmt(lb)} <= claimed {claim} ({result.statistic})"


def _comparison_cells(r) -> tuple[str, str, str]:
    """TPR at FPR 0.1 % and 1 %, AUROC [interval] of audit.json ``comparison`` (— in older files)."""
    comp = r.comparison or {}
    tprs = {round(float(t["fpr"]), 6): t for t in comp.get("tpr_at_fpr") or []}

    def tpr(f: float) -> str:
        t = tprs.get(f)
        return "—" if t is None else f"{float(t['tpr']):.3f}"

    a = comp.get("auroc")
    if not a:
        return tpr(0.001), tpr(0.01), "—"
    low, high = (float(x) for x in a["interval"])
    return tpr(0.001), tpr(0.01), f"{float(a['auc']):.2f} [{low:.2f}, {high:.2f}]"


def _gdp_cell(r) -> str:
    g = r.gdp_estimate
    if g.get("saturated"):
        return "saturated (AUC = 1)"
    lo, hi = g["epsilon_interval"]
    return f"{g['epsilon']:.2f} [{lo:.2f}, {hi:.2f}]"


def render(result, out: Path) -> None:
    print_table(_table(result))
    for entry in LEGEND:  # one line per abbreviation, wrapped at the terminal width
        console.print(escape(entry))
    for line in _verdict_lines(result):
        console.print(line)
    console.print(
        f"wrote {out / 'audit.json'} (shareable), {out / 'audit_local.json'} and {out / 'scores.npz'} (not for publication: "
        "computed on the private data, outside the release's claim)"
    )


#: The table's rows: label -> the cell of a run (its result, its comparison cells).
_ROWS = {
    "eps_LB": lambda r, c: _fmt(r.epsilon_lower_bound),
    "CP eps_LB": lambda r, c: _fmt(r.clopper_pearson_epsilon),
    "claim": lambda r, c: _fmt(r.claimed_epsilon),
    "CP ceiling": lambda r, c: _fmt(r.ceiling),
    "TPR@FPR 0.1%": lambda r, c: c[0],
    "TPR@FPR 1%": lambda r, c: c[1],
    "AUROC [CI]": lambda r, c: escape(c[2]),
    "GDP est. [CI]": lambda r, c: escape(_gdp_cell(r)),
}


def _table(result) -> Table:
    """One column per run (audit and its controls), one row per statistic: fits 80 columns."""
    runs = [("audit" if result.noise else "audit (no noise)", result), *result.controls.items()]
    table = Table(
        title=f"audit: {result.mechanism}, canary {result.canary}, {result.runs} trials, {result.confidence:.0%} confidence"
    )
    table.add_column("statistic", no_wrap=True)
    for name, _ in runs:
        table.add_column(name)
    cells = [(r, _comparison_cells(r)) for _, r in runs]
    for label, cell in _ROWS.items():
        table.add_row(label, *(cell(r, c) for r, c in cells))
    return table


def _verdict_lines(result) -> list[str]:
    """The statistic, the verdict (not for a no-noise audit that found nothing), the sequential
    stop, the power and an underpowered warning, as they apply."""
    lines = [_statistic_line(result)]
    if result.violated or result.noise:
        lines.append(_verdict_line(result))
    if result.sequential:
        lines.append(sequential_line(result.sequential))
    if result.power:
        lines.append(escape(power_line(result.power)))
    if result.underpowered:
        lines.append(
            f"[yellow]audit underpowered:[/] the ceiling {result.ceiling:.3f} is below the claim; use more --runs."
        )
    return lines
