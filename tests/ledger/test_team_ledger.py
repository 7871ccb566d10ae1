"""The team ledger: signed entries on both backends, forged ledgers, anchors,
export/import between SQLite and PostgreSQL, and PostgreSQL under concurrency and restarts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from dpaudit.accounting import PureEpsilon, SubsampledGaussian
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import entry_hash, open_ledger
from dpaudit.cli import app
from dpaudit.errors import BudgetExceededError, LedgerError, UsageError
from dpaudit.records import Release

RACER = Path(__file__).with_name("budget_racer.py")
G = SubsampledGaussian(noise_multiplier=1.0, sample_rate=0.01, steps=100)


def key(seed: int, name: str) -> sg.SigningKey:
    return sg.SigningKey(
        name,
        Path(f"/nonexistent/{name}.key"),
        Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32),
    )


OWNER, ALICE, MALLORY = key(1, "owner"), key(2, "alice"), key(3, "mallory")


def release(i: int, nm: float = 1.0) -> Release:
    ev = SubsampledGaussian(noise_multiplier=nm, sample_rate=0.01, steps=100 + i)
    return Release(
        mechanism="dp-sgd",
        dataset={"name": "toy", "sha256": "ab" * 32},
        adjacency="add-remove-record",
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


# ---------------------------------------------------------------- forging behind dpaudit's back


def _rows(target) -> list[list]:
    with open_ledger(target, signing_key=None) as led:
        return [list(r) for r in led.store.rows()]


def forge(target, seq: int, change) -> None:
    """What a forger with write access to the database does: drop the append-only triggers,
    edit entry ``seq``'s payload, recompute every hash from there on and the chain head."""
    rows = _rows(target)
    prev = "0" * 64
    updates = []
    for r in rows:
        s, eid, kind, created, ds, text, _prev, _h, signer, signature = r
        if s == seq:
            text = json.dumps(change(json.loads(text)), sort_keys=True, separators=(",", ":"))
        h = entry_hash(prev, eid, kind, created, ds, text, signer, signature)
        updates.append((text, prev, h, s))
        prev = h
    if isinstance(target, Path):
        import sqlite3

        conn = sqlite3.connect(target, isolation_level=None)
        conn.execute("DROP TRIGGER entries_no_update")
        for u in updates:
            conn.execute("UPDATE entries SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?", u)
        conn.execute("UPDATE chain_head SET hash = ?", (prev,))
        conn.close()
    else:
        import psycopg

        from dpaudit.ledger.paths import resolve_ledger

        loc = resolve_ledger(target)
        s = f'"{loc.schema}"'
        with psycopg.connect(loc.url, autocommit=True) as c:
            c.execute(f"DROP TRIGGER entries_no_update ON {s}.entries")
            c.execute(f"DROP TRIGGER chain_head_guard ON {s}.chain_head")
            for u in updates:
                c.execute(
                    f"UPDATE {s}.entries SET payload = %s, prev_hash = %s, hash = %s WHERE seq = %s",
                    u,
                )
            c.execute(f"UPDATE {s}.chain_head SET hash = %s", (prev,))
            # ... and puts the triggers back, so that nothing looks altered.
            c.execute(
                f"CREATE TRIGGER entries_no_update BEFORE UPDATE ON {s}.entries FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()"
            )
            c.execute(
                f"CREATE TRIGGER chain_head_guard BEFORE UPDATE OR DELETE OR INSERT ON {s}.chain_head FOR EACH ROW EXECUTE FUNCTION {s}.guard_head()"
            )


def _double_noise(p):
    return {**p, "noise_multiplier": p["noise_multiplier"] * 2}


def _problems(target, **kw):
    with open_ledger(target, signing_key=None) as led:
        rep = led.verify(**kw)
    return [p for p in rep.problems if p.kind != "schema"], rep


def test_a_forged_release_passes_the_hash_chain_without_signatures(target):
    """The hole: with write access, drop the triggers, edit, re-hash -- verify cannot tell."""
    with open_ledger(target, signing_key=None) as led:
        ids = [led.record(release(i)) for i in range(3)]
    forge(target, 2, _double_noise)
    found, rep = _problems(target)
    assert found == [] and rep.signatures["signed"] == 0
    with open_ledger(target, signing_key=None) as led:
        assert led.get(ids[1]).payload["noise_multiplier"] == 2.0  # forged, and nothing noticed


def test_a_forged_release_fails_verification_with_signatures_naming_it(target):
    with open_ledger(target, signing_key=OWNER) as led:
        led.register_key()
        led.register_key(ALICE.public_text, "alice")
        ids = [led.record(release(i)) for i in range(3)]
        assert led.verify().ok
        assert all(e.signer == OWNER.key_id for e in led.entries())
    forge(target, 4, _double_noise)  # the second release (entries: key, key, rel, rel, rel)
    found, rep = _problems(target)
    # The edited entry is named; so is the next one, whose signature covers the edited entry's hash.
    assert [(p.kind, p.seq, p.id) for p in found] == [
        ("signature", 4, ids[1]),
        ("signature", 5, ids[2]),
    ]
    assert (
        "invalid signature by key" in found[0].message
        and f"entry #4 (release {ids[1]})" in found[0].message
    )
    # Budgets are never computed from it (fail closed), and the CLI exits 1 naming the entry.
    with (
        open_ledger(target, signing_key=None) as led,
        pytest.raises(LedgerError, match="fails verification.*entry #4"),
    ):
        led.summary()
    r = CliRunner().invoke(app, ["ledger", "verify", "--ledger", str(target)])
    assert r.exit_code == 1 and f"entry #4 (release {ids[1]})" in r.output


def test_stripping_signatures_is_caught_by_the_next_signature_and_the_policy(target):
    with open_ledger(target, signing_key=OWNER) as led:
        led.register_key()
        led.require_signatures()
        ids = [led.record(release(i)) for i in range(2)]

    # Edit the last release and strip its signature: the policy makes an unsigned entry a problem.
    forge_strip(target, 4)
    found, _ = _problems(target)
    assert [(p.kind, p.seq) for p in found] == [
        ("signature", 4)
    ] and "requires signatures since entry #1" in found[0].message
    assert ids


def forge_strip(target, seq: int) -> None:
    """Edit entry ``seq``, set its signer and signature to NULL, re-hash from there."""
    rows = _rows(target)
    prev = "0" * 64
    updates = []
    for r in rows:
        s, eid, kind, created, ds, text, _prev, _h, signer, signature = r
        if s == seq:
            text = json.dumps(
                _double_noise(json.loads(text)), sort_keys=True, separators=(",", ":")
            )
            signer = signature = None
        h = entry_hash(prev, eid, kind, created, ds, text, signer, signature)
        updates.append((text, prev, h, signer, signature, s))
        prev = h
    if isinstance(target, Path):
        import sqlite3

        conn = sqlite3.connect(target, isolation_level=None)
        conn.execute("DROP TRIGGER entries_no_update")
        for u in updates:
            conn.execute(
                "UPDATE entries SET payload = ?, prev_hash = ?, hash = ?, signer = ?, signature = ? WHERE seq = ?",
                u,
            )
        conn.execute("UPDATE chain_head SET hash = ?", (prev,))
        conn.close()
    else:
        import psycopg

        from dpaudit.ledger.paths import resolve_ledger

        loc = resolve_ledger(target)
        s = f'"{loc.schema}"'
        with psycopg.connect(loc.url, autocommit=True) as c:
            c.execute(f"ALTER TABLE {s}.entries DISABLE TRIGGER entries_no_update")
            c.execute(f"ALTER TABLE {s}.chain_head DISABLE TRIGGER chain_head_guard")
            for u in updates:
                c.execute(
                    f"UPDATE {s}.entries SET payload = %s, prev_hash = %s, hash = %s, signer = %s, signature = %s WHERE seq = %s",
                    u,
                )
            c.execute(f"UPDATE {s}.chain_head SET hash = %s", (prev,))
            c.execute(f"ALTER TABLE {s}.entries ENABLE TRIGGER entries_no_update")
            c.execute(f"ALTER TABLE {s}.chain_head ENABLE TRIGGER chain_head_guard")


# ---------------------------------------------------------------- stripping signatures


def rewrite_from(target, seq: int, edit) -> None:
    """The signature-stripping attack: delete every entry from ``seq`` on, re-insert them edited
    (``edit(kind, payload)`` -> payload, or None to drop the entry) and unsigned, with the hashes
    and the chain head recomputed, and put the append-only triggers back."""
    rows = _rows(target)
    prev = rows[seq - 2][7] if seq > 1 else "0" * 64
    new = []
    for r in rows[seq - 1 :]:
        s, eid, kind, created, ds, text, *_ = r
        payload = edit(kind, json.loads(text))
        if payload is None:
            continue
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        h = entry_hash(prev, eid, kind, created, ds, text)
        new.append((seq + len(new), eid, kind, created, ds, text, prev, h))
        prev = h
    count = seq - 1 + len(new)
    if isinstance(target, Path):
        import sqlite3

        conn = sqlite3.connect(target, isolation_level=None)
        conn.execute("DROP TRIGGER entries_no_delete")
        conn.execute("DELETE FROM entries WHERE seq >= ?", (seq,))
        conn.executemany(
            "INSERT INTO entries (seq, id, kind, created_at, dataset, payload, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?)",
            new,
        )
        conn.execute("UPDATE chain_head SET seq = ?, count = ?, hash = ?", (count, count, prev))
        conn.execute(
            "CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END"
        )
        conn.close()
        return
    import psycopg

    from dpaudit.ledger.paths import resolve_ledger

    loc = resolve_ledger(target)
    s = f'"{loc.schema}"'
    with psycopg.connect(loc.url, autocommit=True) as c:
        for t in ("entries_no_delete", "entries_chain"):
            c.execute(f"ALTER TABLE {s}.entries DISABLE TRIGGER {t}")
        c.execute(f"ALTER TABLE {s}.chain_head DISABLE TRIGGER chain_head_guard")
        c.execute(f"DELETE FROM {s}.entries WHERE seq >= %s", (seq,))
        for row in new:
            c.execute(
                f"INSERT INTO {s}.entries (seq, id, kind, created_at, dataset, payload, prev_hash, hash) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                row,
            )
        c.execute(
            f"UPDATE {s}.chain_head SET seq = %s, count = %s, hash = %s", (count, count, prev)
        )
        for t in ("entries_no_delete", "entries_chain"):
            c.execute(f"ALTER TABLE {s}.entries ENABLE TRIGGER {t}")
        c.execute(f"ALTER TABLE {s}.chain_head ENABLE TRIGGER chain_head_guard")


def append_unsigned(target, kind: str, dataset: str, payload: dict) -> None:
    """An unsigned entry appended straight into the database (INSERT is what the triggers allow)."""
    import uuid

    from dpaudit.ledger.book import canonical_json

    with open_ledger(target, signing_key=None) as led, led.store.write():
        prev = led.store.head()[2]
        eid, created, text = (
            uuid.uuid4().hex,
            "2026-12-01T00:00:00.000000+00:00",
            canonical_json(payload),
        )
        led.store.insert(
            eid,
            kind,
            created,
            dataset,
            text,
            prev,
            entry_hash(prev, eid, kind, created, dataset, text),
        )


def _signed_toy_ledger(target, policy: bool = True) -> list[str]:
    """owner key (1), policy (2), cap 3 on toy (3), three releases (4-6), all signed by the owner
    (without ``policy``: entries 1-5, no policy entry)."""
    with open_ledger(target, signing_key=OWNER) as led:
        led.register_key()
        if policy:
            led.require_signatures()
        led.cap("toy", 3.0, 1e-5)
        return [led.record(release(i, nm=0.7)) for i in range(3)]


def _weaken(kind, payload):
    if kind == "policy":
        return None
    if kind == "cap":
        return {**payload, "epsilon": 100.0}
    if kind == "release":
        g = {**payload["guarantee"], "noise_multiplier": 5.0}
        return {**payload, "guarantee": g, "noise_multiplier": 5.0, "epsilon": 0.1}
    return payload


def _refused_everywhere(target, **owner) -> None:
    """Budget answers fail closed: preflight and summary raise, the CLI says so in one line."""
    from dpaudit.errors import LedgerVerificationError

    with open_ledger(target, signing_key=None, **owner) as led:
        with pytest.raises(LedgerVerificationError, match="fails verification"):
            led.preflight(dataset="toy", partition="train", event=G, adjacency="add-remove-record")
        with pytest.raises(LedgerVerificationError, match="fails verification"):
            led.summary()


def test_deleting_from_the_policy_on_and_reinserting_unsigned_fails_verify_and_preflight(target):
    _signed_toy_ledger(target)
    with open_ledger(target, signing_key=None) as led:
        spent = next(r for r in led.summary() if r["partition"] == "*")["epsilon"]
        with pytest.raises(BudgetExceededError):
            led.preflight(dataset="toy", partition="train", event=G, adjacency="add-remove-record")
    assert spent > 3.0
    rewrite_from(target, 2, _weaken)
    found, rep = _problems(target, owner=OWNER.key_id)
    # The owner's registration (entry 1) survives, so every later unsigned entry is named.
    assert [(p.kind, p.seq) for p in found] == [
        ("signature", 2),
        ("signature", 3),
        ("signature", 4),
        ("signature", 5),
    ]
    assert all("requires signatures since entry #1" in p.message for p in found)
    assert _problems(target)[0] == found  # no pin needed for this one
    _refused_everywhere(target)
    r = CliRunner().invoke(
        app, ["ledger", "verify", "--owner", OWNER.key_id, "--ledger", str(target)]
    )
    assert r.exit_code == 1 and "entry #2 (cap" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["ledger", "summary", "--ledger", str(target)])
    assert (
        r.exit_code == 2
        and len(r.output.strip().splitlines()) == 1
        and "fails verification" in r.output
    )


def test_deleting_the_owners_registration_too_is_caught_by_the_pinned_owner(target, monkeypatch):
    _signed_toy_ledger(target)
    rewrite_from(target, 1, lambda k, p: None if k in ("key", "policy") else _weaken(k, p))
    found, rep = _problems(target)
    assert (
        found == [] and rep.signatures["signed"] == 0
    )  # without a pin it looks like an unsigned ledger
    found, _ = _problems(target, owner=OWNER.key_id)
    assert len(found) == 1 and "registers no owner key" in found[0].message
    _refused_everywhere(target, owner=OWNER.key_id)
    monkeypatch.setenv(sg.OWNER_ENV, OWNER.public_text)  # a public key works as well as its id
    _refused_everywhere(target)
    r = CliRunner().invoke(app, ["ledger", "summary", "--ledger", str(target)])
    assert r.exit_code == 2 and "registers no owner key" in r.output


@pytest.mark.parametrize("kind", ["void", "cap", "partition"])
def test_an_unsigned_entry_appended_to_a_signed_ledger_fails_verify_and_preflight(target, kind):
    ids = _signed_toy_ledger(target, policy=False)  # every entry signed, no policy entry
    payload = {
        "void": {"target": ids[0], "reason": "x", "artefacts_published": False},
        "cap": {"dataset": "toy", "epsilon": 100.0, "delta": 1e-5},
        "partition": {
            "dataset": "toy",
            "parent": "all",
            "children": ["train", "other"],
            "declared_by": "x",
        },
    }[kind]
    append_unsigned(target, kind, "toy", payload)
    found, _ = _problems(target, owner=OWNER.key_id)
    # a partition over children that already hold releases is also an authority finding (it would lower their spend)
    extra = [(6, "authority")] if kind == "partition" else []
    assert [(p.seq, p.kind) for p in found] == [
        (6, "signature")
    ] + extra and f"entry #6 ({kind}" in found[0].message
    _refused_everywhere(target)


def test_a_signed_ledger_refuses_unsigned_writes_from_the_owners_registration_on(target):
    with open_ledger(target, signing_key=OWNER) as led:
        led.register_key()  # no policy entry: the registration is the policy
    with (
        open_ledger(target, signing_key=None) as led,
        pytest.raises(LedgerError, match="requires signed entries .since entry #1"),
    ):
        led.record(release(0))


# ---------------------------------------------------------------- keys, policy, anchors


def test_keys_policy_and_who_may_sign(target):
    with open_ledger(target, signing_key=ALICE) as led:
        with pytest.raises(UsageError, match="must be signed by a registered key"):
            led.require_signatures()  # no key registered yet
        led.record(release(0))  # unsigned: allowed until the policy
    with open_ledger(target, signing_key=OWNER) as led:
        with pytest.raises(UsageError, match="first key registered must be your own"):
            led.register_key(ALICE.public_text)
        led.register_key()
        led.register_key(ALICE.public_text, "alice")
        led.require_signatures()
    with open_ledger(target, signing_key=MALLORY) as led:  # not registered
        with pytest.raises(LedgerError, match="requires signed entries.*not registered"):
            led.record(release(1))
        with pytest.raises(LedgerError, match="requires signed entries"):
            led.register_key(MALLORY.public_text)
    with open_ledger(target, signing_key=None) as led:
        with pytest.raises(LedgerError, match="no signing key"):
            led.cap("toy", 5.0, 1e-5)
    with open_ledger(target, signing_key=ALICE) as led:
        eid = led.record(release(1))
        assert led.get(eid).signer == ALICE.key_id
        rep = led.verify(owner=OWNER.key_id)
        assert rep.ok, rep.problems
        assert (
            rep.signatures["owner"] == OWNER.key_id
            and rep.signatures["unsigned"] == 1
            and rep.signatures["signed"] == 4
        )
        assert {k["name"] for k in rep.signatures["keys"]} == {"owner", "alice"}
        assert not led.verify(owner=MALLORY.key_id).ok
        assert len(led.entries(kind="release")) == 2  # key and policy entries compose nothing
        assert [r["releases"] for r in led.summary() if r["partition"] == "*"] == [0]


def test_an_anchor_detects_a_truncated_tail(target):
    with open_ledger(target, signing_key=None) as led:
        for i in range(3):
            led.record(release(i))
        anchor = led.head()["hash"]
        assert led.verify(anchor=anchor).ok
        led.record(release(3))
        assert led.verify(anchor=anchor).ok  # later entries keep the anchor in the chain
    # Remove the tail behind dpaudit's back and move the chain head back: the chain itself is intact ...
    rows = _rows(target)
    if isinstance(target, Path):
        import sqlite3

        conn = sqlite3.connect(target, isolation_level=None)
        conn.execute("DROP TRIGGER entries_no_delete")
        conn.execute("DELETE FROM entries WHERE seq >= 3")
        conn.execute("UPDATE chain_head SET seq = 2, count = 2, hash = ?", (rows[1][7],))
        conn.close()
    else:
        import psycopg

        from dpaudit.ledger.paths import resolve_ledger

        loc = resolve_ledger(target)
        s = f'"{loc.schema}"'
        with psycopg.connect(loc.url, autocommit=True) as c:
            c.execute(f"ALTER TABLE {s}.entries DISABLE TRIGGER entries_no_delete")
            c.execute(f"ALTER TABLE {s}.chain_head DISABLE TRIGGER chain_head_guard")
            c.execute(f"DELETE FROM {s}.entries WHERE seq >= 3")
            c.execute(f"UPDATE {s}.chain_head SET seq = 2, count = 2, hash = %s", (rows[1][7],))
            c.execute(f"ALTER TABLE {s}.entries ENABLE TRIGGER entries_no_delete")
            c.execute(f"ALTER TABLE {s}.chain_head ENABLE TRIGGER chain_head_guard")
    found, _ = _problems(target)
    assert found == []
    # ... but the published head is gone.
    found, _ = _problems(target, anchor=anchor)
    assert [p.kind for p in found] == ["anchor"] and "truncated or rewritten" in found[0].message
    r = CliRunner().invoke(app, ["ledger", "verify", "--anchor", anchor, "--ledger", str(target)])
    assert r.exit_code == 1 and "truncated or rewritten" in r.output
    r = CliRunner().invoke(app, ["ledger", "verify", "--anchor", "xyz", "--ledger", str(target)])
    assert r.exit_code == 2 and "anchor must be" in r.output


def test_the_cli_team_workflow(tmp_path, monkeypatch, target):
    """keygen, register the owner and a member, require signatures, record, head, verify."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv(sg.SIGNING_KEY_ENV, raising=False)
    run = CliRunner().invoke
    led = ["--ledger", str(target)]
    r = run(app, ["ledger", "keygen", "--json"])
    owner = json.loads(r.output)
    r = run(app, ["ledger", "keygen", "--name", "bob", "--json"])
    bob = json.loads(r.output)
    r = run(app, ["ledger", "register-key", "--json", *led])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["role"] == "owner"
    r = run(
        app,
        [
            "ledger",
            "register-key",
            "--public-key",
            bob["public_key"],
            "--name",
            "bob",
            "--json",
            *led,
        ],
    )
    assert r.exit_code == 0 and json.loads(r.output)["registered_by"] == owner["key_id"]
    assert run(app, ["ledger", "require-signatures", *led]).exit_code == 0
    monkeypatch.setenv(sg.SIGNING_KEY_ENV, "bob")
    # digits (embedded data): the cap declares its rows, two signed `rows` entries before the cap
    r = run(app, ["ledger", "cap", "--dataset", "digits", "--eps", "3", "--delta", "1e-5", *led])
    assert r.exit_code == 2 and "only the owner may set or raise a cap" in " ".join(
        r.output.split()
    )  # a member sets no cap
    r = run(
        app,
        [
            "ledger",
            "cap",
            "--dataset",
            "digits",
            "--eps",
            "3",
            "--delta",
            "1e-5",
            "--key",
            "default",
            *led,
        ],
    )
    assert r.exit_code == 0, r.output
    r = run(app, ["ledger", "head", "--json", *led])
    head = json.loads(r.output)
    assert head["entries"] == 6
    r = run(
        app,
        ["ledger", "verify", "--json", "--anchor", head["hash"], "--owner", owner["key_id"], *led],
    )
    rep = json.loads(r.output)
    assert r.exit_code == 0 and rep["ok"]
    assert rep["signatures"]["signed"] == 6 and rep["signatures"]["required_since"] == 1
    r = run(app, ["ledger", "list", "--json", *led])
    assert [e.get("signer") for e in json.loads(r.output)["entries"]] == [owner["key_id"]] * 6
    monkeypatch.setenv(sg.SIGNING_KEY_ENV, str(tmp_path / "nope.key"))
    r = run(app, ["ledger", "cap", "--dataset", "digits", "--eps", "3", "--delta", "1e-5", *led])
    assert r.exit_code == 2 and "signing key must be an existing key" in r.output


# ---------------------------------------------------------------- moving between backends


def test_export_import_sqlite_to_postgresql_and_back_keeps_every_hash_and_signature(
    tmp_path, pg_ledger_url
):
    src, back = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    with open_ledger(src, signing_key=OWNER) as led:
        led.register_key()
        led.cap("toy", 9.0, 1e-5)
        rid = led.reserve(
            dataset="toy",
            partition="train",
            event=PureEpsilon(1.0),
            adjacency="add-remove-record",
            data_digest="ab" * 32,
        )
        led.settle(rid, [release(0)])
        mistake = release(1)
        led.record(mistake)
        led.void(mistake.id, "mistake", published=False)
        before = led.summary()
        fp = led.fingerprint("cd" * 32)
        import base64

        secret = base64.b64encode(led._key()).decode("ascii")
    run = CliRunner().invoke
    dump = tmp_path / "dump.json"
    # The fingerprint key leaves only when asked for.
    r = run(app, ["ledger", "export", "--out", str(dump), "--ledger", str(src)])
    assert r.exit_code == 0 and "without" in r.output, r.output
    assert (
        secret not in dump.read_text() and json.loads(dump.read_text())["fingerprint_key"] is None
    )
    r = run(app, ["ledger", "export", "--include-key", "--out", str(dump), "--ledger", str(src)])
    assert r.exit_code == 2 and "must be a new file" in r.output  # never overwritten
    dump.unlink()
    r = run(app, ["ledger", "export", "--include-key", "--out", str(dump), "--ledger", str(src)])
    assert r.exit_code == 0, r.output
    assert json.loads(dump.read_text())["fingerprint_key"] == secret
    assert (dump.stat().st_mode & 0o777) == 0o600
    r = run(app, ["ledger", "import", "--from", str(dump), "--json", "--ledger", pg_ledger_url])
    assert r.exit_code == 0 and json.loads(r.output)["ok"], r.output
    r = run(
        app,
        [
            "ledger",
            "export",
            "--include-key",
            "--out",
            str(tmp_path / "dump2.json"),
            "--ledger",
            pg_ledger_url,
        ],
    )
    assert r.exit_code == 0, r.output
    r = run(
        app, ["ledger", "import", "--from", str(tmp_path / "dump2.json"), "--ledger", str(back)]
    )
    assert r.exit_code == 0, r.output
    a, p, b = _rows(src), _rows(pg_ledger_url), _rows(back)
    assert a == p == b and all(r[8] == OWNER.key_id for r in a)
    for t in (pg_ledger_url, back):
        with open_ledger(t, signing_key=None) as led:
            assert led.verify(owner=OWNER.key_id).ok
            assert led.summary() == before
            assert (
                led.fingerprint("cd" * 32) == fp
            )  # same fingerprint key: new data is identified alike
    # Importing twice, or into a ledger with entries, is refused.
    r = run(app, ["ledger", "import", "--from", str(dump), "--ledger", pg_ledger_url])
    assert r.exit_code == 2 and "must be empty" in r.output


# ---------------------------------------------------------------- PostgreSQL under load and faults


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX processes")
def test_eight_concurrent_runs_against_a_postgresql_cap_that_admits_three(tmp_path, pg_ledger_url):
    """Eight real DP-ELM runs (separate processes, as on separate machines) released at once
    against one PostgreSQL ledger: exactly three complete, five are refused before training."""
    with open_ledger(pg_ledger_url) as led:
        led.cap("race", 3.5, 1e-5)  # admits three pure epsilon-1 releases
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(RACER), pg_ledger_url, str(tmp_path / f"run{i}")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(8)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", (
                f"racer did not start: {line!r} {p.stderr.read() if p.poll() is not None else ''}"
            )
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    released = [o for (o, _), c in zip(outs, codes) if c == 0]
    refused = [o for (o, _), c in zip(outs, codes) if c == 3]
    assert sorted(codes) == [0] * 3 + [3] * 5, [(c, o, e[-400:]) for (o, e), c in zip(outs, codes)]
    assert all("BudgetExceededError" in o and "training" not in o.splitlines() for o in refused), (
        refused
    )
    assert all("training" in o.splitlines() for o in released)
    with open_ledger(pg_ledger_url) as led:
        assert len(led.entries(kind="release")) == 3 and led.open_reservations() == []
        total = [r for r in led.summary("race") if r["partition"] == "*"][0]
        assert total["epsilon"] == pytest.approx(3.0)
        assert led.verify().ok


@pytest.mark.slow
def test_a_server_restart_during_a_run_is_one_clear_error_and_the_ledger_stays_valid(
    private_pg_cluster,
):
    """A run reserves its budget, the server restarts while it trains, and the run then settles:
    (1) a write in flight during the restart fails with one LedgerError line and leaves nothing;
    (2) the reservation made before the restart is still there, spent, visible and voidable;
    (3) verify passes."""
    helper, root, url = private_pg_cluster
    with open_ledger(url, signing_key=OWNER) as led:
        led.register_key()
        led.cap("toy", 3.0, 1e-5)
        rid = led.reserve(
            dataset="toy",
            partition="train",
            event=PureEpsilon(1.0),
            adjacency="add-remove-record",
            data_digest="ab" * 32,
        )
        # The server restarts while the settlement's transaction is open.
        real_record = led._record

        def record_then_restart(rel, art, *rows):  # rows: the reservation's row sets
            out = real_record(rel, art, *rows)
            helper.restart(root)
            return out

        led._record = record_then_restart
        with pytest.raises(LedgerError) as ei:
            led.settle(rid, [release(0)])
        msg = str(ei.value)
        assert (
            "connection to the PostgreSQL server was lost" in msg
            and "no entry is half-written" in msg
            and "\n" not in msg
        )
        led._record = real_record
        # Nothing of the settlement is there; the reservation is open (spent) and listed.
        assert [e.kind for e in led.entries()] == ["key", "cap", "reservation"]
        assert [e.id for e in led.open_reservations()] == [rid]
        row = [r for r in led.summary("toy") if r["partition"] == "*"][0]
        assert row["open_reservations"] == 1 and row["epsilon"] == pytest.approx(1.0)
        assert led.verify().ok
        # The operator voids it (the same connection object reconnects between transactions).
        led.void(rid, "server restarted mid-run", published=False)
        assert led.open_reservations() == [] and led.verify().ok


def test_a_granted_writer_role_uses_the_ledger_but_cannot_rewrite_it(
    pg_server_url, pg_schema, pg_role, tmp_path
):
    from .conftest import with_schema

    name, _pw, role_url = pg_role
    owner_url, writer_url = with_schema(pg_server_url, pg_schema), with_schema(role_url, pg_schema)
    with open_ledger(owner_url, signing_key=OWNER) as led:
        led.register_key()
        led.register_key(ALICE.public_text, "alice")
        led.cap("toy", 5.0, 1e-5)
    r = CliRunner().invoke(app, ["ledger", "grant", "--role", name, "--ledger", owner_url])
    assert r.exit_code == 0, r.output
    with open_ledger(writer_url, signing_key=ALICE) as led:
        rid = led.reserve(
            dataset="toy",
            partition="train",
            event=PureEpsilon(1.0),
            adjacency="add-remove-record",
            data_digest="ab" * 32,
        )
        (eid,) = led.settle(rid, [release(0)])
        assert led.get(eid).signer == ALICE.key_id and led.verify().ok
        for sql in (
            "UPDATE {s}.entries SET payload = '{{}}'",
            "DELETE FROM {s}.entries",
            "DROP TRIGGER entries_no_update ON {s}.entries",
        ):
            with pytest.raises(LedgerError, match="permission denied|must be owner"):
                led.store.execute(sql.format(s=led.store.s))
    r = CliRunner().invoke(
        app, ["ledger", "grant", "--role", name, "--ledger", str(tmp_path / "l.sqlite")]
    )
    assert r.exit_code == 2 and "must be a postgresql:// ledger" in r.output


# ---------------------------------------------------------------- voids need authority


def test_on_a_signed_ledger_only_the_owner_voids_and_says_whether_artefacts_were_published(target):
    from dpaudit.accounting import Composed, compute_epsilon
    from dpaudit.errors import LedgerAuthorityError

    with open_ledger(target, signing_key=OWNER) as led:
        led.register_key()
        led.register_key(ALICE.public_text, "alice")
        a, b, _ = (led.record(release(i, nm=0.7)) for i in range(3))
        full = next(r for r in led.summary(accountants=("rdp",)) if r["partition"] == "*")[
            "epsilon"
        ]
    with (
        open_ledger(target, signing_key=ALICE) as led,
        pytest.raises(LedgerAuthorityError, match="signed by its owner's key"),
    ):
        led.void(a, "mistake", published=False)
    with open_ledger(target, signing_key=OWNER) as led:
        with pytest.raises(LedgerAuthorityError, match="ever published"):
            led.void(a, "mistake")
        led.void(a, "recorded twice", published=False)
        led.void(b, "withdrawn after publication", published=True)
        row = next(r for r in led.summary(accountants=("rdp",)) if r["partition"] == "*")
        assert led.verify(owner=OWNER.key_id).ok
    # The never-published void leaves the total and is shown apart; the published one keeps counting.
    kept = Composed((SubsampledGaussian(0.7, 0.01, 101), SubsampledGaussian(0.7, 0.01, 102)))
    assert row["epsilon_rdp"] == pytest.approx(
        compute_epsilon(kept, delta=1e-5, accountant="rdp").epsilon, rel=1e-9
    )
    assert row["epsilon"] < full
    assert row["voided_releases"] == 2 and row["voided_published_releases"] == 1
    alone = compute_epsilon(
        SubsampledGaussian(0.7, 0.01, 100), delta=1e-5, accountant="rdp"
    ).epsilon
    assert row["voided_epsilon"] == pytest.approx(alone, rel=1e-9)
    r = CliRunner().invoke(
        app, ["ledger", "summary", "--ledger", str(target)], env={"COLUMNS": "200"}
    )
    out = " ".join(r.output.split())
    assert r.exit_code == 0 and "voided, not counted" in out and "still counted: 1" in out
