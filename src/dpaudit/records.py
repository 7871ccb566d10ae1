"""Release records: the guarantee and everything needed to check or re-create a release.

A :class:`Release` is frozen and written as ``release.json``, which is meant to be published (what it may hold, and what stays
local: :class:`Release`). Readers get a one-line :class:`~dpaudit.errors.DataError` for a missing, truncated or malformed file."""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import os
import subprocess
import tempfile
import uuid
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from . import __version__
from .claims import steps_problem, target_problem
from .errors import AccountingMismatchError, DataError, UsageError
from .grouped import Grouped, group
from .paths import results_in, write_atomically

RELEASE_FILE = "release.json"
#: Written beside ``release.json``: local-only facts of a run (exact timings). NOT for publication; ``dpaudit report`` never reads
#: it.
LOCAL_FILE = "local.json"
#: Release fields kept in memory (and in the ledger's keyed form) but never written to ``release.json``: each is a function of the
#: private data that the guarantee does not cover.
LOCAL_FIELDS = ("data_digest", "exact_timings", "noise_seed_file")
#: Published timings are rounded to this many significant figures ...
TIMING_SIGNIFICANT_FIGURES = 2
#: ... and never finer than this many decimals of a second (0.1 s).
TIMING_DECIMALS = 1


def git_commit() -> str | None:
    """The commit of the dpaudit source tree, when it is a git checkout."""
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Calibration:
    """A release's schedule: the target, the noise and sampling it was calibrated to, the steps."""

    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    steps: int | None = None
    steps_executed: int | None = None
    clipping_norm: float | None = None
    normalizer: int | None = None


@dataclass(frozen=True)
class Outputs:
    """What the run produced: test metrics, rounded timings, artefact files (:class:`Release`)."""

    metrics: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    artefacts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Origin:
    """How the release was asked for: its derived ``command`` and its ``request``
    (:meth:`dpaudit.requests.Request.to_dict`; public by construction), from which ``command`` and
    the audit's target are rebuilt (None for releases made before it was recorded)."""

    command: str | None = None
    request: dict | None = None


@dataclass(frozen=True)
class NoiseFacts:
    """The noise sampler actually used, in words (dpaudit.noise.GAUSSIAN_SAMPLER_DESCRIPTION), and
    the delta its truncated tails add over the whole run (dpaudit.noise module docstring): the
    release is (epsilon, delta + noise_tail_delta)-DP; releases refuse a value above 1 % of delta,
    and the ledger composes it into every total. None: not recorded (old releases, made with
    torch.randn float32 noise truncated at 5.77 sigma)."""

    noise_sampler: str | None = None
    noise_tail_delta: float | None = None


@dataclass(frozen=True)
class Stamp:
    """The release's id and when and by which dpaudit it was made."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: str = field(default_factory=now_utc)
    dpaudit_version: str = __version__
    git_commit: str | None = field(default_factory=git_commit)


@dataclass(frozen=True)
class LocalFacts:
    """Local only (:data:`LOCAL_FIELDS`, see :class:`Release`); None for releases read from disk."""

    data_digest: str | None = None
    exact_timings: dict | None = None
    noise_seed_file: str | None = None


@dataclass(frozen=True)
class Release(Grouped):
    """One released model (or statistic) and the privacy guarantee it carries. ``guarantee`` is the event tree as data (see
    :mod:`dpaudit.accounting.events`), so any accountant can recompute it. ``epsilon`` is the claim made with ``accountant`` under
    ``adjacency`` at ``delta``; ``epsilons`` holds other accountants' values for comparison.

    **What a release publishes** (``to_dict`` / ``release.json``). A deterministic function of the private records (a hash of the
    prepared data, of the source files or of the user ids) would tell neighbouring datasets apart exactly, so none is written. The
    published fields are:

    - the mechanism's output (weights files, ``metrics["weights"]`` of DP-MixMin) and hashes or post-processing of it;
    - public configuration: seeds, split seed, profile, schedule, hyper-parameters, command;
    - sizes the guarantee assumes public: the declared reference size the sampling rate is built from
      (``config["reference_size"]``, N0 records or users; q = batch / N0 and T are published in ``sample_rate`` / ``steps``),
      never the actual training count, the dataset's schema (``n_features``, ``n_classes``) and the sizes of the val/test
      partitions (see next point);
    - ``metrics`` on the *test* (and, where stated, validation) partition: these are evaluation data outside the training
      partition the DP claim covers. Their records are NOT protected by this release's guarantee: the metrics are exact functions
      of them;
    - ``timings`` rounded to :data:`TIMING_SIGNIFICANT_FIGURES` significant figures and never finer than 0.1 s
      (:func:`round_timings`). Running time depends on realised Poisson batch sizes, hence on the data; rounding bounds the
      resolution of this side channel but does not make it DP (a neighbour changes the expected work by about 1/N0 of the total,
      so it moves a published value only when the exact time lies within that margin of a rounding boundary, and machine jitter,
      typically larger than both, decides it). Timings are outside the DP claim; the exact ones are written to ``local.json``
      only.

    Local-only fields (:data:`LOCAL_FIELDS`, never in ``release.json``): ``data_digest``, the unkeyed SHA-256 of the prepared
    private data, which the ledger stores only as a keyed (HMAC) ``dataset_fingerprint``; ``exact_timings``, the unrounded timings
    (``local.json``); ``noise_seed_file``, the file holding a ``reproducible-secret`` release's secret noise seed (``local.json``;
    the seed itself is in that file only). ``noise_source`` says which noise the release used: secret (``secret: true``),
    reproducible from a secret seed (``reproducible: secret-seed``) or from the published seed (``reproducible: public-seed``, not
    private: :func:`public_noise_reason`). Old releases that published ``dataset["sha256"]`` still load.

    Related fields live in small frozen groups (``calibration``, ``outputs``, ``origin``,
    ``noise``, ``stamp``, ``local``; :mod:`dpaudit.grouped`) and are given, read and written by
    their own names: ``release.json`` holds the same flat keys in the same order."""

    mechanism: str
    dataset: dict
    adjacency: str
    accountant: str
    epsilon: float
    delta: float
    guarantee: dict
    seed: int
    noise_source: dict
    calibration: Calibration = group(Calibration)
    partition: str = "train"
    privacy_unit: str = "record"
    non_private: bool = False
    epsilons: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    outputs: Outputs = group(Outputs)
    origin: Origin = group(Origin)
    noise: NoiseFacts = group(NoiseFacts)
    stamp: Stamp = group(Stamp)
    local: LocalFacts = group(LocalFacts)

    def to_dict(self, *, local: bool = False) -> dict:
        """The published form (``release.json``): local-only fields dropped, timings rounded. ``local=True`` keeps them, for
        handing a release between processes of one operator (e.g. a sweep worker to the ledger writer); never write that form to a
        file."""
        d = self.flat()
        if not local:
            for name in LOCAL_FIELDS:
                del d[name]
            d["timings"] = round_timings(d["timings"])  # a guard: mechanisms already round them
        return _json_safe(d)

    @classmethod
    def from_dict(cls, data: dict) -> "Release":
        known = cls.flat_names()
        # the fields without any default
        required = [f.name for f in fields(cls) if f.default is f.default_factory is MISSING]
        absent = [k for k in required if k not in data]
        if absent:
            raise DataError(f"release is missing required keys: {', '.join(absent)}.")
        return cls(**{k: v for k, v in data.items() if k in known})


def public_noise_reason(noise_source) -> str | None:
    """Why a release whose ``noise_source`` (its recorded dict) is not secret is not private, else None. Noise derived from a seed
    that is published (``--reproducible-noise``: the public ``--seed``, written in release.json) makes the release a deterministic
    function of the data and public facts: rerunning it on a candidate neighbour tells whether a record was in (an exact
    membership test). Such a release counts as non-private (unbounded) in the ledger. Old releases without a ``secret`` key are
    judged by their source name."""
    if not isinstance(noise_source, dict):
        return None
    # without a "secret" key (old releases) only the source name decides
    if noise_source.get("secret") is not False and noise_source.get("source") != "reproducible":
        return None
    seed = noise_source.get("seed")
    return f"noise derived from a published seed ({seed}, reproducible-public-seed): not private"


def round_seconds(seconds: float) -> float:
    """A duration as published: 2 significant figures, never finer than 0.1 s (idempotent)."""
    if not math.isfinite(seconds) or seconds == 0:
        return seconds
    return round(float(f"{seconds:.{TIMING_SIGNIFICANT_FIGURES}g}"), TIMING_DECIMALS)


def round_timings(timings):
    """``timings`` with every float rounded by :func:`round_seconds` (recursively). Every float in a release's timings is a
    duration or derived from one; integers (thread counts) and strings are not functions of the data and are kept."""
    if isinstance(timings, dict):
        return {k: round_timings(v) for k, v in timings.items()}
    if isinstance(timings, (list, tuple)):
        return [round_timings(v) for v in timings]
    if isinstance(timings, float):
        return round_seconds(timings)
    return timings


def _json_safe(obj):
    """Replace non-finite floats by strings so the JSON stays standard."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _json_safe(obj.item())
    return obj


def write_json_atomic(path: str | os.PathLike, data: dict) -> Path:
    """Write JSON so that a crash leaves either the old file or the complete new one."""
    path = Path(path)
    write_atomically(path, json.dumps(_json_safe(data), indent=2, sort_keys=False) + "\n")
    return path


def read_json(path: str | os.PathLike, what: str = "file") -> dict:
    path = Path(path)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise DataError(f"{what} not found: {path}.") from None
    except json.JSONDecodeError as e:
        raise DataError(
            f"{what} {path} is not valid JSON (truncated or corrupt): {e.msg} at line {e.lineno}."
        ) from None
    except OSError as e:
        raise DataError(f"cannot read {what} {path}: {e.strerror}.") from None
    if not isinstance(data, dict):
        raise DataError(f"{what} {path} must hold a JSON object, got {type(data).__name__}.")
    return data


def existing_release(out_dir: str | os.PathLike) -> tuple[Path, str] | None:
    """(file, release id) of a release already in ``out_dir`` or one folder below it (the parts of a multi-release run), else
    None; an unreadable file's id reads ``unreadable``."""
    # the one rule of what a folder holds (dpaudit.paths)
    found = results_in(out_dir, (RELEASE_FILE,))
    if not found:
        return None
    try:
        rid = str(read_json(found[0], "release").get("id") or "without id")
    except DataError:
        rid = "unreadable"
    return found[0], rid


def check_release_folder(
    out_dir: str | os.PathLike, *, release_id: str | None = None, name: str = "out_dir"
) -> Path:
    """Refuse (UsageError) a folder that already holds a release (other than ``release_id``): a release folder is never
    overwritten, since the ledger keeps the old release (its budget spent) and replacing its artefacts would leave that entry
    without them."""
    hit = existing_release(out_dir)
    if hit is not None and hit[1] != release_id:
        raise UsageError(
            f"{name} must not hold a release already, got {str(out_dir)!r} (release {hit[1]} in {hit[0]}); "
            f"choose another --out: a release folder is never overwritten."
        )
    return Path(out_dir)


def write_release(release: Release, out_dir: str | os.PathLike) -> Path:
    """Write ``release.json`` (the published form) and, when the release carries exact timings, ``local.json`` beside it (local
    only, not for publication). A folder holding another release is refused (:func:`check_release_folder`); rewriting the same
    release (its id) is allowed."""
    hit = existing_release(out_dir)
    if hit is not None and hit[0] == Path(out_dir).expanduser() / RELEASE_FILE:
        check_release_folder(out_dir, release_id=release.id)
    path = write_json_atomic(Path(out_dir) / RELEASE_FILE, release.to_dict())
    if release.exact_timings or release.noise_seed_file:
        local = {
            "release_id": release.id,
            "not_for_publication": "local facts of this run; they depend on the private data and are outside the DP guarantee",
            "timings": release.exact_timings,
        }
        if release.noise_seed_file:  # the file, not the secret; it says which use made this release
            local["noise_seed_file"] = release.noise_seed_file
        write_json_atomic(Path(out_dir) / LOCAL_FILE, local)
    return path


def check_out_dir(out_dir: str | os.PathLike, *, name: str = "out_dir") -> Path:
    """Check that ``out_dir`` can be created (if absent) and written, and leave it as found (one-line UsageError otherwise).
    Called by every release function before any calibration, budget reservation or training, so a bad ``--out`` costs nothing.
    A real write is the test (permission bits say nothing about /proc, read-only mounts or root); directories made here are
    removed again, so a run refused later leaves no trace."""
    path = Path(out_dir).expanduser()
    rule = "a directory dpaudit can create and write"
    if path.exists() and not path.is_dir():
        raise UsageError(
            f"{name} must be {rule}, got {str(path)!r} (it exists and is not a directory)."
        )
    # the directories this check creates, innermost first
    missing = list(itertools.takewhile(lambda p: not p.exists(), (path, *path.parents)))
    step = "cannot create it"
    try:
        path.mkdir(parents=True, exist_ok=True)
        step = "cannot write in it"
        fd, probe = tempfile.mkstemp(dir=path, prefix=".dpaudit-write-check.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(
            f"{name} must be {rule}, got {str(path)!r} ({step}: {e.strerror or type(e).__name__})."
        ) from None
    finally:
        for d in missing:  # only empty directories made here
            try:
                d.rmdir()
            except OSError:
                break
    return path


def read_release(path: str | os.PathLike) -> Release:
    """Read a release from ``path`` (a ``release.json`` or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / RELEASE_FILE
    return Release.from_dict(read_json(p, "release"))


def check_accounting(
    *, steps_executed: int, steps_accounted: int, epsilon: float, target_epsilon: float | None
) -> None:
    """Fail loudly when a run did not do what was accounted for, before anything is published: rules 2 and 3 of
    :mod:`dpaudit.claims`, raised as :class:`~dpaudit.errors.AccountingMismatchError`."""
    problem = steps_problem(steps_executed, steps_accounted, missing_ok=False) or target_problem(
        epsilon, target_epsilon
    )
    if problem is not None:
        raise AccountingMismatchError(f"{problem}; the release is withheld.")
