"""One-run audits of user-level DP-SGD heads: each canary is one more user."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.auditing import build_target
from dpaudit.mechanisms.dpsgd.one_run_heads import heads_one_run
from dpaudit.cli import app
from dpaudit.errors import UsageError
from dpaudit.noise import NoiseSource


def _user_target():
    return build_target(
        "dp-rvfl",
        epsilon=2.0,
        privacy_unit="user",
        records_per_user=4,
        epochs=1,
        seed=3,
        reference_size=315,
    )


def test_canary_users_separate_perfectly_without_noise_and_are_sampled_at_the_user_rate():
    t = _user_target()
    r = heads_one_run(
        t, canaries=60, noise=NoiseSource("reproducible", seed=5), seed=3, noise_on=False
    )
    assert r.info["unit"] == "user" and r.info["sample_rate"] == t._config.sample_rate
    s, inc = np.asarray(r.scores), np.asarray(r.included)
    assert 0 < inc.sum() < inc.size
    # without noise (a vanishing noise multiplier) a canary user moves its coordinate only when
    # included and sampled at least once
    assert np.max(np.abs(s[~inc])) < 1e-6
    assert np.mean(s[inc] > 1e-4) > 0.5 and np.min(s[inc]) > -1e-6


def test_user_level_one_run_refuses_record_canaries():
    with pytest.raises(UsageError, match="one-run kind for a user-level audit must be gradient"):
        heads_one_run(
            _user_target(),
            canaries=10,
            noise=NoiseSource("reproducible", seed=1),
            seed=0,
            kind="input-mislabeled",
        )


def test_cli_one_run_privacy_unit_user_is_not_silently_record_level(tmp_path):
    out = tmp_path / "or"
    res = CliRunner().invoke(
        app,
        [
            "audit",
            "dp-rvfl",
            "--one-run",
            "--canaries",
            "40",
            "--privacy-unit",
            "user",
            "--records-per-user",
            "4",
            "--reference-size",
            "315",
            "--epochs",
            "1",
            "--no-noise",
            "--reproducible-noise",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    import json

    rec = json.loads((out / "one_run.json").read_text())
    assert (
        rec["bounds"]["info"]["unit"] == "user"
        if "bounds" in rec
        else rec["info"]["unit"] == "user"
    )
    assert "--privacy-unit user" in rec["command"]
