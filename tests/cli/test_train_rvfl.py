"""`dpaudit train MODEL` through CliRunner: exit codes, one JSON object, forwarded arguments."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.mechanisms.dpsgd.schedule import MODEL_NAMES
from dpaudit import releasing

try:  # click >= 8.2 keeps stderr apart by default; older versions need mix_stderr=False
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()


def test_all_models_are_registered():
    res = runner.invoke(app, ["train", "--help"])
    assert res.exit_code == 0
    for name in MODEL_NAMES:
        assert name in res.stdout


def test_default_dataset_json_release(tmp_path):
    out = tmp_path / "run"
    res = runner.invoke(
        app,
        [
            "train",
            "dp-rvfl",
            "--eps",
            "2",
            "--json",
            "--out",
            str(out),
            "--ledger",
            str(tmp_path / "l.sqlite"),
        ],
    )
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)  # exactly one JSON object on stdout
    assert data["mechanism"] == "dp-rvfl" and data["dataset"] == "digits"
    assert data["epsilon"] <= 2.0 and data["steps_executed"] == data["steps"]
    notes = [line for line in res.stderr.splitlines() if "no --dataset" in line]
    assert len(notes) == 1 and "digits" in notes[0]
    on_disk = json.loads((out / "release.json").read_text())
    assert on_disk["id"] == data["id"] and (out / "weights.npz").exists()
    from dpaudit.ledger.book import open_ledger

    with open_ledger(tmp_path / "l.sqlite") as ledger:
        assert [e.id for e in ledger.entries(dataset="digits", kind="release")] == [data["id"]]
        entry = ledger.get(data["id"])
    # the summary shows the ledger's keyed fingerprint of the data, never a plain digest
    assert (
        "dataset_sha256" not in data
        and data["dataset_fingerprint"] == entry.payload["dataset_fingerprint"]
    )
    assert "sha256" not in on_disk["dataset"]


def test_arguments_are_forwarded(monkeypatch, tmp_path):
    seen = {}

    class _Rel:
        non_private = True
        metrics = {"accuracy": 0.5}
        timings = {"train_seconds": 0.0, "setup_seconds": 0.0}
        id = "x"

        def to_dict(self):
            return {
                "mechanism": "dp-cnn",
                "dataset": {"name": "heart"},
                "metrics": self.metrics,
                "timings": self.timings,
            }

    def fake(name, request, **kw):
        seen["request"] = request
        seen.update(kw)
        return _Rel()

    from dpaudit.mechanisms.dpsgd import mechanism as dpsgd_release
    from dpaudit.requests import DPSGDRequest

    monkeypatch.setattr(releasing, "release", fake)
    argv = [
        "train",
        "dp-cnn",
        "--dataset",
        "heart",
        "--data-dir",
        str(tmp_path),
        "--eps",
        "0.5",
        "--delta",
        "1e-06",
        "--seed",
        "44",
        "--non-private",
        "--out",
        str(tmp_path / "o"),
        "--reproducible-noise",
        "--epochs",
        "3",
        "--batch-size",
        "32",
        "--split-seed",
        "2027",
        "--threads",
        "1",
        "--json",
    ]
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.stderr
    # The command parses into the request the library releases (and the release records).
    assert seen["request"] == DPSGDRequest(
        model="dp-cnn",
        dataset="heart",
        data_dir=str(tmp_path),
        epsilon=0.5,
        delta=1e-6,
        seed=44,
        non_private=True,
        reproducible_noise=True,
        epochs=3,
        batch_size=32,
        split_seed=2027,
    )
    assert str(seen["out_dir"]) == str(tmp_path / "o")
    # ... and the request's argv is the command it was parsed from (less the run-only flags)
    # (an absolute --data-dir is this machine's: never recorded)
    assert sorted(seen["request"].to_argv(out=tmp_path / "o")[1:]) == sorted(
        a for a in argv if a not in ("--threads", "1", "--json", "--data-dir", str(tmp_path))
    )
    assert "no --dataset" not in res.stderr
    assert json.loads(res.stdout)["mechanism"] == "dp-cnn"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--eps", "-1"], "--eps must be"),
        (["--delta", "2"], "delta must be"),
        (["--dataset", "nope"], "nope"),
        (["--epochs", "0"], "epochs must be"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path):
    res = runner.invoke(app, ["train", "dp-rvfl", *args, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert any(needle in line for line in lines) and "Traceback" not in res.stderr
    assert not (tmp_path / "o" / "release.json").exists()


def test_missing_real_data_is_one_line(tmp_path):
    res = runner.invoke(
        app, ["train", "dp-rvfl", "--dataset", "mnist", "--data-dir", str(tmp_path / "empty")]
    )
    assert res.exit_code == 2 and "Traceback" not in res.stderr
