"""Property: whatever a registered member key does -- append through the API, try the owner's
entries through the API, or with write access to the SQLite file delete, reorder, re-sign, or
insert entries it signs itself -- the ledger's budget answers either fail closed or report a cap
the owner set and a spend no lower than what the owner last sealed (docs/ledger.md, "Who may write what").
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpaudit.errors import LedgerAuthorityError, LedgerVerificationError
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger


def _authority_tests():
    """tests/ledger/test_authority_model.py as a module (its keys, releases and direct inserts)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "authority_model_helpers", Path(__file__).with_name("test_authority_model.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_am = _authority_tests()
ALICE, OWNER, release, signed_insert = _am.ALICE, _am.OWNER, _am.release, _am.signed_insert

CAP = (3.0, 1e-5)


def _setup(path: Path) -> float:
    """owner, alice, the owner's cap, two releases by alice, sealed; returns the sealed spend."""
    with open_ledger(path, signing_key=OWNER) as led:
        led.register_key()
        led.register_key(ALICE.public_text, "alice")
        led.cap("toy", *CAP)
    with open_ledger(path, signing_key=ALICE) as led:
        led.record(release(0))
        led.record(
            dataclasses.replace(release(1), partition="x")
        )  # a declared split of train and x would halve the total
    with open_ledger(path, signing_key=OWNER) as led:
        led.seal()
    return _observe(path)[0]


def _observe(path: Path):
    """(spend, cap) from a budget answer with the owner pinned, or None when it fails closed."""
    try:
        with open_ledger(path, signing_key=None, owner=OWNER.key_id) as led:
            row = next(
                (
                    r
                    for r in led.summary(accountants=("rdp",))
                    if r["dataset"] == "toy" and r["partition"] == "*"
                ),
                None,
            )
    except LedgerVerificationError:
        return None
    if row is None:
        return 0.0, None
    cap = row["cap"]
    return row["epsilon_rdp"], None if cap is None else (
        cap["epsilon"],
        cap["delta"],
        bool(cap.get("include_audits")),
    )


def _rows(path: Path) -> list:
    with sqlite3.connect(path) as c:
        return c.execute(
            "SELECT seq, id, kind, created_at, dataset, payload FROM entries ORDER BY seq"
        ).fetchall()


def _weaken(kind: str, p: dict) -> dict:
    if kind == "cap":
        return {**p, "epsilon": 100.0, "include_audits": False}
    if kind == "release":
        nm = p["noise_multiplier"] * 10
        return {
            **p,
            "guarantee": {**p["guarantee"], "noise_multiplier": nm},
            "noise_multiplier": nm,
        }
    if kind == "void":
        return {**p, "artefacts_published": False}
    return p


def _tail(path: Path, k: int) -> list:
    return [
        (eid, kind, created, ds, json.loads(text))
        for _s, eid, kind, created, ds, text in _rows(path)[k - 1 :]
    ]


def _file_attack(path: Path, op: str, at: int) -> None:
    """delete / reorder / re-sign (weakened) from entry ``at`` on, everything re-signed by alice."""
    n = len(_rows(path))
    k = 1 + at % n
    tail = _tail(path, k)
    if op == "delete":
        tail = tail[1:]
    elif op == "reorder" and len(tail) > 1:
        tail = [tail[1], tail[0], *tail[2:]]
    else:
        tail = [(eid, kind, c, ds, _weaken(kind, p)) for eid, kind, c, ds, p in tail]
    _am.resign_tail(path, k, ALICE, tail)


def _insert(path: Path, kind: str, at: int) -> None:
    """An entry alice signs herself, inserted behind the API: each would raise a cap or lower spend."""
    releases = [r for r in _rows(path) if r[2] == "release"]
    payload = {
        "cap": {"dataset": "toy", "epsilon": 100.0, "delta": 1e-5, "include_audits": True},
        "partition": {
            "dataset": "toy",
            "parent": "all",
            "children": ["train", "x"],
            "declared_by": "alice",
        },
        "void": {
            "target": releases[at % len(releases)][1] if releases else "0" * 32,
            "reason": "x",
            "artefacts_published": False,
        },
        "key": sg.key_payload(OWNER.public_raw[::-1], "ghost", "member"),
        "seal": sg.seal_payload(0, "0" * 64),
    }[kind]
    signed_insert(path, ALICE, kind, "toy" if kind in ("cap", "partition", "void") else "", payload)


def _api(path: Path, op: str, at: int) -> None:
    """Alice through the API: records a release, or tries an owner's entry (refused, nothing written)."""
    with open_ledger(path, signing_key=ALICE) as led:
        if op == "append":
            led.record(release(10 + at))
            return
        before = len(led.store.rows())
        try:
            {
                "cap": lambda: led.cap("toy", 100.0, 1e-5),
                "void": lambda: led.void(led.entries(kind="release")[0].id, "x", published=False),
                "seal": led.seal,
            }[op]()
        except LedgerAuthorityError:
            assert len(led.store.rows()) == before
            return
        raise AssertionError(f"a member's {op} was accepted")


OPS = st.tuples(
    st.sampled_from(
        [
            "append",
            "cap",
            "void",
            "seal",
            "delete",
            "reorder",
            "resign",
            "insert-cap",
            "insert-partition",
            "insert-void",
            "insert-key",
            "insert-seal",
            "owner-seal",
        ]
    ),
    st.integers(0, 50),
)


def _apply(path: Path, op: str, at: int) -> None:
    if op == "owner-seal":
        with open_ledger(path, signing_key=OWNER) as led:
            led.seal()
    elif op in ("append", "cap", "void", "seal"):
        _api(path, op, at)
    elif op.startswith("insert-"):
        _insert(path, op[len("insert-") :], at)
    else:
        _file_attack(path, op, at)


def _run(ops) -> None:
    """Apply ``ops`` to a fresh team ledger, checking the property after each."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ledger.sqlite"
        sealed = _setup(path)
        for op, at in ops:
            _apply(path, op, at)
            seen = _observe(path)
            if seen is None:
                break  # every budget answer fails closed from here on
            spent, cap = seen
            assert cap == (*CAP, True), f"after {op}: cap {cap}"
            assert spent >= sealed - 1e-9, f"after {op}: spend {spent} < sealed {sealed}"
            if op == "owner-seal":
                sealed = spent


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(OPS, min_size=1, max_size=4))
def test_member_operations_never_lower_sealed_spend_nor_raise_a_cap(ops):
    _run(ops)


@pytest.mark.parametrize(
    "ops", [[("insert-cap", 0)], [("resign", 2)], [("insert-void", 0)], [("insert-partition", 0)]]
)
def test_the_property_fails_when_the_authority_rules_are_off(monkeypatch, ops):
    """The harness can fail: with the authority rules switched off (no owner-only kinds, no
    partition check, no remembered seal), a member-signed cap raise, re-signed history, void or
    partition is accepted and the property is violated."""
    from dpaudit.ledger import integrity

    monkeypatch.setattr(sg, "authority_problem", lambda *a, **k: None)
    monkeypatch.setattr(sg, "_seal_problem", lambda *a, **k: None)
    monkeypatch.setattr(integrity, "authority_problems", lambda rows: [])
    with pytest.raises(AssertionError, match="after (insert|resign)"):
        _run(ops)
