"""`dpaudit audit MECHANISM --canary ...`: canary audits (claimed-curve test of the release's event, or
Clopper–Pearson bounds without one). The command is generated from
:class:`~dpaudit.requests.AuditRequest` (one option per field, as the ``train`` commands from
their Requests); parsing and rendering only."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from .. import auditing, one_run_auditing
from ..audit_outputs import shareable_one_run
from ..audits import engine
from ..catalogue import ALIASES, CATALOGUE, lookup, names
from ..errors import UsageError
from ..ledger.paths import resolve_ledger
from ..progress import phase
from ..records import read_release
from ..reports import tradeoff
from ..requests import THREAT_MODELS, WHITE_BOX_THREAT_MODELS, AuditRequest
from ..sweeps.executors import check_executor_args, make_executor
from ..validation import one_of, positive_int
from . import audit_opacus, audit_white_box, generic, plan as plan_cli
from .audit_render import render_one_run, show
from .common import ROUTES, console, default_workers, emit_json, exit_on_violation, keyword, note
from .common import NOT_RECORDED, new_out, out_or_fresh, recorded_argv


_DOC = (
    "Empirical privacy audit: the claimed event's trade-off curve tested (what the claim's family rules out decides), eps_LB for any "
    "mechanism, Clopper–Pearson eps_LB (Jagielski et al. 2020), TPR at low FPR, AUROC, GDP estimate, controls."
)


def register(app: typer.Typer) -> None:
    # `dpaudit audit NAME` of catalogue entries with their own request options goes to its generic command.
    generic.register_audit(app)
    # `dpaudit audit opacus SCRIPT.py -- ARGS`: your own Opacus script
    ROUTES[("audit", "opacus")] = audit_opacus.click_command
    # The MECHANISM names from the catalogue (auditable entries; aliases in parentheses).
    mechanisms = ", ".join(
        n + (f" (alias {', '.join(CATALOGUE[n].aliases)})" if CATALOGUE[n].aliases else "")
        for n in names(auditable=True)
    )
    help_text = (
        f"{mechanisms}. `audit plan MECHANISM ...`: write a "
        "pre-registered plan; `audit opacus SCRIPT.py -- ARGS`: audit your own Opacus script."
    )
    mechanism = typer.Argument(None, metavar="MECHANISM|plan", help=help_text)
    arg = keyword("mechanism", Optional[str], mechanism)

    def audit(**kwargs):
        todo = plan_cli.dispatch(kwargs, _check)
        if todo is not None:
            run(*todo)

    app.command("audit")(
        generic.make_command(
            audit,
            [arg, *plan_cli.PARAMETERS, *generic.request_parameters(AuditRequest)],
            "audit",
            _DOC,
        )
    )


def _check(a: AuditRequest) -> None:
    """What is checked before any data is loaded or a cluster is started."""
    check_executor_args(a.trials.executor, a.trials.scheduler, a.trials.workers)
    positive_int("runs", a.runs, engine.MIN_RUNS)
    if a.out is not None:  # before any training: a bad --out must not throw a long run away
        new_out(a.out)
    _check_threat_model(a)
    one_run_auditing.audit_device(a)
    # a release's schedule: from its recorded N0
    if a.release is not None and a.settings.reference_size is not None:
        raise UsageError(
            "reference_size must not be given with --release (the release records its own), "
            f"got {a.settings.reference_size}."
        )
    _check_modes(a)


def _check_modes(a: AuditRequest) -> None:
    """--canaries with a one-run or white-box audit only, --sequential with a final-model trial audit only."""
    canaries_without_one_run = a.protocol.canaries is not None and not a.protocol.one_run
    if canaries_without_one_run and a.threat_model not in WHITE_BOX_THREAT_MODELS:
        raise UsageError(
            f"canaries must only be given with --one-run, got --canaries {a.protocol.canaries}."
        )
    if a.sequential and (a.protocol.one_run or a.threat_model != "final-model"):
        raise UsageError(
            "sequential must only be used with a final-model trial audit, got --one-run or --threat-model trajectory."
        )
    if a.protocol.one_run and a.protocol.canaries is None:
        raise UsageError("canaries must be given with --one-run (an integer >= 2), got none.")


def run(a: AuditRequest, plan=None) -> None:
    """The ``dpaudit audit`` command on its parsed request: build the target, run, render
    (``plan``: a run under a pre-registered plan, :class:`dpaudit.audit_plans.PlanRun`)."""
    _check(a)
    if a.threat_model in WHITE_BOX_THREAT_MODELS:
        return exit_on_violation(a.output.fail_on_violation, [audit_white_box.run(a, plan)])
    if a.protocol.one_run or a.protocol.canaries is not None:
        return exit_on_violation(a.output.fail_on_violation, [_one_run(a, plan)])
    phase("building the audit target (loading the data, preparing features)")
    t, release_id, release_path = _target(a)
    out = out_or_fresh(a.out, _default_out(a, t), a.output.json_out)
    resolved, always = _recorded(a, t, out)
    kwargs = dict(
        runs=a.runs,
        confidence=a.confidence,
        seed=a.seed,
        controls=engine.CONTROLS if a.trials.controls else (),
        control_runs=a.trials.control_runs,
        chunk_size=a.trials.chunk_size,
        out_dir=out,
        reproducible_noise=a.trials.reproducible_noise,
        progress=True,
        command=_command(plan, values=resolved, always=always),
        release_id=release_id,
        release_path=release_path,
        ledger_path=a.output.ledger,
        plan=plan,
        sequential=a.sequential,
    )
    # Trajectory: also the final-model audit of the same configuration and seed, side by side
    # (stored in OUT/final-model; its command is this one without --threat-model).
    final_dir = out / "final-model"
    audits = [(t, kwargs)]
    if a.threat_model != "final-model":
        values = {**resolved, "threat_model": "final-model", "out": final_dir}
        final_cmd = shlex.join(recorded_argv(values=values, always=always, omit=NOT_RECORDED))
        final = {**kwargs, "out_dir": final_dir, "command": final_cmd}
        audits.append((t.with_threat_model("final-model"), final))
    results = _run_all(a, audits, engine.run_audit)
    show(results, [kw["out_dir"] for _, kw in audits], json_out=a.output.json_out)
    _note_unbounded_control(t, a, results)
    _note_runs(plan, a.output.json_out)
    exit_on_violation(a.output.fail_on_violation, results)


def _default_out(a: AuditRequest, t) -> Path:
    """audits/MECHANISM-DATA-CANARY, with -user, -no-noise and the threat model when they apply."""
    data = generic.data_label(t.describe().get("dataset") or a.data.task)
    suffixes = {
        "-user": t.adjacency == "add-remove-user",
        "-no-noise": a.no_noise,
        f"-{a.threat_model}": a.threat_model != "final-model",
    }
    suffix = "".join(k for k, on in suffixes.items() if on)
    return Path("audits") / f"{t.mechanism}-{data}-{t.canary}{suffix}"


def _note_unbounded_control(t, a: AuditRequest, results) -> None:
    """One line when a no-noise control trained on the private data: the ledger now counts the
    dataset's releases + audits as infinite (a cap that counts audits would have refused it)."""
    scope = t.private_data()
    controlled = any("no-noise" in (r.controls or {}) for r in results)
    if a.output.json_out or scope is None or not controlled:
        return
    note(
        f"the no-noise control trained on {scope['dataset']!r} without DP noise: its releases + audits "
        f"total is now infinite (epsilon=inf) in ledger {resolve_ledger(a.output.ledger).display}; "
        "--no-controls keeps it finite."
    )


def _command(plan, **recorded) -> str:
    """The recorded command: the plan's run, or the options that re-create the audit."""
    if plan is not None:
        return shlex.join(["dpaudit", "audit", "--plan", plan.path])
    return shlex.join(recorded_argv(omit=NOT_RECORDED, **recorded))


def _note_runs(plan, json_out: bool) -> None:
    if plan is not None and plan.runs > 1 and not json_out:
        note(
            f"{plan.runs} runs of plan {plan.plan['id']}: the ledger records every run, and `dpaudit verify` fails a bundle without all of them."
        )


def _target(a: AuditRequest):
    """(target, release id, release path) of a fresh audit or of ``--release``."""
    if a.release is None:
        t = auditing.target_for(a)
        given = a.data.task is not None or a.data.dataset is not None
        if not (a.output.json_out or given or a.mechanism == "gaussian"):
            note(
                f"no --task/--dataset given: auditing {a.mechanism} on the embedded {t.describe().get('dataset')}."
            )
    else:
        if a.data.profile is not None:  # the release records the profile its data were made with
            raise UsageError(
                f"profile must not be given with --release (the release records its own), got {a.data.profile!r}."
            )
        rel = read_release(a.release)
        # the release decides the privacy unit
        auditing.check_release_unit(rel, a.settings.privacy_unit, a.settings.records_per_user)
        t = auditing.target_from_release(
            rel,
            canary=a.canary,
            data_dir=a.data.data_dir,
            no_noise=a.no_noise,
            mechanism=a.mechanism,
            user_ids=a.settings.user_ids,
        )
    if a.threat_model != "final-model":
        if not hasattr(t, "with_threat_model"):  # trajectory: DP-SGD head targets only
            raise _trajectory_only(a.mechanism, a.threat_model)
        t = t.with_threat_model(a.threat_model)
    return (t, None, None) if a.release is None else (t, rel.id, str(Path(a.release).resolve()))


def _recorded(a: AuditRequest, t, out: Path):
    """The recorded command's resolved values and always-written options: every parameter as
    parsed, the defaults this audit resolved (canary, epsilon) written out, so that it re-creates
    the audit under later defaults too."""
    always = ("canary", "runs", "confidence", "seed")
    if a.release is not None:
        return {"canary": t.canary, "out": out, "epsilon": None}, always
    entry = lookup(a.mechanism)
    epsilon = entry.default_epsilon if a.epsilon is None else a.epsilon
    always += ("epsilon", "delta") + (("width",) if entry.family == "dp-elm" else ())
    return {"canary": t.canary, "out": out, "epsilon": epsilon}, always


def _run_all(a: AuditRequest, audits, run_audit) -> list:
    workers = a.trials.workers or default_workers()
    if a.trials.executor != "dask":
        return [run_audit(t, workers=workers, **kw) for t, kw in audits]
    # The executor changes where chunks run, never what they compute: same chunks, same noise.
    if a.trials.scheduler:
        where, workers = f"scheduler {a.trials.scheduler}", None
    else:
        where = f"LocalCluster of {workers} workers on 127.0.0.1"
    if not a.output.json_out:
        note(f"executor dask: {where}")
    with make_executor("dask", scheduler=a.trials.scheduler, workers=workers) as ex:
        return [run_audit(t, executor=ex, **kw) for t, kw in audits]


def _one_run(a: AuditRequest, plan=None):
    """``--one-run``: one training run with M canaries (dpaudit/one_run_auditing.py), one_run.json."""
    data = a.data.dataset or a.data.task
    if not data and a.release is not None:
        data = read_release(a.release).dataset
    suffix = "-no-noise" if a.no_noise else ""
    default = Path("audits") / f"{a.mechanism}-{generic.data_label(data)}-one-run{suffix}"
    out = out_or_fresh(a.out, default, a.output.json_out)
    cmd = _command(
        plan, values={"out": out}, always=("canaries", "one_run_kind", "confidence", "seed")
    )
    phase("one-run audit: loading the data, preparing the canaries")
    result = one_run_auditing.run_one_run(
        a, out_dir=out, command=cmd, ledger_path=a.output.ledger, plan=plan
    )
    _note_runs(plan, a.output.json_out)
    if a.output.json_out:
        emit_json({**shareable_one_run(result.to_dict()), "audit_dir": str(out)})
        return result
    render_one_run(result, out)
    console.print(f"wrote {tradeoff.write_one_run_png(result.to_dict(), out)}")
    return result


def _check_threat_model(a: AuditRequest) -> None:
    """``--threat-model`` before any data is loaded: trajectory only for record-level DP-SGD heads; white-box and
    crafted-final for dp-dense / dp-cnn (:func:`~dpaudit.cli.audit_white_box.check`)."""
    one_run = a.protocol.one_run or a.protocol.canaries is not None
    one_of("threat model", a.threat_model, THREAT_MODELS + WHITE_BOX_THREAT_MODELS)
    if a.threat_model == "final-model":
        return
    if a.threat_model in WHITE_BOX_THREAT_MODELS:
        return audit_white_box.check(a)
    # unknown: the build step names the allowed ones
    head = a.mechanism not in ALIASES or CATALOGUE[ALIASES[a.mechanism]].family == "dp-sgd-head"
    if not head or a.settings.privacy_unit != "record" or one_run:
        raise _trajectory_only(audit_white_box.refused_what(a, one_run, head), a.threat_model)


def _trajectory_only(what: str, threat_model: str) -> UsageError:
    return UsageError(
        f"threat model for {what} must be final-model (trajectory: DP-SGD head models, record "
        f"level), got {threat_model!r}."
    )
