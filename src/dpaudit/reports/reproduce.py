"""Section ``reproduce``: the recorded command of every release and audit (and of the report)."""

from __future__ import annotations

from .. import __version__
from .claim import noise_label
from .inputs import Inputs, Note, command_str


#: The fields of every reproduce entry, in their order (an audit's adds its ``parameters``).
FIELDS = ("kind", "mechanism", "id", "path", "command", "seed", "noise", "dpaudit_version")
FIELDS += ("git_commit",)


def _release_entry(lr, notes: list[Note]) -> dict:
    cmd = command_str(lr.release.command)
    if cmd is None:
        text = f"release {lr.release.id[:12]} records no command."
        notes.append(Note("warning", "reproduce", text))
    return {
        "kind": "release",
        "mechanism": lr.release.mechanism,
        "id": lr.release.id,
        "path": str(lr.path),
        "command": cmd,
        "seed": lr.release.seed,
        "noise": noise_label(lr.release.noise_source)[0],
        "dpaudit_version": lr.release.dpaudit_version,
        "git_commit": lr.release.git_commit,
    }


def _audit_entry(la, notes: list[Note]) -> dict:
    cmd = command_str(la.view.command)
    if cmd is None:
        text = f"audit {la.path} records no command; its recorded parameters are listed instead."
        notes.append(Note("warning", "reproduce", text))
    return {
        "kind": "audit",
        "mechanism": la.view.mechanism,
        "id": la.view.id,
        "path": str(la.path),
        "command": cmd,
        "seed": la.view.seeds,
        "noise": None,
        "dpaudit_version": la.view.dpaudit_version,
        "git_commit": la.view.git_commit,
        "parameters": la.view.parameters | ({"config": la.view.config} if la.view.config else {}),
    }


def reproduce(
    inputs: Inputs, report_command: str | None, notes: list[Note], extra: list[dict] | None = None
) -> list[dict]:
    """The recorded command of every release, audit and sweep (``extra``), and of this report."""
    out = (
        [_release_entry(lr, notes) for lr in inputs.releases]
        + [_audit_entry(la, notes) for la in inputs.audits]
        + (extra or [])
    )
    if report_command:
        mine = {"kind": "report", "command": report_command, "dpaudit_version": __version__}
        out.append(dict.fromkeys(FIELDS) | mine)
    return out
