"""The report model: one JSON-serialisable dict, the source of truth every renderer reads.

:func:`build_report` assembles the sections of :data:`SECTIONS` (plus ``sweep`` with a sweep
input), each built by its own module from what :mod:`.inputs` loaded; what each section says
(the fail-closed verdict rules among it) is in docs/review-walkthrough.md, the JSON model field by
field in its last part. Notes (error / warning / info) carry everything the reader must know
about bad inputs.
"""

from __future__ import annotations

import os
from typing import Iterable

from .. import __version__
from ..audit_outputs import NOT_COVERED
from ..errors import DataError
from ..progress import JobProgress
from ..records import _json_safe, git_commit, now_utc, read_json
from . import audit, budget, claim, provenance, reproduce, utility, verdict
from .inputs import dataset_name, load_inputs
from .sweep import sweep_reproduce, sweep_section, sweep_verdict

SCHEMA = "dpaudit-report/1"
SECTIONS = (
    ("verdict", "1. Verdict"),
    ("claim", "2. Claim card"),
    ("provenance", "3. Data provenance"),
    ("budget", "4. Budget"),
    ("utility", "5. Utility"),
    ("audit", "6. Audit"),
    ("reproduce", "7. Reproduce"),
)


def _eps_point(e: dict) -> dict:
    return {
        **{k: e[k] for k in ("mechanism", "canary", "task")},
        "claimed_epsilon": e["compared_claim"],
        "epsilon_lower_bound": e["epsilon_lower_bound"],
        "no_noise": (e["no_noise"] or {}).get("epsilon_lower_bound"),
        "ceiling": e["ceiling"],
        "status": e["status"],
    }


def _budget_section(inputs, covered: list, ledger_path, notes: list) -> tuple[dict, dict[str, str]]:
    """The budget section (ledger summary and the releases' own composition) and the ledger's data version labels."""
    datasets = list(dict.fromkeys(dataset_name(lr.release.dataset) for lr in covered))
    ids = [lr.release.id for lr in inputs.releases]
    ledger = budget.ledger_budget(ledger_path, datasets, ids, notes)
    fingerprints = ledger.pop("data_versions", {})
    composition = budget.release_composition(covered, notes)
    return {**ledger, "composition": composition, "datasets": datasets}, fingerprints


def _audit_section(entries: list[dict], one_runs: list[dict], white_boxes: list[dict]) -> dict:
    return {
        "table16": audit.table16(entries),
        "audits": entries,
        "eps_points": [_eps_point(e) for e in entries],
        "one_run": one_runs,
        "white_box": white_boxes,
        "not_covered": NOT_COVERED,
    }


def _sweeps(inputs, budget_section: dict, notes: list) -> list[dict]:
    ledger = budget_section["ledger"] if budget_section["available"] else None
    return [sweep_section(sw, notes, ledger_path=ledger) for sw in inputs.sweeps]


def _run_entries(entry_of, records: list, notes: list) -> list[dict]:
    """The entries ``entry_of`` makes of one-run or white-box ``records`` (a skipped one: a note)."""
    entries = (entry_of(i, lo, notes) for i, lo in enumerate(records))
    return [e for e in entries if e is not None]


def _named(source, path) -> dict:
    """A release's or an audit's (``source``: its Release or AuditView) line among the inputs."""
    return {"id": source.id, "mechanism": source.mechanism, "path": str(path)}


def _inputs_of(inputs, sweeps: list[dict], ledger: str | None) -> dict:
    return {
        "paths": inputs.paths,
        "releases": [_named(lr.release, lr.path) for lr in inputs.releases],
        "audits": [_named(la.view, la.path) for la in inputs.audits],
        "one_runs": [str(lo.path) for lo in inputs.one_runs],
        "white_boxes": [str(lo.path) for lo in inputs.white_boxes],
        "sweeps": [{k: e[k] for k in ("name", "path", "store", "releases")} for e in sweeps],
        "ledger": ledger,
    }


def build_report(
    paths: Iterable[str | os.PathLike],
    *,
    ledger_path: str | os.PathLike | None = None,
    title: str | None = None,
    command: str | None = None,
    progress: bool = False,
) -> dict:
    """Build the JSON report model from release/audit/sweep paths (files or folders, searched recursively).

    ``ledger_path``: the ledger to summarise; None uses ``$DPAUDIT_LEDGER`` or the default path when it
    exists (a missing default is a note; a missing explicit path is a UsageError). ``command``: the
    command line that produced this report (under "Reproduce"). A one-line UsageError / DataError only
    when nothing readable is found; every other problem becomes a note. ``progress``: a bar (a
    terminal) or periodic lines (a pipe) on stderr, one step per release claim re-checked."""
    inputs = load_inputs(paths)
    notes = list(inputs.notes)
    with JobProgress("steps", enabled=progress) as bar:
        task = bar.add("building the report", len(inputs.releases) + 2)
        claims = []
        for lr in inputs.releases:  # each claim re-checked from its event: the slow part
            claims.append(claim.claim_card(lr, notes))
            bar.update(task, advance=1)
        links = audit.link_audits(inputs, notes)
        verdicts, audit_entries = verdict.mechanism_verdicts(inputs, claims, links, notes)
        # A sweep's releases are summarised (sections.sweep), not carded; they still count in the
        # provenance and in the composition of everything this report covers.
        covered = inputs.releases + [lr for sw in inputs.sweeps for lr in sw.releases]
        budget_section, fingerprints = _budget_section(inputs, covered, ledger_path, notes)
        bar.update(task, advance=1)
        sweeps = _sweeps(inputs, budget_section, notes)
        bar.update(task, advance=1)
    one_runs = _run_entries(audit.one_run_entry, inputs.one_runs, notes)
    white_boxes = _run_entries(audit.white_box_entry, inputs.white_boxes, notes)
    runs = verdict.one_run_verdicts(one_runs + white_boxes)
    audit_section = _audit_section(audit_entries, one_runs, white_boxes)
    sections = {
        "verdict": verdicts + runs + [sweep_verdict(e) for e in sweeps],
        "claim": claims,
        "provenance": provenance.provenance(covered, inputs.audits, notes, fingerprints),
        "budget": budget_section,
        "utility": utility.utility(inputs.releases, notes),
        "audit": audit_section,
        "reproduce": reproduce.reproduce(
            inputs, command, notes, extra=[sweep_reproduce(e) for e in sweeps]
        ),
        **({"sweep": sweeps} if sweeps else {}),
    }
    return _json_safe(
        {
            "schema": SCHEMA,
            "title": title or "dpaudit reviewer report",
            "generated_at": now_utc(),
            "dpaudit_version": __version__,
            "git_commit": git_commit(),
            "inputs": _inputs_of(inputs, sweeps, budget_section["ledger"]),
            "sections": sections,
            "notes": [n.to_dict() for n in notes],
        }
    )


def read_report(path: str | os.PathLike) -> dict:
    """Read a report written with ``--format json`` (so HTML/Markdown can be re-rendered from it)."""
    data = read_json(path, "report")
    if data.get("schema") != SCHEMA:
        raise DataError(f"report schema must be {SCHEMA}, got {data.get('schema')!r}.")
    return data
