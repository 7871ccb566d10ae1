"""What a failed run's error says about its budget reservation when the session closes it.

Pins the notes a release session adds to the run's own error: closing failed (the reservation stays
spent), kept open because release files may exist, and nothing added when it was cancelled."""

from __future__ import annotations

import contextlib

from dpaudit import releasing


class _Ledger:
    def __init__(self):
        self.cancelled = []

    def cancel(self, rid, what):
        self.cancelled.append((rid, what))


def _closed(monkeypatch, session, ledger=None) -> RuntimeError:
    @contextlib.contextmanager
    def open_ledger(path, **kwargs):
        if ledger is None:
            raise OSError("disk gone")
        yield ledger

    monkeypatch.setattr(releasing, "open_ledger", open_ledger)
    error = RuntimeError("boom")
    releasing._close_session(session, error)
    return error


def test_a_failed_close_keeps_the_reservation_spent_and_says_so(monkeypatch):
    session = releasing.ReleaseSession(reservation_id="r1")
    error = _closed(monkeypatch, session)
    assert error.__notes__ == [
        "dpaudit: budget reservation r1 kept as spent because closing it failed "
        "(disk gone; `dpaudit ledger void r1 --reason ...`)."
    ]
    assert session.outcome in error.__notes__[0]


def test_a_reservation_kept_open_for_written_files_is_noted(monkeypatch):
    session = releasing.ReleaseSession(reservation_id="r2", writing="/some/out")
    error = _closed(monkeypatch, session, _Ledger())
    assert error.__notes__ == [
        "dpaudit: budget reservation r2 kept as spent because release files may have been "
        "written to /some/out (delete them, then `dpaudit ledger void r2 --reason ...`)."
    ]
    assert session.reservation_id is None


def test_a_cancelled_reservation_adds_no_note(monkeypatch):
    ledger = _Ledger()
    session = releasing.ReleaseSession(reservation_id="r3")
    error = _closed(monkeypatch, session, ledger)
    assert not hasattr(error, "__notes__")
    assert ledger.cancelled == [
        ("r3", "the run failed before releasing anything (RuntimeError: boom)")
    ]
    assert session.outcome == "reservation r3 cancelled, nothing was released"
