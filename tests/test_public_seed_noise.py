"""A release whose DP noise is derived from its published seed is not private.

``--reproducible-noise`` makes the release a deterministic function of the data and public facts
(the seed is in release.json), so the ledger must count it as unbounded, a capped dataset must
refuse it before training, and reports must say why. A secret noise seed keeps reproducibility
without publishing the noise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpaudit.accounting import SubsampledGaussian
from dpaudit.ledger.book import open_ledger
from dpaudit.errors import BudgetExceededError
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest
from dpaudit.records import Release

FAST = dict(dataset="digits", epsilon=1.0, epochs=1)


def test_public_seed_noise_is_refused_against_a_cap_before_training(tmp_path):
    led = tmp_path / "l.sqlite"
    with open_ledger(led) as ledger:
        ledger.cap("digits", 5.0, 1e-5)
    with pytest.raises(BudgetExceededError, match="noise derived from a published seed"):
        release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", reproducible_noise=True, **FAST),
            out_dir=tmp_path / "r",
            ledger_path=led,
            progress=False,
        )
    assert not (tmp_path / "r").exists()
    with open_ledger(led) as ledger:
        assert [e.kind for e in ledger.entries()] == ["cap"]  # nothing reserved, nothing released
    # the same request with secret noise fits the cap
    release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", **FAST),
        out_dir=tmp_path / "s",
        ledger_path=led,
        progress=False,
    )


def test_public_seed_noise_is_recorded_unbounded_and_reports_say_why(tmp_path):
    led = tmp_path / "l.sqlite"
    rel = release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", reproducible_noise=True, **FAST),
        out_dir=tmp_path / "r",
        ledger_path=led,
        progress=False,
    )
    assert rel.noise_source["reproducible"] == "public-seed" and rel.noise_source["seed"] == 42
    with open_ledger(led) as ledger:
        total = next(r for r in ledger.summary("digits") if r["partition"] == "*")
        (entry,) = ledger.entries(kind="release")
    assert total["unbounded"] and math.isinf(total["epsilon"])
    assert "noise derived from a published seed (42" in total["unbounded_reasons"][0]
    assert "not private" in entry.payload["uncertified"]

    from dpaudit.reports.claim import noise_label

    label, secure = noise_label(rel.noise_source)
    assert secure is False and "NOT PRIVATE" in label


def _release(noise_source: dict) -> Release:
    event = SubsampledGaussian(1.0, 0.01, 100)
    return Release(
        mechanism="dp-rvfl",
        dataset={"name": "mnist"},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee=event.to_dict(),
        seed=3,
        noise_source=noise_source,
        noise_multiplier=1.0,
        sample_rate=0.01,
        steps=100,
        steps_executed=100,
    )


@pytest.mark.parametrize(
    "noise_source, private",
    [
        ({"source": "reproducible", "seed": 3, "secret": False}, False),
        ({"source": "reproducible", "seed": 3}, False),  # an old release without the "secret" key
        ({"source": "os-entropy", "seed": None, "secret": True}, True),
        ({"source": "cryptographic", "seed": None, "secret": True}, True),
    ],
)
def test_a_recorded_release_with_public_noise_makes_the_budget_unbounded(
    tmp_path, noise_source, private
):
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        ledger.record(_release(noise_source))
        total = next(r for r in ledger.summary("mnist") if r["partition"] == "*")
    assert math.isfinite(total["epsilon"]) is private
    from dpaudit.records import public_noise_reason

    assert (public_noise_reason(noise_source) is None) is private


def test_two_public_seed_runs_are_identical_so_their_noise_is_known(tmp_path):
    """Why it is not private: the same public facts give bit-identical weights."""
    a = release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", reproducible_noise=True, **FAST),
        out_dir=tmp_path / "a",
        ledger_path=tmp_path / "l.sqlite",
        progress=False,
    )
    b = release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", reproducible_noise=True, **FAST),
        out_dir=tmp_path / "b",
        ledger_path=tmp_path / "l.sqlite",
        progress=False,
    )
    wa, wb = (np.load(tmp_path / d / "weights.npz")["head_weight"] for d in ("a", "b"))
    assert a.id != b.id and np.array_equal(wa, wb)


def test_a_secret_noise_seed_is_reproducible_private_and_never_published(tmp_path):
    import json

    from dpaudit.errors import UsageError
    from dpaudit.releasing import secret_noise_seed

    led, seed_file = tmp_path / "l.sqlite", tmp_path / "keys" / "noise.seed"
    seed_file.parent.mkdir()
    with open_ledger(led) as ledger:
        ledger.cap("digits", 5.0, 1e-5)
    with secret_noise_seed(seed_file):  # created with 256 fresh bits on first use (mode 0600)
        a = release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", **FAST),
            out_dir=tmp_path / "a",
            ledger_path=led,
            progress=False,
        )
        b = release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", **FAST),
            out_dir=tmp_path / "b",
            ledger_path=led,
            progress=False,
        )
    secret = seed_file.read_text().splitlines()[0]
    assert len(secret) == 64 and (seed_file.stat().st_mode & 0o777) == 0o600
    wa, wb = (np.load(tmp_path / d / "weights.npz")["head_weight"] for d in ("a", "b"))
    # each release is its own use of the secret (never the same noise: tests/test_noise_seed_single_use.py)
    assert not np.array_equal(wa, wb)
    c = release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", **FAST),
        out_dir=tmp_path / "c",
        ledger_path=led,
        progress=False,
    )
    assert not np.array_equal(wa, np.load(tmp_path / "c" / "weights.npz")["head_weight"])
    published = (tmp_path / "a" / "release.json").read_text()
    assert secret not in published and str(int(secret, 16)) not in published
    assert (
        a.noise_source["source"] == "reproducible-secret"
        and a.noise_source["seed"] is None
        and a.noise_source["secret"] is True
    )
    assert json.loads((tmp_path / "a" / "local.json").read_text())["noise_seed_file"] == str(
        seed_file.resolve()
    )
    with open_ledger(led) as ledger:
        total = next(r for r in ledger.summary("digits") if r["partition"] == "*")
        n_entries = len(ledger.entries())
    assert (
        math.isfinite(total["epsilon"]) and total["epsilon"] < 5.0
    )  # private: charged its epsilon, within the cap
    assert b.id != a.id != c.id
    bad = tmp_path / "short.seed"
    bad.write_text("abc123\n")
    for path, kw in ((seed_file, {"reproducible_noise": True}), (bad, {})):
        with secret_noise_seed(path), pytest.raises(UsageError, match="noise seed file must"):
            release(
                "dp-rvfl",
                DPSGDRequest(model="dp-rvfl", **FAST, **kw),
                out_dir=tmp_path / "x",
                ledger_path=led,
                progress=False,
            )
    with open_ledger(led) as ledger:
        assert len(ledger.entries()) == n_entries  # refused before anything was reserved
