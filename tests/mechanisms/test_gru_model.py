"""dp-gru: a DP-SGD model added by one builder in ``dpsgd/models.py`` and one catalogue line; the
machinery derives the rest (train, release, one-run and trial audits, sweeps). Its GRU cell is
outside what ghost clipping covers: its clipped sums come from the per-sample reference kernel."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.mechanisms.dpsgd import user_level
from dpaudit.mechanisms.dpsgd.ghost_clip import ghost_layers, module_clipped_sum
from dpaudit.mechanisms.dpsgd.models import build_module
from dpaudit.records import read_release
from dpaudit.sweeps import open_store, parse_spec, run_sweep

SWEEP = """
name = "gru"
models = ["dp-gru"]
datasets = ["digits"]
epsilons = [2.0]
seeds = [1, 2]
[settings]
epochs = 1
batch_size = 600
reproducible_noise = true
"""


def test_gru_clipped_sums_are_the_per_sample_reference():
    module = build_module(
        "gru", kind="image", n_features=64, n_classes=10, image_shape=(1, 8, 8), seed=3
    )
    assert ghost_layers(module) is None  # the GRU cell: the reference kernel, not a new path
    x, y = torch.randn(6, 64), torch.randint(0, 10, (6,))
    params = {n: p.detach() for n, p in module.named_parameters()}
    got = module_clipped_sum(module, params, x, y, np.arange(6), 0.5)
    seg, k = np.arange(6), np.ones(6, dtype=np.int64)
    want = user_level.user_module_clipped_sum(module, params, x, y, np.arange(6), seg, k, 0.5)
    for name in params:
        torch.testing.assert_close(got[name], want[name])


def test_gru_trains_releases_and_audits_one_run_and_by_trials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "train",
            "dp-gru",
            "--eps",
            "2",
            "--epochs",
            "1",
            "--batch-size",
            "600",
            "--reproducible-noise",
            "--out",
            "rel",
        ],
    )
    assert r.exit_code == 0, r.output
    rel = read_release("rel")
    assert rel.mechanism == "dp-gru" and rel.steps_executed == rel.steps
    assert (tmp_path / "rel" / "model.pt").exists()
    one = runner.invoke(
        app,
        [
            "audit",
            "dp-gru",
            "--release",
            "rel",
            "--one-run",
            "--canaries",
            "8",
            "--reproducible-noise",
            "--out",
            "one",
        ],
    )
    assert one.exit_code == 0, one.output
    assert json.loads((tmp_path / "one" / "one_run.json").read_text())["mechanism"] == "dp-gru"
    trials = runner.invoke(
        app,
        [
            "audit",
            "dp-gru",
            "--release",
            "rel",
            "--runs",
            "4",
            "--no-controls",
            "--reproducible-noise",
            "--out",
            "trials",
        ],
    )
    assert trials.exit_code == 0, trials.output
    audit = json.loads((tmp_path / "trials" / "audit.json").read_text())
    assert audit["mechanism"] == "dp-gru" and audit["canary"] == "max-clip"
    assert audit["claimed_epsilon"] == pytest.approx(rel.epsilon)
    assert audit["config"]["dp_sgd"] == rel.config["dp_sgd"]  # trials train with the plan's config


def test_a_two_task_sweep_runs_dp_gru(tmp_path):
    spec = parse_spec(SWEEP)
    summary = run_sweep(spec, out=tmp_path, ledger_path=tmp_path / "ledger.sqlite")
    assert (summary.done, summary.failed) == (2, 0)
    with open_store(tmp_path / "gru", create=False) as store:
        releases = [read_release(row.result["release_dir"]) for row in store.rows(status="done")]
    assert sorted(r.seed for r in releases) == [1, 2]
    assert {r.mechanism for r in releases} == {"dp-gru"}
