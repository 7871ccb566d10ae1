"""Requests: what a user asked a mechanism to release, as one frozen dataclass per mechanism.

Public by construction (docs/architecture.md, "request"): a release stores its request whole and
the audit of a release rebuilds its target from it, never from the recorded ``command``, which is
derived from it (:meth:`Request.to_argv`). Every field carries its command-line spelling in its
metadata (:func:`option`), so :meth:`Request.to_argv`, :meth:`Request.to_dict`,
:meth:`Request.from_dict` and the generic ``dpaudit train NAME`` command (:mod:`dpaudit.cli.generic`)
are written once for every request type.

This module is torch-free (stdlib and :mod:`dpaudit.errors` only): the CLI and the catalogue
import it without loading any numerical library.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import sys
import typing
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .errors import DataError, UsageError
from .grouped import Grouped, group
from .validation import one_of, open_unit, positive_finite, positive_int

_MISSING = dataclasses.MISSING


def option(
    default: Any = _MISSING,
    *,
    flag: str | None = None,
    help: str = "",
    choices: tuple[str, ...] | None = None,
    positional: bool = False,
    hidden: bool = False,
    path: bool = False,
    note: str | None = None,
):
    """A request field with its command-line spelling.

    ``flag`` (default ``--field-name``) is the option's name; ``choices`` the allowed strings
    (the generic CLI refuses others); ``positional`` marks the argument right after
    ``dpaudit train`` (the model name of a family that registers one command per model);
    ``hidden`` keeps a test-only switch out of ``--help``; ``path`` parses a string field as a path;
    ``note``: what the generic CLI says on stderr when the option is left at its default.
    """
    meta = {
        "flag": flag,
        "help": help,
        "choices": tuple(choices) if choices else None,
        "positional": positional,
        "hidden": hidden,
        "path": path,
        "note": note,
    }
    return field(default=default, metadata=meta)  # MISSING: a required field


#: A request field holding a small frozen record of related options (every field an
#: :func:`option` with a default). Outside, the request stays flat: each member is given,
#: serialised, parsed and spelt on the command line by its own name, as if declared in place of
#: the group (:meth:`Request.option_fields`).
options_group = group


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of a request field (``--field-name`` unless its metadata says otherwise)."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _base_type(tp) -> type:
    """``int`` for ``int``, ``Optional[int]`` and ``int | None`` (the scalar type of a field)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args else tp


@dataclass(frozen=True)
class Request(Grouped):
    """Base of every request type (a frozen dataclass of public, JSON-able scalars).

    Subclasses set ``COMMAND`` (the name after ``dpaudit train``; None when a positional field
    names it, as :class:`DPSGDRequest`'s ``model``) and declare their fields with :func:`option`,
    related ones gathered in a group (:func:`options_group`).
    Field values are ``str``, ``int``, ``float``, ``bool`` or None; paths are kept as strings.
    """

    COMMAND: ClassVar[str | None] = None
    #: A torch training run: its ``train`` command takes ``--threads`` and shows a progress bar.
    TORCH_RUN: ClassVar[bool] = False

    def check(self) -> None:
        """The checks of the request's own values that need no mechanism module: the CLI runs them
        before any numerical library loads (a refused value costs no torch import); the mechanism's
        ``validate`` runs them too."""

    # ---------------------------------------------------------------- field reflection
    @classmethod
    def option_fields(cls) -> list[dataclasses.Field]:
        """Every option, in declaration order, a group's members in the group's place: the flat
        fields the command line, :meth:`to_dict` and :meth:`from_dict` know."""
        groups = cls.groups()
        return [
            m for f in fields(cls) for m in (fields(groups[f.name]) if f.name in groups else (f,))
        ]

    @classmethod
    def field_types(cls) -> dict[str, type]:
        """Each option's scalar type (``Optional[X]`` -> ``X``), resolved from the annotations."""
        hints = {}
        for owner in (cls, *cls.groups().values()):
            module = sys.modules.get(owner.__module__)
            hints.update(typing.get_type_hints(owner, globalns=vars(module) if module else None))
        return {f.name: _base_type(hints[f.name]) for f in cls.option_fields()}

    def command_name(self) -> str:
        """The name after ``dpaudit train``: ``COMMAND`` or the positional field's value."""
        pos = [f for f in fields(self) if f.metadata.get("positional")]
        if pos:
            return str(getattr(self, pos[0].name))
        if self.COMMAND is None:
            raise TypeError(
                f"{type(self).__name__} must set COMMAND or declare a positional field."
            )
        return self.COMMAND

    # ---------------------------------------------------------------- serialisation
    def to_dict(self) -> dict:
        """Every option by name, flat (paths as strings): the form ``release.json`` stores."""
        return {
            k: (os.fspath(v) if isinstance(v, os.PathLike) else v) for k, v in self.flat().items()
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Request":
        """The request recorded in ``data`` (a :meth:`to_dict` result, e.g. ``Release.request``).

        A key this version does not know is refused (:class:`~dpaudit.errors.DataError`): a
        newer option could change what was released, and guessing would audit something else.
        Absent keys take their defaults (requests recorded before a field existed).
        """
        if not isinstance(data, dict):
            raise DataError(f"request must be a JSON object, got {type(data).__name__}.")
        known = cls.flat_names()
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataError(
                f"request keys must be among {', '.join(sorted(known))} for {cls.__name__}, got {', '.join(unknown)}."
            )
        types = cls.field_types()
        kwargs = {name: _coerce(name, value, types[name]) for name, value in data.items()}
        required = [f.name for f in fields(cls) if f.default is f.default_factory is _MISSING]
        missing = [name for name in required if name not in kwargs]
        if missing:
            raise DataError(f"request is missing required keys: {', '.join(missing)}.")
        return cls(**kwargs)

    def to_argv(self, *, out: str | os.PathLike | None = None) -> list[str]:
        """The ``dpaudit train NAME ...`` argument list that makes this request.

        Written once for every request type from the fields' metadata: fields equal to their
        default are omitted, except the privacy target and the model size (:data:`ALWAYS_RECORDED`:
        the command re-creates the release under later defaults too); an absolute ``data_dir`` is
        this machine's, never recorded; booleans are bare flags (``--no-x`` for a False whose default
        is True), floats are written with ``repr`` (exact round trip). ``out`` appends the output
        directory (``--out``), which is where a release goes, not what it is.
        """
        values = self.to_dict()
        argv = ["dpaudit", "train", self.command_name()]
        for f in self.option_fields():
            if _recorded(f, values[f.name]):
                argv += _spelt(f, values[f.name])
        return argv + ([] if out is None else ["--out", os.fspath(out)])

    def command(self, *, out: str | os.PathLike | None = None) -> str:
        """:meth:`to_argv` as one shell-quoted string (``Release.command``)."""
        return shlex.join(self.to_argv(out=out))


def _recorded(f: dataclasses.Field, value) -> bool:
    """Whether a recorded command spells the option ``f`` set to ``value``: not the positional
    name, not a default (but :data:`ALWAYS_RECORDED`), not this machine's absolute data folder."""
    if f.metadata.get("positional"):
        return False
    if f.name == "data_dir" and value is not None and os.path.isabs(value):
        return False
    at_default = f.default is not _MISSING and _same(value, f.default)
    return not at_default or (f.name in ALWAYS_RECORDED and value is not None)


def _spelt(f: dataclasses.Field, value) -> list[str]:
    """The option ``f`` set to ``value`` on the command line (``--no-x`` for a False flag)."""
    flag = flag_of(f)
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    if value is None:  # a None whose default is not None cannot be spelled on the command line
        raise ValueError(f"{f.name} must not be None in a request whose default is {f.default!r}.")
    return [flag, repr(value) if isinstance(value, float) else str(value)]


#: Request fields a recorded command always writes, defaults included: what the claim is about.
ALWAYS_RECORDED = ("epsilon", "delta", "width")


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


#: Scalar field type -> (JSON types it may be recorded as, what the error says).
_JSON_TYPES = {
    bool: ((bool,), "true or false"),
    float: ((int, float), "a number"),
    int: ((int,), "an integer"),
    str: ((str,), "a string"),
}


def _coerce(name: str, value, tp):
    """A recorded JSON value as the field's type (JSON writes 2.0 as 2; paths are strings)."""
    if value is None or tp not in _JSON_TYPES:
        return value
    types, rule = _JSON_TYPES[tp]
    if not isinstance(value, types) or (isinstance(value, bool) and tp is not bool):
        raise DataError(f"request {name} must be {rule}, got {value!r}.")
    return tp(value)


# ---------------------------------------------------------------------------- existing mechanisms

NOISE_SOURCES = ("os-entropy", "cryptographic")
_NOISE_HELP = "os-entropy (default), cryptographic; --reproducible-noise overrides."
_REPRO_HELP = "Derive DP noise from the published --seed: NOT private (the ledger counts it as unbounded). Off: fresh OS entropy."
_SEED_HELP = "Public seed: data split, random features, initialisation."
_DATA_DIR_HELP = "Directory with real data (default: $DPAUDIT_DATA_DIR)."
_SPLIT_SEED_HELP = "Public split seed (default: the dataset's documented default)."
_SEEDED_NOISE_HELP = "Derive DP noise from --seed (marked in the release). Off: fresh OS entropy."
#: Where a module model trains (dpaudit.mechanisms.dpsgd.module_training.resolve_device); noise: drawn on the CPU.
DEVICES = ("cpu", "cuda", "auto")
_DEVICE_HELP = (
    "Where dp-dense, dp-cnn, dp-attention train: cpu (default), cuda, or auto (cuda "
    "when torch finds one, else cpu). Speed only: the noise is drawn on the CPU by "
    "dpaudit's sampler."
)
PROFILE_HELP = (
    "Preprocessing profile. Images: raw01 (default), centered, half-resolution; tabular: default. "
    "authors (mnist, cifar10, cardio, heart): the DP-RVFL authors' split and encoding, split seed 2026 "
    "unless --split-seed is given (docs/data-profiles.md)."
)


@dataclass(frozen=True)
class TrainingOptions:
    """How a DP-SGD model is trained: the update rule on the sanitised gradient, and where."""

    optimizer: str = option(
        "adam",
        choices=("adam", "sgd"),
        help="Update rule on the sanitised gradient: adam (default, the paper's) or sgd.",
    )
    momentum: float = option(
        0.0, help="Heavy-ball momentum of --optimizer sgd, in [0, 1) (default 0)."
    )
    device: str = option("cpu", choices=DEVICES, help=_DEVICE_HELP)


@dataclass(frozen=True)
class DPSGDRequest(Request):
    """A DP-SGD release of a DP-RVFL-family model (frozen-feature heads and trainable modules),
    at record or user level (``dpaudit.releasing.release(model, DPSGDRequest(model=model, ...))``)."""

    TORCH_RUN: ClassVar[bool] = True

    model: str = option(
        positional=True,
        help="Model name (a catalogue entry of family dp-sgd-head or dp-sgd-module).",
    )
    dataset: str = option(
        "digits",
        help="Dataset (mnist, cifar10, cardio, heart, digits, breast-cancer). Default: digits (embedded, no files).",
        note="no --dataset given: using the embedded 'digits' dataset.",
    )
    data_dir: str | None = option(None, help=_DATA_DIR_HELP)
    epsilon: float = option(2.0, flag="--eps", help="Target epsilon (> 0).")
    delta: float = option(1e-5, help="Target delta in (0, 1).")
    seed: int = option(42, help=_SEED_HELP)
    non_private: bool = option(False, help="Train without clipping or noise (no privacy claim).")
    reproducible_noise: bool = option(False, help=_REPRO_HELP)
    # a plain string: the release refuses others in one line
    noise_source: str = option("os-entropy", help=_NOISE_HELP)
    epochs: int | None = option(None, help="Override the epochs (default: 10 images, 30 tabular).")
    batch_size: int | None = option(
        None,
        help="Override the requested batch size (default: 256; heart, digits, breast-cancer 64).",
    )
    profile: str | None = option(None, help=PROFILE_HELP)
    split_seed: int | None = option(None, help=_SPLIT_SEED_HELP)
    privacy_unit: str = option(
        "record",
        help="record (default) or user: user-level DP-SGD, adjacency add-remove-user (needs --user-ids, --records-per-user).",
    )
    records_per_user: int | None = option(
        None,
        help="G: records averaged per sampled user and step, min(G, |D_u|), drawn without replacement.",
    )
    user_ids: str | None = option(
        None,
        help="FILE.npy: one user id per row of the dataset before splitting (loader order); the data are re-split by users.",
    )
    reference_size: int | None = option(
        None,
        help="Public size N0 the schedule (q, T, m0) is built from: training records (default: the "
        "dataset definition's train size), or training users (privacy unit user: required).",
    )

    training: TrainingOptions = options_group(TrainingOptions)

    def check(self) -> None:
        one_of("privacy_unit", self.privacy_unit, ("record", "user"))
        if self.privacy_unit == "record" and (
            self.user_ids is not None or self.records_per_user is not None
        ):
            # never ignore a request for user-level privacy
            raise UsageError(
                "privacy_unit must be 'user' when user ids or records_per_user are given, got 'record'."
            )
        if self.privacy_unit == "user":
            positive_int("records_per_user", self.records_per_user)
            if self.reference_size is None:  # no dataset definition declares a user count
                raise UsageError(
                    "reference_size must be given (--reference-size: the public number of training users the schedule is "
                    "built from) for data whose definition declares none, got None."
                )
        if self.reference_size is not None:
            positive_int("reference_size", self.reference_size)
        if not self.non_private:
            positive_finite("epsilon", self.epsilon)
        open_unit("delta", self.delta)


@dataclass(frozen=True)
class DPELMRequest(Request):
    """A Laplace DP-ELM release (pure epsilon-DP; ``dpaudit.releasing.release("dp-elm", DPELMRequest(...))``)."""

    COMMAND: ClassVar[str] = "dp-elm"

    dataset: str = option(
        "digits", help="Dataset name (digits, breast-cancer, mnist, cardio, heart, ...)."
    )
    data_dir: str | None = option(None, help=_DATA_DIR_HELP, path=True)
    width: int = option(10, help="Hidden width L (the paper reports 1, 3, 5 and 10).")
    epsilon: float = option(2.0, flag="--eps", help="Target epsilon (> 0).")
    seed: int = option(42, help=_SEED_HELP)
    sampler: str = option(
        "discrete-laplace",
        choices=("discrete-laplace", "textbook"),
        help="discrete-laplace: exact, certified in finite precision (default). textbook: inverse-CDF doubles, leaky (comparison only).",
    )
    adjacency: str = option(
        "add-remove-record",
        choices=("add-remove-record", "replace-record"),
        help="Adjacency the claim is made under (the scale covers both).",
    )
    split_seed: int | None = option(None, help="Seed of the public split (default: the dataset's).")
    profile: str | None = option(None, help=PROFILE_HELP)
    non_private: bool = option(False, help="Fit without noise (no privacy claim).")
    reproducible_noise: bool = option(False, help=_REPRO_HELP)
    noise_source: str = option("os-entropy", choices=NOISE_SOURCES, help=_NOISE_HELP)


@dataclass(frozen=True)
class MixtureOptions:
    """How DP-MixMin learns the mixture weights (mirror descent); None = the task's default."""

    loss: str = option(
        "bce",
        choices=("bce", "nll", "mse"),
        help="bce (mixture probabilities), nll (mixture densities) or mse.",
    )
    steps: int | None = option(None, help="Mirror-descent steps n (default 200).")
    batch_size: int | None = option(
        None, help="Expected batch size B (q = B / |D_mix|, capped at 1; default 1000)."
    )
    clipping_norm: float | None = option(
        None,
        help="Per-example (per-user) clipping norm C (default: 1 on the embedded digits-mix, 13 otherwise).",
    )
    step_size: float | None = option(None, help="Mirror-descent step size eta (default 0.5).")


@dataclass(frozen=True)
class MixMinRequest(Request):
    """A DP-MixMin release: mixture weights, or the full pipeline
    (``dpaudit.releasing.release("mixmin", request)``). None = the task's
    public default (:func:`~dpaudit.mechanisms.mixmin.mechanism.default_mixture`, ``default_rho``)."""

    COMMAND: ClassVar[str] = "mixmin"

    task: str = option(
        "digits-mix",
        choices=("digits-mix", "mnist-mix", "heart-mix"),
        help="digits-mix (embedded), mnist-mix or heart-mix (need --data-dir).",
    )
    target: str | None = option(
        None,
        help="Private target (digit tasks: digit-3, loops-0689, small-0to4, ink-heavy; heart: cleveland).",
    )
    epsilon: float = option(1.0, flag="--eps", help="Target epsilon (> 0).")
    delta: float = option(1e-5, help="Target delta in (0, 1).")
    rho: float | None = option(
        None,
        help="Fraction of the private training records used to learn the mixture (default: 0.5 on the embedded digits-mix, 0.1 otherwise).",
    )
    stage: str = option(
        "mixture",
        choices=("mixture", "pipeline"),
        help="mixture: release lambda. pipeline: also pretrain and DP fine-tune.",
    )
    privacy_unit: str = option(
        "record", choices=("record", "user"), help="record (Algorithm 1) or user (Algorithm 2)."
    )
    records_per_user: int | None = option(
        None,
        help="G: records used per sampled user (built-in tasks group records into users of this size; default 4).",
    )
    proxy_predictions: str | None = option(
        None, help="FILE.npz with probs (n, k), labels (n,), optional user_ids, source_names."
    )
    proxy_mode: str = option(
        "joint",
        choices=("joint", "per-source"),
        help="joint: one multi-class proxy for all sources; per-source: one proxy each.",
    )
    composition: str = option(
        "parallel",
        choices=("parallel", "sequential"),
        help="parallel: disjoint D_mix / D_ft (max). sequential: all data, eps split rho / 1 - rho.",
    )
    pretrain_objective: str = option(
        "weighted-targets",
        choices=("weighted-targets", "source-sampling"),
        help="pipeline pretraining: mixture-weighted targets sum_c lambda_c y_c, or sampling sources with probability lambda.",
    )
    mixture: MixtureOptions = options_group(MixtureOptions)
    reference_size: int | None = option(
        None,
        help="Public size N0 both stages' schedules are built from: training records (default: the "
        "task's declared size); with --proxy-predictions (required) the file's records, or users.",
    )
    seed: int = option(42, help=_SEED_HELP)
    reproducible_noise: bool = option(False, help=_REPRO_HELP)
    noise_source: str = option("os-entropy", choices=NOISE_SOURCES, help=_NOISE_HELP)
    data_dir: str | None = option(None, help=_DATA_DIR_HELP)


@dataclass(frozen=True)
class GaussianRequest(Request):
    """The synthetic Gaussian sum query of the audits (:mod:`dpaudit.mechanisms.simple.gaussian`),
    calibrated exactly for (epsilon, delta); never released by ``dpaudit train``."""

    COMMAND: ClassVar[str] = "gaussian"

    epsilon: float = option(1.0, flag="--eps", help="Target epsilon (> 0).")
    delta: float = option(1e-5, help="Target delta in (0, 1).")
    seed: int = option(42, help="Public seed of the synthetic records.")
    broken_noise_factor: float = option(
        1.0,
        hidden=True,
        help="Divide the noise by this factor, claim unchanged (a broken mechanism).",
    )


@dataclass(frozen=True)
class DataOptions:
    """What the audited target trains on: the dataset (or mixmin task and target) and its files."""

    task: str | None = option(
        None, help="mixmin task: digits-mix (embedded, default), mnist-mix, heart-mix."
    )
    target: str | None = option(
        None, help="mixmin target within the task (default: the task's first)."
    )
    dataset: str | None = option(
        None, help="Dataset for trained models (default: embedded digits)."
    )
    data_dir: str | None = option(None, help=_DATA_DIR_HELP, path=True)
    profile: str | None = option(None, help=PROFILE_HELP)


@dataclass(frozen=True)
class TrialOptions:
    """How an audit's trials run: their noise, the controls beside them, and where they run."""

    reproducible_noise: bool = option(False, help=_SEEDED_NOISE_HELP)
    controls: bool = option(True, help="Also run the no-noise and null controls.")
    control_runs: int | None = option(None, help="Trials per control (default: --runs).")
    workers: int | None = option(
        None,
        help="Worker processes for the trials (local: default min(2, CPUs); dask without --scheduler: a "
        "LocalCluster of N workers on 127.0.0.1).",
    )
    executor: str = option(
        "local",
        help="local (processes on this machine) or dask (the trial chunks go to a Dask cluster).",
    )
    scheduler: str | None = option(
        None,
        help="Address of a running Dask scheduler, e.g. tcp://HOST:8786 (with --executor dask).",
    )
    chunk_size: int | None = option(None, help="Trials per batched call (speed only).")


@dataclass(frozen=True)
class MechanismSettings:
    """The audited mechanism's own settings (as its release's request gives them; each family
    reads those it has)."""

    width: int = option(10, help="dp-elm hidden width L.")
    epochs: int | None = option(
        None, help="Frozen-feature models: epochs (default: the paper's protocol)."
    )
    rho: float | None = option(
        None,
        help="mixmin: fraction of private training records used for mixture learning "
        "(default: the task's training default, 0.5 for digits-mix, 0.1 otherwise).",
    )
    privacy_unit: str = option(
        "record",
        help="record (default) or user: audit user-level DP-SGD (head models) with one whole "
        "canary user, adjacency add-remove-user (needs --records-per-user).",
    )
    records_per_user: int | None = option(
        None,
        help="G: records of the canary user and records per sampled user and step (--privacy-unit user).",
    )
    user_ids: str | None = option(
        None,
        path=True,
        help="FILE.npy: one user id per row before splitting (--privacy-unit user; default: rows grouped "
        "into users of G by the public seed).",
    )
    reference_size: int | None = option(
        None,
        help="Public size N0 the schedule is built from, as a release's --reference-size "
        "(--privacy-unit user: required, the declared number of training users; an audit of a release takes "
        "the release's).",
    )
    broken_noise_factor: float = option(
        1.0,
        hidden=True,
        help="gaussian only: divide the noise by this factor, claim unchanged (a broken mechanism).",
    )


@dataclass(frozen=True)
class AuditProtocol:
    """A one-run audit (one training with many canaries) and the canaries it inserts."""

    one_run: bool = option(
        False,
        help="One-run audit (Steinke et al. 2023; f-DP analysis of Mahloujifar et al. 2024): train ONCE with "
        "--canaries independent canaries; DP-SGD head models and dp-dense, dp-cnn, dp-attention. Writes one_run.json.",
    )
    canaries: int | None = option(
        None,
        help="M: canaries of the one-run audit (each included w.p. 1/2; needs --one-run) or of a "
        "white-box / crafted-final audit.",
    )
    one_run_kind: str = option(
        "gradient",
        help="One-run canaries: gradient (Dirac gradient canaries) or input-mislabeled (needs --one-run).",
    )


@dataclass(frozen=True)
class OutputOptions:
    """Where an audit is recorded and how it reports (never what it audits)."""

    ledger: str | None = option(
        None,
        path=True,
        help="Ledger database (default: $DPAUDIT_LEDGER or ./.dpaudit/ledger.sqlite).",
    )
    json_out: bool = option(False, flag="--json", help="Print one JSON object on stdout.")
    fail_on_violation: bool = option(
        False, help="Exit 1 when a verdict is VIOLATION (for CI; README: exit codes)."
    )


@dataclass(frozen=True)
class AuditRequest(Request):
    """``dpaudit audit MECHANISM ...``: what is audited and how (the CLI command is generated from
    these fields, :mod:`dpaudit.cli.audit`). The fields not in :attr:`RUN_FIELDS` describe the
    target: without ``release`` they build the family's request
    (:func:`dpaudit.auditing.family_request`; a field that request lacks must stay at its default).
    ``user_ids`` may also be an array of one user id per row (library use)."""

    COMMAND: ClassVar[str] = "audit"
    #: How, where and in what format the audit runs (never part of the family's request).
    RUN_FIELDS: ClassVar[tuple[str, ...]] = (
        *("runs", "confidence", "release", "out", "threat_model", "device", "sequential"),
        *(f.name for group in (TrialOptions, AuditProtocol, OutputOptions) for f in fields(group)),
    )

    mechanism: str = option(
        positional=True, help="The mechanism audited (a catalogue name with canaries, or an alias)."
    )
    canary: str | None = option(
        None,
        help="Canary kind, one of the mechanism's (e.g. max-clip, mislabeled, natural; default: its strongest).",
    )
    runs: int = option(1000, help="Trials R (half with the canary, half without).")
    epsilon: float | None = option(
        None,
        flag="--eps",
        help="Claimed epsilon the noise is calibrated for (default 1 for mixmin and gaussian, 2 otherwise).",
    )
    delta: float = option(1e-5, help="Target delta in (0, 1).")
    data: DataOptions = options_group(DataOptions)
    no_noise: bool = option(
        False, help="Audit the mechanism with its DP noise removed (must find large leakage)."
    )
    confidence: float = option(0.95, help="Joint confidence of the FPR and FNR bounds.")
    release: str | None = option(
        None,
        path=True,
        help="Audit the configuration recorded in this release.json (or its folder).",
    )
    out: str | None = option(
        None,
        path=True,
        help="Output directory for audit.json and scores.npz (default: audits/ plus mechanism, "
        "dataset and canary, or a fresh -2, ... beside an earlier audit's; one holding results is refused).",
    )
    seed: int = option(
        42, help="Public seed: model features, canary choice, worlds and SELECT/EVAL split."
    )
    trials: TrialOptions = options_group(TrialOptions)
    settings: MechanismSettings = options_group(MechanismSettings)
    protocol: AuditProtocol = options_group(AuditProtocol)
    threat_model: str = option(
        "final-model",
        help="final-model (the adversary sees the released model) or trajectory (every iterate: "
        "DP-SGD head models, max-clip canary, scored by the per-step likelihood ratio of its coordinate; the "
        "final-model audit also runs, into OUT/final-model); white-box (dp-dense, dp-cnn: --canaries Dirac canaries observed at "
        "every step) or crafted-final (dp-dense: only the final model of a plain-SGD run; docs/white_box.md).",
    )
    output: OutputOptions = options_group(OutputOptions)
    device: str = option(
        "cpu", choices=DEVICES, help=_DEVICE_HELP.replace("train:", "train in a one-run audit:")
    )
    sequential: bool = option(
        False,
        help="Sequential (anytime-valid) audit: trials in batches, stop as soon as a violation is certain "
        "or no remaining trial (up to --runs) can change the verdict; needs a claimed event.",
    )


NOISY_SUM_ACCOUNTANTS = ("pld", "rdp", "prv")
#: What an audit's adversary sees: the released model, or every iterate (DP-SGD head models).
THREAT_MODELS = ("final-model", "trajectory")
#: Threat models of the white-box audits of trainable DP-SGD models (their own statistic, docs/white_box.md): every step
#: seen, or only the final model of a run with crafted gradients at every step.
WHITE_BOX_THREAT_MODELS = ("white-box", "crafted-final")


@dataclass(frozen=True)
class NoisySumRequest(Request):
    """``dpaudit train noisy-sum`` (:mod:`dpaudit.mechanisms.simple.noisy_sum`): the clipped sum of a dataset's training rows plus Gaussian
    noise. Here, not in its module, so the CLI builds its commands without loading the mechanism (numpy)."""

    COMMAND: ClassVar[str] = "noisy-sum"

    dataset: str = option(
        "digits", help="Dataset (digits, breast-cancer embedded; others need --data-dir)."
    )
    data_dir: str | None = option(None, help=_DATA_DIR_HELP)
    epsilon: float = option(1.0, flag="--eps", help="Target epsilon (> 0).")
    delta: float = option(1e-5, help="Target delta in (0, 1).")
    clipping_norm: float = option(
        1.0, help="L2 norm C every row is clipped to (the sum's sensitivity)."
    )
    accountant: str = option(
        "pld",
        choices=NOISY_SUM_ACCOUNTANTS,
        help="Accountant calibrating sigma and making the claim (pld: tight).",
    )
    seed: int = option(42, help="Public seed (recorded; the audit's public randomness).")
    non_private: bool = option(False, help="Release the exact clipped sum (no privacy claim).")
    reproducible_noise: bool = option(False, help=_SEEDED_NOISE_HELP)
    noise_source: str = option(
        "os-entropy", choices=NOISE_SOURCES, help="os-entropy (default), cryptographic."
    )
    profile: str | None = option(None, help="Preprocessing profile (default: the dataset's).")
    split_seed: int | None = option(None, help=_SPLIT_SEED_HELP)


#: The request type of each built-in family, or of a mechanism by name (any other mechanism's comes from its MECHANISM).
REQUEST_TYPES: dict[str, type[Request]] = {
    "dp-sgd-head": DPSGDRequest,
    "dp-sgd-module": DPSGDRequest,
    "dp-elm": DPELMRequest,
    "dp-mixmin": MixMinRequest,
    "gaussian": GaussianRequest,
    "noisy-sum": NoisySumRequest,
}
