"""The common tail of every training command: noise source, budget reservation, publish.

Order matters ("check, then commit; fail closed", docs/architecture.md):

1. :func:`reserve` checks the planned release against the ledger (budget cap, dataset identity)
   *before* any training and, in the same write transaction, holds its budget with a
   ``reservation`` entry, so runs started at the same time cannot together exceed a cap.
2. :func:`publish` writes ``release.json``.
3. When the run ends, the reservation is closed: *settled* (the published releases are recorded
   and the reservation closed in one transaction) or *cancelled* (the run failed or was
   interrupted before publishing anything). A run killed before that leaves its reservation
   open: the budget stays spent until an operator voids it (``dpaudit ledger void ID``).

:func:`release` is the one skeleton every mechanism's release runs through (the contract:
:mod:`dpaudit.mechanisms.contract`); steps 1-3 share one :func:`release_session`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .accounting import compute_epsilon
from .accounting.accountants import comparison_epsilons, comparisons_ahead
from .accounting.events import Event
from .errors import AccountingMismatchError, UsageError
from .lazy import lazy_import
from .ledger import result_cache
from .ledger.book import open_ledger
from .ledger.paths import ledger_missing, resolve_ledger
from .mechanisms import registry
from .noise import NoiseSource, NoiseSpec, gaussian_run_tail
from .records import Release, check_accounting, check_out_dir, check_release_folder, public_noise_reason, round_timings, write_release
from .requests import NOISE_SOURCES
from .validation import one_of
np = lazy_import("numpy")


def make_noise_source(*, seed: int, reproducible_noise: bool = False, noise_source: str = "os-entropy",
                      secret_seed: int | None = None) -> NoiseSource:
    """DP noise generator: secret by default; derived from ``seed`` only on explicit request;
    from ``secret_seed`` (read by :func:`read_noise_seed`, never recorded) when given."""
    one_of("noise_source", noise_source, NOISE_SOURCES)
    if secret_seed is not None:
        return NoiseSource("reproducible-secret", seed=secret_seed)
    if reproducible_noise:
        return NoiseSource("reproducible", seed=seed)
    return NoiseSource(noise_source)


#: Hex digits of a secret noise seed written by :func:`read_noise_seed` (256 bits) and the fewest
#: it accepts (128 bits).
_SEED_HEX, _MIN_SEED_HEX = 64, 32
_NOISE_SEED_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("dpaudit_noise_seed_file", default=None)


@contextlib.contextmanager
def secret_noise_seed(path: str | os.PathLike | None) -> Iterator[None]:
    """Within this block, releases draw their DP noise reproducibly from the secret noise seed in
    the file ``path`` (``--noise-seed-file``; created with 256 fresh bits when absent): the same
    file gives the same noise, and the seed is never published (release.json records the source
    ``reproducible-secret`` without a seed; ``local.json`` names the file). None: no effect."""
    token = _NOISE_SEED_FILE.set(None if path is None else Path(path).expanduser())
    try:
        yield
    finally:
        _NOISE_SEED_FILE.reset(token)


def read_noise_seed(path: Path) -> int:
    """The secret noise seed in ``path`` (hex digits, at least 128 bits); a missing file is created
    (mode 0600) with 256 bits from the OS. Its content is never printed."""
    rule = f"a file holding one secret of at least {_MIN_SEED_HEX} hex digits"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as e:
        raise UsageError(f"noise seed file must be {rule}, got {str(path)!r} (cannot create it: {e.strerror}).") from None
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(_SEED_HEX // 2) + "\n")
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"noise seed file must be {rule}, got {str(path)!r} (unreadable: {type(e).__name__}).") from None
    if len(text) < _MIN_SEED_HEX or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise UsageError(f"noise seed file must be {rule}, got {str(path)!r} ({len(text)} characters, not all hex digits or too few).")
    return int(text, 16)


def planned_secret_seed(request) -> tuple[int | None, str | None]:
    """(secret noise seed, its file) when :func:`secret_noise_seed` is in effect, else (None, None);
    refuses (UsageError) a request that also asks for another noise source, before anything is reserved."""
    path = _NOISE_SEED_FILE.get()
    if path is None:
        return None, None
    if getattr(request, "reproducible_noise", False) or getattr(request, "noise_source", "os-entropy") != "os-entropy":
        raise UsageError("noise seed file must not be combined with --reproducible-noise or --noise-source, got both.")
    return read_noise_seed(path), str(path.resolve())


def public_seed_reason(seed: int, event, reproducible_noise) -> str | None:
    """Why a planned release of ``event`` will not be private because its noise is derived from the
    published ``seed`` (:func:`dpaudit.records.public_noise_reason`), else None; checked before
    training, so the reservation counts it as unbounded and a capped dataset refuses it."""
    if event is None or not reproducible_noise:
        return None
    return public_noise_reason(NoiseSpec("reproducible", int(seed)).to_dict())


@dataclass
class ReleaseSession:
    """One run's budget reservation and the releases it published (see the module docstring)."""

    ledger_path: str | os.PathLike | None = None
    reservation_id: str | None = None
    published: list = field(default_factory=list)  # (Release, artefact path) not yet recorded
    settled: list = field(default_factory=list)  # release ids recorded when the session closed

    def close(self, error: BaseException | None = None) -> None:
        """Settle the published releases with the reservation, or cancel it when there are none."""
        if self.reservation_id is None:
            return
        with open_ledger(self.ledger_path) as ledger:
            if self.published:
                # Released files exist even when the run failed afterwards: they are recorded.
                self.settled = ledger.settle(self.reservation_id, self.published)
            else:
                what = "the run ended without a release" if error is None else \
                    f"the run failed before releasing anything ({type(error).__name__}: {_first_line(error)})"
                ledger.cancel(self.reservation_id, what)
        self.reservation_id = None


_SESSION: contextvars.ContextVar[ReleaseSession | None] = contextvars.ContextVar("dpaudit_release_session", default=None)


@contextlib.contextmanager
def release_session() -> Iterator[ReleaseSession]:
    """Scope of one run: :func:`reserve` and :func:`publish` inside it settle or cancel the
    reservation when it ends (on any exception too, KeyboardInterrupt included). An error while
    closing never hides the run's own error; the reservation then stays open (spent)."""
    session = ReleaseSession()
    token = _SESSION.set(session)
    try:
        yield session
    except BaseException as e:
        _SESSION.reset(token)
        try:
            session.close(error=e)
        except Exception as close_error:  # noqa: BLE001 - the run's own error is the one to raise
            e.add_note(f"dpaudit: budget reservation {session.reservation_id} stays open (spent) because closing it failed: "
                       f"{_first_line(close_error)}; void it with `dpaudit ledger void {session.reservation_id} --reason ...`.")
        raise
    _SESSION.reset(token)
    session.close()


def budget_session(fn):
    """Decorator: run ``fn`` inside its own :func:`release_session`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with release_session():
            return fn(*args, **kwargs)

    return wrapper


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

    def keywords(self, *, mechanism: bool = True) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if mechanism or f.name != "mechanism"}


def reserve(check: BudgetCheck | None = None, /, *, ledger_path: str | os.PathLike | None = None, record: bool = True, **fields) -> str | None:
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
        raise RuntimeError("reserve() must run inside releasing.release_session() (or a @budget_session function), "
                           "so that the reservation is settled or cancelled when the run ends.")
    if session.reservation_id is not None:
        raise UsageError(f"a run must reserve its budget once (reserve the combined event), got a second reservation "
                         f"after {session.reservation_id}.")
    with open_ledger(ledger_path) as ledger:
        rid = ledger.reserve(**check.keywords())
    session.ledger_path = ledger_path
    session.reservation_id = rid
    return rid


#: Reservations held on this run's behalf by someone else (a sweep's coordinator holds the whole
#: sweep's budget): the run's own pre-check must not count them again (see :func:`held_by_caller`).
_HELD: contextvars.ContextVar[tuple] = contextvars.ContextVar("dpaudit_held_reservations", default=())


@contextlib.contextmanager
def held_by_caller(reservation_ids) -> Iterator[None]:
    """Within this block, :func:`preflight` leaves ``reservation_ids`` out of the spent budget.

    For a sweep worker: its coordinator reserved the budget of every task of the sweep in one
    atomic check before dispatching them, so the task's own planned release is already inside
    those reservations; counting them again would refuse the sweep against itself. The worker's
    pre-check still enforces the cap against everything else and checks the data identity."""
    token = _HELD.set(tuple(reservation_ids or ()))
    try:
        yield
    finally:
        _HELD.reset(token)


def preflight(check: BudgetCheck | None = None, /, *, ledger_path: str | os.PathLike | None = None, **fields) -> None:
    """Raise if the planned release (``check``, or a :class:`BudgetCheck` of ``fields``) would
    exceed a cap or change the dataset's data (writes nothing; :func:`reserve` also holds the
    budget). A ledger file that does not exist holds no cap and no identity to check against:
    nothing is checked and nothing is created."""
    check = check or BudgetCheck(**fields)
    if ledger_missing(resolve_ledger(ledger_path)):
        return
    with open_ledger(ledger_path, create=False) as ledger:
        ledger.preflight(**check.keywords(mechanism=False), exclude_reservations=_HELD.get())


def publish(release: Release, out_dir: str | os.PathLike, *, ledger_path: str | os.PathLike | None = None, record: bool = True) -> Path:
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
    """Make one release of ``mechanism`` (a :class:`~dpaudit.mechanisms.contract.Mechanism` or
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
    with release_session():
        return _release_in_session(mech, request, out_dir=out_dir, ledger_path=ledger_path, record=record, progress=progress,
                                   prepared=prepared)


def _release_in_session(mech, request, *, out_dir, ledger_path, record, progress, prepared):
    request = mech.validate(request)
    one_of("noise_source", getattr(request, "noise_source", "os-entropy"), NOISE_SOURCES)  # a typo costs no ledger entry
    secret_seed, seed_file = planned_secret_seed(request)
    out_dir = check_release_folder(check_out_dir(out_dir)) if out_dir is not None else None
    t0 = time.perf_counter()
    load_kw = {"ledger_path": ledger_path} if mech.load_uses_ledger else {}
    data = mech.load(request, **load_kw) if prepared is None else mech.load(request, prepared=prepared, **load_kw)
    info = mech.data_info(request, data)
    plan = mech.plan(request, info)
    out_dir = Path(out_dir if out_dir is not None else check_release_folder(check_out_dir(mech.default_out_dir(plan))))
    # The comparison epsilons depend on public parameters only: a child computes them meanwhile.
    # Remembered answers of the same computations (ledger.result_cache, on inside a command) spare the child.
    with comparisons_ahead([(p.event, p.delta, p.adjacency, p.compare_accountants) for p in plan.parts or (plan,) if p.event is not None],
                           memory=result_cache):
        _reserve_plan(plan, info, data, request, ledger_path=ledger_path, record=record)
        noise = make_noise_source(seed=int(getattr(request, "seed", plan.seed)), reproducible_noise=bool(getattr(request, "reproducible_noise", False)),
                                  noise_source=getattr(request, "noise_source", "os-entropy"), secret_seed=secret_seed)
        releases, outputs = _run_verified(mech, plan, data, noise, out_dir, setup_seconds=time.perf_counter() - t0, progress=progress)
    if seed_file is not None:  # local only: which secret the noise came from (never release.json)
        releases = [dataclasses.replace(r, noise_seed_file=seed_file) for r in releases]
    return _publish_all(mech, plan, releases, outputs, out_dir, ledger_path=ledger_path, record=record)


def _run_verified(mech, plan, data, noise, out_dir: Path, *, setup_seconds: float, progress) -> tuple[list, tuple]:
    """Run ``plan`` and build every part's Release, its claim verified (nothing written yet)."""
    timings = {"setup_seconds": setup_seconds}
    t1 = time.perf_counter()
    output = mech.run(plan, data, noise, progress=progress)
    timings["train_seconds"] = time.perf_counter() - t1
    parts, outputs = plan.parts or (plan,), output.parts if plan.parts else (output,)
    if len(outputs) != len(parts):
        raise AccountingMismatchError(f"run outputs must match the plan's {len(parts)} release(s), got {len(outputs)}.")
    releases = [build_release(mech, part, out, noise=noise, out_dir=out_dir / part.out_subdir, data=data,
                              timings=timings if part.time_run else None) for part, out in zip(parts, outputs)]
    return releases, outputs


def _publish_all(mech, plan, releases: list, outputs, out_dir: Path, *, ledger_path, record):
    """Link, write, declare and publish the verified releases (the commit half); the last one."""
    parts = plan.parts or (plan,)
    if plan.parts:
        releases = list(mech.link_releases(plan, releases))
    for part, out in zip(parts, outputs):  # each folder was checked writable before the run
        folder = out_dir / part.out_subdir
        folder.mkdir(parents=True, exist_ok=True)
        if out.save is not None:
            out.save(folder)
        elif out.arrays is not None:
            np.savez(folder / out.weights_name, **out.arrays)
    for d in plan.declarations if record else ():
        declare_partition(d, ledger_path)
    for part, rel in zip(parts, releases):
        publish(rel, out_dir / part.out_subdir, ledger_path=ledger_path, record=record)
    if plan.parts:
        mech.after_publish(plan, releases, out_dir)
    return releases[-1]


def _reserve_plan(plan, info, data, request, *, ledger_path, record) -> None:
    """Check, then commit: the budget of ``plan`` is checked and held before the private data are
    used; a multi-release plan reserves its combined event (``plan.event``) once, for all its parts."""
    planned_tail = planned_noise_tail(plan)  # public sizes: refuses an over-large tail before any work
    seeded = public_seed_reason(getattr(request, "seed", plan.seed), plan.event, getattr(request, "reproducible_noise", False))
    check = BudgetCheck(dataset=plan.data_name or info.name, partition=plan.partition, event=plan.event, adjacency=plan.adjacency,
                        data_digest=getattr(data, "sha256", None), data_info={"split_seed": info.split_seed, "profile": info.profile},
                        uncertified=plan.uncertified or seeded, mechanism=plan.mechanism, noise_tail_delta=planned_tail,
                        data_rows=getattr(data, "rows", None) or None)
    reserve(check, ledger_path=ledger_path, record=record)


def declare_partition(declaration, ledger_path=None) -> None:
    """Declare ``declaration`` (:class:`~dpaudit.mechanisms.contract.PartitionDeclaration`):
    its parent splits into disjoint children in the ledger."""
    with open_ledger(ledger_path) as ledger:
        ledger.declare_partition(declaration.dataset, declaration.parent, tuple(declaration.children), declaration.declared_by)


def verify_planned_claim(plan, steps_executed: int) -> tuple[float, dict]:
    """(claimed epsilon, epsilons by accountant) of ``plan``, recomputed from its event.

    Raises :class:`~dpaudit.errors.AccountingMismatchError` when ``steps_executed`` differs from
    ``plan.steps`` or the recomputed epsilon exceeds ``plan.target_epsilon``. A non-private plan
    (event None) claims nothing: ``(inf, {})``.
    """
    if plan.event is None:
        return float("inf"), {}
    claimed = compute_epsilon(plan.event, delta=plan.delta, accountant=plan.accountant, adjacency=plan.adjacency).epsilon
    check_accounting(steps_executed=int(steps_executed), steps_accounted=int(plan.steps), epsilon=claimed, target_epsilon=plan.target_epsilon)
    return claimed, {plan.accountant: claimed, **comparison_epsilons(plan.event, plan.delta, plan.adjacency, plan.compare_accountants)}


def build_release(mech, plan, output, *, noise, out_dir, data=None, timings: dict | None = None) -> Release:
    """The :class:`Release` of a verified run (:func:`verify_planned_claim` runs here: an unverified claim
    never becomes a Release)."""
    claimed, epsilons = verify_planned_claim(plan, output.steps_executed)
    times = {**(timings or {}), **output.timings}
    fields = {**plan.release_fields, **output.release_fields}
    values = output.noise_values if output.noise_values is not None else plan.noise_values
    if values is not None:  # a Gaussian mechanism: its sampler's tail delta (none drawn when non-private)
        fields["noise_tail_delta"] = 0.0 if plan.event is None else _noise_tail(plan, values, claimed, what=output.noise_what)
    request = plan.request
    command = mech.command_line(plan, out_dir)  # derived from the request, never parsed back
    extra = {}
    if hasattr(request, "to_dict") and "request" in {f.name for f in dataclasses.fields(Release)}:
        extra["request"] = request.to_dict()
    artefacts = dict(output.artefacts)
    if (output.arrays is not None or output.save is not None) and output.weights_name:
        artefacts.setdefault("weights", output.weights_name)
    for key, rel_path in output.artefact_paths.items():  # written by save(); recorded resolved
        artefacts[key] = str((Path(out_dir) / rel_path).resolve())
    if mech.record_out_dir:  # releases of this mechanism have always named their folder
        artefacts["out_dir"] = str(out_dir)
    return Release(
        mechanism=plan.mechanism,
        dataset=plan.dataset,  # public identity only; the digest stays local (data_digest)
        adjacency=plan.adjacency,
        accountant=plan.accountant,
        epsilon=claimed,
        delta=plan.delta,
        guarantee={"type": "non-private"} if plan.event is None else plan.event.to_dict(),
        seed=int(plan.seed),
        noise_source=noise.spec.to_dict(),
        target_epsilon=None if plan.event is None else plan.target_epsilon,
        steps=int(plan.steps),
        steps_executed=int(output.steps_executed),
        partition=plan.partition,
        privacy_unit=plan.privacy_unit,
        non_private=plan.event is None,
        epsilons=epsilons,
        config={**plan.config, **output.config},
        metrics=output.metrics,  # evaluation data outside the DP claim (Release docstring)
        timings=round_timings(times),  # published rounded (data-dependent); exact ones in local.json
        exact_timings=times,
        data_digest=getattr(data, "sha256", None),  # never published; the ledger keeps a keyed fingerprint
        artefacts=artefacts,
        command=command,
        **fields,
        **extra,
    )


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
    return gaussian_run_tail(1, int(values), float(epsilon), plan.delta, what=what or plan.noise_what)


def _first_line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__
