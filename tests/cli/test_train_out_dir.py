"""Issue 13 point 6 (last bullet): `dpaudit train ... --out UNWRITABLE` is refused before any
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
def no_work(monkeypatch):
    """Every expensive first step of a train command fails the test if it is reached."""
    import dpaudit.accounting
    import dpaudit.data
    from dpaudit.mechanisms import dpsgd_release, mixmin_pipeline, mixmin_tasks

    monkeypatch.setattr(dpaudit.data, "load_dataset", _no_work)
    monkeypatch.setattr(dpaudit.accounting, "calibrate_noise_multiplier", _no_work)
    monkeypatch.setattr(dpsgd_release, "train_linear_head", _no_work)
    monkeypatch.setattr(mixmin_tasks, "load_task", _no_work)
    monkeypatch.setattr(mixmin_pipeline, "calibrate_noise_multiplier", _no_work)


@pytest.mark.parametrize("argv", [
    ["train", "dp-rvfl", "--eps", "2", "--out", "/proc/x"],
    ["train", "dp-cnn", "--non-private", "--out", "/proc/x"],
    ["train", "dp-elm", "--eps", "2", "--out", "/proc/x"],
    ["train", "mixmin", "--eps", "1", "--out", "/proc/x"],
])
def test_unwritable_out_is_refused_before_any_work(argv, no_work, tmp_path):
    res = runner.invoke(app, argv + ["--ledger", str(tmp_path / "l.sqlite")])
    assert res.exit_code == 2, (res.exception, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "'/proc/x'" in errors[0] and "cannot create it" in errors[0], res.stderr
    assert "Traceback" not in res.stderr and res.stderr.strip().splitlines()[-1] == errors[0]  # one line, nothing after it
    assert not (tmp_path / "l.sqlite").exists()  # nothing was reserved: the run never reached the ledger


def test_out_that_is_a_file_is_refused(no_work, tmp_path):
    f = tmp_path / "taken"
    f.write_text("not a directory")
    res = runner.invoke(app, ["train", "dp-rvfl", "--eps", "2", "--out", str(f)])
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and "it exists and is not a directory" in errors[0]
