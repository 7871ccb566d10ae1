"""`dpaudit audit MODEL --one-run --canaries M` through the CLI runner: dispatch to the score
producers (replaced here by tiny fakes: the analysis is what is tested), one_run.json, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()


def _fake_scores(m: int, sigma: float, seed: int = 0, kind: str = "gradient", info=None):
    from dpaudit.audits.one_run import OneRunScores

    rng = np.random.default_rng(seed)
    inc = rng.random(m) < 0.5
    return OneRunScores(
        scores=inc + sigma * rng.standard_normal(m), included=inc, kind=kind, info=dict(info or {})
    )


def test_head_model_one_run_json_and_file(tmp_path, monkeypatch, patch_everywhere):
    from dpaudit.mechanisms.dpsgd import head_audit as heads, one_run_heads

    seen = {}

    def fake(
        target, *, canaries, noise, seed, kind="gradient", noise_on=True, coins=None, progress=None
    ):
        seen.update(target=target, canaries=canaries, seed=seed, kind=kind, noise_on=noise_on)
        return _fake_scores(canaries, 50.0, kind=kind, info={"fake": True})

    patch_everywhere(one_run_heads, "heads_one_run", fake)
    out = tmp_path / "o"
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-rvfl",
            "--one-run",
            "--canaries",
            "300",
            "--eps",
            "2",
            "--seed",
            "5",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (
        isinstance(seen["target"], heads.HeadTarget)
        and seen["canaries"] == 300
        and seen["seed"] == 5
        and seen["noise_on"]
    )
    assert (
        d["schema"] == "dpaudit.one-run/1"
        and d["canaries"] == 300
        and d["mechanism"] == "dp-rvfl"
        and d["info"] == {}
    )
    assert json.loads((out / "one_run_local.json").read_text())["info"] == {
        "fake": True
    }  # an unknown info key stays local
    assert d["claimed_epsilon"] == pytest.approx(2.0, abs=0.05) and d["statistic"] == "f-dp"
    assert (
        d["fdp"]["event"]["type"] == "subsampled-gaussian" and not d["violated"]
    )  # scores nearly pure noise
    on_disk = json.loads((out / "one_run.json").read_text())
    assert on_disk["steinke"] == d["steinke"] and "--one-run" in on_disk["command"]
    # the power line of this m and claim (a PLD-profile claim: its ceiling is not searched)
    p = on_disk["power"]
    assert p["kind"] == "one-run" and p["trials"] == 300 and p["unit"] == "canaries"
    assert p["claimed_epsilon"] == d["claimed_epsilon"] and p["estimator"] == "f-DP (claimed curve)"
    assert 0.0 < p["at_claim"] < d["claimed_epsilon"] and p["ceiling"] is None


def test_module_model_dispatch_and_no_noise(tmp_path, monkeypatch, patch_everywhere):
    from dpaudit.audits import one_run
    from dpaudit.mechanisms.dpsgd import one_run_modules

    # The PLD-profile f-DP search is exercised by the head test; here only the dispatch matters.
    monkeypatch.setattr(one_run, "_fdp_block", lambda *a, **k: None)

    seen = {}

    def fake(
        model,
        data,
        config,
        *,
        canaries,
        noise,
        seed,
        kind="gradient",
        noise_on=True,
        tensors=None,
        progress=None,
        coins=None,
        device="cpu",
    ):
        seen.update(
            model=model,
            config=config,
            canaries=canaries,
            noise_on=noise_on,
            kind=kind,
            device=device,
        )
        return _fake_scores(canaries, 1e-6, kind=kind)

    patch_everywhere(one_run_modules, "modules_one_run", fake)
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-cnn",
            "--one-run",
            "--canaries",
            "200",
            "--no-noise",
            "--one-run-kind",
            "input-mislabeled",
            "--out",
            str(tmp_path),
        ],
    )
    assert r.exit_code == 0, r.output
    assert (
        seen["model"] == "dp-cnn"
        and seen["canaries"] == 200
        and not seen["noise_on"]
        and seen["kind"] == "input-mislabeled"
    )
    assert seen["device"] == "cpu"  # the default --device
    assert (
        seen["config"].noise_multiplier > 0
    )  # the release protocol's calibrated config; the producer removes the noise
    d = json.loads((tmp_path / "one_run.json").read_text())
    assert (
        d["noise"] is False and not d["violated"]
    )  # a no-noise control never counts as a violation
    assert d["steinke"]["epsilon_lower_bound"] >= 0.8 * d["steinke"]["ceiling"]
    assert "one-run audit: dp-cnn" in r.stdout
    # printed, wrapped at the terminal width
    assert "power (200 canaries, steinke (eps, delta))" in " ".join(r.stdout.split())
    assert d["power"]["kind"] == "one-run"


@pytest.mark.parametrize(
    "args,msg",
    [
        (["audit", "dp-rvfl", "--canaries", "100"], "canaries must only be given with --one-run"),
        (["audit", "dp-rvfl", "--one-run"], "canaries must be given with --one-run"),
        (["audit", "dp-rvfl", "--one-run", "--canaries", "1"], "canaries must be an integer >= 2"),
        (["audit", "gaussian", "--one-run", "--canaries", "10"], "for a one-run audit"),
    ],
)
def test_usage_errors(args, msg, tmp_path):
    r = runner.invoke(app, args + ["--out", str(tmp_path)])
    assert r.exit_code == 2 and msg in r.output, r.output
