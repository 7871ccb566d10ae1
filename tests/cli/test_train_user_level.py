"""`dpaudit train MODEL --privacy-unit user` through CliRunner: release, ledger, refusals."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()
N_DIGITS = 1797  # rows of the embedded digits dataset before splitting


def _ids(tmp_path, ids=None, name="ids.npy"):
    p = tmp_path / name
    np.save(p, np.arange(N_DIGITS) // 3 if ids is None else ids)
    return p


def _run(tmp_path, name, *extra, model="dp-rvfl"):
    # --eps 3 --epochs 2 --batch-size 64 on 3-record users: the same (q, T) as the library tests,
    # so the session's calibration cache is shared.
    args = [
        "train",
        model,
        "--dataset",
        "digits",
        "--eps",
        "3",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--out",
        str(tmp_path / name),
        "--ledger",
        str(tmp_path / "ledger.sqlite"),
        *extra,
    ]
    return runner.invoke(app, args)


def _one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    for f in fragments:
        assert f in err, err


def test_user_level_json_release_and_ledger(tmp_path):
    ids = _ids(tmp_path)
    r = _run(
        tmp_path,
        "u",
        "--privacy-unit",
        "user",
        "--records-per-user",
        "2",
        "--user-ids",
        str(ids),
        "--reference-size",
        "419",
        "--reproducible-noise",
        "--json",
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["adjacency"] == "add-remove-user" and d["privacy_unit"] == "user"
    assert d["steps_executed"] == d["steps"] and d["epsilon"] <= 3.0
    rel = json.loads((tmp_path / "u" / "release.json").read_text())
    assert rel["privacy_unit"] == "user" and rel["config"]["records_per_user"] == 2
    n_users = rel["config"][
        "reference_size"
    ]  # declared; the actual training users are never published
    assert n_users == (70 * (N_DIGITS // 3)) // 100 and "train" not in rel["dataset"]["n_users"]
    assert rel["sample_rate"] == 1.0 / -(-n_users // 64)
    assert f"--user-ids {ids}" in rel["command"] and "--records-per-user 2" in rel["command"]
    led = runner.invoke(
        app, ["ledger", "list", "--ledger", str(tmp_path / "ledger.sqlite"), "--json"]
    )
    assert led.exit_code == 0, led.output
    assert rel["id"] in led.stdout and "add-remove-user" in led.stdout


def test_record_level_release_on_the_same_dataset_is_refused_by_the_ledger(tmp_path):
    """User-level and record-level guarantees on one dataset cannot compose: fail closed."""
    ids = _ids(tmp_path)
    ok = _run(
        tmp_path,
        "u",
        "--privacy-unit",
        "user",
        "--records-per-user",
        "2",
        "--user-ids",
        str(ids),
        "--reference-size",
        "419",
        "--json",
    )
    assert ok.exit_code == 0, ok.output
    # --batch-size 180 on 1,257 training records: the same (q, T) as above (calibration cache)
    _one_line_error(
        _run(tmp_path, "r", "--batch-size", "180", "--json"), "add-remove-user", "add-remove-record"
    )


def test_refusals(tmp_path):
    ids = _ids(tmp_path)
    _one_line_error(
        _run(
            tmp_path,
            "a",
            "--privacy-unit",
            "user",
            "--records-per-user",
            "2",
            "--reference-size",
            "419",
        ),
        "--user-ids must be given",
    )
    _one_line_error(
        _run(tmp_path, "b", "--privacy-unit", "user", "--user-ids", str(ids)),
        "--records-per-user must be",
    )
    _one_line_error(_run(tmp_path, "c", "--user-ids", str(ids)), "--privacy-unit")
    _one_line_error(_run(tmp_path, "d", "--records-per-user", "2"), "--privacy-unit")
    _one_line_error(
        _run(tmp_path, "e", "--privacy-unit", "group"), "--privacy-unit must be one of record, user"
    )
    short = _ids(tmp_path, np.arange(100), "short.npy")
    _one_line_error(
        _run(
            tmp_path,
            "f",
            "--privacy-unit",
            "user",
            "--records-per-user",
            "2",
            "--user-ids",
            str(short),
            "--reference-size",
            "419",
        ),
        "one id per row",
        "1797",
    )
    _one_line_error(
        _run(
            tmp_path,
            "g",
            "--privacy-unit",
            "user",
            "--records-per-user",
            "2",
            "--user-ids",
            str(tmp_path / "missing.npy"),
            "--reference-size",
            "419",
        ),
        "not found",
    )
    _one_line_error(
        _run(
            tmp_path,
            "h",
            "--privacy-unit",
            "user",
            "--records-per-user",
            "2",
            "--user-ids",
            str(ids),
        ),
        "--reference-size must be given",
    )
    _one_line_error(
        _run(tmp_path, "i", "--reference-size", "0"),
        "--reference-size must be an integer >= 1, got 0.",
    )
    assert not any((tmp_path / n / "release.json").exists() for n in "abcdefghi")
