"""Progress of long jobs in a pipe or log: plain periodic lines on stderr (a terminal gets a rich bar)."""

from __future__ import annotations

import io
import re

from rich.console import Console
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit import progress
from dpaudit.progress import JobProgress, stage


def _lines(every_s: float, updates: range, total: int) -> list[str]:
    buf = io.StringIO()
    with JobProgress(
        "trials", console=Console(file=buf, width=200), every_s=every_s, quiet_s=0.0
    ) as bar:
        task = bar.add("audit main", total, info="x=1")
        for done in updates:
            bar.update(task, completed=done)
    return buf.getvalue().splitlines()


def test_a_pipe_gets_one_line_per_tenth_and_the_end():
    lines = _lines(3600.0, range(1, 101), 100)
    assert [int(re.search(r"(\d+)/100", x).group(1)) for x in lines] == list(range(10, 101, 10))
    assert (
        lines[-1].startswith("audit main: 100/100 trials (100%) x=1, elapsed 0:00:0")
        and "ETA" not in lines[-1]
    )
    assert "ETA 0:00:0" in lines[0]


def test_a_pipe_gets_a_line_every_period_between_tenths():
    assert len(_lines(0.0, range(1, 6), 1000)) == 5  # every update once the period has passed
    assert _lines(3600.0, range(1, 6), 1000) == []  # within a tenth and the period: silent


def test_disabled_and_stage_messages(capsys):
    buf = io.StringIO()
    with JobProgress("steps", enabled=False, console=Console(file=buf)) as bar:
        bar.update(bar.add("training", 10), completed=10)
    assert buf.getvalue() == ""
    said = []
    stage(said.append, "learning the mixture")
    stage(None, "quiet")
    assert said == ["learning the mixture"]


def test_training_and_audits_report_progress_through_a_pipe(tmp_path, monkeypatch):
    monkeypatch.setattr(
        progress, "QUIET_S", 0.0
    )  # these tiny jobs end before the default grace period
    r = CliRunner().invoke(
        app, ["train", "dp-rvfl", "--epochs", "1", "--out", str(tmp_path / "r"), "--json"]
    )
    assert r.exit_code == 0, r.output
    assert re.search(r"^training: (\d+)/\1 steps \(100%\) eps spent", r.stderr, re.M)
    r = CliRunner().invoke(
        app, ["audit", "noisy-sum", "--runs", "8", "--no-controls", "--out", str(tmp_path / "a")]
    )
    assert r.exit_code == 0, r.output
    assert "audit main: 8/8 trials (100%)" in r.stderr


def test_a_quick_job_is_silent_in_a_pipe_until_its_grace_period_passes():
    buf = io.StringIO()
    with JobProgress("steps", console=Console(file=buf, width=200), quiet_s=3600.0) as bar:
        bar.update(bar.add("building the report", 3), completed=3)
    assert buf.getvalue() == ""
    assert (
        JobProgress("steps").quiet_s == progress.QUIET_S > 0
    )  # the default: a sub-second job prints nothing
    buf = io.StringIO()
    with JobProgress("steps", console=Console(file=buf, width=200), quiet_s=0.0) as bar:
        bar.update(bar.add("building the report", 3), completed=3)
    assert "building the report: 3/3 steps (100%)" in buf.getvalue()


def test_report_building_and_ledger_summary_advance_one_step_per_claim_and_dataset(
    tmp_path, monkeypatch
):
    from pathlib import Path

    from dpaudit.accounting.events import PureEpsilon
    from dpaudit.ledger.book import open_ledger
    from dpaudit.reports.model import build_report

    seen = []
    real = JobProgress.update
    monkeypatch.setattr(
        JobProgress,
        "update",
        lambda self, task, **kw: (
            seen.append(self.lines[task].description) or real(self, task, **kw)
        ),
    )
    with open_ledger(tmp_path / "ledger.sqlite") as led:
        for name in ("heart", "cardio"):
            led.reserve(
                dataset=name,
                partition="train",
                event=PureEpsilon(0.5),
                adjacency="add-remove-record",
            )
        led.summary(progress=True)
    assert seen == ["composing the ledger"] * 2
    seen.clear()
    for name in (
        "rvfl",
        "elm",
    ):  # releases written by earlier versions: the report reads them as they are
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "release.json").write_text(
            (Path(__file__).parent / "audits" / "old_releases" / f"{name}.json").read_text()
        )
    model = build_report([tmp_path / "runs"], ledger_path=tmp_path / "ledger.sqlite", progress=True)
    assert len(model["sections"]["claim"]) == 2
    assert seen == ["building the report"] * (len(model["sections"]["claim"]) + 2)
