"""The common tail of every training command: noise source, budget reservation, publish.

Order matters (DESIGN.md, "check, then commit; fail closed"):

1. :func:`reserve` checks the planned release against the ledger (budget cap, dataset identity)
   *before* any training and, in the same write transaction, holds its budget with a
   ``reservation`` entry, so runs started at the same time cannot together exceed a cap.
2. :func:`publish` writes ``release.json``.
3. When the run ends, the reservation is closed: *settled* (the published releases are recorded
   and the reservation closed in one transaction) or *cancelled* (the run failed or was
   interrupted before publishing anything). A run killed before that leaves its reservation
   open: the budget stays spent until an operator voids it (``dpaudit ledger void ID``).

Steps 1-3 share one :func:`release_session` (a context manager; :func:`budget_session` is the
same as a function decorator), used by every release path: DP-SGD (record and user level),
DP-ELM and DP-MixMin (whose two releases settle one combined reservation).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .accounting.events import Event
from .errors import UsageError
from .noise import NoiseSource
from .records import Release, write_release


def make_noise_source(*, seed: int, reproducible_noise: bool = False, noise_source: str = "os-entropy") -> NoiseSource:
    """DP noise generator: secret by default; derived from ``seed`` only on explicit request."""
    if reproducible_noise:
        return NoiseSource("reproducible", seed=seed)
    return NoiseSource(noise_source)


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
        from .accounting.ledger import open_ledger

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


def reserve(
    *,
    dataset: str,
    partition: str,
    event: Event | None,
    adjacency: str,
    ledger_path: str | os.PathLike | None = None,
    record: bool = True,
    data_digest: str | None = None,
    data_info: dict | None = None,
    uncertified: str | None = None,
    mechanism: str = "",
) -> str | None:
    """Check the planned release and hold its budget before training; returns the reservation id.

    Raises :class:`~dpaudit.errors.BudgetExceededError` (over a cap) or
    :class:`~dpaudit.errors.DatasetIdentityError` (``data_digest`` differs from the dataset's
    recorded versions) and writes nothing then. ``event`` None is a non-private release;
    ``uncertified`` (a reason) one whose guarantee cannot be certified: both count as unbounded.
    ``record=False`` (the release will not be recorded here, e.g. a sweep worker whose
    coordinator records it) only checks. Must run inside :func:`release_session`."""
    if not record:
        preflight(dataset=dataset, partition=partition, event=event, adjacency=adjacency, ledger_path=ledger_path,
                  data_digest=data_digest, data_info=data_info, uncertified=uncertified)
        return None
    session = _SESSION.get()
    if session is None:
        raise RuntimeError("reserve() must run inside releasing.release_session() (or a @budget_session function), "
                           "so that the reservation is settled or cancelled when the run ends.")
    if session.reservation_id is not None:
        raise UsageError(f"a run must reserve its budget once (reserve the combined event), got a second reservation "
                         f"after {session.reservation_id}.")
    from .accounting.ledger import open_ledger

    with open_ledger(ledger_path) as ledger:
        rid = ledger.reserve(dataset=dataset, partition=partition, event=event, adjacency=adjacency, data_digest=data_digest,
                             data_info=data_info, uncertified=uncertified, mechanism=mechanism)
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


def preflight(
    *,
    dataset: str,
    partition: str,
    event: Event | None,
    adjacency: str,
    ledger_path: str | os.PathLike | None = None,
    data_digest: str | None = None,
    data_info: dict | None = None,
    uncertified: str | None = None,
) -> None:
    """Raise if the planned release would exceed a cap or change the dataset's data (writes nothing;
    :func:`reserve` also holds the budget)."""
    from .accounting.ledger import open_ledger

    with open_ledger(ledger_path) as ledger:
        ledger.preflight(dataset=dataset, partition=partition, event=event, adjacency=adjacency, data_digest=data_digest,
                         data_info=data_info, uncertified=uncertified, exclude_reservations=_HELD.get())


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
        from .accounting.ledger import open_ledger

        with open_ledger(ledger_path) as ledger:
            ledger.record(release, artefact_path=artefact)
    return path


def _first_line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__
