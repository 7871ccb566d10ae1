"""A long job is never silent: its first progress line within 2 s, one at least every period after (10 s,
shortened here through DPAUDIT_PROGRESS_EVERY_S), in a pipe as plain lines, and estimates that do not jump."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from dpaudit import progress

DPAUDIT = str(Path(sys.executable).parent / "dpaudit")


class _Stamped(io.StringIO):
    """A console file that remembers when each line was written."""

    def __init__(self) -> None:
        super().__init__()
        self.t0 = time.monotonic()
        self.stamps: list[tuple[float, str]] = []

    def write(self, s: str) -> int:
        self.stamps += [(time.monotonic() - self.t0, x) for x in s.splitlines() if x.strip()]
        return super().write(s)


def test_a_slow_phase_and_a_stalled_task_still_get_lines(monkeypatch):
    monkeypatch.setenv(progress.PERIOD_ENV, "0.4")
    out = _Stamped()
    con = Console(file=out, width=200)
    with progress.heartbeat("dpaudit audit", console=con):
        progress.phase("loading MNIST")
        time.sleep(1.5)  # a phase without a count: data loading, feature preparation
        with progress.JobProgress("trials", console=con) as bar:
            task = bar.add("audit main", 10)
            bar.update(task, completed=1)
            time.sleep(1.5)  # one chunk that takes minutes in a real audit
    times = [t for t, _ in out.stamps]
    assert times and times[0] <= progress.QUIET_S + 0.5, out.stamps
    assert max(b - a for a, b in zip([0.0, *times], times + [3.0])) <= 0.4 + 0.6, out.stamps
    texts = [x for _, x in out.stamps]
    assert any(x.startswith("dpaudit audit: loading MNIST ..., elapsed 0:00:0") for x in texts)
    assert any(x.startswith("audit main: 1/10 trials (10%)") and "ETA" in x for x in texts)
    assert not any("\r" in x for x in texts)


def test_the_period_is_at_most_ten_seconds(monkeypatch):
    for value, period in (("0.5", 0.5), ("30", 10.0), ("0", 10.0), ("soon", 10.0)):
        monkeypatch.setenv(progress.PERIOD_ENV, value)
        assert progress.period_s() == period
    monkeypatch.delenv(progress.PERIOD_ENV)
    assert progress.period_s() == 10.0 and progress.JobProgress("trials").every_s == 10.0


def test_the_estimate_is_smoothed_and_counts_down_while_a_task_stalls():
    line = progress._Line("audit main", 2000, start=0.0, said_at=0.0, moved_at=0.0)
    done, checks = 0, []
    for k in range(
        1, 10
    ):  # two workers: chunks of 100 trials finish in pairs, 20 s apart (10 trials a second)
        for t in (20.0 * k, 20.0 * k + 0.5):
            done += 100
            line.advanced(done, t)
            checks.append(
                line.eta(t) / ((2000 - done) / 10)
            )  # the estimate over the true time left
    # the last interval's rate would say 200 trials a second after each pair's second chunk (20x too fast)
    assert all(0.7 < c < 1.4 for c in checks[2:]), checks
    at = line.moved_at
    assert (
        line.eta(at + 5.0) == line.eta(at) - 5.0
    )  # no update for 5 s: the estimate counts down instead of freezing
    assert (
        line.eta(at + 500.0) > 0
    )  # a stalled task's estimate grows from the whole run's average, never 0


def test_a_long_command_in_a_pipe_says_something_at_once_and_keeps_talking(tmp_path):
    env = {
        **os.environ,
        "DPAUDIT_PROGRESS_EVERY_S": "1",
        "DPAUDIT_DATA_DIR": os.environ.get("DPAUDIT_DATA_DIR", ""),
    }
    t0 = time.monotonic()
    p = subprocess.Popen(
        [
            DPAUDIT,
            "audit",
            "dp-rvfl",
            "--runs",
            "40",
            "--control-runs",
            "8",
            "--out",
            "a",
            "--ledger",
            "l.sqlite",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stamps = [(time.monotonic() - t0, line) for line in p.stderr]
    end = time.monotonic() - t0
    assert p.wait() == 0, stamps
    times = [t for t, _ in stamps]
    assert times[0] <= 2.0, stamps  # from launch: the interpreter and the CLI's imports included
    assert max(b - a for a, b in zip(times, times[1:] + [end])) <= 1.0 + 2.0, (
        stamps
    )  # the period, with room for a loaded machine
    assert not any("\r" in x for _, x in stamps)


#: Documented long commands (README, docs/*.md), at small sizes; each is stopped at its first line.
LONG = [
    "train dp-rvfl --eps 2 --epochs 1",
    "audit dp-rvfl --runs 40",
    "sweep --builtin selftest",
    "audit opacus train.py --canaries 10 -- --epochs 1",
    "report runs --out report.html",
    "calibrate --eps 2 --sample-rate 0.005 --steps 2000",
]
#: The command line's imports start this much later, as on a loaded 2-core machine (seconds).
SLOW_IMPORTS = """
import builtins, sys, time
real_import = builtins.__import__
def slow_import(name, *args, **kwargs):
    if name == "typer" and name not in sys.modules:
        time.sleep(2.5)
    return real_import(name, *args, **kwargs)
builtins.__import__ = slow_import
"""


def test_every_long_command_speaks_within_two_seconds_of_launch_however_slow_its_imports(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SLOW_IMPORTS)
    paths = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": paths}
    firsts = []
    for args in LONG:
        t0 = time.monotonic()
        p = subprocess.Popen(
            [DPAUDIT, *args.split()],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = p.stderr.readline().strip()
        firsts.append((round(time.monotonic() - t0, 2), line, args))
        p.kill()
        p.wait()
    said = [
        t <= 2.0 and line.startswith(f"dpaudit {args.split()[0]}: starting ..., elapsed 0:00:0")
        for t, line, args in firsts
    ]
    assert all(said), firsts
