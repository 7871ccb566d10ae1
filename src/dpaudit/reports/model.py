"""The report model: one JSON-serialisable dict, the source of truth every renderer reads.

:func:`build_report` assembles seven sections (eight with a sweep), each built by its own module
from what :mod:`.inputs` loaded:

1. ``verdict`` (:mod:`.verdict`) — one line per mechanism, fail closed: ``VIOLATION`` when an
   audit certifies eps_LB above the claim it tested (its recorded claim; a covered release's only
   when it records none); ``ACCOUNTING MISMATCH`` when a release fails
   :func:`dpaudit.claims.verify_claim` (its stored guarantee, recomputed with its own accountant,
   exceeds the claim, steps executed differ from steps accounted, or the achieved epsilon exceeds
   the target); ``INCONCLUSIVE`` when an audit lacks eps_LB or a claim, or disagrees with its own
   counts; ``NOT AUDITED`` without an audit; else ``no evidence of a violation``, with ``audit
   underpowered`` when an audit's ceiling (the largest eps_LB its EVAL trials can certify) is
   below the claim.
2. ``claim`` (:mod:`.claim`) — claim cards, every accountant's epsilon recomputed from the events.
3. ``provenance`` (:mod:`.provenance`) — public dataset identity, splits and seeds, and the data
   version label the ledger holds its releases under (never a fingerprint or hash of the data).
4. ``budget`` (:mod:`.budget`) — the ledger's summary, and the releases' own composition.
5. ``utility`` (:mod:`.utility`) — metrics as mean +/- SD over seeds, privacy-utility curves.
6. ``audit`` (:mod:`.audit`) — the Table-16-shaped table (DP-MixMin paper), per-audit detail,
   ROC and eps_LB-vs-claimed points, one-run audits.
7. ``reproduce`` (:mod:`.reproduce`) — the recorded command of every release, audit and sweep.
8. ``sweep`` (:mod:`.sweep`; only with a sweep folder or ``sweep.sqlite`` among the inputs,
   rendered after ``budget``) — one summary and one verdict line per sweep.

Notes (error / warning / info) carry everything the reader must know about bad inputs.

JSON model (``"schema": "dpaudit-report/1"``; non-finite floats are the strings "inf"/"nan"):

- ``title``, ``generated_at``, ``dpaudit_version``, ``git_commit``;
- ``inputs``: ``paths``, ``releases`` / ``audits`` ([{id, mechanism, path}]), ``sweeps``
  ([{name, path, store, releases}]), ``ledger``;
- ``notes``: [{level: error|warning|info, section, message}];
- ``sections.verdict``: [{mechanism, key, status (violation | accounting-mismatch |
  inconclusive | not-audited | no-evidence | no-claim), flags, line,
  max_epsilon_lower_bound, claimed_epsilons, releases, non_private_releases, audits,
  family_wise ({audits: K, method} when K > 1 audits of the mechanism were re-judged at
  1 - alpha / K, Bonferroni; else null)}];
- ``sections.claim``: one card per release (the Release fields a reviewer checks, plus
  ``epsilons``: [{accountant, epsilon (recomputed), lower, estimate, stored, error}],
  ``accounting_check`` {status: ok | mismatch | unverified | no-claim, message},
  ``noise_source_label``, ``noise_secure``, ``sampler``);
- ``sections.provenance``: per dataset {name, kind, profile, split_sizes, split_seeds,
  source_files (names), data_versions (labels "version 1", ... of the keyed fingerprints in the
  ledger's entries for these releases; empty without a ledger or for an old ledger), partitions,
  releases, audits, ...};
- ``sections.budget``: {ledger, available, summary (Ledger.summary rows), entries, verify,
  composition (the releases' own composition: dataset, partition, releases, naive_sum, rdp,
  prv, delta), datasets};
- ``sections.utility``: {rows: [{mechanism, dataset, epsilon, n, seeds, non_private,
  metrics: {name: {mean, sd, n}}}], curves: [{mechanism, dataset, delta, points, reference}]};
- ``sections.audit``: {table16: {canaries, rows, max}, audits: [one entry per audit record
  with status, compared_claim (the claim the audit recorded; a linked release's epsilon only when
  it records none), covers_releases (the release it records, by id, path or folder; never one
  matched by epsilon), family_decision (with K > 1), claim_family_bound, recomputed_epsilon_lower_bound
  (the published eps_LB from the stored counts), recomputed (the statistic that decided,
  recomputed from the stored counts: the claimed-curve family search, or the eps_LB), plan_id, ceiling (+ source), controls,
  roc, histogram, statistic (claimed-curve | clopper-pearson: what decides its verdict; an old
  audit.json means clopper-pearson), clopper_pearson_epsilon, threat_model, claimed_curve (the
  validated audit.json block, drawn as the trade-off figure; null without one), comparison
  (cp_bonferroni, tpr_at_fpr, auroc, gdp_estimate; null without one), ...], eps_points,
  one_run: [one entry per one_run.json: mechanism, kind, canaries, claimed_epsilon, delta,
  confidence, steinke, fdp, epsilon_lower_bound, statistic, status]};
- ``sections.verdict`` entries also carry ``decided_by`` and ``statistics`` (the statistics
  behind the line) and ``rows``: the report's first table, a row per release of the mechanism
  and one per audit covering none ({release, mechanism, epsilon, delta, adjacency, accountant,
  plans (the revealed ``plan.id`` of audit.json; None without a plan), plan_runs (audits per plan), statistics, audits, epsilon_lower_bound,
  ceiling, status, reason}; :func:`dpaudit.reports.verdict.summary_rows`); a one-run record with
  a claim gets a verdict line of its own;
- ``sections.reproduce``: [{kind: release | audit | sweep | report, mechanism, id, path, command,
  seed, noise, parameters?}];
- ``sections.sweep`` (present only when the inputs include a sweep): one entry per sweep, its
  fields listed in :mod:`dpaudit.reports.sweep`.
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
from .recompute import EpsCache
from .sweep import sweep_reproduce, sweep_section, sweep_verdict

SCHEMA = "dpaudit-report/1"
SECTIONS = (("verdict", "1. Verdict"), ("claim", "2. Claim card"), ("provenance", "3. Data provenance"), ("budget", "4. Budget"),
            ("utility", "5. Utility"), ("audit", "6. Audit"), ("reproduce", "7. Reproduce"))


def _datasets(releases: list) -> list[str]:
    return list(dict.fromkeys(dataset_name(lr.release.dataset) for lr in releases))


def _eps_point(e: dict) -> dict:
    return {"mechanism": e["mechanism"], "canary": e["canary"], "task": e["task"], "claimed_epsilon": e["compared_claim"],
            "epsilon_lower_bound": e["epsilon_lower_bound"], "no_noise": (e["no_noise"] or {}).get("epsilon_lower_bound"),
            "ceiling": e["ceiling"], "status": e["status"]}


def _budget_section(inputs, covered: list, ledger_path, cache: EpsCache, notes: list) -> tuple[dict, dict[str, str]]:
    """The budget section (ledger summary and the releases' own composition) and the ledger's data version labels."""
    datasets = _datasets(covered)
    ledger = budget.ledger_budget(ledger_path, ledger_path is not None, datasets, [lr.release.id for lr in inputs.releases], notes)
    fingerprints = ledger.pop("data_versions", {})
    return {**ledger, "composition": budget.release_composition(covered, cache, notes), "datasets": datasets}, fingerprints


def _sweeps(inputs, budget_section: dict, cache: EpsCache, notes: list) -> list[dict]:
    ledger = budget_section["ledger"] if budget_section["available"] else None
    return [sweep_section(sw, cache, notes, ledger_path=ledger) for sw in inputs.sweeps]


def _audit_section(entries: list[dict], one_runs: list[dict]) -> dict:
    return {"table16": audit.table16(entries), "audits": entries, "eps_points": [_eps_point(e) for e in entries],
            "one_run": one_runs, "not_covered": NOT_COVERED}


def _one_runs(inputs, notes: list) -> list[dict]:
    return [e for i, lo in enumerate(inputs.one_runs) if (e := audit.one_run_entry(i, lo, notes)) is not None]


def _inputs_of(inputs, sweeps: list[dict], ledger: str | None) -> dict:
    return {"paths": inputs.paths,
            "releases": [{"id": lr.release.id, "mechanism": lr.release.mechanism, "path": str(lr.path)} for lr in inputs.releases],
            "audits": [{"id": la.view.id, "mechanism": la.view.mechanism, "path": str(la.path)} for la in inputs.audits],
            "one_runs": [str(lo.path) for lo in inputs.one_runs],
            "sweeps": [{"name": e["name"], "path": e["path"], "store": e["store"], "releases": e["releases"]} for e in sweeps], "ledger": ledger}


def build_report(paths: Iterable[str | os.PathLike], *, ledger_path: str | os.PathLike | None = None, title: str | None = None,
                 command: str | None = None, progress: bool = False) -> dict:
    """Build the JSON report model from release/audit/sweep paths (files or folders, searched recursively).

    ``ledger_path``: the ledger to summarise; None uses ``$DPAUDIT_LEDGER`` or the default path when it
    exists (a missing default is a note; a missing explicit path is a UsageError). ``command``: the
    command line that produced this report (under "Reproduce"). A one-line UsageError / DataError only
    when nothing readable is found; every other problem becomes a note. ``progress``: a bar (a
    terminal) or periodic lines (a pipe) on stderr, one step per release claim re-checked."""
    inputs = load_inputs(paths)
    notes = list(inputs.notes)
    cache = EpsCache()
    with JobProgress("steps", enabled=progress) as bar:
        task = bar.add("building the report", len(inputs.releases) + 2)
        claims = []
        for lr in inputs.releases:  # each claim re-checked from its event: the slow part
            claims.append(claim.claim_card(lr, cache, notes))
            bar.update(task, advance=1)
        links = audit.link_audits(inputs, notes)
        verdicts, audit_entries = verdict.mechanism_verdicts(inputs, claims, links, notes)
        # A sweep's releases are summarised (sections.sweep), not carded; they still count in the
        # provenance and in the composition of everything this report covers.
        covered = inputs.releases + [lr for sw in inputs.sweeps for lr in sw.releases]
        budget_section, fingerprints = _budget_section(inputs, covered, ledger_path, cache, notes)
        bar.update(task, advance=1)
        sweeps = _sweeps(inputs, budget_section, cache, notes)
        bar.update(task, advance=1)
    one_runs = _one_runs(inputs, notes)
    sections = {"verdict": verdicts + verdict.one_run_verdicts(one_runs) + [sweep_verdict(e) for e in sweeps], "claim": claims,
                "provenance": provenance.provenance(covered, inputs.audits, notes, fingerprints), "budget": budget_section,
                "utility": utility.utility(inputs.releases, notes), "audit": _audit_section(audit_entries, one_runs),
                "reproduce": reproduce.reproduce(inputs, command, notes, extra=[sweep_reproduce(e) for e in sweeps]),
                **({"sweep": sweeps} if sweeps else {})}
    return _json_safe({"schema": SCHEMA, "title": title or "dpaudit reviewer report", "generated_at": now_utc(), "dpaudit_version": __version__,
                       "git_commit": git_commit(), "inputs": _inputs_of(inputs, sweeps, budget_section["ledger"]), "sections": sections,
                       "notes": [n.to_dict() for n in notes]})


def read_report(path: str | os.PathLike) -> dict:
    """Read a report written with ``--format json`` (so HTML/Markdown can be re-rendered from it)."""
    data = read_json(path, "report")
    if data.get("schema") != SCHEMA:
        raise DataError(f"report schema must be {SCHEMA}, got {data.get('schema')!r}.")
    return data
