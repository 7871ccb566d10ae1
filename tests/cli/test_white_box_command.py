"""The white-box audit's recorded command re-creates it: the command path, the mechanism and the
options, with no placeholder for an argument the user did not type."""

from typer.testing import CliRunner

from dpaudit.cli import app, audit_white_box
from dpaudit.errors import UsageError


def test_white_box_recorded_command_has_no_empty_plan_argument(monkeypatch, tmp_path):
    seen = {}

    def record(*args, command, **kwargs):
        seen["command"] = command
        raise UsageError("stopped before training (test).")

    claim = {"event": None}
    setup = (None, None, None, claim, "toy", 0)
    monkeypatch.setattr(audit_white_box, "_setup", lambda a, rel: setup)
    monkeypatch.setattr(audit_white_box, "_record_costs", lambda *args: None)
    monkeypatch.setattr(audit_white_box, "white_box_audit", record)
    argv = ["audit", "dp-dense", "--threat-model", "white-box", "--canaries", "300"]
    r = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "wb")])
    assert r.exit_code == 2 and "stopped before training" in r.output
    words = seen["command"].split()
    assert words[:3] == ["dpaudit", "audit", "dp-dense"] and "None" not in words, seen["command"]
