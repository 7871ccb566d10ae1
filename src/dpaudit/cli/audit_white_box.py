"""`dpaudit audit dp-dense|dp-cnn --threat-model white-box|crafted-final --canaries M`: the white-box
step audit and the crafted-gradient final-model audit (:mod:`dpaudit.mechanisms.dpsgd.white_box_target`,
docs/white_box.md); `dpaudit audit HEAD --threat-model white-box` for the DP-SGD heads (dp-rvfl and
its frozen-feature controls, record level). Parsing and rendering only."""

from __future__ import annotations

import dataclasses
import shlex
import uuid
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from ..auditing import target_claim, target_for, target_from_release
from ..audits.power import power_line
from ..errors import UsageError
from ..mechanisms.dpsgd.head_audit import HEAD_MODELS
from ..mechanisms.dpsgd.white_box_target import (
    WHITE_BOX_FILE,
    WHITE_BOX_LOCAL_FILE,
    white_box_audit,
    write_white_box,
)
from ..noise import NoiseSource
from ..one_run_auditing import module_target, record_run_cost
from ..progress import JobProgress
from ..records import read_release
from ..requests import AuditRequest
from ..validation import positive_int
from .common import NOT_RECORDED, console, emit_json, print_message, print_table, recorded_argv

#: Models with both audits; the DP-SGD heads have the white-box one.
MODELS = ("dp-dense", "dp-cnn")


def check(a: AuditRequest) -> None:
    """What is checked before any data is loaded."""
    models = MODELS + (HEAD_MODELS if a.threat_model == "white-box" else ())
    if a.mechanism not in models or a.settings.privacy_unit != "record" or a.protocol.one_run:
        what = refused_what(a, a.protocol.one_run, a.mechanism in models)
        heads = " and the DP-SGD heads" if a.threat_model == "white-box" else ""
        raise UsageError(
            f"threat model for {what} must be final-model or trajectory ({a.threat_model}: "
            f"{', '.join(MODELS)}{heads}, record level, without --one-run), got {a.threat_model!r}."
        )
    positive_int("canaries", a.protocol.canaries, 2)


def refused_what(a: AuditRequest, one_run: bool, model_allowed: bool) -> str:
    """What a refused threat model is refused for: --one-run, else the privacy unit of an allowed
    model, else the mechanism."""
    if one_run:
        return "--one-run"
    return f"--privacy-unit {a.settings.privacy_unit}" if model_allowed else a.mechanism


def _head_setup(a: AuditRequest, rel):
    """(target, dataset name, claim dict, public seed) of a DP-SGD head: the release's, else the ordinary audit's."""
    target = (
        target_for(dataclasses.replace(a, canary=None, no_noise=False))
        if rel is None
        else target_from_release(rel, data_dir=a.data.data_dir, mechanism=a.mechanism)
    )
    target.prepare()
    claim = target_claim(target)
    claim.update(delta=float(claim["delta"]), claimed_epsilon=float(claim["claimed_epsilon"]))
    return target, target._dataset_name, claim, a.seed if rel is None else int(rel.seed)


def _setup(a: AuditRequest, rel):
    """(model, data, config, claim, dataset name, seed) of a head model or a module model."""
    if a.mechanism in HEAD_MODELS:
        model, dataset, claim, seed = _head_setup(a, rel)
        return model, None, None, claim, dataset, seed
    target = module_target(a, rel)
    model, data, cfg, claim = target.model, target.prepared, target.config, target_claim(target)
    return model, data, cfg, claim, data.name, a.seed if rel is None else int(rel.seed)


def _record_costs(a: AuditRequest, rel, dataset: str, claim: dict) -> None:
    """Each training run (the main one and its controls) is an audit entry of the ledger, before it runs."""
    release_id = None if rel is None else rel.id
    for role in ("main", "no-noise", "null") if a.trials.controls else ("main",):
        event = None if role == "no-noise" else claim["event"]
        entry = (a.mechanism, dataset, "add-remove-record", event, a.output.ledger, release_id)
        record_run_cost(*entry, uuid.uuid4().hex)


def run(a: AuditRequest, plan=None):
    """The audit of ``a`` (``plan`` must be None: a planned audit is final-model only)."""
    check(a)
    if plan is not None:
        raise UsageError(
            f"threat model of a planned audit must be final-model (one audit per plan), got {a.threat_model!r}."
        )
    rel = None if a.release is None else read_release(a.release)
    if rel is not None and rel.mechanism != a.mechanism:
        raise UsageError(
            f"mechanism argument must match the release's mechanism {rel.mechanism!r}, got {a.mechanism!r}."
        )
    model, data, cfg, claim, dataset, seed = _setup(a, rel)
    out = Path(a.out) if a.out is not None else Path("audits") / f"{a.mechanism}-{a.threat_model}"
    _record_costs(a, rel, dataset, claim)
    noise = (
        NoiseSource("reproducible", seed=a.seed) if a.trials.reproducible_noise else NoiseSource()
    )
    always = ("canaries", "threat_model", "confidence", "seed")
    command = shlex.join(recorded_argv(values={"out": out}, always=always, omit=NOT_RECORDED))
    with JobProgress("steps") as bar:
        result = white_box_audit(
            model,
            data,
            cfg,
            claim,
            canaries=a.protocol.canaries,
            noise=noise,
            seed=seed,
            threat_model=a.threat_model,
            confidence=a.confidence,
            controls=a.trials.controls,
            command=command,
            progress=lambda role: bar.steps(
                f"{a.threat_model} training ({role}, {a.protocol.canaries} canaries)"
            ),
        )
    write_white_box(result, out)
    if a.output.json_out:
        emit_json({**result.to_dict(), "audit_dir": str(out)})
    else:
        _render(result, out)
    return result


def _render(result, out: Path) -> None:
    heads = ("run", "eps_LB", "claim", "sigma_hi", "d_lo", "q_lo", "steps", "observations")
    title = f"{result.main.threat_model} audit, {result.main.confidence:.0%} confidence"
    table = Table(*heads, title=title)
    for role, b in result.bounds.items():
        cells = (f"{b.epsilon_lb:.3f}", f"{b.claimed_epsilon:.3f}", f"{b.noise_upper:.4f}")
        cells += (f"{b.sensitivity_lower:.4f}", f"{b.sample_rate_lower:.5f}")
        table.add_row(role, *cells, str(b.steps), str(b.observations))
    print_table(table)
    for role, ok in result.controls_ok().items():
        state = "as expected" if ok else "[bold red]FAILED[/] (the audit cannot be trusted)"
        console.print(f"{role} control: {state}")
    m = result.main
    verdict = "[bold red]VIOLATION:[/]" if m.violation else "no evidence of a violation:"
    console.print(
        f"{verdict} eps_LB {m.epsilon_lb:.3f} {'>' if m.violation else '<='} claimed {m.claimed_epsilon:.3f}"
    )
    console.print(escape(power_line(result.power)))
    print_message(
        f"wrote {out / WHITE_BOX_FILE} (shareable) and {out / WHITE_BOX_LOCAL_FILE} "
        "(not for publication)"
    )
