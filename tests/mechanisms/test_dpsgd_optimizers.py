"""The noisy step's pluggable optimizer: SGD with momentum beside the paper's Adam.

``--optimizer sgd --momentum 0.9`` is a DPSGDRequest setting: recorded in the release's
``config["dp_sgd"]``, used by the release and by the audit target of its plan. Values are checked
against torch.optim.SGD on the same clipped, noised, normalised gradients.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import core as dpsgd_core
from dpaudit.mechanisms.contract import DataInfo
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
from dpaudit.mechanisms.dpsgd.loop import SumUnits, run_dp_sgd
from dpaudit.mechanisms.dpsgd.core import SGD, gaussian_filler
from dpaudit.mechanisms.dpsgd.mechanism import MECHANISM
from dpaudit.noise import NoiseSource
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest


def _cfg(**kw) -> DPSGDConfig:
    return DPSGDConfig(
        **{
            "sample_rate": 0.5,
            "steps": 6,
            "normalizer": 4,
            "noise_multiplier": 1.5,
            "lr": 0.1,
            **kw,
        }
    )


def test_sgd_momentum_by_hand():
    """b_1 = g_1, b_t = mu b_{t-1} + g_t, p -= lr b_t: three steps written out."""
    p = np.array([1.0, -2.0])
    opt = SGD([p], _cfg(optimizer="sgd", momentum=0.5))
    g1, g2, g3 = (np.array(v) for v in ([1.0, 2.0], [0.0, -4.0], [2.0, 2.0]))
    for t, g in enumerate((g1, g2, g3), start=1):
        opt.step([g], t)
    b1 = np.array([1.0, 2.0])
    b2 = 0.5 * b1 + [0.0, -4.0]
    b3 = 0.5 * b2 + [2.0, 2.0]
    np.testing.assert_allclose(p, np.array([1.0, -2.0]) - 0.1 * (b1 + b2 + b3), rtol=0, atol=1e-15)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_noisy_sgd_step_equals_torch_sgd_on_the_clipped_noisy_gradient(momentum):
    """run_dp_sgd with optimizer sgd == torch.optim.SGD fed the same clipped sum + noise, / m0."""
    cfg = _cfg(optimizer="sgd", momentum=momentum)
    rng = np.random.default_rng(4)
    x = torch.tensor(rng.normal(size=(30, 5)), dtype=torch.float32)

    def clipped_sum(params, idx):  # per-record gradient x_i, clipped to C
        g = x[torch.as_tensor(idx)]
        return [(g * dpsgd_core.clip_factors(g.norm(dim=1), cfg.clipping_norm)[:, None]).sum(0)]

    ours = torch.zeros(5)
    run_dp_sgd(SumUnits(clipped_sum, 30), [ours], cfg, noise=NoiseSource("reproducible", seed=8))
    ref = torch.nn.Parameter(torch.zeros(5))
    opt = torch.optim.SGD([ref], lr=cfg.lr, momentum=momentum)
    noise = NoiseSource("reproducible", seed=8)
    buf = np.empty(5, dtype=np.float32)
    fill = gaussian_filler(noise, buf, cfg.noise_std)
    for _ in range(
        cfg.steps
    ):  # the draws of the loop, in its order: the Poisson sample, then the noise
        idx, _ = dpsgd_core.poisson_batch(noise, 1, 30, cfg.sample_rate)
        s = clipped_sum(None, idx)[0].numpy() if idx.size else np.zeros(5, dtype=np.float32)
        ref.grad = torch.from_numpy((s + fill()) / cfg.normalizer)
        opt.step()
    np.testing.assert_allclose(ours.numpy(), ref.detach().numpy(), rtol=1e-6, atol=1e-7)
    assert np.any(ours.numpy() != 0)


def test_momentum_needs_sgd():
    with pytest.raises(UsageError, match="momentum must be in"):
        _cfg(momentum=0.9)
    with pytest.raises(UsageError, match="momentum must be in"):
        _cfg(optimizer="sgd", momentum=1.0)
    with pytest.raises(UsageError, match="optimizer must be one of"):
        _cfg(optimizer="rmsprop")
    assert DPSGDConfig.from_dict(_cfg(optimizer="sgd", momentum=0.9).to_dict()) == _cfg(
        optimizer="sgd", momentum=0.9
    )
    old = {
        k: v for k, v in _cfg().to_dict().items() if k not in ("optimizer", "momentum")
    }  # an older record
    assert DPSGDConfig.from_dict(old) == _cfg()


def _request(**kw) -> DPSGDRequest:
    return DPSGDRequest(model="dp-rvfl", epochs=1, reproducible_noise=True, **kw)


def test_the_release_records_sgd_and_its_audit_uses_it(tmp_path):
    torch.set_num_threads(1)
    sgd = release(
        "dp-rvfl", _request(optimizer="sgd", momentum=0.9), out_dir=tmp_path / "sgd", record=False
    )
    adam = release("dp-rvfl", _request(), out_dir=tmp_path / "adam", record=False)
    assert sgd.config["dp_sgd"]["optimizer"] == "sgd" and sgd.config["dp_sgd"]["momentum"] == 0.9
    assert adam.config["dp_sgd"]["optimizer"] == "adam" and adam.config["dp_sgd"]["momentum"] == 0.0
    assert (
        "--optimizer sgd" in sgd.command
        and "--momentum 0.9" in sgd.command
        and "--optimizer" not in adam.command
    )
    with (
        np.load(tmp_path / "sgd" / "weights.npz") as a,
        np.load(tmp_path / "adam" / "weights.npz") as b,
    ):
        assert not np.allclose(a["head_weight"], b["head_weight"])
    # The audit target of the release's plan trains with the recorded optimizer, not Adam defaults.
    req = DPSGDRequest.from_dict(sgd.request)
    plan = MECHANISM.plan(req, DataInfo.from_prepared(MECHANISM.load(req)))
    target = MECHANISM.audit_target(plan, "max-clip")
    target.prepare()
    assert target._config == DPSGDConfig.from_dict(sgd.config["dp_sgd"])
    adam_req = DPSGDRequest.from_dict(adam.request)
    adam_target = MECHANISM.audit_target(
        MECHANISM.plan(adam_req, DataInfo.from_prepared(MECHANISM.load(adam_req))), "max-clip"
    )
    worlds = np.array([True, False, True, False])
    s_sgd, s_adam = (
        t.scores(worlds, NoiseSource("reproducible", seed=0)) for t in (target, adam_target)
    )
    assert not np.allclose(s_sgd, s_adam)


def test_cli_optimizer_flags(tmp_path):
    res = CliRunner().invoke(
        app,
        [
            "train",
            "dp-rvfl",
            "--epochs",
            "1",
            "--reproducible-noise",
            "--optimizer",
            "sgd",
            "--momentum",
            "0.9",
            "--out",
            str(tmp_path / "o"),
            "--ledger",
            str(tmp_path / "l.sqlite"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    rel = json.loads((tmp_path / "o" / "release.json").read_text())
    assert (
        rel["config"]["dp_sgd"]["optimizer"] == "sgd" and rel["config"]["dp_sgd"]["momentum"] == 0.9
    )
