"""`dpaudit audit MECHANISM --canary ...`: canary audits (claimed-curve test of the release's event, or
Clopper–Pearson bounds without one). Parsing and rendering only."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

import typer

from . import options
from .common import console, emit_json, note, recorded_argv

#: Options that say how, where or in what format an audit runs, never what it computes: left out
#: of the recorded command line.
NOT_RECORDED = ("json_out", "workers", "executor", "scheduler", "ledger")


def _default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def register(app: typer.Typer) -> None:
    from . import generic

    # `dpaudit audit NAME` of catalogue entries without a bespoke target goes to its generic command.
    generic.register_audit(app)
    from ..catalogue import CATALOGUE, names

    # The MECHANISM names from the catalogue (auditable entries; aliases in parentheses).
    mechanisms = ", ".join(n + (f" (alias {', '.join(CATALOGUE[n].aliases)})" if CATALOGUE[n].aliases else "") for n in names(auditable=True))

    @app.command("audit")
    def audit(
        mechanism: str = typer.Argument(..., help=f"{mechanisms}."),
        canary: Optional[str] = typer.Option(None, "--canary", help="natural, max-clip, mislabeled, worst-case (default: the mechanism's strongest).",
                                             show_default=False),
        runs: int = typer.Option(1000, "--runs", help="Trials R (half with the canary, half without)."),
        epsilon: Optional[float] = typer.Option(None, "--eps", help="Claimed epsilon the noise is calibrated for (default 1 for mixmin and gaussian, 2 otherwise).",
                                                show_default=False),
        delta: float = options.delta(),
        task: Optional[str] = typer.Option(None, "--task", help="mixmin task: digits-mix (embedded, default), mnist-mix, heart-mix.", show_default=False),
        target: Optional[str] = typer.Option(None, "--target", help="mixmin target within the task (default: the task's first).", show_default=False),
        dataset: Optional[str] = typer.Option(None, "--dataset", help="Dataset for trained models (default: embedded digits).", show_default=False),
        data_dir: options.OptionalPath = options.data_dir(),
        profile: Optional[str] = options.profile(),
        no_noise: bool = typer.Option(False, "--no-noise", help="Audit the mechanism with its DP noise removed (must find large leakage)."),
        confidence: float = typer.Option(0.95, "--confidence", help="Joint confidence of the FPR and FNR bounds."),
        release: options.OptionalPath = typer.Option(None, "--release", help="Audit the configuration recorded in this release.json (or its folder).",
                                                     show_default=False),
        out: options.OptionalPath = typer.Option(None, "--out", help="Output directory for audit.json and scores.npz (default: audits/MECHANISM-CANARY).",
                                                 show_default=False),
        seed: int = typer.Option(42, "--seed", help="Public seed: model features, canary choice, worlds and SELECT/EVAL split."),
        reproducible_noise: bool = options.reproducible_noise(),
        controls: bool = typer.Option(True, "--controls/--no-controls", help="Also run the no-noise and null controls."),
        control_runs: Optional[int] = typer.Option(None, "--control-runs", help="Trials per control (default: --runs).", show_default=False),
        workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes for the trials (local: default min(2, CPUs); "
                                                                     "dask without --scheduler: a LocalCluster of N workers on 127.0.0.1).",
                                              show_default=False),
        executor: str = typer.Option("local", "--executor", help="local (processes on this machine) or dask (the trial chunks go to a Dask cluster)."),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Address of a running Dask scheduler, e.g. tcp://HOST:8786 (with --executor dask).",
                                                show_default=False),
        chunk_size: Optional[int] = typer.Option(None, "--chunk-size", help="Trials per batched call (speed only).", show_default=False),
        width: int = typer.Option(10, "--width", help="dp-elm hidden width L."),
        epochs: Optional[int] = typer.Option(None, "--epochs", help="Frozen-feature models: epochs (default: the paper's protocol).", show_default=False),
        rho: Optional[float] = typer.Option(None, "--rho", help="mixmin: fraction of private training records used for mixture learning "
                                                                 "(default: the task's training default, 0.5 for digits-mix, 0.1 otherwise).",
                                            show_default=False),
        privacy_unit: str = typer.Option("record", "--privacy-unit", help="record (default) or user: audit user-level DP-SGD (head models) with one whole "
                                                                          "canary user, adjacency add-remove-user (needs --records-per-user)."),
        records_per_user: Optional[int] = typer.Option(None, "--records-per-user", help="G: records of the canary user and records per sampled user "
                                                                                        "and step (--privacy-unit user).", show_default=False),
        user_ids: options.OptionalPath = typer.Option(None, "--user-ids", help="FILE.npy: one user id per row before splitting (--privacy-unit user; "
                                                                              "default: rows grouped into users of G by the public seed).",
                                                      show_default=False),
        broken_noise_factor: float = typer.Option(1.0, "--broken-noise-factor", hidden=True,
                                                  help="gaussian only: divide the noise by this factor, claim unchanged (a broken mechanism)."),
        one_run: bool = typer.Option(False, "--one-run", help="One-run audit (Steinke et al. 2023; f-DP analysis of Mahloujifar et al. 2024): "
                                                              "train ONCE with --canaries independent canaries; DP-SGD head models and "
                                                              "dp-dense, dp-cnn, dp-attention. Writes one_run.json."),
        canaries: Optional[int] = typer.Option(None, "--canaries", help="M: canaries of the one-run audit (each included w.p. 1/2; needs --one-run).",
                                               show_default=False),
        one_run_kind: str = typer.Option("gradient", "--one-run-kind", help="One-run canaries: gradient (Dirac gradient canaries) or "
                                                                          "input-mislabeled (needs --one-run)."),
        threat_model: str = typer.Option("final-model", "--threat-model", help="final-model (the adversary sees the released model) or trajectory "
                                                                             "(every iterate: DP-SGD head models, max-clip canary, scored by the "
                                                                             "per-step likelihood ratio of its coordinate; the final-model audit "
                                                                             "also runs, into OUT/final-model)."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Empirical privacy audit: the claimed event's trade-off curve tested (what the claim's family rules out decides), eps_LB for any mechanism, Clopper–Pearson eps_LB (Jagielski et al. 2020), TPR at low FPR, AUROC, GDP estimate, controls."""
        from ..auditing import build_target, check_privacy_unit, check_release_unit, target_from_release
        from ..catalogue import lookup
        from ..audits.engine import CONTROLS, run_audit
        from ..sweeps.executors import check_executor_args

        check_executor_args(executor, scheduler, workers)  # before any data is loaded or a cluster is started
        _check_threat_model(mechanism, threat_model, privacy_unit=privacy_unit, one_run=one_run or canaries is not None)
        if one_run or canaries is not None:
            _one_run(mechanism, one_run=one_run, canaries=canaries, kind=one_run_kind, release=release, epsilon=epsilon, delta=delta,
                     dataset=dataset, data_dir=data_dir, profile=profile, epochs=epochs, seed=seed, no_noise=no_noise,
                     confidence=confidence, reproducible_noise=reproducible_noise, out=out, json_out=json_out,
                     privacy_unit=privacy_unit, records_per_user=records_per_user, user_ids=user_ids, ledger=ledger)
            return

        release_id = release_path = None
        if release is not None:
            from ..records import read_release

            if profile is not None:  # the release records the profile its data were prepared with
                from ..errors import UsageError

                raise UsageError(f"profile must not be given with --release (the release records its own), got {profile!r}.")
            rel = read_release(release)
            check_release_unit(rel, privacy_unit, records_per_user)  # the release decides the privacy unit
            release_id, release_path = rel.id, str(Path(release).resolve())
            t = target_from_release(release, canary=canary, data_dir=data_dir, no_noise=no_noise, mechanism=mechanism,
                                    user_ids=user_ids)
        else:
            check_privacy_unit(mechanism, privacy_unit, records_per_user, user_ids)  # before any data is loaded
            t = build_target(mechanism, canary=canary, epsilon=epsilon, delta=delta, task=task, target=target, dataset=dataset,
                             data_dir=data_dir, seed=seed, no_noise=no_noise, width=width, epochs=epochs, rho=rho,
                             broken_noise_factor=broken_noise_factor, privacy_unit=privacy_unit, records_per_user=records_per_user,
                             user_ids=user_ids, profile=profile)
            if not json_out and task is None and dataset is None and mechanism != "gaussian":
                note(f"no --task/--dataset given: auditing {mechanism} on the embedded {t.describe().get('dataset')}.")
        if threat_model != "final-model":
            t = _with_threat_model(t, mechanism, threat_model)
        user_level = t.adjacency == "add-remove-user"
        if out is None:
            out = Path("audits") / (f"{t.mechanism}-{t.canary}{'-user' if user_level else ''}{'-no-noise' if no_noise else ''}"
                                    f"{'-' + threat_model if threat_model != 'final-model' else ''}")
        # The recorded command: every parameter as parsed, the defaults this audit resolved
        # (canary, epsilon) written out, so that it re-creates the audit under later defaults too.
        resolved = {"canary": t.canary, "out": out,
                    "epsilon": None if release is not None else (epsilon if epsilon is not None else lookup(mechanism).default_epsilon)}
        always = ("canary", "runs", "confidence", "seed") + (() if release is not None else ("epsilon", "delta")) \
            + (("width",) if release is None and lookup(mechanism).family == "dp-elm" else ())
        cmd = recorded_argv(values=resolved, always=always, omit=NOT_RECORDED)
        kwargs = dict(runs=runs, confidence=confidence, seed=seed, controls=CONTROLS if controls else (),
                      control_runs=control_runs, chunk_size=chunk_size, out_dir=out,
                      reproducible_noise=reproducible_noise, progress=True, command=shlex.join(cmd),
                      release_id=release_id, release_path=release_path, ledger_path=ledger)
        # Trajectory: also the final-model audit of the same configuration and seed, side by side
        # (stored in OUT/final-model; its command is this one without --threat-model).
        final_dir = Path(out) / "final-model"
        audits = [(t, kwargs)]
        if threat_model != "final-model":
            final_cmd = recorded_argv(values={**resolved, "threat_model": "final-model", "out": final_dir}, always=always, omit=NOT_RECORDED)
            audits.append((t.with_threat_model("final-model"), {**kwargs, "out_dir": final_dir, "command": shlex.join(final_cmd)}))
        results = []
        if executor == "dask":
            # The executor changes where chunks run, never what they compute: same chunks, same noise.
            from ..sweeps.executors import make_executor

            if not json_out:
                note("executor dask: " + (f"scheduler {scheduler}" if scheduler else f"LocalCluster of {workers or _default_workers()} workers on 127.0.0.1"))
            with make_executor("dask", scheduler=scheduler, workers=None if scheduler else (workers or _default_workers())) as ex:
                results = [run_audit(a, executor=ex, **kw) for a, kw in audits]
        else:
            results = [run_audit(a, workers=workers or _default_workers(), **kw) for a, kw in audits]
        result = results[0]
        if json_out:
            from ..audit_outputs import shareable_audit

            d = shareable_audit(result.to_dict())  # what audit.json holds; the rest is in audit_local.json
            d["audit_dir"] = str(Path(out))
            if len(results) > 1:
                d["final_model"] = {"audit_dir": str(final_dir), "epsilon_lower_bound": results[1].epsilon_lower_bound,
                                    "statistic": getattr(results[1], "statistic", "clopper-pearson")}
            emit_json(d)
            return
        _render(result, Path(out))
        if len(results) > 1:
            _render_threat_models(results[0], results[1], final_dir)
        for r, kw in zip(results, (kw for _, kw in audits)):
            write_figure(r, Path(kw["out_dir"]))


def _one_run(mechanism, *, one_run, canaries, kind, release, epsilon, delta, dataset, data_dir, profile, epochs, seed, no_noise,
             confidence, reproducible_noise, out, json_out, privacy_unit="record", records_per_user=None, user_ids=None, ledger=None) -> None:
    """``--one-run``: one training run with M canaries (audits/one_run_audit.py), one_run.json."""
    from ..errors import UsageError

    if not one_run:
        raise UsageError(f"canaries must only be given with --one-run, got --canaries {canaries}.")
    if canaries is None:
        raise UsageError("canaries must be given with --one-run (--canaries M, M >= 2), got none.")
    from ..audits.one_run_audit import run_one_run

    if out is None:
        out = Path("audits") / f"{mechanism}-one-run{'-no-noise' if no_noise else ''}"
    cmd = recorded_argv(values={"out": out}, always=("canaries", "one_run_kind", "confidence", "seed"), omit=NOT_RECORDED)
    result = run_one_run(mechanism, canaries=canaries, release=release, epsilon=epsilon, delta=delta, dataset=dataset, data_dir=data_dir,
                         profile=profile, epochs=epochs, seed=seed, no_noise=no_noise, kind=kind, confidence=confidence,
                         reproducible_noise=reproducible_noise, out_dir=out, command=shlex.join(cmd), privacy_unit=privacy_unit,
                         records_per_user=records_per_user, user_ids=user_ids, ledger_path=ledger)
    if json_out:
        from ..audit_outputs import shareable_one_run

        d = shareable_one_run(result.to_dict())
        d["audit_dir"] = str(Path(out))
        emit_json(d)
        return
    _render_one_run(result, Path(out))
    from ..reports.tradeoff import write_one_run_png

    console.print(f"wrote {write_one_run_png(result.to_dict(), Path(out))}", soft_wrap=True)


def write_figure(result, out: Path) -> Path | None:
    """The reviewer's picture next to ``out/audit.json``: the claimed trade-off curve with the audit's
    empirical points and confidence box (reports/tradeoff.py); nothing without a claimed event."""
    from ..reports.tradeoff import write_tradeoff_png

    path = write_tradeoff_png(result.to_dict(), out)
    if path is not None:
        console.print(f"wrote {path}", soft_wrap=True)
    return path


def _render_one_run(result, out: Path) -> None:
    from rich.table import Table

    b = result.bounds
    table = Table(title=f"one-run audit: {result.mechanism}, {b['canaries']} {b['kind']} canaries ({b['included']} included), "
                        f"{b['confidence']:.0%} confidence")
    for col in ("analysis", "eps_LB", "claim", "ceiling", "guesses", "correct"):
        table.add_column(col)
    st, fdp = b["steinke"], b.get("fdp")
    name = "steinke (eps, delta)" + ("" if result.noise else ", no noise")
    table.add_row(name, _fmt(st["epsilon_lower_bound"]), _fmt(b.get("claimed_epsilon")), _fmt(st["ceiling"]), str(st["guesses"]), str(st["correct"]))
    if fdp and fdp.get("epsilon_lower_bound") is not None:
        table.add_row("f-DP (claimed curve)" + ("" if result.noise else ", no noise"), _fmt(fdp["epsilon_lower_bound"]),
                      _fmt(b.get("claimed_epsilon")), _fmt(fdp.get("ceiling")), "", "")
    console.print(table)
    console.print(f"deciding statistic: {result.statistic}" + ("" if fdp else " (no claimed event: the (eps, delta) analysis decides)"))
    if fdp and fdp.get("unavailable"):
        console.print(f"f-DP analysis not computed: {fdp['unavailable']}.")
    if result.violated:
        console.print(f"[bold red]VIOLATION:[/] eps_LB {result.epsilon_lower_bound:.3f} > claimed {_fmt(b.get('claimed_epsilon'))}")
    elif result.noise:
        console.print(f"no evidence of a violation: eps_LB {result.epsilon_lower_bound:.3f} <= claimed {_fmt(b.get('claimed_epsilon'))}")
    console.print(f"wrote {out / 'one_run.json'} (shareable) and {out / 'one_run_local.json'} (not for publication)", soft_wrap=True)


def _check_threat_model(mechanism: str, threat_model: str, *, privacy_unit: str, one_run: bool) -> None:
    """``--threat-model`` before any data is loaded: trajectory only for record-level DP-SGD heads."""
    from ..audits.heads import THREAT_MODELS
    from ..catalogue import ALIASES, CATALOGUE
    from ..errors import UsageError

    if threat_model not in THREAT_MODELS:
        raise UsageError(f"threat model must be one of {', '.join(THREAT_MODELS)}, got {threat_model!r}.")
    if threat_model == "final-model":
        return
    head = mechanism not in ALIASES or CATALOGUE[ALIASES[mechanism]].family == "dp-sgd-head"  # unknown: the build step names the allowed ones
    if not head or privacy_unit != "record" or one_run:
        what = "--one-run" if one_run else (f"--privacy-unit {privacy_unit}" if head else mechanism)
        raise UsageError(f"threat model for {what} must be final-model (trajectory: DP-SGD head models, record level), got {threat_model!r}.")


def _with_threat_model(t, mechanism: str, threat_model: str):
    """The built target under ``threat_model`` (trajectory: :class:`~dpaudit.audits.heads.HeadTarget` only)."""
    from ..audits.heads import HeadTarget
    from ..errors import UsageError

    if not isinstance(t, HeadTarget):
        raise UsageError(f"threat model for {mechanism} must be final-model (trajectory: DP-SGD head models, record level), got {threat_model!r}.")
    return t.with_threat_model(threat_model)


def _render_threat_models(trajectory, final, final_dir: Path) -> None:
    """Both threat models' eps_LB, side by side (issue 15 part 3)."""
    for name, r in (("trajectory", trajectory), ("final-model", final)):
        console.print(f"{name}: {_verdict_line(r)}", soft_wrap=True)
    console.print(f"wrote the final-model audit to {final_dir / 'audit.json'}", soft_wrap=True)


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def _statistic_line(result) -> str:
    """Which statistic decided, in the claim's own units (audit.json ``statistic``, ``claim_family_bound``)."""
    fam = result.claim_family_bound
    if result.statistic != "claimed-curve" or not fam:
        return ("statistic: clopper-pearson (no claimed event): the verdict is eps_LB > claimed epsilon; eps_LB bounds any "
                "mechanism (the SELECT rule's EVAL counts and every threshold on all trials)")
    acc = (result.claimed_curve or {}).get("accountant", "")
    return (f"statistic: claimed-curve: {fam['statement']}, decides the verdict (family epsilon "
            f"{_fmt(_float(fam.get('family_epsilon')))}, {acc} accountant: a statement about the claim's family only); "
            "eps_LB bounds any mechanism")


def _float(x):
    return None if x is None else float(x)


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
    auroc = "—" if not a else f"{float(a['auc']):.2f} [{float(a['interval'][0]):.2f}, {float(a['interval'][1]):.2f}]"
    return tpr(0.001), tpr(0.01), auroc


def _gdp_cell(r) -> str:
    g = r.gdp_estimate
    if g.get("saturated"):
        return "saturated (AUC = 1)"
    lo, hi = g["epsilon_interval"]
    return f"{g['epsilon']:.2f} [{lo:.2f}, {hi:.2f}]"


def _render(result, out: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    # One column per run (audit and its controls), one row per statistic: fits 80 columns.
    runs = [("audit" if result.noise else "audit (no noise)", result)] + [(k, v) for k, v in result.controls.items()]
    table = Table(title=f"audit: {result.mechanism}, canary {result.canary}, {result.runs} trials, {result.confidence:.0%} confidence",
                  caption=escape("eps_LB: a lower bound on epsilon for any mechanism; the verdict: the statistic below. CP: "
                                 "Clopper–Pearson eps_LB (SELECT/EVAL rule). TPR and AUROC [bootstrap interval]: EVAL trials, "
                                 "descriptive. GDP: an estimate, not a bound."))
    table.add_column("statistic", no_wrap=True)
    for name, _ in runs:
        table.add_column(name)
    cells = [(r, _comparison_cells(r)) for _, r in runs]
    rows = [("eps_LB", [_fmt(r.epsilon_lower_bound) for r, _ in cells]),
            ("CP eps_LB", [_fmt(r.clopper_pearson_epsilon) for r, _ in cells]),
            ("claim", [_fmt(r.claimed_epsilon) for r, _ in cells]),
            ("CP ceiling", [_fmt(r.ceiling) for r, _ in cells]),
            ("TPR@FPR 0.1%", [c[0] for _, c in cells]),
            ("TPR@FPR 1%", [c[1] for _, c in cells]),
            ("AUROC [CI]", [escape(c[2]) for _, c in cells]),
            ("GDP est. [CI]", [escape(_gdp_cell(r)) for r, _ in cells])]
    for label, values in rows:
        table.add_row(label, *values)
    console.print(table)
    console.print(_statistic_line(result), soft_wrap=True)
    if result.violated or result.noise:
        console.print(_verdict_line(result), soft_wrap=True)
    if result.underpowered:
        console.print(f"[yellow]audit underpowered:[/] the ceiling {result.ceiling:.3f} is below the claim; use more --runs.")
    console.print(f"wrote {out / 'audit.json'} (shareable), {out / 'audit_local.json'} and {out / 'scores.npz'} (not for publication: "
                  "computed on the private data, outside the release's claim)", soft_wrap=True)
