"""Section ``reproduce``: the recorded command of every release and audit (and of the report)."""

from __future__ import annotations

from .. import __version__
from .claim import noise_label
from .inputs import Inputs, Note, command_str


#: The fields of every reproduce entry, in their order (an audit's adds its ``parameters``).
FIELDS = ("kind", "mechanism", "id", "path", "command", "seed", "noise", "dpaudit_version")
FIELDS += ("git_commit",)


#: The entry fields a release and an audit's view both carry under these names.
OWN_FIELDS = ("mechanism", "id", "dpaudit_version", "git_commit")


def _entry(kind: str, source, path, command: str | None, **fields) -> dict:
    """An entry in :data:`FIELDS` order: ``source``'s own fields, where it is, then ``fields``."""
    own = {k: getattr(source, k) for k in OWN_FIELDS}
    where = {"kind": kind, "path": str(path), "command": command}
    return dict.fromkeys(FIELDS) | own | where | fields


def _release_entry(lr, notes: list[Note]) -> dict:
    r, cmd = lr.release, command_str(lr.release.command)
    if cmd is None:
        notes.append(Note("warning", "reproduce", f"release {r.id[:12]} records no command."))
    return _entry("release", r, lr.path, cmd, seed=r.seed, noise=noise_label(r.noise_source)[0])


def _audit_entry(la, notes: list[Note]) -> dict:
    v, cmd = la.view, command_str(la.view.command)
    if cmd is None:
        text = f"audit {la.path} records no command; its recorded parameters are listed instead."
        notes.append(Note("warning", "reproduce", text))
    parameters = v.parameters | ({"config": v.config} if v.config else {})
    return _entry("audit", v, la.path, cmd, seed=v.seeds, parameters=parameters)


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
