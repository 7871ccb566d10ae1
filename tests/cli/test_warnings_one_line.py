"""No NumPy, SciPy, torch or Opacus warning reaches the terminal raw (``file:line: Category: text``
and its source line) from any command: each is one ``warning:`` line of dpaudit's, or dropped when
expected (torch's backward-hook note on Opacus's hooks). Run as a user would, with ``-W default``."""

from __future__ import annotations

import os
import re
import subprocess
import sys

#: Python's own form of a shown warning: ``path:line: SomeWarning: text``.
RAW = re.compile(r"^\S+:\d+: \w+(Warning|Error): ", re.M)
#: ``dpaudit schedule`` whose library call raises a NumPy warning and torch's expected note first.
WARNING_RUN = """
import sys, warnings
import numpy as np
from dpaudit.cli import accounting, main
real = accounting.dp_sgd_schedule
def warned(*args):
    np.log(np.zeros(1))  # RuntimeWarning: divide by zero encountered in log
    warnings.warn("Full backward hook is firing when gradients are computed with respect to module outputs")
    return real(*args)
accounting.dp_sgd_schedule = warned
main()
"""


def _run(args, tmp_path, code="from dpaudit.cli import main; main()"):
    env = {**os.environ, "MPLBACKEND": "Agg", "DPAUDIT_LEDGER": str(tmp_path / "l.sqlite")}
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", code, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_warning_is_one_dpaudit_line_and_an_expected_one_is_dropped(tmp_path):
    r = _run(
        ["schedule", "--n", "100", "--batch-size", "10", "--epochs", "1"], tmp_path, WARNING_RUN
    )
    assert r.returncode == 0, r.stderr
    assert not RAW.search(r.stderr) and "np.log" not in r.stderr, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(said) == 1, r.stderr
    assert re.fullmatch(
        r"warning: RuntimeWarning: divide by zero encountered in log \(<string>:\d+\)", said[0]
    )
    assert "backward hook" not in r.stderr


def test_documented_commands_leak_no_raw_warning(tmp_path):
    for args in (
        "train dp-rvfl --epochs 1 --out r",
        "audit gaussian --runs 200 --out a",
        "report r a --out x.html",
    ):
        r = _run(args.split(), tmp_path)
        assert r.returncode == 0 and not RAW.search(r.stderr), (args, r.stderr[-3000:])


#: A module the sweep's forkserver workers preload: their selftest tasks warn (two lines of text).
WORKER_TASK = """
import warnings
from dpaudit.sweeps import tasks
real = tasks.RUNNERS["selftest"]
def warned(*args):
    warnings.warn("a sweep worker's warning\\nits second line")
    return real(*args)
tasks.RUNNERS["selftest"] = warned
"""
SWEEP_RUN = """
from dpaudit.sweeps import executors
executors._PRELOAD.append("worker_task")
from dpaudit.cli import main
main()
"""


def test_a_sweep_workers_warning_is_one_dpaudit_line(tmp_path, monkeypatch):
    (tmp_path / "worker_task.py").write_text(WORKER_TASK)
    (tmp_path / "grid.toml").write_text(
        'name = "w"\nrunner = "selftest"\nmodels = ["mean"]\ndatasets = ["synthetic"]\n'
        "epsilons = [1.0]\nseeds = [1, 2, 3]\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    r = _run(["sweep", "grid.toml", "--workers", "2", "--out", "out"], tmp_path, SWEEP_RUN)
    assert r.returncode == 0, r.stderr
    assert not RAW.search(r.stderr) and "second line" not in r.stderr, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert said == ["warning: UserWarning: a sweep worker's warning (worker_task.py:6)"], r.stderr
