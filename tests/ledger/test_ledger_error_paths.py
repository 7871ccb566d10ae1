"""Ledger error paths and integrity findings the rest of the suite never reaches: each refuses bad
input with its one-line message, or names a tampered chain (fail closed), without writing anything."""

from __future__ import annotations

import re
import sqlite3

import pytest

from dpaudit.errors import LedgerError, UsageError
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger
from dpaudit.ledger.budget import sampler_uncertified_reason, unbounded_audit_refusal
from dpaudit.ledger.fingerprint import keyed_fingerprint
from dpaudit.ledger.integrity import (
    Snapshot,
    chain_problems,
    entry_hash,
    import_chain,
    partition_problems,
    require_export,
    verify_snapshot,
)
from dpaudit.ledger.paths import GENESIS_HASH, resolve_ledger
from dpaudit.ledger.store_pg import grant_writer_sql
from dpaudit.ledger.text import seal_notes, summary_notes


@pytest.fixture(autouse=True)
def _no_default_key(tmp_path, monkeypatch):
    """No signing key of this machine's user is picked up."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv(sg.SIGNING_KEY_ENV, raising=False)


def _chain(*ids: str, kind: str = "cap", payloads=None, sigs=None) -> list[tuple]:
    """Stored rows (seq, id, kind, created_at, dataset, payload, prev_hash, hash, signer, signature)
    of an intact chain from the genesis hash (``kind``: ``ID:KIND`` overrides it per entry)."""
    rows, prev = [], GENESIS_HASH
    for seq, name in enumerate(ids, 1):
        eid, _, own_kind = name.partition(":")
        columns = (eid, own_kind or kind, "t", "toy", (payloads or {}).get(eid, "{}"))
        signer, signature = (sigs or {}).get(eid, (None, None))
        rows.append((seq, *columns, prev, entry_hash(prev, *columns, signer, signature)))
        rows[-1] += (signer, signature)
        prev = rows[-1][7]
    return rows


def _messages(head, rows) -> list[str]:
    return [p.message for p in chain_problems(head, rows)]


def test_chain_head_findings_name_what_was_done_outside_dpaudit():
    rows = _chain("a", "b", "c")
    assert _messages(None, rows) == [
        "the chain head is missing: the ledger was altered outside dpaudit."
    ]
    assert _messages((2, 2, rows[1][7]), rows) == [
        "entry #3 (c) and later were added outside dpaudit (after the chain head)."
    ]
    assert _messages((3, 5, rows[2][7]), rows) == [
        "the chain head records 5 entries but the ledger holds 3."
    ]
    assert _messages((0, 2, GENESIS_HASH), []) == [
        "the chain head records 2 entries but the ledger holds 0."
    ]
    assert _messages((3, 3, "f" * 64), rows) == [
        "entry #3 (cap c) was edited and re-hashed: its hash differs from the chain head."
    ]


def test_a_second_chain_start_is_named_as_reordered():
    first, second = _chain("a")[0], (2, *_chain("b")[0][1:])
    assert _messages((1, 1, first[7]), [first, second]) == [
        "entry #2 (cap b) was reordered: it was the first entry but is now stored after entry #1 (a)."
    ]


def test_an_invalid_split_inserted_behind_the_ledgers_back_is_a_finding():
    split = {"a": '{"parent":"*","children":["x","y"]}', "b": '{"parent":"*","children":["z"]}'}
    (problem,) = partition_problems(_chain("a", "b", kind="partition", payloads=split))
    assert problem.seq == 2 and "an invalid split (partition toy:* must be split only once" in (
        problem.message
    )


def test_an_import_that_does_not_continue_the_chain_imports_nothing():
    rows = [list(r) for r in _chain("a", "b")]
    assert import_chain({"rows": rows, "head_hash": rows[1][7]}) == rows
    with pytest.raises(LedgerError, match="head hash does not match its last entry"):
        import_chain({"rows": rows, "head_hash": rows[0][7]})
    with pytest.raises(LedgerError, match=r"entry #2 \(b\) does not continue the chain"):
        import_chain({"rows": rows[1:], "head_hash": rows[1][7]})
    with pytest.raises(UsageError, match="import must be a dpaudit ledger export"):
        require_export({"format": "other"})


def test_a_ledger_failing_verification_is_not_exported(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with open_ledger(path) as led:
        led.cap("toy", 1.0, 1e-5)
        led.cap("toy", 2.0, 1e-5)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS entries_no_delete")
    conn.execute("DELETE FROM entries WHERE seq = 1")
    conn.close()
    with open_ledger(path) as led:
        report = led.verify()
        assert str(report) == "\n".join(p.message for p in report.problems)
        assert "were deleted" in str(report)
        with pytest.raises(LedgerError, match="fails verification .*; it was not exported"):
            led.export_rows()


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with pytest.raises(UsageError, match="owner must be a key id .* got 'zz'"):
        open_ledger(path, owner="zz")
    with open_ledger(path) as led:
        cap_id = led.cap("toy", 1.0, 1e-5)
        with pytest.raises(UsageError, match="include_audits must be True or False, got 'yes'"):
            led.cap("toy", 1.0, 1e-5, include_audits="yes")
        with pytest.raises(UsageError, match="published must be True or False, got 'yes'"):
            led.void(cap_id, "why", published="yes")
        with pytest.raises(UsageError, match="reservation id must name a reservation, got a cap"):
            led.cancel(cap_id, "why")
        with pytest.raises(UsageError, match="plan entry must have a plan_id"):
            led.record_plan({"plan_id": "p", "stage": "nope"})
        with pytest.raises(UsageError, match="signing key must exist to register keys"):
            led.register_key()
        with pytest.raises(UsageError, match="ledger to seal must have an owner"):
            led.seal()
        assert [e.id for e in led.entries()] == [cap_id] and led.verify().ok


def test_helpers_refuse_bad_values_with_one_line():
    with pytest.raises(UsageError, match="digest must be a non-empty string, got ''"):
        keyed_fingerprint(bytes(32), "")
    with pytest.raises(UsageError, match="role must be a lower-case SQL name"):
        grant_writer_sql("dpaudit", "Analyst; DROP")


def test_a_location_prints_without_its_password_and_resolves_to_itself():
    loc = resolve_ledger("postgresql://ann:secret@db.example/team")
    assert "secret" not in str(loc) and str(loc) == loc.display
    assert resolve_ledger(loc) is loc


def test_the_summary_names_unsealed_entries():
    assert seal_notes({"owner": "k", "unsealed": 2, "sealed_through": 5})[0].startswith(
        "ledger: 2 entries after entry #5 UNSEALED"
    )
    assert seal_notes({"owner": "k", "unsealed": 0}) == []


def test_the_summary_names_declared_data_versions():
    row = {"dataset": "toy", "partition": "*", "dataset_fingerprints": ["a", "b"]}
    assert summary_notes([row]) == ["toy: 2 declared data versions, composed sequentially."]


def _verified(rows) -> list[str]:
    head = (len(rows), len(rows), rows[-1][7])
    snap = Snapshot("p", "sqlite", 1, head, rows)
    return [p.message for p in verify_snapshot(snap, anchor=None, owner=None).problems]


def test_forged_or_unreadable_entries_are_findings_never_skipped():
    key = sg.key_payload(bytes(32), "k", "owner")
    payloads = {
        "a": "{",
        "b": '{"key_id": "00", "public_key": "ed25519:nope"}',
        "c": '{"key_id": "00", "public_key": "%s"}' % key["public_key"],
    }
    sigs = {eid: ("f" * 32, "ab") for eid in "bc"} | {"d": (None, "ab")}
    rows = _chain("a", "b", "c", "d:bogus", kind="key", payloads=payloads, sigs=sigs)
    found = _verified(rows)
    assert "entry #1 (key a) is unreadable: its payload is not a JSON object." in found
    assert "entry #4 (bogus d) cannot be read: unknown kind 'bogus'" in found
    assert "entry #4 (bogus d) has a signature but no signer." in found
    assert "entry #2 (key b) registers a public key that cannot be read." in found
    assert (
        f"entry #3 (key c) registers key '00' but its public key has id {key['key_id']}." in found
    )


def test_a_ledger_key_of_the_wrong_size_is_refused_and_a_closed_ledger_is_not_read(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with open_ledger(path) as led:
        led.cap("toy", 1.0, 1e-5)
    (tmp_path / "ledger.sqlite.key").write_bytes(b"short")
    led = open_ledger(path)
    with pytest.raises(LedgerError, match="must hold exactly 32 bytes, got 5"):
        led.fingerprint("digest")
    led.close()
    with pytest.raises(LedgerError, match="is closed"):
        led.entries()


def test_registering_a_key_or_requiring_signatures_again_changes_nothing(tmp_path):
    owner = sg.keygen("owner", directory=tmp_path / "keys")
    with open_ledger(tmp_path / "ledger.sqlite", signing_key=owner) as led:
        first, policy = led.register_key(), led.require_signatures()
        assert (led.register_key(), led.require_signatures()) == (first, policy)
        assert len(led.entries()) == 2 and led.verify().ok


def test_a_signing_key_of_another_type_is_refused(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "other.key"
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(pem)
    path.chmod(0o600)
    with pytest.raises(
        LedgerError, match=re.escape(f"signing key {path} must be an Ed25519 key, got ")
    ):
        sg.load_signing_key(str(path))


def test_an_import_beside_another_key_imports_nothing(tmp_path):
    with open_ledger(tmp_path / "a.sqlite") as led:
        led.cap("toy", 1.0, 1e-5)
        dump = led.export_rows(include_key=True)
    (tmp_path / "b.sqlite.key").write_bytes(bytes(32))
    with open_ledger(tmp_path / "b.sqlite") as led:
        with pytest.raises(LedgerError, match="exists with another key; import into a new ledger"):
            led.import_rows(dump)
        assert led.entries() == []


def test_an_uncertified_sampler_is_named_and_its_audit_refusal_says_the_way_out():
    reason = "the trials use the uncertified gaussian sampler"
    refusal = unbounded_audit_refusal("toy", {"unbounded_reason": reason}, "its cap")
    assert f"refused before any trial ran: {reason}, so its cost is unbounded" in refusal
    assert "audit a configuration with a certified, known privacy event" in refusal
    assert sampler_uncertified_reason("gaussian") == (
        "uncertified: gaussian sampler (no finite-precision guarantee)"
    )
