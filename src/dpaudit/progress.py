"""Progress of every long job (training, audit trials, one-run audits, sweeps, reports), on stderr.

In a terminal: a rich bar with elapsed time and an estimate of the time left. In a pipe or a log
(stderr not a terminal): one plain line per task every ``every_s`` seconds or 10 % of the work,
and at the end, so a job that runs for minutes is never silent and a log stays short."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .console import err_console


#: Seconds a task runs before a pipe or log gets its first progress line (a sub-second training prints none).
QUIET_S = 2.0


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


@dataclass
class _Line:
    description: str
    total: int
    done: int = 0
    info: str = ""
    base: int = 0  # done before this run (resumed from checkpoints): not in the rate
    start: float = field(default_factory=time.monotonic)
    said_at: float = field(default_factory=time.monotonic)
    said_tenth: int = 0


class JobProgress:
    """Tasks of one job, each ``description done/total unit``; ``info`` is free text after it
    (e.g. the epsilon spent). ``enabled=False`` shows nothing; ``quiet_s`` (default :data:`QUIET_S`): a pipe
    gets no line before a task has run that long, so a job that ends sooner stays silent. Use as a context manager."""

    def __init__(self, unit: str, *, enabled: bool = True, console=None, every_s: float = 10.0, quiet_s: float | None = None) -> None:
        self.unit, self.enabled, self.every_s = unit, enabled, every_s
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.console = console or err_console
        self.live = enabled and self.console.is_terminal
        self.lines: list[_Line] = []
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(f"{unit} {{task.fields[info]}}"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
                            transient=False) if self.live else None

    def __enter__(self) -> JobProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def add(self, description: str, total: int, completed: int = 0, info: str = "") -> int:
        self.lines.append(_Line(description, int(total), int(completed), info, base=int(completed)))
        if self.bar is not None:
            self.bar.add_task(description, total=total, completed=completed, info=info)
        return len(self.lines) - 1

    def update(self, task: int, *, completed: int | None = None, advance: int = 0, info: str | None = None) -> None:
        line = self.lines[task]
        line.done = (line.done if completed is None else int(completed)) + int(advance)
        line.info = line.info if info is None else info
        if self.bar is not None:
            self.bar.update(task, completed=line.done, info=line.info)
        elif self.enabled:
            self._say(line)

    def _say(self, line: _Line) -> None:
        """A plain line when ``every_s`` passed, a new tenth was reached, or the task finished."""
        now, tenth = time.monotonic(), 10 * line.done // max(line.total, 1)
        if now - line.start < self.quiet_s:
            return
        if now - line.said_at < self.every_s and tenth == line.said_tenth and line.done < line.total:
            return
        line.said_at, line.said_tenth = now, tenth
        spent = now - line.start
        left = f", ETA {_clock(spent * (line.total - line.done) / (line.done - line.base))}" if line.base < line.done < line.total else ""
        self.console.print(f"{line.description}: {line.done}/{line.total} {self.unit} ({100 * line.done // max(line.total, 1)}%)"
                           f"{' ' + line.info if line.info else ''}, elapsed {_clock(spent)}{left}", highlight=False, soft_wrap=True)

    def steps(self, description: str):
        """A ``progress(done, total)`` callback (the training loops') whose task is added on its first call."""
        task: list[int] = []

        def cb(done: int, total: int) -> None:
            if not task:
                task.append(self.add(description, total))
            self.update(task[0], completed=done)

        return cb


def stage(progress, message: str) -> None:
    """A stage of a job without a count (``progress`` as the mechanisms take it: None / False: quiet;
    a callable gets the message; True: one line on stderr)."""
    if callable(progress):
        progress(message)
    elif progress:
        err_console.print(f"{message} ...", highlight=False, soft_wrap=True)
