"""``dpaudit audit opacus SCRIPT.py -- ARGS`` (docs/one_run.md): a user's Opacus script, unchanged, runs in this process as
``__main__`` while ``PrivacyEngine.make_private`` (which ``make_private_with_epsilon`` calls) is wrapped: the canaries record
theta_0 before Opacus wraps the module, then they and a PipelineCheck attach to what it returns. The privacy contract is
:class:`~dpaudit.integrations.opacus.OpacusCanaries`'s (one canary set per optimizer) and, under a plan, ``from_plan``'s.
"""

from __future__ import annotations

import runpy
import sys
import warnings
from pathlib import Path
from typing import Callable, Iterable

from ..audit_plans import PlanRun
from ..audits.one_run import OneRunResult
from ..errors import UsageError
from ..records import check_out_dir
from ..validation import open_unit, positive_int
from .opacus import OpacusCanaries, opacus_plan_run
from .pipeline import PipelineCheck


def check_script_audit(
    script,
    out,
    *,
    plan=None,
    canaries: int | None = None,
    tensors: Iterable[str] | None = None,
    delta: float | None = None,
) -> tuple[Path, PlanRun | None, int | None, float | None]:
    """The checks made before the script runs: (script path, checked plan or None, canaries (1000 by default) and delta (1e-5 by
    default), both None under a plan: it fixes them)."""
    path = Path(script)
    if path.suffix != ".py" or not path.is_file():
        raise UsageError(f"SCRIPT must be an existing .py file, got {str(script)!r}.")
    if out is not None:
        check_out_dir(out, name="out")
    if plan is None:
        canaries = positive_int("canaries", 1000 if canaries is None else canaries, 2)
        return path, None, canaries, open_unit("delta", 1e-5 if delta is None else delta)
    if delta is not None:
        raise UsageError(f"delta must not be given with --plan (the plan fixes it), got {delta!r}.")
    return path, opacus_plan_run(plan, canaries=canaries, tensors=tensors), None, None


def audit_script(
    script,
    args: Iterable[str] = (),
    *,
    out=None,
    plan=None,
    canaries: int | None = None,
    tensors: Iterable[str] | None = None,
    delta: float | None = None,
    seed: int = 0,
    on_warning: Callable[[str], None] | None = None,
) -> tuple[OneRunResult, Path]:
    """Run ``script`` with ``args`` under the hook and audit it (module docstring). ``out``: the record's folder (default: the
    plan's folder, else audits/opacus-SCRIPT); ``seed``: public seed of the canary coordinates (a plan fixes its own);
    ``on_warning``: receives each warning the run raised, as one line (:func:`warning_lines`; default: re-warned).
    Returns the result and the folder of its one_run.json."""
    path, run, canaries, delta = check_script_audit(
        script, out, plan=plan, canaries=canaries, tensors=tensors, delta=delta
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hooked = _run_hooked(path, [str(a) for a in args], run, canaries, tensors, seed)
    for line in warning_lines(caught):
        (on_warning or warnings.warn)(line)
    if out is None and run is None:
        out = Path("audits") / f"opacus-{path.stem}"
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
    result = hooked["canaries"].audit(out=out, delta=delta, pipeline=hooked["check"])
    return result, Path(run.path).parent if out is None else Path(out)


#: Warnings that say nothing about the audited run: torch's note that a full backward hook fires with respect to module
#: outputs when no input requires gradients is how Opacus's per-sample hooks always run on a first layer.
_EXPECTED = (
    "Full backward hook is firing when gradients are computed with respect to module outputs",
)
#: Warnings that say something a reviewer must see, in dpaudit's words (the match -> the line).
_REWORDED = {
    "Secure RNG turned off": "the script runs Opacus with secure_mode off: its DP noise comes from torch's "
    "non-cryptographic generator (Opacus's own warning; the audit's claim assumes ideal noise)"
}


def warning_lines(caught) -> list[str]:
    """One line per distinct warning of a script's run: the expected ones (:data:`_EXPECTED`) dropped, Opacus's secure-RNG
    warning reworded, every other one kept as ``Category: first line`` (never hidden: it may say something is wrong)."""
    out: list[str] = []
    for w in caught:
        message = str(w.message).strip()
        text = message.splitlines()[0] if message else type(w.message).__name__
        if any(text.startswith(e) for e in _EXPECTED):
            continue
        line = next(
            (v for k, v in _REWORDED.items() if text.startswith(k)),
            f"{w.category.__name__}: {text}",
        )
        if line not in out:
            out.append(line)
    return out


def _run_hooked(path: Path, args: list[str], run, canaries, tensors, seed) -> dict:
    """Execute the script with make_private wrapped; the canaries and check it attached."""
    # third-party and heavy: bound when a script is audited, never at `dpaudit --help`
    from opacus import PrivacyEngine

    original, hooked = PrivacyEngine.make_private, {}

    def make_private(engine, **kwargs):
        if hooked:
            raise UsageError(
                "SCRIPT must call PrivacyEngine.make_private once (one audited training), got a second call."
            )
        module = kwargs["module"]
        c = (
            OpacusCanaries.from_plan(module, run)
            if run
            else OpacusCanaries(module, canaries=canaries, seed=seed, tensors=tensors)
        )
        made = original(engine, **kwargs)
        optimizer, loader = made[1], made[-1]  # (module, optimizer, [criterion,] data loader)
        hooked["canaries"] = c.attach(optimizer, data_loader=loader)
        hooked["check"] = PipelineCheck().attach(
            optimizer, data_loader=loader, accountant=engine.accountant
        )
        return made

    argv, path0 = sys.argv, sys.path[0]
    # as `python SCRIPT ARGS` sees them
    sys.argv, sys.path[0] = ([str(path), *args], str(path.resolve().parent))
    PrivacyEngine.make_private = make_private
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise UsageError(f"SCRIPT must exit with status 0, got {e.code!r}.") from None
    finally:
        PrivacyEngine.make_private, sys.argv, sys.path[0] = original, argv, path0
    if not hooked:
        raise UsageError(
            f"SCRIPT must train through opacus.PrivacyEngine.make_private (or make_private_with_epsilon), got no call in {str(path)!r}."
        )
    return hooked
