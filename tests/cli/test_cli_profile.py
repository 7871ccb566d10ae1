"""`--profile authors` on the train and audit commands (CliRunner, a small Kaggle-format Heart file)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()

HEART_HEADER = "age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,oldpeak,slope,ca,thal,target"


def _tiny_heart(root: Path) -> Path:
    (root / "heart").mkdir(parents=True)
    rows = [
        f"{30 + i},{i % 2},{i % 4},{120 + i},{200 + 3 * i},0,{i % 3},{140 + i},{i % 2},{(i % 5) / 2},{i % 3},{i % 4},{1 + i % 3},{(i * 7) % 2}"
        for i in range(60)
    ]
    (root / "heart" / "heart_kaggle.csv").write_text("\n".join([HEART_HEADER] + rows) + "\n")
    return root


def _release(folder: Path) -> dict:
    return json.loads((folder / "release.json").read_text())


def test_train_rvfl_with_the_authors_profile(tmp_path):
    data = _tiny_heart(tmp_path / "data")
    r = runner.invoke(
        app,
        [
            "train",
            "dp-rvfl",
            "--dataset",
            "heart",
            "--profile",
            "authors",
            "--data-dir",
            str(data),
            "--epochs",
            "1",
            "--out",
            str(tmp_path / "r"),
            "--ledger",
            str(tmp_path / "l.sqlite"),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    rel = _release(tmp_path / "r")
    assert rel["dataset"]["profile"] == "authors" and rel["dataset"]["split_seed"] == 2026
    # 42 training rows in this tiny file: never published; the schedule is the definition's (authors' Heart: 211)
    assert (
        rel["dataset"]["split_sizes"] == {"val": 9, "test": 9}
        and rel["config"]["reference_size"] == 211
    )
    assert "--profile authors" in rel["command"]


def test_train_dp_elm_with_the_authors_profile(tmp_path):
    data = _tiny_heart(tmp_path / "data")
    r = runner.invoke(
        app,
        [
            "train",
            "dp-elm",
            "--dataset",
            "heart",
            "--profile",
            "authors",
            "--data-dir",
            str(data),
            "--width",
            "3",
            "--out",
            str(tmp_path / "e"),
            "--ledger",
            str(tmp_path / "l.sqlite"),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    rel = _release(tmp_path / "e")
    assert rel["dataset"]["profile"] == "authors" and "--profile authors" in rel["command"]


def test_a_profile_the_dataset_lacks_is_a_usage_error(tmp_path):
    r = runner.invoke(
        app,
        [
            "train",
            "dp-rvfl",
            "--dataset",
            "digits",
            "--profile",
            "authors",
            "--out",
            str(tmp_path / "x"),
        ],
    )
    assert r.exit_code == 2 and "'authors'" in r.output and "raw01" in r.output


def test_audit_takes_the_profile_but_not_beside_a_release(tmp_path):
    data = _tiny_heart(tmp_path / "data")
    out = tmp_path / "a"
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-elm",
            "--dataset",
            "heart",
            "--profile",
            "authors",
            "--data-dir",
            str(data),
            "--width",
            "1",
            "--runs",
            "20",
            "--no-controls",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "--profile authors" in json.loads((out / "audit.json").read_text())["command"]
    bad = runner.invoke(app, ["audit", "dp-elm", "--release", str(out), "--profile", "authors"])
    assert bad.exit_code == 2 and "profile must not be given with --release" in bad.output
