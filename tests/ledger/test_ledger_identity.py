"""Dataset identity in the ledger.

- A dataset name means one set of records: a release (or a planned one, before training) whose
  data fingerprint differs from the name's recorded versions is refused unless the new version is
  declared; declared versions compose sequentially.
- The fingerprint is keyed (HMAC-SHA256 with a secret beside the ledger): no listing shows the
  plain digest of the private data.
- DP-ELM with the uncertified textbook Laplace sampler makes the dataset total unbounded.
- Bring-your-own proxy predictions are budgeted by content, not by file name.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import shutil
import stat

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.accounting import Composed, Parallel, SubsampledGaussian, compute_epsilon
from dpaudit.ledger.book import open_ledger
from dpaudit.cli import app
from dpaudit.errors import BudgetExceededError, DPAuditError, LedgerError, UsageError
from dpaudit.records import Release

SHA_A = "a1" * 32
SHA_B = "b2" * 32
MIX = SubsampledGaussian(noise_multiplier=4.0, sample_rate=1.0, steps=3)
FT = SubsampledGaussian(noise_multiplier=6.0, sample_rate=1.0, steps=10)
runner = CliRunner()


def release(event, digest, *, partition="train", dataset="digits-mix", **ds) -> Release:
    return Release(
        mechanism="dp-mixmin",
        dataset={"name": dataset, "sha256": digest, **ds},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee=event.to_dict(),
        seed=0,
        noise_source={"kind": "test"},
        partition=partition,
        git_commit=None,
    )


def best(event, delta=1e-5) -> float:
    """The ledger's headline bound, computed independently: the smaller of rdp and prv."""
    return min(compute_epsilon(event, delta=delta, accountant=a).epsilon for a in ("rdp", "prv"))


def total(led, dataset="digits-mix") -> dict:
    return [r for r in led.summary(dataset) if r["partition"] == "*"][0]


# ---------------------------------------------------------------- point 2: one name, one set of records


def test_other_data_under_a_known_name_is_refused_until_declared_then_versions_compose_sequentially(
    tmp_path,
):
    with open_ledger(tmp_path / "l.sqlite") as led:
        led.declare_partition("digits-mix", "split", ["split/mix", "split/ft"], "dp-mixmin")
        led.record(release(MIX, SHA_A, partition="split/mix", split_seed=42))
        # Same data: parallel children of the declared split (the worst child counts).
        led.record(release(FT, SHA_A, partition="split/ft", split_seed=42))
        assert total(led)["epsilon"] == pytest.approx(best(Parallel((MIX, FT))), rel=1e-9)
        other = release(FT, SHA_B, partition="split/ft", split_seed=43)
        with pytest.raises(DPAuditError) as e:
            led.record(other)
        msg = str(e.value)
        fp_a, fp_b = led.fingerprint(SHA_A), led.fingerprint(SHA_B)
        assert "\n" not in msg and "'digits-mix'" in msg and fp_a[:12] in msg and fp_b[:12] in msg
        assert "the split differs: split_seed 43 here, 42 in the recorded releases" in msg
        assert f"dpaudit ledger declare-version digits-mix --fingerprint {fp_b}" in msg
        # ... and before training, from the planned release's digest.
        with pytest.raises(DPAuditError, match="refused before training"):
            led.preflight(
                dataset="digits-mix",
                partition="split/ft",
                event=FT,
                adjacency="add-remove-record",
                data_digest=SHA_B,
            )
        with pytest.raises(DPAuditError):
            led.reserve(
                dataset="digits-mix",
                partition="split/ft",
                event=FT,
                adjacency="add-remove-record",
                data_digest=SHA_B,
            )
        assert len(led.entries(kind="release")) == 2 and led.entries(kind="reservation") == []
        # Declared: accepted, and the versions compose sequentially even across the "disjoint"
        # children (the split of one version says nothing about the other's records).
        vid = led.declare_version("digits-mix", fp_b, "split seed 43")
        assert led.declare_version("digits-mix", fp_b.upper(), "again") == vid  # idempotent
        led.preflight(
            dataset="digits-mix",
            partition="split/ft",
            event=FT,
            adjacency="add-remove-record",
            data_digest=SHA_B,
        )
        led.record(other)
        row = total(led)
        assert row["epsilon"] == pytest.approx(best(Composed((Parallel((MIX, FT)), FT))), rel=1e-9)
        assert row["epsilon"] > best(Parallel((MIX, FT)))
        ft_row = [r for r in led.summary("digits-mix") if r["partition"] == "split/ft"][0]
        assert ft_row["epsilon"] == pytest.approx(best(Composed((FT, FT))), rel=1e-9)
        assert row["dataset_fingerprints"] == sorted([fp_a, fp_b])
        with pytest.raises(UsageError, match="64 hex"):
            led.declare_version("digits-mix", fp_b[:12], "prefix only")
        with pytest.raises(UsageError, match="already use"):
            led.declare_version("digits-mix", fp_a, "known")
        assert led.verify().ok


def test_declare_version_through_the_cli(tmp_path):
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as led:
        led.record(release(MIX, SHA_A))
        fp = led.fingerprint(SHA_B)
        with pytest.raises(DPAuditError) as e:
            led.record(release(MIX, SHA_B))
    # The refusal's own command line works as printed (plus a reason).
    cmd = str(e.value).split("declare it: ", 1)[1].split(" --reason")[0].split()
    assert cmd[:3] == ["dpaudit", "ledger", "declare-version"]
    r = runner.invoke(app, cmd[1:] + ["--reason", "new split", "--ledger", str(path), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["fingerprint"] == fp and d["dataset"] == "digits-mix" and len(d["previous"]) == 1
    with open_ledger(path) as led:
        led.record(release(MIX, SHA_B))
        assert total(led)["releases_subtree"] == 2
    r = runner.invoke(
        app,
        [
            "ledger",
            "declare-version",
            "digits-mix",
            "--fingerprint",
            "xyz",
            "--reason",
            "r",
            "--ledger",
            str(path),
        ],
    )
    assert r.exit_code == 2 and "fingerprint must be" in r.output


@pytest.mark.slow
def test_dp_elm_split_seed_changes_the_identity_but_the_public_seed_does_not(tmp_path):
    from dpaudit.releasing import release
    from dpaudit.requests import DPELMRequest

    path = tmp_path / "l.sqlite"
    kw = dict(dataset="digits", width=3, epsilon=1.0)
    release(
        "dp-elm", DPELMRequest(seed=1, split_seed=5, **kw), out_dir=tmp_path / "a", ledger_path=path
    )
    release(
        "dp-elm", DPELMRequest(seed=2, split_seed=5, **kw), out_dir=tmp_path / "b", ledger_path=path
    )  # random features only: same data
    with pytest.raises(
        DPAuditError, match="the split differs: split_seed 6 here, 5 in the recorded releases"
    ) as e:
        release(
            "dp-elm",
            DPELMRequest(seed=1, split_seed=6, **kw),
            out_dir=tmp_path / "c",
            ledger_path=path,
        )
    assert (
        "refused before training" in str(e.value) and not (tmp_path / "c" / "release.json").exists()
    )
    with open_ledger(path) as led:
        assert (
            len(led.entries(kind="release")) == 2
            and len(total(led, "digits")["dataset_fingerprints"]) == 1
        )


# ---------------------------------------------------------------- point 5: keyed fingerprint


def test_the_ledger_stores_and_shows_a_keyed_fingerprint_never_the_plain_digest(tmp_path):
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as led:
        rid = led.record(release(MIX, SHA_A))
    for f in path.parent.glob("l.sqlite*"):  # database, WAL: the plain digest is nowhere
        if not f.name.endswith(".key"):
            assert SHA_A.encode() not in f.read_bytes(), f
    with open_ledger(path) as led:
        led.reserve(
            dataset="digits-mix",
            partition="train",
            event=MIX,
            adjacency="add-remove-record",
            data_digest=SHA_A,
        )
        key_file = led.key_path
    key = key_file.read_bytes()
    assert key_file == path.with_name("l.sqlite.key") and len(key) == 32
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    expected = hmac.new(key, SHA_A.encode("ascii"), hashlib.sha256).hexdigest()  # independent HMAC
    listed = json.loads(
        runner.invoke(app, ["ledger", "list", "--ledger", str(path), "--json"]).stdout
    )["entries"]
    shown = json.loads(
        runner.invoke(app, ["ledger", "summary", "--ledger", str(path), "--json"]).stdout
    )["rows"]
    one = json.loads(
        runner.invoke(app, ["ledger", "show", rid, "--ledger", str(path), "--json"]).stdout
    )
    text = json.dumps([listed, shown, one])
    assert SHA_A not in text and "dataset_sha256" not in text
    assert [e["dataset_fingerprint"] for e in listed] == [expected, expected] and one[
        "dataset_fingerprint"
    ] == expected
    assert all(r["dataset_fingerprints"] == [expected] for r in shown)
    # The key is the ledger's own: another ledger fingerprints the same data differently.
    with open_ledger(tmp_path / "other.sqlite") as other:
        assert other.fingerprint(SHA_A) != expected
    # A lost key is an error, never silently replaced (that would make every dataset look new).
    key_file.unlink()
    with open_ledger(path) as led, pytest.raises(LedgerError, match="key .* is missing"):
        led.fingerprint(SHA_A)


def test_entries_written_before_keyed_fingerprints_are_keyed_when_read_and_keep_their_identity(
    tmp_path,
):
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as led:
        # An entry as the previous dpaudit wrote it: the plain sha256 in the payload.
        old = {
            "release_id": "old1",
            "mechanism": "dp-rvfl",
            "dataset_name": "digits-mix",
            "dataset_sha256": SHA_A,
            "partition": "train",
            "adjacency": "add-remove-record",
            "guarantee": MIX.to_dict(),
            "epsilon": 1.0,
            "delta": 1e-5,
            "non_private": False,
        }
        with led.store.write():
            led._append("release", "digits-mix", old, entry_id="old1")
    with open_ledger(path) as led:
        e = led.get("old1")
        assert (
            e.payload["dataset_fingerprint"] == led.fingerprint(SHA_A)
            and "dataset_sha256" not in e.payload
        )
        led.record(release(MIX, SHA_A))  # the same data as the old entry: accepted
        with pytest.raises(DPAuditError, match="declare-version"):
            led.record(release(MIX, SHA_B))
        row = total(led)
        assert row["dataset_fingerprints"] == [led.fingerprint(SHA_A)]
        assert row["epsilon"] == pytest.approx(best(Composed((MIX, MIX))), rel=1e-9)
        assert led.verify().ok


# ---------------------------------------------------------------- point 6: uncertified DP-ELM


@pytest.mark.slow
def test_a_textbook_laplace_dp_elm_release_makes_the_total_unbounded_until_voided(tmp_path):
    from dpaudit.releasing import release
    from dpaudit.requests import DPELMRequest

    path = tmp_path / "l.sqlite"
    kw = dict(dataset="digits", width=3, epsilon=1.0)
    release("dp-elm", DPELMRequest(**kw), out_dir=tmp_path / "a", ledger_path=path)
    rel = release(
        "dp-elm", DPELMRequest(sampler="textbook", **kw), out_dir=tmp_path / "b", ledger_path=path
    )
    with open_ledger(path) as led:
        row = total(led, "digits")
        assert math.isinf(row["epsilon"]) and row["unbounded"] and row["uncertified_releases"] == 1
        assert row["bound_by"] == "uncertified release"
        assert row["unbounded_reasons"] == [
            f"uncertified release {rel.id}: uncertified: textbook floating-point Laplace sampler "
            "(ideal-arithmetic guarantee only)"
        ]
        assert "textbook floating-point Laplace sampler" in led.get(rel.id).payload["uncertified"]
    r = runner.invoke(app, ["ledger", "summary", "--ledger", str(path)])
    assert r.exit_code == 0 and "digits is unbounded: uncertified release" in " ".join(
        r.output.split()
    )
    with open_ledger(path) as led:
        led.void(rel.id, "uncertified sampler; model withdrawn", published=False)
        assert total(led, "digits")["epsilon"] == pytest.approx(1.0)
        led.cap("digits", 5.0, 1e-5)
    # With a cap, an uncertified release is refused before training (it would be unbounded).
    with pytest.raises(BudgetExceededError, match="textbook"):
        release(
            "dp-elm",
            DPELMRequest(sampler="textbook", **kw),
            out_dir=tmp_path / "c",
            ledger_path=path,
        )
    assert not (tmp_path / "c" / "release.json").exists()


# ---------------------------------------------------------------- point 6: proxy predictions by content


def test_renamed_proxy_predictions_share_the_budget_and_the_cap(tmp_path):
    from dpaudit.releasing import release
    from dpaudit.requests import MixMinRequest

    rng = np.random.default_rng(0)
    probs = rng.uniform(0.05, 0.95, size=(300, 3))
    labels = (rng.random(300) < probs[:, 2]).astype(float)
    f = tmp_path / "preds.npz"
    np.savez(f, probs=probs, labels=labels)
    copy = tmp_path / "renamed-copy.npz"
    shutil.copy(f, copy)
    path = tmp_path / "l.sqlite"

    def train_and_release_mixmin(*, proxy_predictions, out_dir):
        request = MixMinRequest(
            proxy_predictions=str(proxy_predictions),
            epsilon=1.0,
            steps=20,
            batch_size=1000,
            clipping_norm=5.0,
            reference_size=300,
        )
        return release("mixmin", request, out_dir=out_dir, ledger_path=path)

    r1 = train_and_release_mixmin(proxy_predictions=f, out_dir=tmp_path / "a")
    name = r1.dataset["name"]
    assert "preds" not in name  # not named after the file
    with open_ledger(path) as led:
        fp = led.get(r1.id).payload["dataset_fingerprint"]
        assert name == f"proxy-predictions-{fp[:12]}" and "preds" not in name
        led.cap(name, total(led, name)["epsilon"] * 1.01, 1e-5)  # room for no second run
    with pytest.raises(BudgetExceededError, match=name):
        train_and_release_mixmin(proxy_predictions=copy, out_dir=tmp_path / "b")
    # The same values saved in another float dtype are the same content.
    np.savez(
        tmp_path / "f32.npz",
        probs=probs.astype(np.float32).astype(np.float64),
        labels=labels.astype(np.float32),
    )
    np.savez(
        tmp_path / "f32b.npz", probs=probs.astype(np.float32), labels=labels.astype(np.float32)
    )
    from dpaudit.mechanisms.mixmin.tasks import load_proxy_predictions

    assert (
        load_proxy_predictions(tmp_path / "f32.npz").sha256
        == load_proxy_predictions(tmp_path / "f32b.npz").sha256
    )
    with open_ledger(path) as led:
        assert len(led.entries(kind="release")) == 1 and led.open_reservations() == []
