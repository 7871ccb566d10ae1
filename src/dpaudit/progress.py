"""Progress of every long job (training, audit trials, one-run audits, sweeps, reports), on stderr.

In a terminal: a rich bar with elapsed time and an estimate of the time left. In a pipe or a log
(stderr not a terminal): plain lines, never carriage-return bars. A command runs inside
:func:`heartbeat`: its first line comes at most :data:`FIRST_LINE_S` seconds after it starts (the
``dpaudit`` process's: after its launch, :func:`heartbeat_from_launch`; a job that ends sooner stays
silent) and a line follows at least every :func:`period_s` seconds (10 s; the environment variable
``DPAUDIT_PROGRESS_EVERY_S`` may shorten it, never lengthen it), naming the current phase
(:func:`phase`, e.g. "loading MNIST") or the state of each task of the job's bars, so that a phase
with no count (loading data, one slow chunk, a user's training script) is never silent. Estimates
of the time left use an exponentially weighted rate: one slow or fast update never makes them
jump."""

from __future__ import annotations

import math
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import rich.progress as bars
from rich.text import Text

from .console import err_console, print_message


#: Seconds a job's bar (:class:`JobProgress`) runs before its first line in a pipe (a sub-second job
#: prints none).
QUIET_S = 0.5
#: Seconds from a command's start to its first progress line; the ``dpaudit`` process starts at its
#: launch, interpreter and imports included (a refusal or a command that ends sooner prints none).
FIRST_LINE_S = 1.5
#: The most seconds between two progress lines of a long job.
MAX_PERIOD_S = 10.0
#: Environment variable that shortens the period between lines (tests; a chatty log); at most
#: :data:`MAX_PERIOD_S`.
PERIOD_ENV = "DPAUDIT_PROGRESS_EVERY_S"
#: Seconds over which the rate behind an estimate is averaged (older updates weigh e times less per TAU_S).
TAU_S = 120.0


def period_s() -> float:
    """Seconds between progress lines: ``$DPAUDIT_PROGRESS_EVERY_S`` when a number in (0, 10], else 10."""
    try:
        value = float(os.environ.get(PERIOD_ENV, MAX_PERIOD_S))
    except ValueError:
        return MAX_PERIOD_S
    return value if 0 < value <= MAX_PERIOD_S else MAX_PERIOD_S


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
    items_w: float = 0.0  # items done, each advance's weighing exp(-age / TAU_S)
    seconds_w: float = 0.0  # the seconds they took, weighed alike
    moved_at: float = field(default_factory=time.monotonic)  # when ``done`` last grew
    moved_done: int = 0

    def advanced(self, done: int, now: float) -> None:
        """Fold the items done since the last advance into the weighted rate."""
        if done <= self.moved_done:
            self.done = done
            return
        dt = max(now - self.moved_at, 1e-6)
        decay = math.exp(-dt / TAU_S)
        self.items_w = self.items_w * decay + (done - self.moved_done)
        self.seconds_w = self.seconds_w * decay + dt
        self.done, self.moved_done, self.moved_at = done, done, now

    def eta(self, now: float) -> float | None:
        """Seconds left: the weighted rate's estimate at the last advance, counted down since; once
        that is used up, the whole run's average (a stalled task's estimate grows, never jumps to 0)."""
        # items per second over an exponentially weighted window: a burst of chunks finishing
        # together counts for its items only, never as the rate of its last short interval
        rate = self.items_w / self.seconds_w if self.items_w > 0 and self.seconds_w > 0 else None
        if rate is None or not (self.base < self.done < self.total):
            return None
        left = (self.total - self.done) / rate - (now - self.moved_at)
        if left > 0:
            return left
        return (self.total - self.done) * (now - self.start) / (self.done - self.base)

    def text(self, unit: str, now: float) -> str:
        eta = self.eta(now)
        percent = 100 * self.done // max(self.total, 1)
        return (
            f"{self.description}: {self.done}/{self.total} {unit} ({percent}%)"
            f"{' ' + self.info if self.info else ''}, elapsed {_clock(now - self.start)}"
            f"{'' if eta is None else ', ETA ' + _clock(eta)}"
        )


def _terminal_bar(unit: str, lines: list[_Line], console):
    """The rich bar of a terminal; its estimate is the same smoothed one as the plain lines'."""

    class EtaColumn(bars.ProgressColumn):
        def render(self, task) -> Text:
            eta = lines[task.id].eta(time.monotonic()) if task.id < len(lines) else None
            return Text(
                "ETA " + ("-:--:--" if eta is None else _clock(eta)), style="progress.remaining"
            )

    return bars.Progress(
        bars.TextColumn("{task.description}"),
        bars.BarColumn(),
        bars.MofNCompleteColumn(),
        bars.TextColumn(f"{unit} {{task.fields[info]}}"),
        bars.TimeElapsedColumn(),
        EtaColumn(),
        console=console,
        transient=False,
    )


class JobProgress:
    """Tasks of one job, each ``description done/total unit``; ``info`` is free text after it
    (e.g. the epsilon spent). ``enabled=False`` shows nothing; ``quiet_s`` (default :data:`QUIET_S`): a pipe
    gets no line before a task has run that long, so a job that ends sooner stays silent; ``every_s``
    (default :func:`period_s`): the most seconds between lines of an unfinished task, also between updates
    while the job runs inside :func:`heartbeat`. Use as a context manager."""

    def __init__(
        self,
        unit: str,
        *,
        enabled: bool = True,
        console=None,
        every_s: float | None = None,
        quiet_s: float | None = None,
    ) -> None:
        self.unit, self.enabled = unit, enabled
        self.every_s = period_s() if every_s is None else every_s
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.console = console or err_console
        self.live = enabled and self.console.is_terminal
        self.lines: list[_Line] = []
        self.bar = _terminal_bar(unit, self.lines, self.console) if self.live else None

    def __enter__(self) -> JobProgress:
        if self.bar is not None:
            self.bar.start()
        if self.enabled:
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def add(self, description: str, total: int, completed: int = 0, info: str = "") -> int:
        done = int(completed)
        self.lines.append(_Line(description, int(total), done, info, base=done, moved_done=done))
        if self.bar is not None:
            self.bar.add_task(description, total=total, completed=completed, info=info)
        return len(self.lines) - 1

    def update(
        self, task: int, *, completed: int | None = None, advance: int = 0, info: str | None = None
    ) -> None:
        line = self.lines[task]
        line.advanced(
            (line.done if completed is None else int(completed)) + int(advance), time.monotonic()
        )
        line.info = line.info if info is None else info
        if self.bar is not None:
            self.bar.update(task, completed=line.done, info=line.info)
        elif self.enabled:
            self._say(line)

    def _say(self, line: _Line) -> None:
        """A plain line when ``every_s`` passed, a new tenth was reached, or the task finished."""
        now, tenth = time.monotonic(), 10 * line.done // max(line.total, 1)
        said = now - line.said_at < self.every_s and tenth == line.said_tenth  # nothing new yet
        if now - line.start < self.quiet_s or (said and line.done < line.total):
            return
        line.said_at, line.said_tenth = now, tenth
        _print(self.console, line.text(self.unit, now))

    def beat(self, now: float) -> bool:
        """The heartbeat's line: the first unfinished task's state (tasks run in order; a live terminal
        bar shows its own). False when every task is finished (the heartbeat names the phase instead)."""
        if self.bar is not None:
            return True
        line = next((x for x in self.lines if x.done < x.total), None)
        if line is None:
            return False
        line.said_at = now
        _print(self.console, line.text(self.unit, now))
        return True

    def steps(self, description: str):
        """A ``progress(done, total)`` callback (the training loops') whose task is added on its first call."""
        task: list[int] = []

        def cb(done: int, total: int) -> None:
            if not task:
                task.append(self.add(description, total))
            self.update(task[0], completed=done)

        return cb


#: The bars of running jobs, innermost last (the heartbeat reports the innermost).
_ACTIVE: list[JobProgress] = []


class _Heartbeat:
    """A thread that prints the job's state whenever nothing was printed for :func:`period_s`
    seconds; the first line :data:`FIRST_LINE_S` seconds after ``start``
    (monotonic; default now). Running from construction, as the innermost heartbeat."""

    def __init__(self, what: str, console, start: float | None = None, phase: str = "") -> None:
        self.what, self.console, self.phase = what, console, phase
        self.start = self.said_at = time.monotonic() if start is None else start
        self.first = True
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="dpaudit-progress", daemon=True)
        _BEATING.append(self)
        self.thread.start()

    def _loop(self) -> None:
        every = period_s()
        while not self.stop.wait(self._wait_s(every)):
            now = time.monotonic()
            quiet = now - max(self.said_at, _LAST_SAID[0])
            if self.first and now - self.start >= FIRST_LINE_S or quiet >= every:
                self.beat(now)

    def _wait_s(self, every: float) -> float:
        """Until the next check: the first line is due at a fixed time, later ones checked every
        quarter period."""
        tick = min(0.25, every / 4)
        if not self.first:
            return tick
        return max(0.0, min(tick, self.start + FIRST_LINE_S - time.monotonic()))

    def beat(self, now: float) -> None:
        self.first, self.said_at = False, now
        if _ACTIVE and _ACTIVE[-1].beat(now):
            return
        what = self.phase or "working"
        _print(self.console, f"{self.what}: {what} ..., elapsed {_clock(now - self.start)}")

    def end(self) -> None:
        """Stop the thread (it prints nothing more); a second call does nothing."""
        self.stop.set()
        self.thread.join()  # started at construction; a finished thread joins at once
        if self in _BEATING:
            _BEATING.remove(self)


#: The heartbeat of the running command (None: no long command runs, :func:`phase` only records nothing).
_BEATING: list[_Heartbeat] = []
#: When any progress line was last printed (monotonic seconds).
_LAST_SAID = [0.0]


def _print(console, text: str) -> None:
    _LAST_SAID[0] = time.monotonic()
    if _BEATING:
        _BEATING[-1].first = False
    print_message(text, console)  # plain text (no markup, no emoji): needs no import mid-start-up


@contextmanager
def heartbeat(what: str, *, console=None):
    """Run a command (``what``, e.g. "dpaudit audit") with a progress line at most
    :data:`FIRST_LINE_S` seconds after it starts and at least every :func:`period_s` seconds after,
    until it returns. Inside a ``dpaudit`` process the heartbeat started at launch
    (:func:`heartbeat_from_launch`) goes on under this name instead: its first line keeps its
    time."""
    beat = _BEATING[-1] if _BEATING and _BEATING[-1].phase == _LAUNCHING else None
    if beat is None:
        beat = _Heartbeat(what, console or err_console)
    beat.what, beat.phase = what, ""
    try:
        yield beat
    finally:
        beat.end()


#: The phase of a ``dpaudit`` process between its launch and its command's start.
_LAUNCHING = "starting"


def heartbeat_from_launch(what: str) -> _Heartbeat:
    """The heartbeat of this ``dpaudit`` process (``what``: e.g. "dpaudit audit"), started before
    the command line's imports (seconds on a loaded machine) and timed from the process's launch:
    its first line comes :data:`FIRST_LINE_S` seconds after launch. The command's :func:`heartbeat`
    takes it over; :meth:`_Heartbeat.end` stops it when no command ran (a usage error)."""
    return _Heartbeat(what, err_console, start=_launched_at(), phase=_LAUNCHING)


def _launched_at() -> float:
    """The monotonic time this process was launched (Linux: its start time in /proc), else now."""
    now = time.monotonic()
    try:
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - age if 0.0 <= age < 60.0 else now


def phase(message: str) -> None:
    """Name what the running command does now (the next heartbeat line says it); outside
    :func:`heartbeat`, nothing."""
    if _BEATING:
        _BEATING[-1].phase = message


def stage(progress, message: str) -> None:
    """A stage of a job without a count (``progress`` as the mechanisms take it: None / False: quiet;
    a callable gets the message; True: one line on stderr)."""
    phase(message)
    if callable(progress):
        progress(message)
    elif progress:
        _print(err_console, f"{message} ...")
