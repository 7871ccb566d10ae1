"""`dpaudit train mixmin` and `dpaudit mixmin plan` through the CLI group."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()


def test_train_mixmin_json(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "train",
            "mixmin",
            "--task",
            "digits-mix",
            "--target",
            "small-0to4",
            "--eps",
            "2",
            "--rho",
            "0.3",
            "--steps",
            "20",
            "--out",
            str(out),
            "--reproducible-noise",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (
        data["mechanism"] == "dp-mixmin" and data["target_epsilon"] == 2.0 and data["steps"] == 20
    )
    assert len(data["metrics"]["weights"]) == 10 and data["config"]["target"] == "small-0to4"
    assert (out / "release.json").exists() and (out / "weights.json").exists()


def test_train_mixmin_human_output(tmp_path):
    res = runner.invoke(app, ["train", "mixmin", "--steps", "10", "--out", str(tmp_path / "h")])
    assert res.exit_code == 0, res.output
    assert "digit-0" in res.stdout and "sigma=" in res.stdout


def test_bad_proxy_file_is_one_line_exit_2(tmp_path):
    f = tmp_path / "bad.npz"
    np.savez(f, probs=np.full((5, 2), 0.5), labels=np.zeros(4))
    res = runner.invoke(
        app,
        [
            "train",
            "mixmin",
            "--proxy-predictions",
            str(f),
            "--reference-size",
            "5",
            "--out",
            str(tmp_path / "o"),
            "--json",
        ],
    )
    assert res.exit_code == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'labels'" in errors[0]
    assert res.stdout == ""


def test_bad_values_exit_2(tmp_path):
    res = runner.invoke(app, ["train", "mixmin", "--eps", "-1", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--eps must be a finite number > 0" in res.stderr
    res = runner.invoke(app, ["train", "mixmin", "--rho", "1.0", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "rho must be in the open interval (0, 1)" in res.stderr
    res = runner.invoke(app, ["train", "mixmin", "--target", "nope", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "target must be one of" in res.stderr


def test_plan_json_and_table():
    res = runner.invoke(
        app,
        ["mixmin", "plan", "--n", "89700", "--k", "14", "--eps", "1", "--alpha", "0.1", "--json"],
    )
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["regime"] == "statistics-limited" and abs(d["statistics_limited_size"] - 400) < 1e-9
    res = runner.invoke(app, ["mixmin", "plan", "--n", "100", "--k", "14", "--alpha", "0.1"])
    assert res.exit_code == 0 and "not enough data" in res.stdout
    res = runner.invoke(app, ["mixmin", "plan", "--n", "0", "--k", "14", "--alpha", "0.1"])
    assert res.exit_code == 2 and "n must be an integer >= 1" in res.stderr


def test_train_mixmin_pipeline_sequential_json(tmp_path):
    out = tmp_path / "p"
    res = runner.invoke(
        app,
        [
            "train",
            "mixmin",
            "--stage",
            "pipeline",
            "--composition",
            "sequential",
            "--rho",
            "0.2",
            "--eps",
            "2",
            "--steps",
            "20",
            "--pretrain-objective",
            "source-sampling",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["mechanism"] == "dp-mixmin-finetune" and data["target_epsilon"] == 1.6
    assert data["metrics"]["end_to_end"]["composition"] == "sequential"
    assert data["metrics"]["pretrain"]["objective"] == "source-sampling"
    assert set(data["metrics"]["auc"]) == {"pretrained", "finetuned"}
    assert (out / "mixture" / "release.json").exists() and (out / "pipeline.json").exists()
