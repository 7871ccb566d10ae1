"""Ed25519 signing of ledger entries: key files, the key ring, and what a signature catches."""

from __future__ import annotations

import json
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.ledger import signing as sg
from dpaudit.errors import LedgerError, UsageError

G = "0" * 64


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv(sg.SIGNING_KEY_ENV, raising=False)
    return tmp_path / "cfg" / "dpaudit" / "keys"


def test_keygen_writes_a_private_key_only_its_owner_can_read(cfg):
    k = sg.keygen()
    assert k.path == cfg / "default.key"
    assert stat.S_IMODE(k.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o700
    pub = (cfg / "default.pub").read_text().strip()
    assert pub == k.public_text and sg.parse_public_key(pub) == k.public_raw
    assert len(k.key_id) == 32 and k.key_id == sg.key_id(k.public_raw)
    # Loading it back (default name, by name, by path, via the environment) gives the same key.
    for which in (None, "default", str(k.path)):
        assert sg.load_signing_key(which).key_id == k.key_id


def test_keygen_never_overwrites_and_names_are_checked(cfg):
    k = sg.keygen("alice")
    before = k.path.read_bytes()
    with pytest.raises(UsageError, match="key name must be new"):
        sg.keygen("alice")
    assert k.path.read_bytes() == before
    with pytest.raises(UsageError, match="key name must be"):
        sg.keygen("../evil")


def test_loading_keys(cfg, monkeypatch, tmp_path):
    assert sg.load_signing_key() is None  # no default key: unsigned, no error
    with pytest.raises(UsageError, match="signing key must be an existing key"):
        sg.load_signing_key("nobody")
    b = sg.keygen("bob")
    monkeypatch.setenv(sg.SIGNING_KEY_ENV, "bob")
    assert sg.load_signing_key().key_id == b.key_id
    monkeypatch.setenv(sg.SIGNING_KEY_ENV, "carol")
    with pytest.raises(UsageError, match="'carol'"):
        sg.load_signing_key()
    os.chmod(b.path, 0o644)
    with pytest.raises(LedgerError, match="readable by other users"):
        sg.load_signing_key("bob")
    bad = tmp_path / "x.key"
    bad.write_text("not a key")
    bad.chmod(0o600)
    with pytest.raises(LedgerError, match="not an unencrypted PEM"):
        sg.load_signing_key(str(bad))


def test_public_keys_parse_from_text_pem_and_files(cfg, tmp_path):
    k = sg.keygen()
    from cryptography.hazmat.primitives import serialization

    pem = (
        k.private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    assert sg.parse_public_key(pem) == k.public_raw
    assert sg.parse_public_key(str(cfg / "default.pub")) == k.public_raw
    for bad in ("", "ed25519:", "ed25519:!!!", "ed25519:" + "QUFB" * 4, "rsa:AAAA"):
        with pytest.raises(UsageError, match="public key must be"):
            sg.parse_public_key(bad)


# ---------------------------------------------------------------- the key ring


def _key(seed: int) -> sg.SigningKey:
    return sg.SigningKey(f"k{seed}", None, Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32))


OWNER, MEMBER, OUTSIDER = _key(1), _key(2), _key(3)


class Chain:
    """Builds rows the way the ledger does: each signature covers the previous row's hash."""

    def __init__(self):
        self.rows: list[sg.SignedRow] = []

    def add(self, kind, payload, signer: sg.SigningKey | None, *, dataset="ds", sign_as=None):
        import hashlib

        seq = len(self.rows) + 1
        prev = self.rows[-1].signature_hash if self.rows else G
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        eid = f"e{seq}"
        kid = (sign_as or signer).key_id if signer else None
        sig = (
            signer.sign(sg.signing_material(prev, eid, kind, "t", dataset, text, kid))
            if signer
            else None
        )
        row = sg.SignedRow(seq, eid, kind, "t", dataset, text, prev, kid, sig)
        h = hashlib.sha256(json.dumps(list(row)).encode()).hexdigest()
        self.rows.append(_Row(row, h))
        return self

    def register(self, key, by, role="member"):
        return self.add(
            sg.KEY_KIND, sg.key_payload(key.public_raw, key.name, role), by, dataset=sg.LEDGER_SCOPE
        )

    def plain(self):
        return [r.row for r in self.rows]


class _Row:
    def __init__(self, row, h):
        self.row, self.signature_hash = row, h

    def __getattr__(self, name):
        return getattr(self.row, name)


def _team() -> Chain:
    c = Chain().register(OWNER, OWNER, "owner")
    c.add("release", {"noise_multiplier": 1.0}, OWNER)
    c.register(MEMBER, OWNER)
    c.add("release", {"noise_multiplier": 0.8}, MEMBER)
    return c


def test_a_team_ledger_verifies_and_the_ring_knows_its_keys():
    ring, found = sg.check_signatures(_team().plain())
    assert found == []
    assert ring.owner == OWNER.key_id
    assert set(ring.keys) == {OWNER.key_id, MEMBER.key_id}
    assert ring.keys[MEMBER.key_id].registered_by == OWNER.key_id
    assert (ring.signed, ring.unsigned) == (4, 0)
    ring, found = sg.check_signatures(_team().plain(), owner=OWNER.key_id)
    assert found == []


def test_an_edited_entry_fails_naming_it_even_after_rehashing():
    rows = _team().plain()
    edited = rows[3]._replace(payload_text=rows[3].payload_text.replace("0.8", "1.6"))
    _, found = sg.check_signatures(rows[:3] + [edited])
    assert [(f.seq, f.id) for f in found] == [(4, "e4")]
    assert (
        "invalid signature by key" in found[0].message
        and "entry #4 (release e4)" in found[0].message
    )


def test_a_signature_covers_the_previous_hash():
    rows = _team().plain()
    moved = rows[1]._replace(prev_hash="f" * 64)
    _, found = sg.check_signatures([rows[0], moved] + rows[2:])
    assert [f.seq for f in found] == [2]


def test_signers_must_be_registered_before_they_sign():
    c = Chain().register(OWNER, OWNER, "owner").add("release", {}, OUTSIDER)
    _, found = sg.check_signatures(c.plain())
    assert [f.seq for f in found] == [2] and "not registered before it" in found[0].message
    # A registration signed by an unregistered key does not count either.
    c = (
        Chain()
        .register(OWNER, OWNER, "owner")
        .register(MEMBER, OUTSIDER)
        .add("release", {}, MEMBER)
    )
    _, found = sg.check_signatures(c.plain())
    assert [f.seq for f in found] == [2, 3]


def test_the_first_key_must_sign_its_own_registration_and_can_be_pinned():
    c = Chain().register(OWNER, MEMBER, "owner")
    _, found = sg.check_signatures(c.plain())
    assert [f.seq for f in found] == [1]
    # Someone who re-creates the ledger with their own key as owner is caught by pinning the owner.
    c = Chain().register(OUTSIDER, OUTSIDER, "owner").add("release", {}, OUTSIDER)
    _, found = sg.check_signatures(c.plain(), owner=OWNER.key_id)
    assert found and "not the expected owner" in found[0].message
    _, found = sg.check_signatures([], owner=OWNER.key_id)
    assert found and "no owner key" in found[0].message


def test_the_owners_registration_makes_every_later_unsigned_entry_a_problem():
    # The policy is the owner's signed registration, not a deletable marker.
    c = _team().add("release", {}, None)
    ring, found = sg.check_signatures(c.plain())
    assert ring.required_since == 1
    assert [f.seq for f in found] == [5] and "requires signatures since entry #1" in found[
        0
    ].message
    # A policy entry (older ledgers) changes nothing.
    c = (
        _team()
        .add(sg.POLICY_KIND, {"require_signatures": True}, OWNER, dataset=sg.LEDGER_SCOPE)
        .add("release", {}, None)
    )
    ring, found = sg.check_signatures(c.plain())
    assert ring.required_since == 1 and [f.seq for f in found] == [6]
    # Unsigned entries before the registration are fine: the policy starts there.
    c = Chain().add("release", {}, None).register(OWNER, OWNER, "owner").add("release", {}, OWNER)
    ring, found = sg.check_signatures(c.plain(), owner=OWNER.key_id)
    assert found == [] and ring.required_since == 2 and (ring.signed, ring.unsigned) == (2, 1)


def test_rewriting_the_unsigned_history_before_the_registration_breaks_its_signature():
    c = (
        Chain()
        .add("release", {"noise_multiplier": 1.0}, None)
        .register(OWNER, OWNER, "owner")
        .add("release", {}, OWNER)
    )
    forged = Chain().add(
        "release", {"noise_multiplier": 9.0}, None
    )  # the first entry edited, its hash recomputed
    rows = c.plain()
    rows = [forged.plain()[0], rows[1]._replace(prev_hash=forged.rows[0].signature_hash), rows[2]]
    _, found = sg.check_signatures(rows, owner=OWNER.key_id)
    assert [f.seq for f in found][:1] == [2] and "invalid signature" in found[0].message
    assert any("no owner key" in f.message for f in found)


def test_a_pinned_owner_whose_registration_was_removed_is_named():
    # The whole signed tail deleted and re-inserted unsigned: only the pinned owner can tell.
    c = Chain().add("release", {}, None).add("release", {}, None)
    ring, found = sg.check_signatures(c.plain())
    assert found == [] and ring.owner is None
    _, found = sg.check_signatures(c.plain(), owner=OWNER.key_id)
    assert (
        len(found) == 1
        and "registers no owner key" in found[0].message
        and "removed" in found[0].message
    )


def test_a_void_on_a_signed_ledger_is_signed_by_the_owner_and_says_whether_it_was_published():
    ok = _team().add("void", {"target": "e4", "reason": "r", "artefacts_published": False}, OWNER)
    assert sg.check_signatures(ok.plain())[1] == []
    by_member = _team().add(
        "void", {"target": "e4", "reason": "r", "artefacts_published": False}, MEMBER
    )
    _, found = sg.check_signatures(by_member.plain())
    assert [f.seq for f in found] == [5] and "not by the ledger's owner" in found[0].message
    silent = _team().add("void", {"target": "e4", "reason": "r"}, OWNER)
    _, found = sg.check_signatures(silent.plain())
    assert [f.seq for f in found] == [5] and "artefacts_published" in found[0].message
    for kind in ("void", "cap", "partition"):
        _, found = sg.check_signatures(_team().add(kind, {"target": "e4"}, None).plain())
        assert [f.seq for f in found] == [5] and "is unsigned" in found[0].message
    # Without a policy an unsigned release is allowed (old ledgers), an unsigned key entry is not.
    c = (
        Chain()
        .add("release", {}, None)
        .add(sg.KEY_KIND, sg.key_payload(OWNER.public_raw, "o", "owner"), None, dataset="")
    )
    ring, found = sg.check_signatures(c.plain())
    assert [f.seq for f in found] == [2] and ring.unsigned == 2


@settings(max_examples=40, deadline=None)
@given(
    which=st.integers(0, 3),
    field=st.sampled_from(["id", "kind", "created_at", "dataset", "payload_text", "prev_hash"]),
    pos=st.integers(0, 200),
    flip=st.integers(1, 255),
)
def test_any_change_to_any_signed_field_is_named(which, field, pos, flip):
    rows = _team().plain()
    r = rows[which]
    value = getattr(r, field)
    i = pos % len(value) if value else 0
    changed = (
        (value[:i] + chr((ord(value[i]) ^ flip) % 128 or 1) + value[i + 1 :]) if value else "x"
    )
    if changed == value:
        return
    rows[which] = r._replace(**{field: changed})
    _, found = sg.check_signatures(rows)
    assert which + 1 in [f.seq for f in found]


def test_cli_keygen_prints_the_public_key_and_refuses_to_overwrite(cfg):
    from typer.testing import CliRunner

    from dpaudit.cli import app

    r = CliRunner().invoke(app, ["ledger", "keygen", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    k = sg.load_signing_key()
    assert out["key_id"] == k.key_id and out["public_key"] == k.public_text
    assert stat.S_IMODE(k.path.stat().st_mode) == 0o600
    r = CliRunner().invoke(app, ["ledger", "keygen"])
    assert r.exit_code == 2 and "key name must be new" in r.output
