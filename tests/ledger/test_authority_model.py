"""The ledger's authority model (docs/ledger.md, "Who may write what"): on a signed ledger caps,
voids, key registrations, the policy and seals are the owner's; a member key can neither lower
recorded spend nor raise a cap, through the API (refused, nothing written) or behind it (named by
verify, refused by every budget answer); owner seals make a rewrite before them fail.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from dpaudit.accounting import SubsampledGaussian
from dpaudit.cli import app
from dpaudit.errors import BudgetExceededError, LedgerAuthorityError, LedgerVerificationError
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import canonical_json, entry_hash, open_ledger
from dpaudit.records import Release

G = SubsampledGaussian(noise_multiplier=1.0, sample_rate=0.01, steps=100)
ADJ = "add-remove-record"


def key(seed: int, name: str) -> sg.SigningKey:
    return sg.SigningKey(
        name,
        Path(f"/nonexistent/{name}.key"),
        Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32),
    )


OWNER, ALICE, BOB = key(11, "owner"), key(12, "alice"), key(13, "bob")


def release(i: int, nm: float = 0.7) -> Release:
    ev = SubsampledGaussian(noise_multiplier=nm, sample_rate=0.01, steps=100 + i)
    return Release(
        mechanism="dp-sgd",
        dataset={"name": "toy", "sha256": "ab" * 32},
        adjacency=ADJ,
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee=ev.to_dict(),
        seed=i,
        noise_source={"kind": "test"},
        git_commit=None,
        noise_multiplier=nm,
        sample_rate=0.01,
        steps=100 + i,
        clipping_norm=1.0,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "ledger.sqlite"
    return request.getfixturevalue("pg_ledger_url")


def team(target, n: int = 3) -> list[str]:
    """owner (1), alice (2), cap 3 on toy by the owner (3), ``n`` releases by alice."""
    with open_ledger(target, signing_key=OWNER) as led:
        led.register_key()
        led.register_key(ALICE.public_text, "alice")
        led.cap("toy", 3.0, 1e-5)
    with open_ledger(target, signing_key=ALICE) as led:
        return [led.record(release(i)) for i in range(n)]


def total(target, **kw) -> tuple[float, float | None]:
    with open_ledger(target, signing_key=None, **kw) as led:
        row = next(r for r in led.summary("toy", accountants=("rdp",)) if r["partition"] == "*")
    return row["epsilon"], (row["cap"] or {}).get("epsilon")


def count(target) -> int:
    with open_ledger(target, signing_key=None) as led:
        return len(led.store.rows())


def signed_insert(target, signer: sg.SigningKey, kind: str, dataset: str, payload: dict) -> str:
    """What a member with INSERT (a PostgreSQL writer role, the SQLite file) can always do: append
    an entry it signs itself, bypassing every check of the API."""
    with open_ledger(target, signing_key=None) as led, led.store.write():
        prev = led.store.head()[2]
        eid, created, text = (
            uuid.uuid4().hex,
            "2026-12-01T00:00:00.000000+00:00",
            canonical_json(payload),
        )
        sig = signer.sign(
            sg.signing_material(prev, eid, kind, created, dataset, text, signer.key_id)
        )
        led.store.insert(
            eid,
            kind,
            created,
            dataset,
            text,
            prev,
            entry_hash(prev, eid, kind, created, dataset, text, signer.key_id, sig),
            signer.key_id,
            sig,
        )
    return eid


def member_rewrite(path: Path, from_seq: int, signer: sg.SigningKey, edit) -> None:
    """The attack on an SQLite ledger: delete every entry from ``from_seq`` on and re-append them
    edited (``edit(kind, payload)`` -> payload, or None to drop it), each re-signed by ``signer``,
    with the hashes and the chain head recomputed and the triggers put back."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT id, kind, created_at, dataset, payload FROM entries WHERE seq >= ? ORDER BY seq",
            (from_seq,),
        ).fetchall()
    tail = [
        (eid, kind, created, ds, edit(kind, json.loads(text)))
        for eid, kind, created, ds, text in rows
    ]
    resign_tail(path, from_seq, signer, [t for t in tail if t[4] is not None])


def resign_tail(path: Path, from_seq: int, signer: sg.SigningKey, tail: list) -> None:
    """Replace every entry from ``from_seq`` on with ``tail`` ((id, kind, created, dataset, payload)),
    each signed by ``signer``, hashes and chain head recomputed, the delete trigger put back: what a
    writer of the SQLite file can always do."""
    conn = sqlite3.connect(path, isolation_level=None)
    prev = conn.execute("SELECT hash FROM entries WHERE seq = ?", (from_seq - 1,)).fetchone()
    prev = prev[0] if prev else "0" * 64
    new = []
    for eid, kind, created, ds, payload in tail:
        text = canonical_json(payload)
        sig = signer.sign(sg.signing_material(prev, eid, kind, created, ds, text, signer.key_id))
        h = entry_hash(prev, eid, kind, created, ds, text, signer.key_id, sig)
        new.append((from_seq + len(new), eid, kind, created, ds, text, prev, h, signer.key_id, sig))
        prev = h
    conn.execute("DROP TRIGGER IF EXISTS entries_no_delete")
    conn.execute("DELETE FROM entries WHERE seq >= ?", (from_seq,))
    conn.executemany(
        "INSERT INTO entries (seq, id, kind, created_at, dataset, payload, prev_hash, hash, signer, signature) "
        "VALUES (?,?,?,?,?,?,?,?,?,?)",
        new,
    )
    n = from_seq - 1 + len(new)
    conn.execute("UPDATE chain_head SET seq = ?, count = ?, hash = ?", (n, n, prev))
    conn.execute(
        "CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END"
    )
    conn.close()


def weaken(kind, p):
    """The finding's edit: the cap raised to 100, every release's noise multiplied by 10."""
    if kind == "cap":
        return {**p, "epsilon": 100.0}
    if kind == "release":
        nm = p["noise_multiplier"] * 10
        return {
            **p,
            "guarantee": {**p["guarantee"], "noise_multiplier": nm},
            "noise_multiplier": nm,
        }
    return p


def verify_fails(target, **kw) -> list:
    with open_ledger(target, signing_key=None) as led:
        rep = led.verify(owner=OWNER.key_id, **kw)
    assert not rep.ok
    with open_ledger(target, signing_key=None, owner=OWNER.key_id) as led:
        with pytest.raises(LedgerVerificationError, match="fails verification"):
            led.summary()
        with pytest.raises(LedgerVerificationError, match="fails verification"):
            led.preflight(dataset="toy", partition="train", event=G, adjacency=ADJ)
    return [p for p in rep.problems if p.kind != "schema"]


# ---------------------------------------------------------------- a member key rewriting history (SQLite)


def test_a_member_rewriting_and_resigning_everything_after_its_registration_fails_verify(tmp_path):
    path = tmp_path / "ledger.sqlite"
    team(path)
    spent, cap = total(path)
    assert cap == 3.0 and spent > 3.0
    member_rewrite(
        path, 3, ALICE, weaken
    )  # the cap (owner's) and the releases, all re-signed by alice
    found = verify_fails(path)
    assert [(p.kind, p.seq) for p in found] == [("signature", 3)]
    assert (
        "cap entry signed by key" in found[0].message
        and "only the owner may set or raise a cap" in found[0].message
    )
    r = CliRunner().invoke(
        app, ["ledger", "verify", "--owner", OWNER.key_id, "--ledger", str(path)]
    )
    assert r.exit_code == 1 and "only the owner may set or raise a cap" in " ".join(
        r.output.split()
    )


def test_a_seal_makes_a_rewrite_before_it_fail_even_when_no_owner_only_entry_is_touched(tmp_path):
    path = tmp_path / "ledger.sqlite"
    team(path)
    with open_ledger(path, signing_key=OWNER) as led:
        sealed = led.seal()
        assert led.get(sealed["id"]).payload == {
            "sealed_seq": 6,
            "sealed_hash": led.store.rows()[5][7],
        }
        assert "nothing unsealed" in str(led.verify())
    with open_ledger(path, signing_key=ALICE) as led:
        led.record(release(9))
        assert "1 later entry UNSEALED" in str(led.verify())
        with pytest.raises(LedgerAuthorityError, match="only the owner may seal the ledger"):
            led.seal()
    before = count(path)
    # Only alice's own releases, before the seal, weakened and re-signed by alice: the seal's signature breaks.
    member_rewrite(path, 4, ALICE, lambda k, p: weaken(k, p) if k == "release" else p)
    found = verify_fails(path)
    assert ("signature", 7) in [(p.kind, p.seq) for p in found] and count(path) == before
    # alice cannot sign the seal again as the owner: re-signed by her, it is not the owner's
    assert any("only the owner may seal the ledger" in p.message for p in found if p.seq == 7)


def test_removing_the_seal_with_the_rewrite_is_named_on_the_owners_machine(tmp_path):
    path = tmp_path / "ledger.sqlite"
    team(path)
    with open_ledger(path, signing_key=OWNER) as led:
        led.seal()
    # From alice's registration on, everything re-signed by alice, dropping the owner's cap and seal:
    # the signatures all check out, but the seal this machine made is gone from the chain.
    member_rewrite(path, 3, ALICE, lambda k, p: None if k in ("cap", "seal") else weaken(k, p))
    found = verify_fails(path)
    assert [p.kind for p in found] == ["seal"] and "truncated or rewritten" in found[0].message


# ---------------------------------------------------------------- the normal API, on both backends


def test_a_member_cannot_raise_a_cap_through_the_api_nor_behind_it(target):
    team(target)
    n = count(target)
    with open_ledger(target, signing_key=ALICE) as led:
        with pytest.raises(
            LedgerAuthorityError, match="only the owner may set or raise a cap; nothing was written"
        ):
            led.cap("toy", 100.0, 1e-5)
        with pytest.raises(BudgetExceededError):
            led.preflight(dataset="toy", partition="train", event=G, adjacency=ADJ)
    assert count(target) == n and total(target)[1] == 3.0
    # The same entry signed by alice and inserted directly: verify names it and no budget answer honours it.
    signed_insert(
        target,
        ALICE,
        "cap",
        "toy",
        {"dataset": "toy", "epsilon": 100.0, "delta": 1e-5, "include_audits": True},
    )
    found = verify_fails(target)
    assert [(p.kind, p.seq) for p in found] == [
        ("signature", n + 1)
    ] and "not by the ledger's owner" in found[0].message


@pytest.mark.parametrize("kind", ["void", "key", "policy", "seal"])
def test_every_other_owner_only_entry_is_refused_to_a_member_and_named_when_inserted(target, kind):
    ids = team(target)
    n = count(target)
    with open_ledger(target, signing_key=ALICE) as led:
        call = {
            "void": lambda: led.void(ids[0], "mine", published=False),
            "key": lambda: led.register_key(BOB.public_text, "bob"),
            "policy": led.require_signatures,
            "seal": led.seal,
        }[kind]
        with pytest.raises(
            LedgerAuthorityError,
            match=f"{kind} on signed ledger .* must be signed by its owner's key",
        ):
            call()
    assert count(target) == n
    payload = {
        "void": {"target": ids[0], "reason": "x", "artefacts_published": False},
        "key": sg.key_payload(BOB.public_raw, "bob", "member"),
        "policy": {"require_signatures": True},
        "seal": sg.seal_payload(n, "0" * 64),
    }[kind]
    signed_insert(target, ALICE, kind, "toy" if kind == "void" else "", payload)
    found = verify_fails(target)
    assert found[0].seq == n + 1 and "only the owner may" in found[0].message


def test_a_member_closes_only_its_own_reservations(target):
    team(target, n=0)
    with open_ledger(target, signing_key=OWNER) as led:
        led.register_key(BOB.public_text, "bob")
    with open_ledger(target, signing_key=BOB) as led:
        rid = led.reserve(dataset="toy", partition="train", event=G, adjacency=ADJ)
    n = count(target)
    with open_ledger(target, signing_key=ALICE) as led:
        with pytest.raises(LedgerAuthorityError, match="must be signed by the key that opened it"):
            led.cancel(rid, "not mine")
        with pytest.raises(LedgerAuthorityError, match="must be signed by the key that opened it"):
            led.settle(rid, [])
    assert count(target) == n
    with open_ledger(target, signing_key=BOB) as led:
        led.cancel(rid, "training failed")  # its own
        assert led.verify(owner=OWNER.key_id).ok
    with open_ledger(target, signing_key=BOB) as led:
        rid = led.reserve(dataset="toy", partition="train", event=G, adjacency=ADJ)
    signed_insert(target, ALICE, "cancel", "toy", {"target": rid, "reason": "freed by alice"})
    found = verify_fails(target)
    assert "did not open it" in found[0].message


def test_a_partition_over_children_that_hold_releases_is_named_even_when_signed(target):
    team(target)
    with open_ledger(target, signing_key=ALICE) as led:
        with pytest.raises(
            LedgerAuthorityError, match="must be declared before its children hold releases"
        ):
            led.declare_partition("toy", "all", ["train", "other"], "alice")
        led.declare_partition(
            "toy", "fresh", ["fresh/a", "fresh/b"], "alice"
        )  # before any release on them: allowed
        assert led.verify(owner=OWNER.key_id).ok
    spent = total(target)[0]
    signed_insert(
        target,
        ALICE,
        "partition",
        "toy",
        {"dataset": "toy", "parent": "all", "children": ["train", "other"], "declared_by": "x"},
    )
    found = verify_fails(target)
    assert [p.kind for p in found] == [
        "authority"
    ] and "parallel composition would lower what they spent" in found[0].message
    assert spent > 3.0


# ---------------------------------------------------------------- voids that say nothing about publication


def test_a_void_that_does_not_say_whether_artefacts_were_published_keeps_counting(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with open_ledger(
        path, signing_key=None
    ) as led:  # unsigned: no owner, published may be left out
        a, b = led.record(release(0)), led.record(release(1))
    before = total(path)[0]
    with open_ledger(path, signing_key=None) as led:
        led.void(b, "recorded by mistake")
    assert total(path)[0] == pytest.approx(before)
    with open_ledger(path, signing_key=None) as led:
        led.void(a, "never shared", published=False)
    assert total(path)[0] < before


# ---------------------------------------------------------------- caps count audits by default


def _head():
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget

    return HeadTarget(
        model="dp-rvfl",
        dataset="digits",
        epsilon=2.0,
        canary="max-clip",
        epochs=1,
        max_train=120,
        seed=3,
    )


def test_a_default_cap_counts_audits_and_refuses_a_default_audit_before_any_trial(
    tmp_path, monkeypatch
):
    import numpy as np

    from dpaudit.audits.engine import run_audit
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget

    path = tmp_path / "ledger.sqlite"
    r = CliRunner().invoke(
        app,
        [
            "ledger",
            "cap",
            "--dataset",
            "digits",
            "--eps",
            "50",
            "--delta",
            "1e-5",
            "--ledger",
            str(path),
        ],
    )
    assert r.exit_code == 0 and "counting releases and audits" in r.output
    t = _head()
    t.prepare()
    calls = []
    monkeypatch.setattr(
        HeadTarget, "scores", lambda self, c, n: calls.append(1) or np.zeros(len(c))
    )
    with pytest.raises(BudgetExceededError) as e:
        run_audit(
            t, runs=8, seed=1, control_runs=4, ledger_path=path
        )  # default controls: no-noise too
    msg = str(e.value)
    assert calls == [] and "\n" not in msg
    assert (
        "no-noise control" in msg
        and "unbounded" in msg
        and "--no-controls" in msg
        and "--exclude-audits" in msg
    )
    with open_ledger(path) as led:
        assert led.entries(kind="audit") == []
    # The recorded opt-out: audits are shown, not counted, and the same audit runs.
    r = CliRunner().invoke(
        app,
        [
            "ledger",
            "cap",
            "--dataset",
            "digits",
            "--eps",
            "50",
            "--delta",
            "1e-5",
            "--exclude-audits",
            "--ledger",
            str(path),
            "--json",
        ],
    )
    assert r.exit_code == 0 and json.loads(r.output)["include_audits"] is False
    monkeypatch.undo()
    run_audit(_head(), runs=8, seed=1, control_runs=4, ledger_path=path)
    with open_ledger(path) as led:
        assert [c.payload["include_audits"] for c in led.entries(kind="cap")] == [True, False]
    # Counting audits again: the cap says the total is infinite and why, and so does the summary.
    r = CliRunner().invoke(
        app,
        [
            "ledger",
            "cap",
            "--dataset",
            "digits",
            "--eps",
            "50",
            "--delta",
            "1e-5",
            "--ledger",
            str(path),
        ],
    )
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and "already infinite" in out and "no-noise control" in out
    r = CliRunner().invoke(app, ["ledger", "summary", "--ledger", str(path)])
    out = " ".join(r.output.split())
    assert (
        "releases + audits is INFINITE because an audit ran without DP noise" in out
        and "nothing is left under its cap" in out
    )


def test_caps_written_before_the_default_keep_reading_as_releases_only(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with open_ledger(path) as led:
        led.record_audit(
            audit_id="a" * 32,
            dataset="heart",
            partition="train",
            adjacency=ADJ,
            event=None,
            trials=10,
            mechanism="dp-rvfl",
            unbounded_reason="the no-noise control trains without DP noise",
        )
        with led.store.write():  # a cap entry as an older dpaudit wrote it (no include_audits key)
            led._append("cap", "heart", {"dataset": "heart", "epsilon": 2.0, "delta": 1e-5})
        planned = dict(dataset="heart", partition="train", event=G, adjacency=ADJ)
        assert led.check(**planned)["allowed"]
        led.cap("heart", 2.0, 1e-5)
        assert not led.check(**planned)["allowed"]
