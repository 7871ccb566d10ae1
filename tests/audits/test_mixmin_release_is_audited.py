"""DP-MixMin releases and audits run one loop, so a fault planted in it reaches both,
and the mechanism's own ``audit_target`` gives the targets the audits build (``dpaudit.auditing``).

Faults are planted as test fixtures (the library has no switch): "skip-clip" patches the one
clipped-sum kernel of the loop (``mixmin._record_sum``) so nothing is clipped; "half-noise"
halves every Gaussian noise draw while the release still claims the calibrated sigma.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dpaudit.auditing import build_target, target_from_release
from dpaudit.mechanisms.mixmin import solver as mm
from dpaudit.mechanisms.mixmin.solver import MixMinConfig
from dpaudit.mechanisms.mixmin.mechanism import MECHANISM
from dpaudit.noise import NoiseSource
from dpaudit.records import read_release
from dpaudit.releasing import release
from dpaudit.requests import MixMinRequest

WORLDS = np.array([True, False] * 4)


def _plant(monkeypatch, fault: str) -> None:
    if fault == "skip-clip":
        real = mm._record_sum
        monkeypatch.setattr(
            mm,
            "_record_sum",
            lambda F, y, config: real(F, y, dataclasses.replace(config, clipping_norm=1e9)),
        )
    else:
        # both float64 Gaussian entries: arrays drawn new and buffers filled in place (the loop's)
        for name in ("gaussian_numpy", "gaussian_into"):
            real = getattr(NoiseSource, name)
            monkeypatch.setattr(
                NoiseSource, name, lambda self, a, std, real=real: real(self, a, std / 2.0)
            )


def _plan(request):
    return MECHANISM.plan(request, MECHANISM.data_info(request, MECHANISM.load(request)))


def _released(tmp_path, tag: str) -> np.ndarray:
    release(
        "mixmin",
        MixMinRequest(epsilon=4.0, steps=20, reproducible_noise=True),
        out_dir=tmp_path / tag,
        record=False,
    )
    return np.array(json.loads((tmp_path / tag / "weights.json").read_text())["weights"])


def _scores(canary: str = "mislabeled") -> np.ndarray:
    t = MECHANISM.audit_target(_plan(MixMinRequest(epsilon=4.0, steps=20)), canary)
    return t.scores(WORLDS, NoiseSource("reproducible", seed=5))


@pytest.mark.parametrize("fault", ["skip-clip", "half-noise"])
def test_a_planted_fault_changes_the_release_and_the_audit_scores(tmp_path, monkeypatch, fault):
    clean, clean_scores = _released(tmp_path, "clean"), _scores()
    assert np.array_equal(clean, _released(tmp_path, "again")) and np.array_equal(
        clean_scores, _scores()
    )  # only the plant differs
    _plant(monkeypatch, fault)
    assert not np.allclose(_released(tmp_path, "faulty"), clean, rtol=1e-6, atol=0)
    assert not np.allclose(_scores(), clean_scores, rtol=1e-6, atol=0)


def _same_target(a, b) -> None:
    assert (
        a.config == b.config
        and a.claimed_epsilon == b.claimed_epsilon
        and a.accountant == b.accountant
    )
    assert a.claimed_event == b.claimed_event and a.private_data() == b.private_data()
    np.testing.assert_array_equal(a.probs, b.probs)
    np.testing.assert_array_equal(
        a.scores(WORLDS, NoiseSource("reproducible", seed=2)),
        b.scores(WORLDS, NoiseSource("reproducible", seed=2)),
    )


@pytest.mark.parametrize("canary", ["max-clip", "natural"])
def test_audit_target_is_the_target_build_makes(canary):
    _same_target(
        MECHANISM.audit_target(_plan(MixMinRequest(epsilon=1.0)), canary),
        build_target("mixmin", canary=canary, epsilon=1.0),
    )


def test_audit_target_of_a_release_is_the_target_build_makes(tmp_path):
    release("mixmin", MixMinRequest(epsilon=2.0, rho=0.3, steps=30), out_dir=tmp_path, record=False)
    rel = read_release(tmp_path)
    plan = _plan(MixMinRequest.from_dict(rel.request))
    _same_target(
        MECHANISM.audit_target(plan, "max-clip", release=rel), target_from_release(tmp_path)
    )
    assert (
        MECHANISM.audit_target(plan, "max-clip", release=rel, no_noise=True)
        ._config_now()
        .noise_multiplier
        == 0.0
    )


def test_old_release_audits_with_its_recorded_configuration():
    from pathlib import Path

    from dpaudit.release_compat import release_request

    rel = read_release(
        Path(__file__).parent / "old_releases" / "mixmin.json"
    )  # no reference size: q from its actual count
    t = MECHANISM.audit_target(_plan(release_request(rel)), "max-clip", release=rel)
    assert (
        (t.config.sample_rate, t.config.expected_batch_size, t.config.steps)
        == (rel.sample_rate, rel.normalizer, rel.steps)
        == (1.0, 266, 50)
    )
    assert (
        len(t.labels) == 266 and t.claimed_epsilon == rel.epsilon
    )  # its D_mix on the former task division


@pytest.mark.parametrize("old", [False, True])
def test_plan_from_a_release_record_is_the_releases(tmp_path, old):
    """MixMinInfo.from_release: the plan of a release from its public record alone; an old release
    (no reference size) plans from the |D_mix| it recorded, on its own task division."""
    from pathlib import Path

    from dpaudit.mechanisms.mixmin.mechanism import MixMinInfo

    if old:
        rel = read_release(Path(__file__).parent / "old_releases" / "mixmin.json")
        mc = rel.config["mixmin_config"]
        request = MixMinRequest(
            task=rel.config["task"],
            target=rel.config["target"],
            epsilon=rel.target_epsilon,
            delta=rel.delta,
            rho=rel.config["rho"],
            seed=rel.seed,
            steps=mc["steps"],
            batch_size=round(mc["expected_batch_size"]),
            clipping_norm=mc["clipping_norm"],
            step_size=mc["step_size"],
            loss=mc["loss"],
        )
    else:
        release(
            "mixmin",
            MixMinRequest(epsilon=2.0, rho=0.3, steps=30, stage="pipeline"),
            out_dir=tmp_path,
            record=False,
        )
        rel, request = (
            read_release(tmp_path / "mixture"),
            MixMinRequest.from_dict(read_release(tmp_path / "mixture").request),
        )
    plan = MECHANISM.plan(request, MixMinInfo.from_release(rel))
    mix = plan.parts[0]
    assert (
        mix.event.to_dict() == rel.guarantee
        and mix.partition == rel.partition
        and plan.dataset == rel.dataset
    )
    assert {
        k: mix.release_fields[k] for k in ("noise_multiplier", "sample_rate", "normalizer")
    } == {
        "noise_multiplier": rel.noise_multiplier,
        "sample_rate": rel.sample_rate,
        "normalizer": rel.normalizer,
    }
    t = MECHANISM.audit_target(plan, "max-clip", release=rel)
    assert t.config == MixMinConfig(**rel.config["mixmin_config"]) and (
        not old or len(t.labels) == 266
    )


def test_a_release_recording_the_calibration_cache_flag_still_audits_verifies_and_reports(
    tmp_path, monkeypatch
):
    """Releases written while plans published ``calibration.cached`` (old_releases/mixmin.json is
    one) still plan, audit, verify and report; the flag is read, never written again."""
    from typer.testing import CliRunner

    from dpaudit.cli import app
    from dpaudit.mechanisms.mixmin import mechanism as mixmin_mechanism
    from dpaudit.release_compat import release_request

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPAUDIT_LEDGER", str(tmp_path / "ledger.sqlite"))
    with monkeypatch.context() as old_writer:
        old_writer.setattr(
            mixmin_mechanism, "_published_calibration", lambda cal: cal.to_dict() | {"cached": True}
        )
        release("mixmin", MixMinRequest(epsilon=2.0, steps=5), out_dir=tmp_path / "rel")
    rel = read_release(tmp_path / "rel")
    assert rel.config["calibration"]["cached"] is True
    plan = MECHANISM.plan_of_release(release_request(rel), rel)
    assert "cached" not in plan.parts[0].config["calibration"]
    assert MECHANISM.audit_target(plan, "max-clip", release=rel).claimed_epsilon == rel.epsilon
    runner = CliRunner()
    for args in (
        ["bundle", "rel", "--out", "b"],
        ["verify", "b"],
        ["report", "rel", "--format", "md", "--out", "r.md"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
