"""The common tail of every training command: noise source, budget reservation, publish.

Order matters ("check, then commit; fail closed", docs/architecture.md):

1. :func:`reserve` checks the planned release against the ledger (budget cap, dataset identity)
   *before* any training and, in the same write transaction, holds its budget with a
   ``reservation`` entry, so runs started at the same time cannot together exceed a cap.
2. :func:`publish` writes ``release.json``.
3. When the run ends, the reservation is closed: *settled* (the published releases are recorded
   and the reservation closed in one transaction) or *cancelled* (the run failed or was
   interrupted, by Ctrl-C or SIGTERM, before writing any release file); when release files may
   have been written but not published it stays open (spent: fail closed). An interrupted run
   says on stderr what it kept and what it released. A run killed outright (SIGKILL) leaves its
   reservation open: the budget stays spent until an operator voids it (``dpaudit ledger void ID``).

Secret noise seed files (``--noise-seed-file``, :func:`secret_noise_seed`) are single-use per
release: each release claims a new use of the file before drawing noise (:func:`read_noise_seed`).

:func:`release` is the one skeleton every mechanism's release runs through (the contract:
:mod:`dpaudit.mechanisms.contract`); steps 1-3 share one :func:`release_session`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import fcntl
import hashlib
import json
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .accounting import compute_epsilon
from .accounting.base import first_line
from .accounting.comparisons import comparison_epsilons, comparisons_ahead
from .accounting.events import Event
from .errors import AccountingMismatchError, UsageError
from .lazy import lazy_import
from .ledger import result_cache
from .ledger.book import open_ledger
from .ledger.fingerprint import write_secret
from .ledger.paths import ledger_missing, resolve_ledger
from .mechanisms import registry
from .noise import NoiseSource, NoiseSpec, gaussian_run_tail
from .progress import phase
from .records import (
    Release,
    check_accounting,
    check_out_dir,
    check_release_folder,
    now_utc,
    public_noise_reason,
    round_timings,
    write_release,
)
from .requests import NOISE_SOURCES
from .validation import one_of

np = lazy_import("numpy")


def make_noise_source(
    *,
    seed: int,
    reproducible_noise: bool = False,
    noise_source: str = "os-entropy",
    secret_seed: "NoiseSeedUse | None" = None,
) -> NoiseSource:
    """DP noise generator: secret by default (fresh entropy per call: two calls never share noise);
    derived from ``seed`` only on explicit request (public, hence not private); from ``secret_seed``,
    one claimed use of a noise seed file (:func:`read_noise_seed`), when given. A claimed use is
    drawn from once: a second call with it is refused, so two releases never share its noise."""
    one_of("noise_source", noise_source, NOISE_SOURCES)
    if secret_seed is not None:
        if not isinstance(secret_seed, NoiseSeedUse):
            raise UsageError(
                f"secret_seed must be a claimed use of a noise seed file "
                f"(releasing.read_noise_seed), got {type(secret_seed).__name__}."
            )
        return NoiseSource("reproducible-secret", seed=secret_seed.take())
    if reproducible_noise:
        return NoiseSource("reproducible", seed=seed)
    return NoiseSource(noise_source)


# ---------------------------------------------------------------- secret noise seed files
#
# A noise seed file holds one secret (first line, hex) and then one JSON line per use: a claim
# {"use": N, "nonce": ...} written and synced before any noise of that use is drawn, and, once the
# use's releases are written, {"use": N, "released": [release ids]}. The noise of use N is a function
# of (secret, N, nonce), the nonce 128 fresh bits: no two uses share noise, even when the file is
# copied, restored from a backup or its records edited. Uses are claimed under an exclusive lock.

#: Hex digits of a secret noise seed written by :func:`read_noise_seed` (256 bits) and the fewest
#: it accepts (128 bits).
_SEED_HEX, _MIN_SEED_HEX = 64, 32
_SEED_RULE = (
    f"a file holding one secret of at least {_MIN_SEED_HEX} hex digits (then its use records)"
)
_NOISE_SEED_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "dpaudit_noise_seed_file", default=None
)


@dataclass(eq=False)
class NoiseSeedUse:
    """One claimed use of a noise seed file (:func:`read_noise_seed`): number ``use`` of ``path``.

    Privacy contract: its noise stream is derived from the file's secret, the use number and a
    fresh nonce recorded with the claim, so it is never the stream of another use; the claim is on
    disk before any of its noise is drawn (a run that dies midway has used it); it is drawn from
    once (:meth:`take`). The stream seed is never shown (repr) nor recorded."""

    path: Path
    use: int
    stream_seed: int = field(repr=False)
    taken: bool = False

    def take(self) -> int:
        """The stream seed, once; a second call is refused (UsageError)."""
        if self.taken:
            raise UsageError(
                f"noise seed use must be drawn from once, got use {self.use} of "
                f"{str(self.path)!r} a second time (claim a new use: read_noise_seed)."
            )
        self.taken = True
        return self.stream_seed


def _seed_error(path: Path, why: str) -> UsageError:
    return UsageError(f"noise seed file must be {_SEED_RULE}, got {str(path)!r} ({why}).")


def _create_seed_file(path: Path) -> None:
    """Create ``path`` (mode 0600) holding 256 fresh bits, atomically: a concurrent creator either
    wins or finds the finished file (written aside, then linked into place create-only)."""
    if path.exists():
        return
    aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}.new")
    try:
        write_secret(aside, (secrets.token_hex(_SEED_HEX // 2) + "\n").encode())
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    except OSError as e:
        raise _seed_error(path, f"cannot create it: {e.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(aside)


def _parse_seed_file(path: Path, text: str) -> tuple[int, list[dict]]:
    """(secret, use records) of a seed file's ``text``. A line that is not a record (a claim cut
    short by a crash) is skipped: its run drew no noise (claims are synced before any draw), and
    a new claim's noise never depends on the records (fresh nonce)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    secret = lines[0] if lines else ""
    if len(secret) < _MIN_SEED_HEX or any(c not in "0123456789abcdefABCDEF" for c in secret):
        raise _seed_error(
            path, f"first line: {len(secret)} characters, not all hex digits or too few"
        )
    records = []
    for line in lines[1:]:
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and isinstance(record.get("use"), int):
                records.append(record)
    return int(secret, 16), records


@contextlib.contextmanager
def _locked_seed_file(path: Path) -> Iterator[tuple]:
    """(open file positioned at its end, secret, records) of ``path`` (created if absent) under an
    exclusive lock held until the block ends: concurrent runs claim uses one at a time."""
    _create_seed_file(path)
    try:
        f = open(path, "r+", encoding="utf-8")
    except OSError as e:
        raise _seed_error(path, f"cannot open it to read and record uses: {e.strerror}") from None
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # released when the file closes
        try:
            text = f.read()
        except UnicodeDecodeError:
            raise _seed_error(path, "unreadable: not text") from None
        secret, records = _parse_seed_file(path, text)
        if text and not text.endswith("\n"):
            f.write("\n")  # after a record cut short: the next one starts on its own line
        yield f, secret, records


def _append_record(f, record: dict) -> None:
    f.write(json.dumps(record, sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())  # on disk before the caller draws any noise


def _use_stream_seed(secret: int, use: int, nonce: str) -> int:
    material = f"dpaudit noise seed use\n{secret:x}\n{use}\n{nonce}".encode()
    return int.from_bytes(hashlib.sha256(material).digest(), "big")


@contextlib.contextmanager
def _scoped(variable: contextvars.ContextVar, value) -> Iterator[None]:
    """``variable`` set to ``value`` within the block, restored after it."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)


def secret_noise_seed(path: str | os.PathLike | None) -> contextlib.AbstractContextManager:
    """Within this block, each release draws its DP noise from its own use of the secret noise
    seed file ``path`` (``--noise-seed-file``; created with 256 fresh bits when absent).

    Privacy contract: every release claims a new use (:func:`read_noise_seed`), so two releases
    never share noise (at any sigma, in any sweep or run, in concurrent processes); the seed is never
    published (release.json records the source ``reproducible-secret`` without a seed; ``local.json``
    names the file; the file records which use made which release). Reproducible means checkable:
    :func:`replay_noise_source` rebuilds a recorded release's noise for re-running it, never for a
    new release. None: no effect."""
    return _scoped(_NOISE_SEED_FILE, None if path is None else Path(path).expanduser())


def read_noise_seed(path: str | os.PathLike) -> NoiseSeedUse:
    """Claim the next use of the noise seed file ``path`` (created, mode 0600, with 256 bits from the
    OS when missing): the claim is appended and synced under an exclusive lock before it is
    returned, so a use is never handed out twice, concurrent processes included, and a run that
    dies after this call has spent it. Its content is never printed."""
    path = Path(path).expanduser()
    with _locked_seed_file(path) as (f, secret, records):
        use = 1 + max((r["use"] for r in records), default=0)
        nonce = secrets.token_hex(16)
        _append_record(f, {"use": use, "nonce": nonce, "claimed_at": now_utc(), "pid": os.getpid()})
    return NoiseSeedUse(path.resolve(), use, _use_stream_seed(secret, use, nonce))


def record_noise_seed_releases(seed_use: NoiseSeedUse, release_ids) -> None:
    """Append to the seed file which releases ``seed_use`` made (for :func:`replay_noise_source`)."""
    with _locked_seed_file(seed_use.path) as (f, _secret, _records):
        _append_record(f, {"use": seed_use.use, "released": list(release_ids), "at": now_utc()})


def replay_noise_source(path: str | os.PathLike, release_id: str) -> NoiseSource:
    """The noise of release ``release_id`` made from the seed file ``path``, rebuilt from its use
    record, to check the release by re-running its mechanism (same data, same noise, same output).
    Never the noise of a new release: :func:`build_release` refuses it (a second release from the
    same noise would reveal the difference of their data)."""
    path = Path(path).expanduser()
    with _locked_seed_file(path) as (_f, secret, records):
        use = next((r["use"] for r in records if release_id in (r.get("released") or ())), None)
        claim = next((r for r in records if r["use"] == use and "nonce" in r), None)
    if claim is None:
        raise UsageError(
            f"release_id must be a release recorded in the noise seed file {str(path)!r}, "
            f"got {release_id!r}."
        )
    noise = NoiseSource(
        "reproducible-secret", seed=_use_stream_seed(secret, use, str(claim["nonce"]))
    )
    noise.replay_of = release_id
    return noise


def planned_secret_seed(request) -> Path | None:
    """The noise seed file (checked, resolved) when :func:`secret_noise_seed` is in effect, else
    None; refuses (UsageError) a request that also asks for another noise source, before anything is
    reserved. Claims no use (:func:`read_noise_seed` does, right before the noise is drawn)."""
    path = _NOISE_SEED_FILE.get()
    if path is None:
        return None
    if (
        getattr(request, "reproducible_noise", False)
        or getattr(request, "noise_source", "os-entropy") != "os-entropy"
    ):
        raise UsageError(
            "noise seed file must not be combined with --reproducible-noise or --noise-source, got both."
        )
    with _locked_seed_file(path):  # holds a secret (created when missing); claims nothing
        pass
    return path.resolve()


def public_seed_reason(seed: int, event, reproducible_noise) -> str | None:
    """Why a planned release of ``event`` will not be private because its noise is derived from the
    published ``seed`` (:func:`dpaudit.records.public_noise_reason`), else None; checked before
    training, so the reservation counts it as unbounded and a capped dataset refuses it."""
    if event is None or not reproducible_noise:
        return None
    return public_noise_reason(NoiseSpec("reproducible", int(seed)).to_dict())


class Terminated(SystemExit):
    """SIGTERM received while a release session holds a budget reservation: raised in the main
    thread so the session closes its reservation as for Ctrl-C (exit status 128 + 15)."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@dataclass
class ReleaseSession:
    """One run's budget reservation and the releases it published (see the module docstring)."""

    ledger_path: str | os.PathLike | None = None
    reservation_id: str | None = None
    published: list = field(default_factory=list)  # (Release, artefact path) not yet recorded
    settled: list = field(default_factory=list)  # release ids recorded when the session closed
    #: the folder release files started being written to (outputs may exist)
    writing: str | None = None
    seed_use: NoiseSeedUse | None = None  # the noise seed file use this run claimed, if any
    outcome: str = "no budget was reserved, nothing was released"  # what closing did, in words
    previous_sigterm: object = None  # the SIGTERM handler replaced while the reservation is held
    kept_open: bool = False  # closed by keeping the reservation open (spent): outputs may exist

    def close(self, error: BaseException | None = None) -> None:
        """Settle the published releases with the reservation; keep it open (spent) when release
        files may have been written without being published; cancel it when nothing left the run."""
        rid = self.reservation_id
        if rid is None:
            return
        if self.published:
            with open_ledger(self.ledger_path) as ledger:
                # Released files exist even when the run failed afterwards: they are recorded.
                self.settled = ledger.settle(rid, self.published)
            ids = ", ".join(map(str, self.settled))
            self.outcome = (
                f"reservation {rid} settled with release(s) {ids}, published before the end"
            )
        # fail closed: a partly written release may be read by someone
        elif self.writing is not None:
            self.kept_open = True
            self.outcome = (
                f"reservation {rid} kept as spent because release files may have been written "
                f"to {self.writing} (delete them, then `dpaudit ledger void {rid} --reason ...`)"
            )
        else:
            what = "the run ended without a release"
            if error is not None:
                what = f"the run failed before releasing anything ({type(error).__name__}: {first_line(error)})"
            with open_ledger(self.ledger_path) as ledger:
                ledger.cancel(rid, what)
            self.outcome = f"reservation {rid} cancelled, nothing was released"
        self.reservation_id = None

    def catch_terminate(self) -> None:
        """While the reservation is held, SIGTERM raises :class:`Terminated` (main thread, default
        handler only: a host's own handler, or a worker thread, is left alone)."""
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self.previous_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)

    def release_terminate(self) -> None:
        if self.previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self.previous_sigterm)
            self.previous_sigterm = None


_SESSION: contextvars.ContextVar[ReleaseSession | None] = contextvars.ContextVar(
    "dpaudit_release_session", default=None
)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _close_session(session: ReleaseSession, error: BaseException | None = None) -> list:
    """Close ``session`` with SIGINT/SIGTERM deferred (a second Ctrl-C must not cut the ledger write
    or the interrupt line short), then stop catching SIGTERM; returns the signals deferred."""
    deferred: list = []
    swapped = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _STOP_SIGNALS:
            if signal.getsignal(signum) is not None:  # None: a handler Python cannot restore
                swapped[signum] = signal.signal(
                    signum, lambda received, _frame: deferred.append(received)
                )
    try:
        if error is None:
            session.close()
        else:
            _close_after_error(session, error)
    finally:
        for signum, handler in swapped.items():
            signal.signal(signum, handler)
        session.release_terminate()
    return deferred


def _close_after_error(session: ReleaseSession, e: BaseException) -> None:
    try:
        session.close(error=e)
    except Exception as close_error:  # noqa: BLE001 - the run's own error is the one to raise
        rid, session.kept_open = session.reservation_id, True
        session.outcome = (
            f"reservation {rid} kept as spent because closing it failed "
            f"({first_line(close_error)}; `dpaudit ledger void {rid} --reason ...`)"
        )
    if session.kept_open:
        e.add_note(f"dpaudit: budget {session.outcome}.")
    if isinstance(e, (KeyboardInterrupt, Terminated)):
        _say_interrupted(session, "SIGTERM" if isinstance(e, Terminated) else "SIGINT")


def _say_interrupted(session: ReleaseSession, signal_name: str) -> None:
    """One line on stderr: what the interrupted run kept and what it released."""
    used, seed = session.seed_use, ""
    if used is not None:
        seed = f"; noise seed use {used.use} of {used.path} stays used (never drawn from again)"
    print(
        f"dpaudit: interrupted ({signal_name}): {session.outcome}{seed}.",
        file=sys.stderr,
        flush=True,
    )


@contextlib.contextmanager
def release_session() -> Iterator[ReleaseSession]:
    """Scope of one run: :func:`reserve` and :func:`publish` inside it settle or cancel the
    reservation when it ends (on any exception too). Interrupted by Ctrl-C, or by SIGTERM while
    a reservation is held (:meth:`ReleaseSession.catch_terminate`), it closes the reservation the
    same way and says on stderr what it kept and what it released. An error while closing never
    hides the run's own error; the reservation then stays open (spent)."""
    session = ReleaseSession()
    try:
        with _scoped(_SESSION, session):  # left before the session closes
            yield session
    except BaseException as e:
        # an interrupt while closing is dropped: the run is stopping already
        _close_session(session, e)
        raise
    # an interrupt during the final ledger write: honoured after it
    for signum in _close_session(session)[:1]:
        signal.raise_signal(signum)


def budget_session(fn):
    """Decorator: run ``fn`` inside its own :func:`release_session` (a new one per call)."""
    return release_session()(fn)


@dataclass(frozen=True)
class BudgetCheck:
    """What the ledger checks (and :func:`reserve` holds) before a run touches private data.

    ``event`` None is a non-private release; ``uncertified`` (a reason) one whose guarantee cannot
    be certified: both count as unbounded. ``data_digest``: the data's digest (a change of the
    dataset's recorded data is refused). ``noise_tail_delta``: the planned run's sampler tail
    delta (counted in the check and held with the budget). ``data_rows``: the source rows the run
    reads (dpaudit.data.rows; the ledger budgets their people under every name)."""

    dataset: str
    partition: str
    event: Event | None
    adjacency: str
    data_digest: str | None = None
    data_info: dict | None = None
    uncertified: str | None = None
    mechanism: str = ""
    noise_tail_delta: float = 0.0
    data_rows: object = None


def reserve(
    check: BudgetCheck | None = None,
    /,
    *,
    ledger_path: str | os.PathLike | None = None,
    record: bool = True,
    **fields,
) -> str | None:
    """Check the planned release (``check``, or a :class:`BudgetCheck` of ``fields``) and hold its
    budget before training; returns the reservation id.

    Raises :class:`~dpaudit.errors.BudgetExceededError` (over a cap) or
    :class:`~dpaudit.errors.DatasetIdentityError` (``data_digest`` differs from the dataset's
    recorded versions) and writes nothing then. ``record=False`` (the release will not be
    recorded here, e.g. a sweep worker whose coordinator records it) only checks. Must run inside
    :func:`release_session`."""
    check = check or BudgetCheck(**fields)
    if not record:
        preflight(check, ledger_path=ledger_path)
        return None
    session = _SESSION.get()
    if session is None:
        raise RuntimeError(
            "reserve() must run inside releasing.release_session() (or a @budget_session function), "
            "so that the reservation is settled or cancelled when the run ends."
        )
    if session.reservation_id is not None:
        raise UsageError(
            f"a run must reserve its budget once (reserve the combined event), got a second reservation "
            f"after {session.reservation_id}."
        )
    with open_ledger(ledger_path) as ledger:
        rid = ledger.reserve(**vars(check))
    session.ledger_path = ledger_path
    session.reservation_id = rid
    session.catch_terminate()
    return rid


#: Reservations held on this run's behalf by someone else (a sweep's coordinator holds the whole
#: sweep's budget): the run's own pre-check must not count them again (see :func:`held_by_caller`).
_HELD: contextvars.ContextVar[tuple] = contextvars.ContextVar(
    "dpaudit_held_reservations", default=()
)


def held_by_caller(reservation_ids) -> contextlib.AbstractContextManager:
    """Within this block, :func:`preflight` leaves ``reservation_ids`` out of the spent budget.

    For a sweep worker: its coordinator reserved the budget of every task of the sweep in one
    atomic check before dispatching them, so the task's own planned release is already inside
    those reservations; counting them again would refuse the sweep against itself. The worker's
    pre-check still enforces the cap against everything else and checks the data identity."""
    return _scoped(_HELD, tuple(reservation_ids or ()))


def preflight(
    check: BudgetCheck | None = None, /, *, ledger_path: str | os.PathLike | None = None, **fields
) -> None:
    """Raise if the planned release (``check``, or a :class:`BudgetCheck` of ``fields``) would
    exceed a cap or change the dataset's data (writes nothing; :func:`reserve` also holds the
    budget). A ledger file that does not exist holds no cap and no identity to check against:
    nothing is checked and nothing is created."""
    check = check or BudgetCheck(**fields)
    if ledger_missing(resolve_ledger(ledger_path)):
        return
    planned = {name: value for name, value in vars(check).items() if name != "mechanism"}
    with open_ledger(ledger_path, create=False) as ledger:
        ledger.preflight(**planned, exclude_reservations=_HELD.get())


def publish(
    release: Release,
    out_dir: str | os.PathLike,
    *,
    ledger_path: str | os.PathLike | None = None,
    record: bool = True,
) -> Path:
    """Write ``release.json`` under ``out_dir`` and put the release in the ledger.

    Inside a session with a reservation, the release is recorded when the session ends, together
    with closing the reservation (one transaction); otherwise it is recorded now."""
    path = write_release(release, out_dir)
    if record:
        artefact = str(Path(out_dir).resolve())
        session = _SESSION.get()
        if session is not None and session.reservation_id is not None:
            session.published.append((release, artefact))
            return path
        with open_ledger(ledger_path) as ledger:
            ledger.record(release, artefact_path=artefact)
    return path


# ---------------------------------------------------------------- the one release skeleton


@budget_session
def release(
    mechanism,
    request,
    *,
    out_dir: str | os.PathLike | None = None,
    ledger_path: str | os.PathLike | None = None,
    record: bool = True,
    progress=None,
    prepared=None,
):
    """Make one release of ``mechanism`` (a :class:`~dpaudit.mechanisms.contract.MechanismBase` or
    its catalogue name) for ``request``: the one order every release follows.

    1. validate the request (``mechanism.validate``), and an explicit ``out_dir`` (a bad one
       fails before anything is loaded, reserved or computed);
    2. load the data (``mechanism.load``; ``prepared``: already loaded data handed to it);
    3. plan from public facts only (``mechanism.plan``): event, calibrated noise, config;
    4. refuse a Gaussian run whose sampler tails exceed 1 % of delta (``plan.noise_values``);
    5. reserve the budget of ``plan.event`` in the ledger (check, then commit:
       :func:`reserve`; ``record=False`` only checks);
    6. make the noise source (secret unless the request asks for reproducible noise);
    7. run (``mechanism.run``) on the private data;
    8. verify the claim (:func:`verify_planned_claim`; a mismatch publishes nothing and cancels the
       reservation); the comparison epsilons (``plan.compare_accountants``, public parameters only)
       are computed by a child process from step 5 on (``comparisons_ahead``);
    9. build the :class:`~dpaudit.records.Release` (with the request) and :func:`publish` it.

    A multi-release plan (``plan.parts``, e.g. DP-MixMin's mixture weights then its fine-tuned
    head) reserves its combined ``plan.event`` once; ``run`` returns one output per part
    (``RunOutput.parts``); each part's claim is verified against its own event and target; the
    plan's partition declarations are made (recorded runs only), then every part is published
    under ``out_dir / part.out_subdir`` and all are settled with the one reservation.

    Returns the Release (the last part's for a multi-release plan).
    """
    mech = registry.mechanism(mechanism) if isinstance(mechanism, str) else mechanism
    request = mech.validate(request)
    # a typo costs no ledger entry
    one_of("noise_source", getattr(request, "noise_source", "os-entropy"), NOISE_SOURCES)
    seed_file = planned_secret_seed(request)
    out_dir = check_release_folder(check_out_dir(out_dir)) if out_dir is not None else None
    t0 = time.perf_counter()
    load_kw = {"ledger_path": ledger_path} if mech.load_uses_ledger else {}
    if prepared is not None:
        load_kw["prepared"] = prepared
    phase("loading the data")
    data = mech.load(request, **load_kw)
    info = mech.data_info(request, data)
    plan = mech.plan(request, info)
    out_dir = Path(out_dir or check_release_folder(check_out_dir(mech.default_out_dir(plan))))
    # The comparison epsilons depend on public parameters only: a child computes them meanwhile.
    # Remembered answers of the same computations (ledger.result_cache, on inside a command) spare the child.
    with comparisons_ahead(_comparisons(plan), memory=result_cache):
        phase("reserving the budget in the ledger")
        _reserve_plan(plan, info, data, request, ledger_path=ledger_path, record=record)
        seed_use, noise = _release_noise(request, plan, seed_file)
        phase("training")
        setup_seconds = time.perf_counter() - t0
        releases, outputs = _run_verified(mech, plan, data, noise, out_dir, setup_seconds, progress)
    if seed_use is not None:  # local only: which secret the noise came from (never release.json)
        releases = [dataclasses.replace(r, noise_seed_file=str(seed_use.path)) for r in releases]
    phase("writing the release and recording it in the ledger")
    last = _publish_all(
        mech, plan, releases, outputs, out_dir, ledger_path=ledger_path, record=record
    )
    if seed_use is not None:
        record_noise_seed_releases(seed_use, [r.id for r in releases])
    return last


def _comparisons(plan) -> list:
    """The comparison epsilons' inputs of every private part of ``plan``."""
    parts = plan.parts or (plan,)
    return [
        (p.event, p.delta, p.adjacency, p.compare_accountants) for p in parts if p.event is not None
    ]


def _release_noise(request, plan, seed_file) -> tuple:
    """(seed use, noise source) of a release: a new use of the secret seed file, claimed (on
    disk) before any of its noise is drawn, else None."""
    seed_use = None if seed_file is None else read_noise_seed(seed_file)
    _SESSION.get().seed_use = seed_use
    return seed_use, make_noise_source(
        seed=int(getattr(request, "seed", plan.seed)),
        reproducible_noise=bool(getattr(request, "reproducible_noise", False)),
        noise_source=getattr(request, "noise_source", "os-entropy"),
        secret_seed=seed_use,
    )


def _run_verified(mech, plan, data, noise, out_dir: Path, setup_seconds: float, progress):
    """(every part's Release, its claim verified, nothing written yet; the run's outputs) of
    running ``plan``."""
    timings = {"setup_seconds": setup_seconds}
    t1 = time.perf_counter()
    output = mech.run(plan, data, noise, progress=progress)
    timings["train_seconds"] = time.perf_counter() - t1
    parts, outputs = plan.parts or (plan,), output.parts if plan.parts else (output,)
    if len(outputs) != len(parts):
        raise AccountingMismatchError(
            f"run outputs must match the plan's {len(parts)} release(s), got {len(outputs)}."
        )
    return [
        build_release(
            mech,
            part,
            out,
            noise=noise,
            out_dir=out_dir / part.out_subdir,
            data=data,
            timings=timings if part.time_run else None,
        )
        for part, out in zip(parts, outputs)
    ], outputs


def _publish_all(mech, plan, releases: list, outputs, out_dir: Path, *, ledger_path, record):
    """Link, write, declare and publish the verified releases (the commit half); the last one."""
    parts = plan.parts or (plan,)
    session = _SESSION.get()
    # from here on, outputs may exist on disk: an interrupt keeps the budget spent
    if session is not None:
        session.writing = str(out_dir)
    if plan.parts:
        releases = list(mech.link_releases(plan, releases))
    for part, out in zip(parts, outputs):  # each folder was checked writable before the run
        _write_artefacts(out, out_dir / part.out_subdir)
    for d in plan.declarations if record else ():
        declare_partition(d, ledger_path)
    for part, rel in zip(parts, releases):
        publish(rel, out_dir / part.out_subdir, ledger_path=ledger_path, record=record)
    if plan.parts:
        mech.after_publish(plan, releases, out_dir)
    return releases[-1]


def _write_artefacts(output, folder: Path) -> None:
    """The run's artefacts into ``folder``: written by its ``save``, else its arrays (``.npz``)."""
    folder.mkdir(parents=True, exist_ok=True)
    if output.save is not None:
        output.save(folder)
    elif output.arrays is not None:
        np.savez(folder / output.weights_name, **output.arrays)


def _reserve_plan(plan, info, data, request, *, ledger_path, record) -> None:
    """Check, then commit: the budget of ``plan`` is checked and held before the private data are
    used; a multi-release plan reserves its combined event (``plan.event``) once, for all its parts."""
    # public sizes: refuses an over-large tail before any work
    planned_tail = planned_noise_tail(plan)
    seeded = public_seed_reason(
        getattr(request, "seed", plan.seed),
        plan.event,
        getattr(request, "reproducible_noise", False),
    )
    check = BudgetCheck(
        dataset=plan.data_name or info.name,
        partition=plan.partition,
        event=plan.event,
        adjacency=plan.adjacency,
        data_digest=getattr(data, "sha256", None),
        data_info={"split_seed": info.split_seed, "profile": info.profile},
        uncertified=plan.uncertified or seeded,
        mechanism=plan.mechanism,
        noise_tail_delta=planned_tail,
        data_rows=getattr(data, "rows", None) or None,
    )
    reserve(check, ledger_path=ledger_path, record=record)


def declare_partition(declaration, ledger_path=None) -> None:
    """Declare ``declaration`` (:class:`~dpaudit.mechanisms.contract.PartitionDeclaration`):
    its parent splits into disjoint children in the ledger."""
    with open_ledger(ledger_path) as ledger:
        ledger.declare_partition(**vars(declaration))  # its fields are the ledger's arguments


def verify_planned_claim(plan, steps_executed: int) -> tuple[float, dict]:
    """(claimed epsilon, epsilons by accountant) of ``plan``, recomputed from its event.

    Raises :class:`~dpaudit.errors.AccountingMismatchError` when ``steps_executed`` differs from
    ``plan.steps`` or the recomputed epsilon exceeds ``plan.target_epsilon``. A non-private plan
    (event None) claims nothing: ``(inf, {})``.
    """
    if plan.event is None:
        return float("inf"), {}
    claimed = compute_epsilon(
        plan.event, delta=plan.delta, accountant=plan.accountant, adjacency=plan.adjacency
    ).epsilon
    check_accounting(
        steps_executed=int(steps_executed),
        steps_accounted=int(plan.steps),
        epsilon=claimed,
        target_epsilon=plan.target_epsilon,
    )
    return claimed, {
        plan.accountant: claimed,
        **comparison_epsilons(plan.event, plan.delta, plan.adjacency, plan.compare_accountants),
    }


#: Release fields the plan gives as they are (``dataset``: the public identity only; the digest
#: stays local, ``data_digest``).
_FROM_PLAN = "mechanism dataset adjacency accountant delta partition privacy_unit".split()


def build_release(
    mech, plan, output, *, noise, out_dir, data=None, timings: dict | None = None
) -> Release:
    """The :class:`Release` of a verified run (:func:`verify_planned_claim` runs here: an unverified claim
    never becomes a Release)."""
    claimed, epsilons = verify_planned_claim(plan, output.steps_executed)
    times = {**(timings or {}), **output.timings}
    if getattr(noise, "replay_of", None) is not None:
        raise UsageError(
            f"noise must be fresh for a release, got the replayed noise of release "
            f"{noise.replay_of} (a second release from the same noise would reveal the "
            f"difference of their data)."
        )
    return Release(
        **{name: getattr(plan, name) for name in _FROM_PLAN},
        epsilon=claimed,
        guarantee={"type": "non-private"} if plan.event is None else plan.event.to_dict(),
        seed=int(plan.seed),
        noise_source=noise.spec.to_dict(),
        target_epsilon=None if plan.event is None else plan.target_epsilon,
        steps=int(plan.steps),
        steps_executed=int(output.steps_executed),
        non_private=plan.event is None,
        epsilons=epsilons,
        config={**plan.config, **output.config},
        metrics=output.metrics,  # evaluation data outside the DP claim (Release docstring)
        # published rounded (data-dependent); exact ones in local.json
        timings=round_timings(times),
        exact_timings=times,
        # never published; the ledger keeps a keyed fingerprint
        data_digest=getattr(data, "sha256", None),
        artefacts=_artefacts(mech, output, out_dir),
        command=mech.command_line(plan, out_dir),  # derived from the request, never parsed back
        request=plan.request.to_dict() if hasattr(plan.request, "to_dict") else None,
        **_release_fields(plan, output, claimed),
    )


def _release_fields(plan, output, claimed: float) -> dict:
    """The plan's and the run's further Release fields, with a Gaussian mechanism's sampler tail
    delta (none drawn when non-private)."""
    fields = {**plan.release_fields, **output.release_fields}
    values = output.noise_values if output.noise_values is not None else plan.noise_values
    if values is not None:
        fields["noise_tail_delta"] = (
            0.0
            if plan.event is None
            else _noise_tail(plan, values, claimed, what=output.noise_what)
        )
    return fields


def _artefacts(mech, output, out_dir) -> dict:
    """The release's artefacts: the run's, its weights file, the files ``save`` wrote (resolved)."""
    artefacts = dict(output.artefacts)
    if (output.arrays is not None or output.save is not None) and output.weights_name:
        artefacts.setdefault("weights", output.weights_name)
    for key, rel_path in output.artefact_paths.items():
        artefacts[key] = str((Path(out_dir) / rel_path).resolve())
    if mech.record_out_dir:  # releases of this mechanism have always named their folder
        artefacts["out_dir"] = str(out_dir)
    return artefacts


def planned_noise_tail(plan) -> float:
    """The sampler tail delta (dpaudit.noise) the run of ``plan`` will add, from public sizes at
    the target epsilon: an upper bound on its releases' (the tail grows with epsilon), held with
    the budget by :func:`reserve`. Refuses (UsageError) a part whose tail is too large, before any
    work; 0 for parts without Gaussian noise or without a claim."""
    total = 0.0
    for part in plan.parts or (plan,):
        if part.event is not None and part.noise_values is not None:
            total += _noise_tail(part, part.noise_values, part.target_epsilon)
    return total


def _noise_tail(plan, values: int, epsilon, *, what: str | None = None) -> float:
    return gaussian_run_tail(
        1, int(values), float(epsilon), plan.delta, what=what or plan.noise_what
    )
