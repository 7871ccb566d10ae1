"""`dpaudit train mixmin --eps 1` on the embedded task shows the mechanism working."""

from __future__ import annotations

import json

import numpy as np
from scipy.spatial.distance import cosine
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.mechanisms.mixmin.solver import solve_mixmin
from dpaudit.mechanisms.mixmin.tasks import load_task, train_proxies

runner = CliRunner()


def test_embedded_default_gives_a_useful_mixture_and_a_test_utility(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app, ["train", "mixmin", "--eps", "1", "--out", str(out), "--reproducible-noise", "--json"]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    names = data["config"]["source_names"]
    w = np.array([data["metrics"]["weights"][s] for s in names])
    # the non-private lambda* on all private training records, as the pipeline's baseline computes it
    t = load_task("digits-mix", seed=42)
    _, y = t.target_labels(data["config"]["target"])
    probs = train_proxies(t).predict(t.private_x[t.train_idx])
    star = solve_mixmin(probs, y[t.train_idx].astype(float), "bce")
    assert 1 - cosine(w, star) >= 0.9, (w.round(3), star.round(3))
    # the human output adds a utility figure computed on the test partition, labelled as such ...
    res = runner.invoke(
        app, ["train", "mixmin", "--eps", "1", "--out", str(tmp_path / "h"), "--reproducible-noise"]
    )
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "utility on the private TEST partition" in text and "not in the release" in text
    assert "uniform mixture" in text and "best single source" in text
    # ... which is never published
    release = (tmp_path / "h" / "release.json").read_text()
    # (the noise sampler's description mentions "uniforms": look for the utility's own words)
    assert (
        "uniform mixture" not in release
        and "uniform_mixture" not in release
        and "best_single_source" not in release
    )
    assert "TEST partition" not in release and "utility" not in json.loads(release)["metrics"]
