"""Generic ``dpaudit train NAME`` and ``dpaudit audit NAME`` commands for catalogue entries: every
field of an entry's :class:`~dpaudit.requests.Request` becomes an option (:func:`request_parameters`),
parsed into the Request and handed to the library (:func:`dpaudit.releasing.release`,
:func:`dpaudit.audits.engine.run_audit`). ``audit NAME`` of a built-in family is the one command of
:mod:`dpaudit.cli.audit`; an entry that declares its own request type gets its generic ``audit NAME`` here.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import shlex
from pathlib import Path
from typing import Any, Optional

import typer
from rich.text import Text
from typer._click.core import ParameterSource
from typer._click.globals import get_current_context

from .. import auditing, releasing
from ..audits import engine
from ..catalogue import CATALOGUE, lookup, names
from ..errors import UsageError
from ..ledger import result_cache
from ..ledger.book import open_ledger
from ..ledger.paths import resolve_ledger
from ..mechanisms import registry
from ..records import read_release
from ..requests import REQUEST_TYPES, AuditRequest, flag_of
from ..threads import set_threads
from . import options
from .audit_render import show
from .common import (
    ROUTES,
    choice_enum,
    default_workers,
    emit_json,
    exit_on_violation,
    keyword,
    new_app,
    new_out,
    note,
    out_or_fresh,
    plain,
    print_message,
    recorded_argv,
    say,
)


def generic_audit_names() -> tuple[str, ...]:
    """Catalogue names that get the generic ``audit NAME`` command: auditable entries whose
    request type is their mechanism's own (not a built-in family's, which AuditRequest covers)."""
    return tuple(n for n, e in CATALOGUE.items() if e.canaries and e.family not in REQUEST_TYPES)


# ---------------------------------------------------------------- Request fields -> typer options


def request_parameters(rtype, *, skip: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per option of the Request type ``rtype`` (positional fields and
    ``skip`` left out), each with its typer Option: the signature a generic command exposes."""
    types = rtype.field_types()
    return [
        keyword(f.name, tp, opt)
        for f in rtype.option_fields()
        if not (f.metadata.get("positional") or f.name in skip)
        for tp, opt in (typer_option(rtype.__name__, f, types[f.name]),)
    ]


def typer_option(owner: str, f: dataclasses.Field, tp: type) -> tuple[Any, Any]:
    """The annotation and typer Option of one request option (choices an Enum, a switch
    ``--x`` or ``--x/--no-x``, a path option a Path)."""
    default = None if f.default is dataclasses.MISSING else f.default
    help_text, hidden = f.metadata.get("help") or "", bool(f.metadata.get("hidden"))
    flag, shown = flag_of(f), {"help": help_text, "hidden": hidden}
    if f.metadata.get("choices"):
        tp = choice_enum(f"{owner}_{f.name}", f.metadata["choices"])
        default = default if default is None else tp(default)
    elif tp is bool:
        return bool, typer.Option(
            bool(default), f"{flag}/--no-{flag[2:]}" if default else flag, **shown
        )
    elif f.metadata.get("path"):
        tp = Path
    annotation = Optional[tp] if default is None else tp
    return annotation, typer.Option(default, flag, show_default=default is not None, **shown)


def request_from_options(rtype, values: dict, **fixed):
    """The Request of ``rtype`` from parsed option ``values`` (enums to their strings, paths to
    strings) and ``fixed`` field values (a positional model name)."""
    names = {f.name for f in rtype.option_fields()}
    return rtype(**{k: plain(v) for k, v in values.items() if k in names}, **fixed)


def given_options(request, keep=()) -> list[tuple[str, object]]:
    """(flag, value) of each option of ``request`` not at its default (given on the command line),
    other than ``keep`` and an audit's MECHANISM argument."""
    values = request.to_dict()
    return [
        (flag_of(f), values[f.name])
        for f in type(request).option_fields()
        if f.name not in ("mechanism", *keep) and values[f.name] != f.default
    ]


def make_command(func, params: list[inspect.Parameter], name: str, doc: str):
    """``func(**kwargs)`` with the explicit signature typer reads."""
    func.__signature__ = inspect.Signature(params)
    func.__annotations__ = {p.name: p.annotation for p in params}
    func.__name__ = name.replace("-", "_")
    func.__doc__ = doc
    return func


# ---------------------------------------------------------------- train NAME

_RUN_OPTIONS = ("out", "ledger", "json_out")


def _run_parameters(name: str, rtype) -> list[inspect.Parameter]:
    threads = options.optional(
        "--threads",
        "Threads of torch and NumPy's BLAS (a speed setting; default: their own choice; "
        "a linear head trains on one).",
    )
    out = options.optional(
        "--out",
        f"Output directory for release.json and artefacts (default: runs/MODEL-DATASET-seedS-epsE, MODEL = {name}).",
    )
    return [
        keyword("out", Optional[Path], out),
        keyword("ledger", Optional[Path], options.ledger()),
        keyword("noise_seed_file", Optional[Path], options.noise_seed_file()),
        *([keyword("threads", Optional[int], threads)] if rtype.TORCH_RUN else []),
        keyword("json_out", bool, options.json_out()),
    ]


def _default_notes(rtype) -> list[str]:
    """The notes (option metadata ``note``) of the request's options this command left at their default."""
    ctx = get_current_context()
    return [
        f.metadata["note"]
        for f in rtype.option_fields()
        if f.metadata.get("note") and ctx.get_parameter_source(f.name) is ParameterSource.DEFAULT
    ]


def _print_release(rel, shown) -> None:
    """The trained release's lines: the mechanism's own (``shown``), else its claim and metrics."""
    if shown is not None:
        for line in shown[1]:
            print_message(Text.from_markup(line))
        return
    claim = "no privacy claim (non-private)"
    if not rel.non_private:
        claim = f"epsilon={rel.epsilon:.4f} (target {rel.target_epsilon:g}), delta={rel.delta:g}, "
        claim += f"{rel.accountant}, {rel.adjacency}"
    dataset = (rel.dataset or {}).get("name")
    print_message(Text.assemble((rel.mechanism, "bold"), f" on {dataset}: {claim}"))
    if rel.metrics:
        say(
            *(
                f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in rel.metrics.items()
            )
        )
    say(f"release id {rel.id};", f"command: {rel.command}")


def written_line(release, ledger) -> str:
    """Where ``dpaudit train`` put its outputs, in one line: the release folder (as the ledger
    recorded it) and its files, and the ledger entry (its id is the release's)."""
    with open_ledger(ledger, create=False) as led:
        folder = led.get(release.id).payload.get("artefact_path")
    weights = release.artefacts.get("weights")
    files = ", ".join(["release.json", *([str(weights)] if weights else [])])
    return (
        f"release {release.id} written to {_shown(folder)} ({files}); "
        f"ledger {resolve_ledger(ledger).display} entry {release.id}"
    )


def _shown(folder) -> str:
    """A folder under the working directory as a relative path (what the user typed), else as recorded."""
    try:
        return str(Path(folder).relative_to(Path.cwd()))
    except (TypeError, ValueError):
        return str(folder)


def make_train_command(entry):
    """The ``dpaudit train NAME`` command of catalogue ``entry`` (parse -> Request -> release)."""
    rtype = entry.request_type()
    fields = rtype.option_fields()
    params = request_parameters(rtype) + [
        p for p in _run_parameters(entry.name, rtype) if p.name not in {f.name for f in fields}
    ]
    # the model a per-model command releases
    named = {f.name: entry.name for f in fields if f.metadata.get("positional")}

    def command(**kwargs):
        out, ledger, json_out, seed_file, threads = (
            kwargs.pop(k, None) for k in (*_RUN_OPTIONS, "noise_seed_file", "threads")
        )
        request = request_from_options(rtype, kwargs, **named)
        request.check()  # before the mechanism's module (and torch) loads
        if threads is not None:
            set_threads(threads)
        mech = registry.mechanism(entry.name)
        request = mech.validate(request)  # a refusal comes before any note about defaults
        for line in _default_notes(rtype) + mech.notes(request):
            note(line)  # on stderr: --json output stays clean
        # prv answers of the same public computations come from the on-disk cache (ledger/result_cache.py)
        with releasing.secret_noise_seed(seed_file), result_cache.enabled():
            rel = releasing.release(
                entry.name, request, out_dir=out, ledger_path=ledger, progress=True
            )
        shown = mech.summary(rel, ledger)
        if json_out:
            return emit_json(rel.to_dict() if shown is None else shown[0])
        _print_release(rel, shown)
        print_message(written_line(rel, ledger))

    doc = f"{entry.description[:1].upper()}{entry.description[1:]}. Writes release.json and records the release in the ledger."
    return make_command(command, params, f"train_{entry.name}", doc)


def register_train(train_app: typer.Typer) -> None:
    """Register ``train NAME`` for every trainable catalogue entry."""
    for name in names(trainable=True):
        entry = CATALOGUE[name]
        command = make_train_command(entry)
        # an alias (e.g. mixmin) is the name shown in help
        for i, shown in enumerate((*entry.aliases, name)):
            train_app.command(shown, help=command.__doc__, hidden=i > 0)(command)


# ---------------------------------------------------------------- audit NAME


#: The AuditRequest options a generic ``audit NAME`` command adds to its request's own.
_AUDIT_OPTIONS = tuple(
    "runs confidence release out no_noise controls control_runs workers chunk_size seed "
    "reproducible_noise data_dir ledger json_out fail_on_violation".split()
)


def _audit_parameters(entry, taken: set[str]) -> list[inspect.Parameter]:
    """The canary (a choice of the entry's) and the :data:`_AUDIT_OPTIONS` of AuditRequest the request lacks."""
    canary_enum = choice_enum(f"{entry.name.replace('-', '_')}_canary", entry.canaries)
    help_text = f"{', '.join(entry.canaries)} (default: {entry.canaries[0]})."
    canary = keyword("canary", Optional[canary_enum], options.optional("--canary", help_text))
    params = {p.name: p for p in request_parameters(AuditRequest)}
    return [canary] + [params[n] for n in _AUDIT_OPTIONS if n not in taken]


def make_audit_command(entry):
    """The ``dpaudit audit NAME`` command of catalogue ``entry``: the request's options build the
    plan (or ``--release`` gives it), the mechanism's ``audit_target(plan, canary)`` is audited."""
    rtype = entry.request_type()
    field_names = {f.name for f in rtype.option_fields()}
    params = request_parameters(rtype) + _audit_parameters(entry, field_names)

    def command(**kwargs):
        audit = {k: kwargs.pop(k) for k in list(kwargs) if k not in field_names}
        if audit["out"] is not None:  # before any training: an --out holding results is refused
            new_out(audit["out"])
        canary = audit["canary"].value if audit.get("canary") is not None else None
        request = request_from_options(rtype, kwargs)
        target, release_id, release_path = _audit_target(entry.name, request, audit, canary)
        out = _audit_folder(audit, target)
        values = {**audit, **request.to_dict()}  # the request's seed and noise, else the audit's
        result = engine.run_audit(
            target,
            runs=audit["runs"],
            confidence=audit["confidence"],
            seed=int(values.get("seed", 42)),
            controls=engine.CONTROLS if audit["controls"] else (),
            control_runs=audit["control_runs"],
            chunk_size=audit["chunk_size"],
            out_dir=out,
            reproducible_noise=bool(values.get("reproducible_noise", False)),
            progress=not audit["json_out"],
            command=_audit_command(entry.name, target, out),
            release_id=release_id,
            release_path=release_path,
            workers=audit["workers"] or default_workers(),
            ledger_path=audit.get("ledger"),
        )
        show([result], [out], json_out=audit["json_out"])
        exit_on_violation(audit["fail_on_violation"], [result])

    doc = f"Empirical privacy audit of {entry.name} (canaries {', '.join(entry.canaries)}): eps_LB with Clopper–Pearson bounds, controls."
    return make_command(command, params, f"audit_{entry.name}", doc)


def _audit_target(name: str, request, audit: dict, canary):
    """(target, release id, release path): the plan recorded in ``--release``, else the request's."""
    if audit["release"] is None:
        target = auditing.generic_target(name, request, canary=canary, no_noise=audit["no_noise"])
        return target, None, None
    # the release records its own request: a second one would be silently ignored
    for flag, value in given_options(request, ("seed", "data_dir", "reproducible_noise"))[:1]:
        raise UsageError(
            f"{flag} must not be given with --release (the release records its own request), "
            f"got {value!r}."
        )
    values = request.to_dict()
    rel = read_release(audit["release"])
    target = auditing.target_from_release(
        rel,
        canary=canary,
        data_dir=values.get("data_dir", audit.get("data_dir")),
        no_noise=audit["no_noise"],
        mechanism=name,
    )
    return target, rel.id, str(Path(audit["release"]).resolve())


def _audit_command(name: str, target, out: Path) -> str:
    """The recorded command of a generic audit, routed as one command path: ``dpaudit audit NAME``."""
    argv = recorded_argv(
        values={"canary": target.canary, "out": out},
        always=("canary", "runs", "confidence"),
        omit=("json_out", "workers", "ledger", "fail_on_violation"),
    )
    first_option = next(i for i, a in enumerate(argv) if a.startswith("--"))
    return shlex.join(["dpaudit", "audit", name, *argv[first_option:]])


def data_label(dataset) -> str:
    """The dataset's name as a folder-name part (a default audit folder names what was audited)."""
    name = dataset.get("name") if isinstance(dataset, dict) else dataset
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(name or "embedded")).strip("_") or "embedded"


def _audit_folder(audit: dict, t) -> Path:
    """``--out`` (checked before any work), else the default folder named after the mechanism, the data and
    the canary, or a fresh ``-2``, ``-3``, ... beside an earlier audit's (said in one line): results are never
    overwritten."""
    suffix = "-no-noise" if audit["no_noise"] else ""
    name = f"{t.mechanism}-{data_label(t.describe().get('dataset'))}-{t.canary}{suffix}"
    return out_or_fresh(audit["out"], Path("audits") / name, audit["json_out"])


def audit_click_command(name: str):
    """The click command of ``dpaudit audit NAME`` (built on first use)."""
    sub = new_app(f"audit {name}")
    sub.command(name)(make_audit_command(lookup(name)))
    return typer.main.get_command(sub)


def register_audit(app: typer.Typer) -> None:
    """Route ``dpaudit audit NAME ...`` to the generic command of every auditable catalogue entry
    without a bespoke audit target (the bespoke ``audit MECHANISM`` command keeps the others)."""
    for name in generic_audit_names():
        ROUTES[("audit", name)] = lambda name=name: audit_click_command(name)
