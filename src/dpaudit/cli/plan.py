"""`dpaudit audit plan MECHANISM ...` (write a pre-registered audit plan) and `dpaudit audit --plan
plan.json` (run exactly that plan): :mod:`dpaudit.audit_plans`. Parsing and rendering only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer

from .. import audit_plans
from ..accounting.events import SubsampledGaussian
from ..errors import UsageError
from ..requests import AuditRequest
from ..validation import half_open_unit
from . import generic, options
from .common import emit_json, keyword, print_message

#: What --plan leaves to the command line: how the result is printed and the ledger that registered the
#: plan (its entries go there), never what is computed.
_FREE = ("json_out", "ledger")
#: `audit plan opacus`: the audit command's options it takes (any other is refused).
_OPACUS_TAKES = tuple("delta canaries confidence epochs out ledger one_run json_out".split())

_PLAN_HELP = (
    "Run exactly this pre-registered plan (plan.json of `dpaudit audit plan MECHANISM ...`); "
    "no other option but --ledger and --json may be given."
)
_KEY_HELP = (
    "audit plan: your Ed25519 signing key (name or path; default $DPAUDIT_SIGNING_KEY or "
    "'default'), registered in the ledger."
)
#: `audit plan opacus`: its own options (name, type, help).
_OPACUS_OPTIONS = (
    ("noise_multiplier", float, "Opacus's noise multiplier."),
    ("sample_rate", float, "Opacus's sample rate (1 / batches per epoch)."),
    ("steps", int, "optimizer steps (or --epochs E: E / sample rate)."),
    (
        "tensors",
        str,
        "comma-separated parameter names holding the canaries (default: all trainable).",
    ),
)
_OPACUS = tuple(name for name, _, _ in _OPACUS_OPTIONS)


#: The audit command's extra parameters: the planned MECHANISM after ``plan``, ``--plan`` and ``--key``.
PARAMETERS = [
    keyword("planned", Optional[str], typer.Argument(None, hidden=True, metavar="MECHANISM")),
    keyword("plan", Optional[Path], options.optional("--plan", _PLAN_HELP)),
    keyword("key", Optional[str], options.optional("--key", _KEY_HELP)),
    *[
        keyword(
            n, Optional[t], options.optional("--" + n.replace("_", "-"), f"audit plan opacus: {h}")
        )
        for n, t, h in _OPACUS_OPTIONS
    ],
]


def dispatch(values: dict, check) -> tuple | None:
    """(AuditRequest, PlanRun or None) to run, or None when ``audit plan`` wrote a plan.
    ``check(request)``: the audit command's checks, run before a plan is written."""
    mechanism, planned, plan, key = (values.pop(k) for k in ("mechanism", "planned", "plan", "key"))
    opacus = {k: values.pop(k) for k in _OPACUS}
    # "opacus": dpaudit.audit_plans.OPACUS (importing it would load the audit library)
    if mechanism == "plan" and planned == "opacus":
        return _written(_opacus_plan(values, opacus, key), values["json_out"])
    _refuse_opacus_options(opacus)
    if plan is not None:
        _refuse_others(values, mechanism, planned, key)
        a, run = audit_plans.load_plan(plan, values["ledger"])
        return dataclasses.replace(a, json_out=values["json_out"]), run
    if mechanism == "plan" and planned is not None:
        a = generic.request_from_options(AuditRequest, values, mechanism=planned)
        check(a)
        return _written(audit_plans.make_plan(a, key=key), a.output.json_out)
    return generic.request_from_options(
        AuditRequest, values, mechanism=_alone(mechanism, planned, key)
    ), None


def _refuse_opacus_options(opacus: dict) -> None:
    """The options of `audit plan opacus` are refused with any other command (UsageError)."""
    extra = next((k for k, v in opacus.items() if v is not None), None)
    if extra is not None:
        raise UsageError(
            f"--{extra.replace('_', '-')} must only be given with `audit plan opacus`, got {opacus[extra]!r}."
        )


def _opacus_plan(values: dict, o: dict, key) -> Path:
    """`audit plan opacus ...`: :func:`dpaudit.audit_plans.opacus_plan` of the options."""
    req = generic.request_from_options(AuditRequest, values, mechanism="-")
    for flag, value in generic.given_options(req, _OPACUS_TAKES)[:1]:
        raise UsageError(f"{flag} must not be given with `audit plan opacus`, got {value!r}.")
    for k in ("noise_multiplier", "sample_rate"):
        if o[k] is None:
            raise UsageError(
                f"--{k.replace('_', '-')} must be given with `audit plan opacus`, got none."
            )
    if (o["steps"] is None) == (req.settings.epochs is None):
        raise UsageError(
            f"--steps or --epochs must be given with `audit plan opacus` (one of them), got {'both' if o['steps'] else 'neither'}."
        )
    q = half_open_unit("--sample-rate", o["sample_rate"])
    # Opacus's steps for E epochs: E / sample rate
    steps = o["steps"] if o["steps"] is not None else round(req.settings.epochs / q)
    return audit_plans.opacus_plan(
        SubsampledGaussian(o["noise_multiplier"], q, steps),
        delta=req.delta,
        canaries=req.protocol.canaries,
        tensors=o["tensors"] and o["tensors"].split(","),
        confidence=req.confidence,
        out=req.out,
        ledger=req.output.ledger,
        key=key,
    )


def _alone(mechanism, planned, key) -> str:
    """An ordinary audit's MECHANISM: no second argument, no --key."""
    if mechanism in (None, "plan") or planned is not None or key is not None:
        got = " ".join(str(x) for x in (mechanism, planned, key and f"--key {key}") if x) or "none"
        raise UsageError(
            f"MECHANISM must be given alone (or `audit plan MECHANISM ...`, or --plan plan.json), got {got}."
        )
    return mechanism


def _refuse_others(values: dict, mechanism, planned, key) -> None:
    """``--plan``: every option is the plan's; anything else on the command line is refused."""
    req = generic.request_from_options(AuditRequest, values, mechanism="-")
    given = [
        (n, v)
        for n, v in (("MECHANISM", mechanism), ("MECHANISM", planned), ("--key", key))
        if v is not None
    ] + generic.given_options(req, _FREE)
    if given:
        raise UsageError(
            f"{given[0][0]} must not be given with --plan (the plan fixes every option), got {given[0][1]!r}."
        )


def _written(path: Path, json_out: bool) -> None:
    plan = json.loads(path.read_text())
    if json_out:
        fields = {"id": plan["id"], "commitment": plan["commitment"]}
        return emit_json({"plan": str(path), **fields, "statistic": plan["audit"]["statistic"]})
    a = plan["audit"]
    what = (
        f"{a['trials']} trials" if a["kind"] == "trials" else f"one run, {a['canaries']} canaries"
    )
    run = f"dpaudit audit --plan {path}"
    if plan["mechanism"] == "opacus":
        run = f"dpaudit audit opacus SCRIPT.py --plan {path} -- ARGS (or OpacusCanaries.from_plan(model, {str(path)!r}) in the script)"
    print_message(
        f"plan {plan['id']}: {plan['mechanism']}, {what}, "
        f"statistic {a['statistic']}; seeds committed, signed by {plan['signer']['key_id'][:12]}, registered in the ledger.\n"
        f"wrote {path} (shareable) and {path.parent / 'plan.local.json'} "
        f"(private until the run); run it: {run}"
    )
