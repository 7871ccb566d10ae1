"""`dpaudit train ... --out UNWRITABLE` is refused before any
loading, calibration or training, in one line with exit code 2 (it used to train, then crash)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app

try:  # click >= 8.2 keeps stderr apart by default; older versions need mix_stderr=False
    runner = CliRunner(mix_stderr=False)
except TypeError:
    runner = CliRunner()


def _no_work(*a, **k):
    raise AssertionError("work started before the output directory was checked")


@pytest.fixture
def no_work(patch_everywhere, monkeypatch):
    """Every expensive first step of a train command fails the test if it is reached."""
    import dpaudit.accounting
    import dpaudit.data
    from dpaudit.mechanisms.dpsgd import mechanism as dpsgd_release
    from dpaudit.mechanisms.mixmin import mechanism as mixmin_pipeline, tasks as mixmin_tasks

    patch_everywhere(dpaudit.data, "load_dataset", _no_work)
    patch_everywhere(dpaudit.accounting, "calibrate_noise_multiplier", _no_work)
    monkeypatch.setattr(dpsgd_release, "train_heads", _no_work)
    monkeypatch.setattr(mixmin_tasks, "load_task", _no_work)
    monkeypatch.setattr(mixmin_pipeline, "calibrate_noise_multiplier", _no_work)


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "dp-rvfl", "--eps", "2", "--out", "/proc/x"],
        ["train", "dp-cnn", "--non-private", "--out", "/proc/x"],
        ["train", "dp-elm", "--eps", "2", "--out", "/proc/x"],
        ["train", "mixmin", "--eps", "1", "--out", "/proc/x"],
    ],
)
def test_unwritable_out_is_refused_before_any_work(argv, no_work, tmp_path):
    res = runner.invoke(app, argv + ["--ledger", str(tmp_path / "l.sqlite")])
    assert res.exit_code == 2, (res.exception, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'/proc/x'" in errors[0] and "cannot create it" in errors[0], (
        res.stderr
    )
    assert (
        "Traceback" not in res.stderr and res.stderr.strip().splitlines()[-1] == errors[0]
    )  # one line, nothing after it
    assert not (
        tmp_path / "l.sqlite"
    ).exists()  # nothing was reserved: the run never reached the ledger


def test_out_that_is_a_file_is_refused(no_work, tmp_path):
    f = tmp_path / "taken"
    f.write_text("not a directory")
    res = runner.invoke(app, ["train", "dp-rvfl", "--eps", "2", "--out", str(f)])
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert (
        res.exit_code == 2 and len(errors) == 1 and "it exists and is not a directory" in errors[0]
    )


# ---- a release folder is never overwritten; a typo costs no ledger entry


def _error_line(res) -> str:
    assert res.exit_code == 2, (res.exception, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    return errors[0]


def _ledger_kinds(path) -> list[str]:
    from dpaudit.ledger.book import open_ledger

    with open_ledger(path) as led:
        return [e.kind for e in led.entries()]


def test_a_release_folder_is_never_overwritten(tmp_path):
    import json

    led, out = str(tmp_path / "l.sqlite"), tmp_path / "run"
    argv = ["train", "dp-rvfl", "--eps", "1", "--epochs", "1", "--out", str(out), "--ledger", led]
    assert runner.invoke(app, argv).exit_code == 0
    first = json.loads((out / "release.json").read_text())["id"]
    weights = (out / "weights.npz").read_bytes()
    entries = _ledger_kinds(led)
    line = _error_line(runner.invoke(app, argv))
    assert f"release {first}" in line and "never overwritten" in line
    assert (
        json.loads((out / "release.json").read_text())["id"] == first
        and (out / "weights.npz").read_bytes() == weights
    )
    assert _ledger_kinds(led) == entries  # refused before anything was reserved


def test_mixmin_stages_do_not_share_a_folder(tmp_path):
    from dpaudit.records import read_release, write_release

    led, out = str(tmp_path / "l.sqlite"), tmp_path / "mixmin"
    fast = ["--steps", "5", "--batch-size", "50", "--ledger", led]
    assert runner.invoke(app, ["train", "mixmin", *fast, "--out", str(out)]).exit_code == 0
    assert "never overwritten" in _error_line(
        runner.invoke(app, ["train", "mixmin", "--stage", "pipeline", *fast, "--out", str(out)])
    )
    # a pipeline's folder holds its parts one level below (mixture/, finetune/): a mixture-only
    # run into it is refused too
    write_release(read_release(out), tmp_path / "pipe" / "mixture")
    assert "never overwritten" in _error_line(
        runner.invoke(app, ["train", "mixmin", *fast, "--out", str(tmp_path / "pipe")])
    )


@pytest.mark.parametrize(
    "bad", [["--noise-source", "bogus"], ["--noise-source", "reproducible"], ["--eps", "1e6"]]
)
def test_a_bad_request_is_refused_before_any_ledger_entry(tmp_path, bad):
    led = tmp_path / "l.sqlite"
    res = runner.invoke(
        app,
        [
            "train",
            "dp-rvfl",
            "--epochs",
            "1",
            *bad,
            "--out",
            str(tmp_path / "r"),
            "--ledger",
            str(led),
        ],
    )
    _error_line(res)
    assert not led.exists() or _ledger_kinds(led) == []  # no reservation, no cancellation
    assert not (tmp_path / "r").exists()
