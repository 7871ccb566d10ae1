"""``--device cpu|cuda|auto`` for module DP-SGD and its one-run audits: the device path runs on the
CPU here (``--device cpu``, and ``auto`` with CUDA mocked absent) with results equal to the default
path; ``cuda`` without a device is one line, exit 2, before any data are loaded; the CUDA-vs-CPU
comparison is skipped, visibly, where no GPU exists."""

from __future__ import annotations

import json
import platform

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import dpaudit.data
from dpaudit import one_run_auditing
from dpaudit.cli import app
from dpaudit.data import load_dataset
from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import (
    core as dpsgd_core,
    mechanism as dpsgd_release,
    module_training,
)
from dpaudit.mechanisms.dpsgd.module_training import (
    DPSGDConfig,
    keep_freed_tensor_memory,
    resolve_device,
    train_module_dp_sgd,
)
from dpaudit.mechanisms.dpsgd.models import build_module
from dpaudit.mechanisms.dpsgd.one_run_modules import modules_one_run
from dpaudit.noise import NoiseSource
from dpaudit.releasing import release
from dpaudit.requests import AuditRequest, DPSGDRequest

CONFIG = DPSGDConfig(sample_rate=0.05, steps=6, normalizer=60, noise_multiplier=1.1)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _cnn_release(tmp_path, name: str, **device) -> tuple[dict, dict]:
    req = DPSGDRequest(
        model="dp-cnn", epochs=1, batch_size=256, reproducible_noise=True, seed=5, **device
    )
    rel = release(
        "dp-cnn",
        req,
        out_dir=tmp_path / name,
        ledger_path=tmp_path / "ledger.sqlite",
        progress=False,
    )
    return rel.timings, torch.load(tmp_path / name / "model.pt")


def test_a_cpu_release_equals_the_default_one_and_records_its_device(tmp_path, no_cuda):
    timings, default = _cnn_release(tmp_path, "default")
    for device in ("cpu", "auto"):  # auto without CUDA: the CPU
        got_timings, got = _cnn_release(tmp_path, device, device=device)
        assert got_timings["device"] == timings["device"] == "cpu"
        assert all(torch.equal(got[k], default[k]) for k in default)


def test_cuda_without_a_gpu_is_one_line_before_any_data_are_loaded(
    tmp_path, monkeypatch, patch_everywhere, no_cuda
):
    monkeypatch.chdir(tmp_path)
    patch_everywhere(
        dpaudit.data, "load_dataset", lambda *a, **k: pytest.fail("data loaded before the refusal")
    )
    r = CliRunner().invoke(app, ["train", "dp-cnn", "--device", "cuda"])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    says = (
        "error: --device must be cpu or auto on this machine (torch finds no CUDA device), "
        "got 'cuda'."
    )
    assert r.exit_code == 2 and lines == [says], r.output
    assert list(tmp_path.iterdir()) == []


def test_device_values_and_where_cuda_is_refused(no_cuda):
    assert [resolve_device(d) for d in ("cpu", "auto")] == ["cpu", "cpu"]
    with pytest.raises(UsageError, match="device must be one of cpu, cuda, auto, got 'gpu'"):
        resolve_device("gpu")
    with pytest.raises(UsageError, match="device must be cpu or auto for this run"):
        dpsgd_release.MECHANISM.validate(DPSGDRequest(model="dp-rvfl", device="cuda"))  # NumPy
    with pytest.raises(UsageError, match="device must be cpu or auto for this run"):
        one_run_auditing.audit_device(
            AuditRequest(mechanism="dp-cnn", device="cuda", threat_model="white-box", canaries=4)
        )
    one_run = AuditRequest(mechanism="dp-cnn", device="auto", one_run=True, canaries=4)
    assert one_run_auditing.audit_device(one_run) == "cpu"


def test_auto_takes_cuda_when_torch_finds_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("auto", supported=False) == "cpu"


def test_a_one_run_module_audit_on_the_cpu_device_equals_the_default_and_says_where_it_ran():
    data = load_dataset("digits")
    runs = [
        modules_one_run(
            "dp-cnn",
            data,
            CONFIG,
            canaries=20,
            noise=NoiseSource("reproducible", seed=2),
            seed=0,
            **kw,
        )
        for kw in ({}, {"device": "cpu"})
    ]
    np.testing.assert_array_equal(runs[0].scores, runs[1].scores)
    assert runs[1].info["device"] == "cpu"


def test_the_noise_is_drawn_on_the_cpu_and_added_as_one_tensor():
    """Module sums are views of one flat tensor; the step draws every buffer's noise with the
    source's own sampler (same draws as per-buffer arrays) into one host buffer."""
    params = [torch.zeros(3, 4), torch.zeros(5)]
    step = dpsgd_core.NoisyStep(params, CONFIG, noise=NoiseSource("reproducible", seed=9))
    flat = step.device_sums.untyped_storage().data_ptr()
    assert all(s.untyped_storage().data_ptr() == flat for s in step.sums)
    step.device_sums.zero_()
    step.apply(1)
    src = NoiseSource("reproducible", seed=9)
    want = np.concatenate(
        [src.gaussian_into(np.empty(n, dtype=np.float32), CONFIG.noise_std) for n in (12, 5)]
    )
    np.testing.assert_array_equal(step._noise, want)


class _Libc:
    """A C library whose ``mallopt`` calls are recorded (and passed on to ``real``, if given)."""

    def __init__(self, real=None):
        self.real, self.calls = real, []

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return self.real.mallopt(param, value) if self.real else 1


TRAINING, RESTORED = [(-3, 32 << 20), (-1, 64 << 20)], [(-3, 128 << 10), (-1, 128 << 10)]


def test_the_heap_settings_hold_while_a_module_trains_and_are_restored_after(monkeypatch):
    libc, seen = _Libc(), []
    monkeypatch.setattr(module_training, "_glibc", lambda: libc)
    monkeypatch.setattr(
        module_training, "run_dp_sgd", lambda *a, **k: seen.append(list(libc.calls))
    )
    module, x, y = torch.nn.Linear(4, 2), torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64)
    train_module_dp_sgd(module, x, y, CONFIG, noise=NoiseSource())
    assert seen == [TRAINING] and libc.calls == TRAINING + RESTORED
    with pytest.raises(KeyError), keep_freed_tensor_memory():  # restored when training fails
        raise KeyError
    assert libc.calls[4:] == TRAINING + RESTORED
    monkeypatch.setattr(module_training, "_glibc", lambda: None)  # no glibc: nothing called
    with keep_freed_tensor_memory():
        pass
    assert len(libc.calls) == 8


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the heap settings are glibc's")
def test_glibc_accepts_the_heap_settings(monkeypatch):
    libc = _Libc(module_training._glibc())
    monkeypatch.setattr(module_training, "_glibc", lambda: libc)
    with keep_freed_tensor_memory():
        pass
    assert libc.calls == TRAINING + RESTORED
    assert all(libc.real.mallopt(*call) == 1 for call in libc.calls)


def test_a_module_outside_ghost_clipping_must_train_on_the_cpu():
    module = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.LayerNorm(2))
    x, y = torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64)
    with pytest.raises(UsageError, match="device must be cpu for a model with trainable layers"):
        train_module_dp_sgd(module, x, y, CONFIG, noise=NoiseSource(), device="meta")


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the CUDA-vs-CPU comparison needs a GPU"
)
def test_cuda_training_matches_the_cpu_on_a_tiny_model():
    data = load_dataset("digits")
    x = torch.as_tensor(data.x_train[:400], dtype=torch.float32)
    y = torch.as_tensor(data.y_train[:400])
    weights = {}
    for device in ("cpu", "cuda"):
        module = build_module(
            "cnn", kind="image", n_features=64, n_classes=10, image_shape=(1, 8, 8), seed=1
        )
        steps = train_module_dp_sgd(
            module, x, y, CONFIG, noise=NoiseSource("reproducible", seed=4), device=device
        )
        assert steps == CONFIG.steps and next(module.parameters()).device.type == "cpu"
        weights[device] = {n: p.detach().clone() for n, p in module.named_parameters()}
    for n, w in weights["cpu"].items():
        torch.testing.assert_close(weights["cuda"][n], w, rtol=1e-4, atol=1e-5)


def test_release_json_records_the_device(tmp_path, no_cuda):
    _cnn_release(tmp_path, "r", device="auto")
    recorded = json.loads((tmp_path / "r" / "release.json").read_text())
    assert recorded["timings"]["device"] == "cpu" and recorded["request"]["device"] == "auto"
    assert "--device auto" in recorded["command"]
