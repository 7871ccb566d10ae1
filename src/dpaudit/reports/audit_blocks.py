"""The Audit section laid out as blocks: the Table-16-shaped table, every audit in detail, the
statistics behind each verdict, and the one-run audits."""

from __future__ import annotations

from typing import Any

from ..audit_outputs import NOT_COVERED
from ..audits.power import power_cell
from .format import DASH, Block, columns, either, f, g, num, p, status_word, table, text, val
from .format import verdict_word, with_interval


#: The captions of the section's tables.
CAPTIONS = {
    "detail": "Every audit in detail (the statistic that decided it recomputed by this report from "
    "the stored counts)",
    "statistic": "Statistic that decided each audit, and those reviewers compare across tools "
    "(claimed-curve: the box of one test chosen on SELECT against the claimed curve; eps_LB: a "
    "bound for any mechanism; family epsilon: no bound; GDP: an estimate)",
    "one_run": "One-run audits (Steinke, Nasr & Jagielski 2023; f-DP analysis: Mahloujifar et al. "
    "2024): m canaries each included with probability 1/2, one training run",
    "white_box": "White-box and crafted-final audits (docs/white_box.md): Dirac canaries seen at "
    "every step, or only in the final model; eps_LB = epsilon of the subsampled Gaussian with "
    "noise multiplier s_hi / d_lo and rate q_lo",
}
#: The columns of each canary in the Table-16-shaped table.
TABLE16_GROUP = ("private eps_LB", "no-noise ctrl", "ceiling")


def _table16_cells(cell: dict | None) -> list[str]:
    if cell is None:
        return ["—", "—", "—"]
    return [
        f(cell["private"]) + (" (VIOLATION)" if cell.get("status") == "violation" else ""),
        f(cell["no_noise"]),
        f(cell["ceiling"], 2),
    ]


def _joined(cells: list[dict | None], key: str, fmt) -> str:
    return " / ".join(
        sorted({fmt(c[key]) for c in cells if c is not None and c.get(key) is not None})
    )


def _table16_block(t: dict) -> Block:
    groups = [f"{c}: {what}" for c in t["canaries"] for what in TABLE16_GROUP]
    headers = ["mechanism", "task / target", "claimed eps", *groups, "confidence", "trials"]
    rows = []
    for r in t["rows"] + ([t["max"]] if t.get("max") else []):
        cells = [r["cells"].get(c) for c in t["canaries"]]
        rows.append(
            [r["mechanism"], r["task"], f(r["claimed_epsilon"])]
            + [x for c in cells for x in _table16_cells(c)]
            + [_joined(cells, "confidence", g), _joined(cells, "trials", str)]
        )
    return table(
        "Empirical privacy audit (shape of DP-MixMin Table 16): Clopper–Pearson eps_LB of the private mechanism and of its "
        "no-noise control, per task and canary",
        headers,
        rows,
    )


def _method_ref(method: Any, methods: list[str]) -> str:
    """Long method descriptions go below the table once; the cell holds a reference [k]."""
    if not method:
        return DASH
    methods += [] if str(method) in methods else [str(method)]
    return f"[{methods.index(str(method)) + 1}]"


def _recomputed(r: dict | None) -> str:
    """The deciding statistic recomputed by the report (the claimed-curve search, or the eps_LB)."""
    if not r:
        return DASH
    if "statement" in r:
        return f"{r['statistic']}: {r['statement']}: {verdict_word(r['violated'])}"
    return f"{r['statistic']}: eps_LB {f(r.get('epsilon_lower_bound'))}"


def _sequential_note(seq: dict | None) -> str:
    """A sequential audit's stop, after its trials: "; sequential, stopped (violation) of 2000"."""
    if not seq:
        return ""
    return f"; sequential, stopped ({text(seq.get('stopped'))}) of {val(seq.get('max_trials'))}"


def _detail_columns(methods: list[str]) -> list[tuple]:
    """The columns of the every-audit table (long methods collected into ``methods``)."""
    return [
        ("audit", "label", text),
        ("mechanism / canary / task", None, _what),
        ("claim (delta)", None, lambda e: f"{f(e.get('compared_claim'))} ({g(e.get('delta'))})"),
        ("eps_LB", "epsilon_lower_bound", f),
        ("deciding statistic, recomputed from the counts", "recomputed", _recomputed),
        ("null ctrl", "null", lambda null: f((null or {}).get("epsilon_lower_bound"))),
        ("confidence", "confidence", g),
        ("trials (EVAL)", None, _trials),
        ("TP/FP/TN/FN", "counts", _counts),
        ("ceiling", "ceiling", lambda x: f(x, 2)),
        ("GDP est. / AUC", None, lambda e: f"{f(e.get('gdp_estimate'))} / {f(e.get('auc'))}"),
        ("power (what this N can detect)", "power", power_cell),
        ("method", "method", lambda method: _method_ref(method, methods)),
        ("status", None, status_word),
    ]


def _what(e: dict) -> str:
    parts = (e.get("mechanism"), e.get("canary"), e.get("task") or e.get("dataset"))
    return " / ".join(text(x) for x in parts)


def _trials(e: dict) -> str:
    return f"{val(e.get('trials'))} ({val(e.get('eval_trials'))})" + _sequential_note(
        e.get("sequential")
    )


def _counts(cnt: dict | None) -> str:
    return either(cnt, "/".join(val((cnt or {}).get(k)) for k in ("tp", "fp", "tn", "fn")))


DETAIL_HEADERS = [header for header, *_ in _detail_columns([])]


def audit_blocks(report: dict) -> list[Block]:
    a = report["sections"]["audit"]
    entries, one_runs, white_boxes = a["audits"], a.get("one_run") or [], a.get("white_box") or []
    covered = p(a.get("not_covered") or NOT_COVERED)
    runs = _one_run_blocks(one_runs) + _white_box_blocks(white_boxes)
    if not entries:
        if not runs:
            return [p("No audit among the inputs.")]
        return [p("No trial-based audit among the inputs."), covered] + runs
    methods: list[str] = []  # filled while the detail table is laid out, listed below it
    detail = columns(CAPTIONS["detail"], _detail_columns(methods), entries)
    head = [covered, _table16_block(a["table16"]), detail]
    head += [_method_block(k, m) for k, m in enumerate(methods, 1)]
    figures = Block("figures", figures=["eps_lb_vs_claimed", "roc"])
    return head + _statistic_blocks(entries) + [figures, *runs]


def _method_block(k: int, method: str) -> Block:
    """Method [k] in full, folded below the detail table under its first clause."""
    return Block("more", text=f"Method [{k}]: {method.split(';')[0]}", caption=method)


def _comparison_cells(cmp_: dict) -> list[str]:
    """CP Bonferroni, TPR at FPR 0.1 % and 1 %, AUROC and the GDP estimate of a comparison block."""
    tprs = {
        round(num(t["fpr"]), 6): t
        for t in cmp_.get("tpr_at_fpr") or []
        if num(t.get("fpr")) is not None
    }
    t01, t1 = tprs.get(0.001) or {}, tprs.get(0.01) or {}
    au, gd, cpb = (cmp_.get(k) or {} for k in ("auroc", "gdp_estimate", "cp_bonferroni"))
    return [
        either(
            cpb,
            f"{f(cpb.get('epsilon_lower_bound'))} ({val(cpb.get('thresholds_tested'))} thresholds)",
        ),
        with_interval(t01.get("tpr"), t01.get("tpr_interval")),
        with_interval(t1.get("tpr"), t1.get("tpr_interval")),
        with_interval(au.get("auc"), au.get("interval")),
        either(gd, with_interval(gd.get("epsilon"), gd.get("epsilon_interval")) + " (estimate)"),
    ]


def _family_cell(e: dict) -> str:
    cv, cfb = e.get("claimed_curve") or {}, e.get("claim_family_bound") or {}
    return either(
        cfb,
        f"{cfb.get('statement')} ({f(cv.get('family_epsilon'))}): {verdict_word(cfb.get('violated'))}",
    )


def _comparison(index: int):
    """The ``index``-th of a comparison block's cells (:func:`_comparison_cells`)."""
    return lambda cmp_: _comparison_cells(cmp_ or {})[index]


STATISTIC_COLUMNS = [
    ("audit", "label", text),
    ("statistic (decides)", "statistic", text),
    ("eps_LB", "epsilon_lower_bound", f),
    ("claim", "compared_claim", f),
    ("claim's family: ruled out (family epsilon, not a bound)", None, _family_cell),
    ("CP eps_LB (SELECT/EVAL)", "clopper_pearson_epsilon", f),
    ("CP eps_LB (Bonferroni)", "comparison", _comparison(0)),
    ("TPR at FPR 0.1 % [CI]", "comparison", _comparison(1)),
    ("TPR at FPR 1 % [CI]", "comparison", _comparison(2)),
    ("AUROC [bootstrap CI]", "comparison", _comparison(3)),
    ("GDP eps (estimate)", "comparison", _comparison(4)),
    ("threat model", "threat_model", text),
]


#: How to read the trade-off figures.
TRADEOFF_NOTE = (
    "Trade-off figures: the claimed curve, the EVAL points and the confidence box (red: wholly below the curve, "
    "the claim is falsified)."
)


def _statistic_blocks(entries: list[dict]) -> list[Block]:
    """Which statistic decided each audit, the claimed-curve test beside today's Clopper-Pearson
    bound, the statistics reviewers compare across tools, and the trade-off figures. Shown only
    when some audit records them (an audit.json from before claimed-curve audits has none)."""
    if not any(
        e.get("claimed_curve") or e.get("comparison") or e.get("statistic") == "claimed-curve"
        for e in entries
    ):
        return []
    out = [columns(CAPTIONS["statistic"], STATISTIC_COLUMNS, entries)]
    if any(e.get("claimed_curve") for e in entries):
        out += [p(TRADEOFF_NOTE), Block("figures", figures=["tradeoff"])]
    return out


def _steinke(show):
    """A cell of the (eps, delta) analysis's block (n/a when the record has none)."""
    return lambda st: either(st, show(st or {}))


def _guesses(st: dict) -> str:
    return f"{f(st.get('correct'))} / {f(st.get('guesses'))}"


def _fdp_bound(fd: dict | None) -> str:
    return either(fd, f((fd or {}).get("epsilon_lower_bound")), "not computed")


def _fdp_flag(fd: dict | None) -> str:
    violated = (fd or {}).get("violated")
    return either(fd, either(violated is not None, verdict_word(violated)))


ONE_RUN_COLUMNS = [
    ("record", "label", text),
    ("mechanism", "mechanism", text),
    ("canary kind", "kind", text),
    ("m", "canaries", f),
    ("included", "included", f),
    ("claim", "claimed_epsilon", f),
    ("delta", "delta", g),
    ("confidence", "confidence", g),
    ("correct / guesses", "steinke", _steinke(_guesses)),
    ("eps_LB (eps, delta)", "steinke", _steinke(lambda st: f(st.get("epsilon_lower_bound")))),
    ("ceiling", "steinke", _steinke(lambda st: f(st.get("ceiling"), 2))),
    ("eps_LB (f-DP)", "fdp", _fdp_bound),
    ("claimed curve (f-DP)", "fdp", _fdp_flag),
    ("statistic (decides)", "statistic", text),
    ("power (what this m can detect)", "power", power_cell),
    ("status", None, status_word),
]
ONE_RUN_HEADERS = [header for header, *_ in ONE_RUN_COLUMNS]


def _one_run_blocks(entries: list[dict]) -> list[Block]:
    """One-run audits (one_run.json): both analyses' bounds against the claim."""
    if not entries:
        return []
    return [
        columns(CAPTIONS["one_run"], ONE_RUN_COLUMNS, entries),
        Block("figures", figures=["onerun"]),
    ]


def _control_cell(controls: dict) -> str:
    words = {True: "as expected", False: "FAILED"}
    return " / ".join(words.get(controls.get(c), "not run") for c in ("no-noise", "null"))


WHITE_BOX_COLUMNS = [
    ("record", "label", text),
    ("mechanism", "mechanism", text),
    ("threat model", "threat_model", text),
    ("canaries", "canaries", f),
    ("steps", "steps", f),
    ("claim", "claimed_epsilon", f),
    ("delta", "delta", g),
    ("confidence", "confidence", g),
    ("eps_LB", "epsilon_lower_bound", f),
    ("noise multiplier <=", "noise_multiplier_upper", g),
    ("sensitivity >=", "sensitivity_lower", g),
    ("sample rate >=", "sample_rate_lower", g),
    ("controls (no-noise / null)", "controls_ok", lambda controls: _control_cell(controls or {})),
    ("power (what these canaries can detect)", "power", power_cell),
    ("status", None, status_word),
]
WHITE_BOX_HEADERS = [header for header, *_ in WHITE_BOX_COLUMNS]


def _white_box_blocks(entries: list[dict]) -> list[Block]:
    """White-box and crafted-final audits (white_box.json): the bound and its three ingredients."""
    if not entries:
        return []
    return [columns(CAPTIONS["white_box"], WHITE_BOX_COLUMNS, entries)]
