"""Progress in a terminal (a rich bar with the smoothed estimate) and the heartbeat's view of a
job whose tasks are all finished."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from dpaudit.progress import JobProgress


def test_a_terminal_gets_a_live_bar_with_the_smoothed_estimate():
    buf = io.StringIO()
    terminal = Console(file=buf, force_terminal=True, width=160)
    with JobProgress("trials", console=terminal) as bar:
        task = bar.add("audit main", 10, info="x=1")
        for done in (1, 2, 5, 5):  # the repeated count leaves the rate as it was
            bar.update(task, completed=done)
        assert bar.beat(time.monotonic())  # the bar shows its own state: no heartbeat line
    out = buf.getvalue()
    assert "audit main" in out and "5/10" in out and "trials x=1" in out
    assert re.search(r"ETA \d+:\d\d:\d\d", out)


def test_the_heartbeat_names_the_phase_once_every_task_is_finished():
    buf = io.StringIO()
    with JobProgress("steps", console=Console(file=buf, width=200), quiet_s=0.0) as bar:
        bar.update(bar.add("training", 2), completed=2)
        assert bar.beat(time.monotonic()) is False
    assert buf.getvalue().splitlines()[-1].startswith("training: 2/2 steps (100%)")
