"""The report model: one JSON-serialisable dict, the source of truth every renderer reads.

:func:`build_report` turns releases, audits, sweeps and the ledger into seven sections (eight
when the inputs include a sweep):

1. ``verdict`` — one line per mechanism. Rules (fail closed, never guess):

   - ``VIOLATION: eps_LB x > claimed y`` when any audit of the mechanism certifies a lower
     bound above the claim. The claim compared against is the *smallest* of the audit's
     ``claimed_epsilon`` and the epsilons of the releases it covers, so a release that claims
     less than its audit assumed cannot hide behind the audit's number.
   - ``ACCOUNTING MISMATCH`` when re-running the release's own accountant on its stored
     guarantee gives a larger epsilon than claimed, or the achieved epsilon exceeds the target.
   - ``INCONCLUSIVE`` when an audit lacks eps_LB or a claim, or its stored eps_LB disagrees
     with its own counts in a way that could hide a violation.
   - ``NOT AUDITED`` when no audit of the mechanism is among the inputs.
   - otherwise ``no evidence of a violation``; ``audit underpowered`` is added when an audit's
     ceiling (the largest eps_LB its EVAL trials can certify) is below the claim — such an
     audit could not have seen a violation of that size.
2. ``claim`` — claim cards, with every accountant's epsilon recomputed from the stored events.
3. ``provenance`` — public dataset identity, profile, splits and seeds, and the keyed dataset
   fingerprint the ledger stored (never an unkeyed hash of the private data).
4. ``budget`` — the ledger's summary for the datasets involved, and the releases' own
   composition as a cross-check.
5. ``utility`` — metrics as mean +/- SD over seeds, privacy-utility curves, non-private reference.
6. ``audit`` — the Table-16-shaped table (DP-MixMin paper, Table 16), per-audit detail, ROC,
   in/out score histograms and eps_LB-vs-claimed points.
7. ``reproduce`` — the recorded command of every release and audit (and of every sweep).
8. ``sweep`` (only when a sweep folder or ``sweep.sqlite`` is among the inputs; rendered after
   ``budget``) — one summary per sweep instead of one claim card per release: task counts, the
   sweep's tables recomputed from its store, an accounting check of every release, and the
   composed budget of its releases (:mod:`dpaudit.reports.sweep`). Each sweep also gets one
   verdict line: ``ACCOUNTING MISMATCH`` when any of its releases fails the claim-card check
   (fail closed), ``INCONCLUSIVE`` when its store cannot be read, else ``NOT AUDITED`` (a sweep
   is not audited as a whole) with the accounting tally and its largest composed epsilon.

Notes (error / warning / info) carry everything the reader must know about bad inputs.

JSON model (``"schema": "dpaudit-report/1"``; non-finite floats are the strings "inf"/"nan"):

- ``title``, ``generated_at``, ``dpaudit_version``, ``git_commit``;
- ``inputs``: ``paths``, ``releases`` / ``audits`` ([{id, mechanism, path}]), ``sweeps``
  ([{name, path, store, releases}]), ``ledger``;
- ``notes``: [{level: error|warning|info, section, message}];
- ``sections.verdict``: [{mechanism, key, status (violation | accounting-mismatch |
  inconclusive | not-audited | no-evidence | no-claim), flags, line,
  max_epsilon_lower_bound, claimed_epsilons, releases, non_private_releases, audits}];
- ``sections.claim``: one card per release (the Release fields a reviewer checks, plus
  ``epsilons``: [{accountant, epsilon (recomputed), lower, estimate, stored, error}],
  ``accounting_check`` {status: ok | mismatch | unverified | no-claim, message},
  ``noise_source_label``, ``noise_secure``, ``sampler``);
- ``sections.provenance``: per dataset {name, kind, profile, split_sizes, split_seeds,
  source_files (names), fingerprints (keyed ``dataset_fingerprint`` values from the ledger's
  entries for these releases; empty without a ledger or for an old ledger), partitions,
  releases, audits, ...};
- ``sections.budget``: {ledger, available, summary (Ledger.summary rows), entries, verify,
  composition (the releases' own composition: dataset, partition, releases, naive_sum, rdp,
  prv, delta), datasets};
- ``sections.utility``: {rows: [{mechanism, dataset, epsilon, n, seeds, non_private,
  metrics: {name: {mean, sd, n}}}], curves: [{mechanism, dataset, delta, points, reference}]};
- ``sections.audit``: {table16: {canaries, rows, max}, audits: [one entry per audit record
  with status, compared_claim, recomputed_epsilon_lower_bound, ceiling (+ source), controls,
  roc, histogram, ...], eps_points};
- ``sections.reproduce``: [{kind: release | audit | sweep | report, mechanism, id, path, command,
  seed, noise, parameters?}];
- ``sections.sweep`` (present only when the inputs include a sweep): one entry per sweep with
  ``name``, ``path`` (folder), ``store`` (sweep.sqlite), ``error`` (unreadable store, else null),
  ``counts`` {done, failed, pending, total}, ``failures`` [{key, model, dataset, epsilon, seed,
  error, in_current_spec (false: left from an earlier version of the spec; null: unknown)}],
  ``spec`` (as stored), ``releases`` (release files read below the folder) and
  ``release_ids``, ``missing_releases`` (named by the store, no readable file) and
  ``orphan_releases`` (on disk, no finished task), ``tables`` (:func:`dpaudit.sweeps.sweep_tables`
  recomputed from the store: cells {dataset, epsilon, model, metric, seeds, values, summary {n,
  mean, sd, ci_low, ci_high, confidence}}, contrasts {..., mean_difference, p_value, p_holm,
  wins, ties, losses, n}, win_tie_loss, table3 {epsilon, citation, rows}, notes),
  ``tables_json`` (matches | differs | unreadable | absent: the saved tables.json against the
  recomputed ones), ``accounting`` {status: ok | mismatch | unverified | no-claim, line,
  checked, ok, mismatch, unverified, non_private, reproducible_noise, mismatches [{release_id,
  mechanism, path, epsilon, message}], unverified_releases}, ``budget`` [per (dataset,
  partition, adjacency): releases, private_releases, non_private_releases, unknown_releases,
  from_store, largest_single {epsilon, release_id, mechanism, target_epsilon},
  max_single_epsilon, naive_sum, delta, rdp, prv (composed at delta; inf when a non-private
  release is among them), errors {accountant: why it declined}, unbounded, lower_bound_only,
  sentence], ``ledger`` (with a ledger: {ledger, recorded (this sweep's releases found by id),
  tagged (entries whose payload carries this sweep's name), tagged_elsewhere, voided, missing,
  missing_ids, composition [the ledger's stored events of the sweep, composed with rdp],
  summary (``Ledger.summary(sweep=...)`` when the ledger knows the sweep), error}, else null).
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any, Iterable

from .. import __version__
from ..errors import DPAuditError, UsageError
from ..records import Release, _json_safe, git_commit, now_utc
from . import stats
from .sweep import sweep_reproduce, sweep_section, sweep_verdict
from .inputs import Inputs, LoadedAudit, LoadedRelease, Note, canonical_mechanism, integer, load_inputs, num, read_scores, scores_file

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
#: Accountants recomputed side by side on every claim card.
SIDE_BY_SIDE = ("rdp", "prv")
#: Relative tolerance when matching an audit's claimed epsilon to a release's epsilon.
CLAIM_MATCH_RTOL = 0.02
#: A recomputed epsilon larger than the claim by more than this (relative) is a mismatch.
RECOMPUTE_RTOL = 1e-3
#: Config keys that may differ between releases on one privacy-utility curve.
EPS_ONLY_KEYS = frozenset({
    "eps", "epsilon", "target_epsilon", "seed", "seeds", "noise_multiplier", "sigma", "out", "out_dir",
    "ledger", "json", "json_out", "data_dir", "reproducible_noise", "noise_source", "workers", "threads",
    "device", "dtype", "batch_size_eval", "progress", "calibrated_epsilon", "model_seed", "timings",
})


def _strip_eps(obj: Any) -> Any:
    """``obj`` without the keys that may differ along a privacy-utility curve (recursively)."""
    if isinstance(obj, dict):
        return {k: _strip_eps(v) for k, v in obj.items() if k not in EPS_ONLY_KEYS}
    if isinstance(obj, list):
        return [_strip_eps(v) for v in obj]
    return obj
METRIC_ORDER = ("accuracy", "precision_macro", "recall_macro", "f1_macro", "auroc", "auprc")


# ------------------------------------------------------------------ small helpers


def _claimed_accountant_epsilon(release: Release) -> float | None:
    return num(release.epsilon)


def _release_eps_key(release: Release) -> float | None:
    t = num(release.target_epsilon)
    e = t if t is not None else num(release.epsilon)
    return None if e is None else float(f"{e:.4g}")


def _close(a: float | None, b: float | None, rtol: float) -> bool:
    if a is None or b is None:
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def _command_str(cmd: Any) -> str | None:
    if cmd is None:
        return None
    if isinstance(cmd, (list, tuple)):
        return shlex.join(str(c) for c in cmd)
    return str(cmd)


def _short(h: Any, n: int = 12) -> str | None:
    return None if h is None else str(h)[:n]


def _dataset_name(ds: Any) -> str:
    if isinstance(ds, dict):
        return str(ds.get("name") or "unknown")
    return str(ds or "unknown")


def _steps_accounted(release: Release) -> int | None:
    if release.steps is not None:
        return integer(release.steps)
    g = release.guarantee if isinstance(release.guarantee, dict) else {}
    if g.get("type") == "subsampled-gaussian":
        return integer(g.get("steps"))
    return None


def _find_key(obj: Any, key: str, depth: int = 4) -> Any:
    """First value stored under ``key`` in nested dicts (breadth-first, bounded depth)."""
    level = [obj]
    for _ in range(depth):
        nxt = []
        for d in level:
            if isinstance(d, dict):
                if d.get(key) is not None:
                    return d[key]
                nxt.extend(v for v in d.values() if isinstance(v, dict))
        level = nxt
    return None


def _noise_label(ns: Any) -> tuple[str, bool | None]:
    """(label, secure?) of a release's noise source."""
    if not isinstance(ns, dict):
        return "not recorded", None
    source = str(ns.get("source") or "unknown")
    secret = ns.get("secret")
    if secret is None:
        secret = source != "reproducible"
    if source == "reproducible" or not secret:
        seed = ns.get("seed")
        return f"REPRODUCIBLE ({source}, derived from seed {seed}; not secret: for testing only)", False
    return f"secure ({source}, secret)", True


# ------------------------------------------------------------------ claim cards


#: Recomputed epsilons are a pure function of (event, delta, accountant, adjacency): one
#: process-wide cache serves every report built in this process.
_EPS_RESULTS: dict[str, dict] = {}

class _EpsCache:
    """Recomputed epsilons, keyed by (guarantee, delta, accountant, adjacency)."""

    def __init__(self) -> None:
        self._c = _EPS_RESULTS

    def get(self, guarantee: dict, delta: float, accountant: str, adjacency: str) -> dict:
        from ..accounting import compute_epsilon, event_from_dict

        key = json.dumps([guarantee, delta, accountant, adjacency], sort_keys=True, default=str)
        if key not in self._c:
            try:
                event = event_from_dict(guarantee)
                # (the rdp accountant caches each mechanism's one-step curve: a sweep's hundreds of
                # releases share a handful of mechanisms)
                r = compute_epsilon(event, delta=delta, accountant=accountant, adjacency=adjacency)
                self._c[key] = {"epsilon": r.epsilon, "lower": r.epsilon_lower, "estimate": r.epsilon_estimate, "error": None}
            except DPAuditError as e:
                self._c[key] = {"epsilon": None, "lower": None, "estimate": None, "error": str(e)}
            except (KeyError, TypeError, ValueError) as e:
                self._c[key] = {"epsilon": None, "lower": None, "estimate": None, "error": f"malformed guarantee ({type(e).__name__}: {e})"}
            except (RuntimeError, ArithmeticError, MemoryError) as e:
                # a numerical failure inside an accountant library (e.g. prv-accountant's
                # discretisation check): no number, never a guessed one
                self._c[key] = {"epsilon": None, "lower": None, "estimate": None,
                                "error": f"{accountant} accountant failed ({type(e).__name__}: {e})"}
        return self._c[key]


#: Accountants a report can recompute (a claim made with any other is "unverified").
RECOMPUTABLE = SIDE_BY_SIDE + ("pure",)


def _claim_card(lr: LoadedRelease, cache: _EpsCache, notes: list[Note], *, only_claimed: bool = False) -> dict:
    """One claim card; ``only_claimed`` recomputes just the release's own accountant (enough for
    the accounting check; used for the hundreds of releases of a sweep)."""
    r = lr.release
    label, secure = _noise_label(r.noise_source)
    delta = num(r.delta)
    claimed = num(r.epsilon)
    accountants = list(SIDE_BY_SIDE)
    if r.accountant not in accountants and r.accountant == "pure":
        accountants.insert(0, "pure")
    if only_claimed:
        accountants = [a for a in accountants if a == r.accountant]
    stored = r.epsilons if isinstance(r.epsilons, dict) else {}
    rows = []
    check = {"status": "unverified", "message": ""}
    if r.non_private:
        check = {"status": "no-claim", "message": "non-private release: no privacy claim"}
    for acc in accountants if not r.non_private else []:
        if delta is None or not (0 < delta < 1) and acc != "pure":
            rows.append({"accountant": acc, "epsilon": None, "stored": num(stored.get(acc)), "lower": None, "estimate": None,
                         "error": f"delta must be in (0, 1), got {r.delta!r}"})
            continue
        res = cache.get(r.guarantee, delta, acc, r.adjacency)
        st = stored.get(acc)
        st = num(st.get("epsilon")) if isinstance(st, dict) else num(st)
        rows.append({"accountant": acc, "epsilon": res["epsilon"], "stored": st, "lower": res["lower"],
                     "estimate": res["estimate"], "error": res["error"], "claimed_with": acc == r.accountant})
        if acc == r.accountant:
            if res["epsilon"] is None:
                check = {"status": "unverified", "message": f"cannot recompute the {acc} epsilon: {res['error']}"}
            elif claimed is None:
                check = {"status": "mismatch", "message": "the release states no numeric epsilon"}
            elif res["epsilon"] > claimed * (1 + RECOMPUTE_RTOL) + 1e-9:
                check = {"status": "mismatch",
                         "message": f"recomputed {acc} epsilon {res['epsilon']:.4f} > claimed {claimed:.4f}"}
            else:
                check = {"status": "ok", "message": f"recomputed {acc} epsilon {res['epsilon']:.4f} <= claimed {claimed:.4f}"}
    if not r.non_private and r.accountant not in RECOMPUTABLE:
        check = {"status": "unverified", "message": f"accountant {r.accountant!r} cannot be recomputed by this report"}
    target = num(r.target_epsilon)
    if not r.non_private and target is not None and claimed is not None and claimed > target * (1 + RECOMPUTE_RTOL) + 1e-9:
        check = {"status": "mismatch", "message": f"achieved epsilon {claimed:.4f} exceeds the target {target:.4f}"}
    if check["status"] == "mismatch":
        notes.append(Note("error", "claim", f"release {r.id[:12]} ({r.mechanism}): ACCOUNTING MISMATCH: {check['message']}."))
    elif check["status"] == "unverified":
        notes.append(Note("warning", "claim", f"release {r.id[:12]} ({r.mechanism}): claim not verified: {check['message']}."))
    steps_acc = _steps_accounted(r)
    steps_exec = integer(r.steps_executed)
    if not r.non_private and steps_exec is not None and steps_acc is not None and steps_exec != steps_acc:
        notes.append(Note("error", "claim", f"release {r.id[:12]} ({r.mechanism}): steps executed ({steps_exec}) differ from steps accounted ({steps_acc})."))
        check = {"status": "mismatch", "message": f"steps executed ({steps_exec}) differ from steps accounted ({steps_acc})"}
    if secure is False and not r.non_private:
        notes.append(Note("warning", "claim", f"release {r.id[:12]} ({r.mechanism}) used reproducible noise derived from a public seed; its DP guarantee assumes secret noise."))
    config = r.config if isinstance(r.config, dict) else {}
    sampler = _find_key(config, "sampler")
    q = num(r.sample_rate)
    if sampler is None and q is not None:
        sampler = ("full batch (q = 1)" if q >= 1.0 else
                   f"not recorded (the subsampled-Gaussian accounting assumes Poisson sampling at q = {q:g})")
    elif sampler is None:
        sampler = "not recorded"
    return {
        "release_id": r.id, "path": str(lr.path), "mechanism": r.mechanism, "non_private": bool(r.non_private),
        "privacy_unit": r.privacy_unit, "adjacency": r.adjacency, "accountant": r.accountant,
        "target_epsilon": target, "epsilon": claimed, "delta": delta, "epsilons": rows,
        "noise_multiplier": num(r.noise_multiplier), "sample_rate": num(r.sample_rate),
        "steps_accounted": steps_acc, "steps_executed": steps_exec, "clipping_norm": num(r.clipping_norm),
        "normalizer": r.normalizer, "noise_source": r.noise_source if isinstance(r.noise_source, dict) else None,
        "noise_source_label": label, "noise_secure": secure, "sampler": sampler,
        "dataset": _dataset_name(r.dataset), "partition": r.partition, "seed": r.seed,
        "dpaudit_version": r.dpaudit_version, "git_commit": r.git_commit, "created_at": r.created_at,
        "accounting_check": check,
    }


# ------------------------------------------------------------------ provenance


def _source_file_names(files: Any) -> list[str]:
    """The names of a dataset's source files: new releases publish a list of names, old ones a
    {name: sha256} dict whose hashes the report does not repeat (they fingerprint the data)."""
    if isinstance(files, dict):
        return sorted(str(k) for k in files)
    if isinstance(files, list):
        return [str(f) for f in files]
    return []


def _provenance(releases: list[LoadedRelease], audits: list[LoadedAudit], notes: list[Note],
                fingerprints: dict[str, str] | None = None) -> list[dict]:
    """Per dataset: its public identity, and the keyed ``dataset_fingerprint`` the ledger stored
    for its releases (``fingerprints``: release id -> fingerprint, only when a ledger was read).

    Never an unkeyed digest of the private data: an old release's ``dataset["sha256"]`` (or its
    source files' hashes) is not repeated here, and such a release gets a warning instead.
    """
    fingerprints = fingerprints or {}
    by: "OrderedDict[str, dict]" = OrderedDict()
    for lr in releases:
        ds = lr.release.dataset if isinstance(lr.release.dataset, dict) else {"name": str(lr.release.dataset)}
        key = json.dumps([ds.get("name"), ds.get("profile")], default=str)
        e = by.setdefault(key, {
            "name": ds.get("name"), "kind": ds.get("kind"), "profile": ds.get("profile"),
            "split_sizes": ds.get("split_sizes"), "n_features": ds.get("n_features"), "n_classes": ds.get("n_classes"),
            "source_files": _source_file_names(ds.get("source_files")),
            "fingerprints": [], "split_seeds": [], "partitions": [], "releases": [], "audits": [],
        })
        for k, v in (("split_seeds", ds.get("split_seed")), ("partitions", lr.release.partition),
                     ("fingerprints", fingerprints.get(lr.release.id))):
            if v is not None and v not in e[k]:
                e[k].append(v)
        for f in _source_file_names(ds.get("source_files")):
            if f not in e["source_files"]:
                e["source_files"].append(f)
        e["releases"].append(lr.release.id)
        if ds.get("sha256") or ds.get("user_ids_sha256") or (isinstance(ds.get("source_files"), dict) and ds["source_files"]):
            notes.append(Note("warning", "provenance", f"release {lr.release.id[:12]} (written by an older dpaudit) publishes unkeyed "
                                                       "hashes of its private data in release.json, which tell neighbouring datasets apart; "
                                                       "this report does not repeat them; do not republish that file."))
    for e in by.values():
        if len(e["fingerprints"]) > 1:
            notes.append(Note("warning", "provenance", f"dataset {e['name']}: the ledger holds {len(e['fingerprints'])} different keyed "
                                                       "fingerprints for its releases (different private data under one name)."))
    for la in audits:
        rec_ds = la.record.get("dataset")
        name = la.view["dataset"]
        match = next((k for k, v in by.items() if name and v["name"] == name), None)
        if match is None:
            if name is None:
                continue
            match = json.dumps([name, rec_ds.get("profile") if isinstance(rec_ds, dict) else None], default=str)
            by[match] = {
                "name": name, "kind": rec_ds.get("kind") if isinstance(rec_ds, dict) else None,
                "profile": rec_ds.get("profile") if isinstance(rec_ds, dict) else None,
                "split_sizes": rec_ds.get("split_sizes") if isinstance(rec_ds, dict) else None,
                "n_features": None, "n_classes": None,
                "source_files": _source_file_names(rec_ds.get("source_files")) if isinstance(rec_ds, dict) else [],
                "fingerprints": [],
                "split_seeds": [rec_ds["split_seed"]] if isinstance(rec_ds, dict) and rec_ds.get("split_seed") is not None else [],
                "partitions": [], "releases": [], "audits": [],
            }
        by[match]["audits"].append(la.view["id"] or str(la.path))
    return list(by.values())


# ------------------------------------------------------------------ budget


def _rows_of(obj: Any) -> list[dict]:
    out = []
    for x in obj or []:
        if isinstance(x, dict):
            out.append(dict(x))
        elif hasattr(x, "to_dict"):
            out.append(dict(x.to_dict()))
        elif hasattr(x, "__dataclass_fields__"):
            from dataclasses import asdict

            out.append(asdict(x))
        elif hasattr(x, "_asdict"):
            out.append(dict(x._asdict()))
    return out


LEDGER_ENTRY_DROP = ("prev_hash", "hash", "guarantee", "payload", "artefact_path", "dataset_sha256", "release_created_at")


def _ledger_budget(ledger_path: str | os.PathLike | None, explicit: bool, datasets: list[str], release_ids: list[str],
                   notes: list[Note]) -> dict:
    """The ledger's own summary (and entries, and hash-chain check) for ``datasets``."""
    from ..accounting.ledger_paths import resolve_ledger

    loc = resolve_ledger(ledger_path)
    # A PostgreSQL ledger is opened as given (a server that is down is an error, not "no ledger").
    path = loc.path if loc.backend == "sqlite" else loc
    out: dict = {"ledger": loc.display, "summary": [], "entries": [], "available": False, "verify": None}
    if loc.backend == "sqlite" and not path.exists():
        if explicit:
            raise UsageError(f"ledger must be an existing ledger database, got {str(ledger_path)!r}.")
        if datasets:
            notes.append(Note("warning", "budget", f"no ledger at {path}: pass --ledger PATH to show the spent and remaining budget; "
                                                 "only the composition of the releases in this report is shown."))
        out["ledger"] = None
        return out
    try:
        from ..accounting.ledger import open_ledger
    except ImportError:
        notes.append(Note("warning", "budget", "this dpaudit has no ledger module (dpaudit.accounting.ledger); budget from the releases only."))
        return out
    summary: list[dict] = []
    entries: list[dict] = []
    try:
        with open_ledger(path) as ledger:
            for name in datasets or [None]:
                try:
                    ds_entries = ledger.entries(dataset=name) if name is not None else ledger.entries()
                    rows = ledger.summary(dataset=name)
                    summary.extend(_rows_of(rows))
                    entries.extend(_rows_of(ds_entries))
                except UsageError:
                    notes.append(Note("warning", "budget", f"dataset {name!r} is not recorded in ledger {path}: its releases were not "
                                                           "accounted there."))
            if hasattr(ledger, "verify"):
                try:
                    ver = ledger.verify()
                    out["verify"] = ver if isinstance(ver, dict) else (_rows_of([ver]) or [None])[0]
                except DPAuditError as e:
                    out["verify"] = {"ok": False, "problems": [{"message": str(e)}]}
    except DPAuditError as e:
        notes.append(Note("error", "budget", f"ledger {path} could not be read: {e}"))
        return out
    ver = out["verify"]
    if isinstance(ver, dict):
        ok = ver.get("ok")
        if ok is None and "problems" in ver:
            ok = not ver["problems"]
        if ok is False:
            msgs = "; ".join(str(p.get("message", p)) for p in ver.get("problems", [])[:3] if isinstance(p, dict))
            notes.append(Note("error", "budget", f"ledger {path} failed its integrity check: {msgs or 'see ledger verify'}."))
    # The keyed dataset fingerprint of each recorded release (HMAC with the ledger's secret key):
    # what the provenance shows. Old ledgers have none; their raw dataset_sha256 is dropped.
    out["dataset_fingerprints"] = {str(e.get("release_id") or e.get("id")): str(e["dataset_fingerprint"])
                                   for e in entries if e.get("kind", "release") == "release" and e.get("dataset_fingerprint")}
    for e in entries:
        for k in LEDGER_ENTRY_DROP:
            e.pop(k, None)
    recorded = {str(e.get("release_id") or e.get("id")) for e in entries if e.get("kind", "release") == "release"}
    for rid in release_ids:
        if rid not in recorded and (entries or summary):
            notes.append(Note("warning", "budget", f"release {rid[:12]} is not in ledger {path}: its budget use is not accounted there."))
    out.update(summary=summary, entries=entries, available=True)
    for row in summary:
        rem = num(row.get("remaining"))
        if rem is not None and rem < 0:
            notes.append(Note("error", "budget", f"dataset {row.get('dataset')} partition {row.get('partition')}: budget exceeded "
                                                 f"(remaining {rem:.4f})."))
    return out


def _sequential(guarantees: Iterable[dict]) -> dict:
    """Sequential composition of stored guarantees as one event dict.

    Identical leaves are merged (k runs of the same subsampled Gaussian = one run with the
    summed steps; pure-epsilon counts add), which is exact and keeps the accountants fast;
    parallel nodes are kept (:func:`dpaudit.accounting.ledger_compose.sequential`). Guarantees
    that do not parse are composed as they are (the accountant then reports the error).
    """
    from ..accounting.events import Composed, event_from_dict
    from ..accounting.ledger_compose import sequential

    gs = list(guarantees)
    try:
        event = sequential([event_from_dict(g) for g in gs])  # the ledger's own composition
    except (DPAuditError, KeyError, TypeError, ValueError):
        return {"type": "composed", "events": gs} if len(gs) != 1 else gs[0]
    return (event or Composed(())).to_dict()


def compose_side_by_side(cache: _EpsCache, tree: dict, delta: float, adjacency: str) -> dict[str, dict]:
    """rdp and prv of one composed tree (accountant -> cache entry), with the ledger's rule: prv is
    not attempted where the rdp bound is already above
    :data:`dpaudit.accounting.ledger_compose.PRV_SKIP_ABOVE_RDP_EPSILON` (it fails there after
    seconds and GBs; leaving out a bound never lowers the reported minimum)."""
    from ..accounting.ledger_compose import PRV_SKIP_ABOVE_RDP_EPSILON

    out: dict[str, dict] = {}
    for acc in SIDE_BY_SIDE:
        rdp = out.get("rdp", {}).get("epsilon")
        if acc == "prv" and rdp is not None and rdp > PRV_SKIP_ABOVE_RDP_EPSILON:
            out[acc] = {"epsilon": None, "lower": None, "estimate": None,
                        "error": f"not attempted: the rdp bound {rdp:.1f} exceeds {PRV_SKIP_ABOVE_RDP_EPSILON:g}, where prv-accountant is unreliable"}
            continue
        out[acc] = cache.get(tree, delta, acc, adjacency)
    return out


def _release_composition(releases: list[LoadedRelease], cache: _EpsCache, notes: list[Note]) -> list[dict]:
    """Sequential composition per (dataset, partition); parallel (max) over partitions."""
    groups: "OrderedDict[tuple, list[Release]]" = OrderedDict()
    for lr in releases:
        r = lr.release
        if r.non_private:
            continue
        groups.setdefault((_dataset_name(r.dataset), str(r.partition), str(r.adjacency)), []).append(r)
    rows = []
    for (ds, part, adj), rels in groups.items():
        deltas = [num(r.delta) for r in rels if num(r.delta) is not None]
        delta = max(deltas) if deltas else None
        row = {"dataset": ds, "partition": part, "adjacency": adj, "releases": len(rels),
               "naive_sum": sum(num(r.epsilon) or 0.0 for r in rels), "delta": delta, "rdp": None, "prv": None}
        if delta is not None and 0 < delta < 1:
            tree = _sequential(r.guarantee for r in rels)
            for acc, res in compose_side_by_side(cache, tree, delta, adj).items():
                row[acc] = res["epsilon"]
                if res["error"]:
                    notes.append(Note("warning", "budget", f"composition of {ds}/{part} with {acc}: {res['error']}"))
        rows.append(row)
    by_ds: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_ds[row["dataset"]].append(row)
    for ds, rs in by_ds.items():
        if len({r["partition"] for r in rs}) > 1:
            rows.append({
                "dataset": ds, "partition": "all (parallel, max over partitions)", "adjacency": ",".join(sorted({r["adjacency"] for r in rs})),
                "releases": sum(r["releases"] for r in rs), "naive_sum": max(r["naive_sum"] for r in rs),
                "delta": max((r["delta"] for r in rs if r["delta"] is not None), default=None),
                "rdp": max((r["rdp"] for r in rs if r["rdp"] is not None), default=None),
                "prv": max((r["prv"] for r in rs if r["prv"] is not None), default=None),
            })
    return rows


# ------------------------------------------------------------------ utility


def _curve_key(r: Release) -> str:
    cfg = r.config if isinstance(r.config, dict) else {}
    rest = _strip_eps(cfg)
    ds = r.dataset if isinstance(r.dataset, dict) else {}
    return json.dumps({
        "mechanism": canonical_mechanism(r.mechanism), "dataset": _dataset_name(r.dataset), "profile": ds.get("profile"),
        "partition": r.partition, "delta": num(r.delta), "adjacency": r.adjacency,
        "sample_rate": num(r.sample_rate), "steps": _steps_accounted(r), "clipping_norm": num(r.clipping_norm),
        "config": rest,
    }, sort_keys=True, default=str)


def _metric_stats(rels: list[Release]) -> dict:
    names: list[str] = []
    for r in rels:
        for k, v in (r.metrics or {}).items():
            if num(v) is not None and k not in names:
                names.append(k)
    names.sort(key=lambda k: (METRIC_ORDER.index(k) if k in METRIC_ORDER else len(METRIC_ORDER), k))
    out = {}
    for k in names:
        m, sd, n = stats.mean_sd([num((r.metrics or {}).get(k)) for r in rels if num((r.metrics or {}).get(k)) is not None])
        out[k] = {"mean": m, "sd": sd, "n": n}
    return out


def _utility(releases: list[LoadedRelease], notes: list[Note]) -> dict:
    private: "OrderedDict[str, dict[float | None, list[Release]]]" = OrderedDict()
    reference: "OrderedDict[tuple, list[Release]]" = OrderedDict()
    for lr in releases:
        r = lr.release
        if r.non_private:
            reference.setdefault((canonical_mechanism(r.mechanism), _dataset_name(r.dataset)), []).append(r)
        else:
            private.setdefault(_curve_key(r), {}).setdefault(_release_eps_key(r), []).append(r)
    rows, curves = [], []
    for key, by_eps in private.items():
        k = json.loads(key)
        ref_rels = reference.get((k["mechanism"], k["dataset"]), [])
        ref = _metric_stats(ref_rels) if ref_rels else None
        points = []
        for eps in sorted(by_eps, key=lambda e: (e is None, e or 0.0)):
            rels = by_eps[eps]
            ms = _metric_stats(rels)
            seeds = sorted({r.seed for r in rels}, key=str)
            if len(seeds) < len(rels):
                notes.append(Note("info", "utility", f"{rels[0].mechanism} at eps={eps}: {len(rels)} releases but only {len(seeds)} distinct seeds."))
            row = {"mechanism": rels[0].mechanism, "dataset": k["dataset"], "epsilon": eps, "delta": k["delta"],
                   "non_private": False, "n": len(rels), "seeds": seeds, "metrics": ms}
            rows.append(row)
            points.append({"epsilon": eps, "n": len(rels), "metrics": ms})
        if len([p for p in points if p["epsilon"] is not None]) >= 2:
            curves.append({"mechanism": by_eps[next(iter(by_eps))][0].mechanism, "dataset": k["dataset"], "delta": k["delta"],
                           "points": [p for p in points if p["epsilon"] is not None], "reference": ref})
    for (mech, ds), rels in reference.items():
        rows.append({"mechanism": rels[0].mechanism, "dataset": ds, "epsilon": None, "delta": None, "non_private": True,
                     "n": len(rels), "seeds": sorted({r.seed for r in rels}, key=str), "metrics": _metric_stats(rels)})
    if private and not reference:
        notes.append(Note("info", "utility", "no non-private reference release among the inputs (train one with --non-private)."))
    if any(not r["metrics"] for r in rows):
        notes.append(Note("warning", "utility", "some releases record no numeric metrics."))
    return {"rows": rows, "curves": curves}


# ------------------------------------------------------------------ audits and verdicts


def _link_audits(inputs: Inputs, notes: list[Note]) -> dict[int, LoadedRelease | None]:
    """Release each audit explicitly belongs to (release_id / release_path / same directory)."""
    by_id = {lr.release.id: lr for lr in inputs.releases}
    by_dir = {lr.path.resolve(): lr for lr in inputs.releases}
    links: dict[int, LoadedRelease | None] = {}
    for i, la in enumerate(inputs.audits):
        v = la.view
        lr = None
        if v["release_id"] and str(v["release_id"]) in by_id:
            lr = by_id[str(v["release_id"])]
        elif v["release_path"]:
            p = Path(v["release_path"])
            p = p if p.is_absolute() else la.path / p
            p = p.parent if p.name.endswith(".json") else p
            lr = by_dir.get(p.resolve())
        if lr is None:
            lr = by_dir.get(la.path.resolve())
        links[i] = lr
        if lr is not None and v["mechanism"] is not None and canonical_mechanism(v["mechanism"]) != canonical_mechanism(lr.release.mechanism):
            notes.append(Note("error", "audit", (
                f"audit {la.path} is of mechanism {v['mechanism']!r} but belongs to release {lr.release.id[:12]} of mechanism "
                f"{lr.release.mechanism!r}: it is NOT used for {lr.release.mechanism}'s verdict.")))
    return links


def _audit_entry(i: int, la: LoadedAudit, covered: list[Release], notes: list[Note], with_scores: bool) -> dict:
    v = dict(la.view)
    label = f"audit {la.path}"
    entry = {k: v[k] for k in ("id", "mechanism", "canary", "task", "dataset", "trials", "eval_trials", "claimed_epsilon", "delta",
                                "epsilon_lower_bound", "confidence", "method", "threshold", "counts", "ceiling", "ceiling_source",
                                "gdp_estimate", "no_noise", "null", "auc", "seeds", "missing")}
    entry["index"] = i
    entry["path"] = str(la.path)
    entry["label"] = la.path.name or str(la.path)
    entry["command"] = _command_str(v["command"])
    entry["covers_releases"] = [r.id for r in covered]
    claims = [c for c in [v["claimed_epsilon"]] + [num(r.epsilon) for r in covered] if c is not None]
    entry["compared_claim"] = min(claims) if claims else None
    if v["missing"]:
        notes.append(Note("info", "audit", f"{label} lacks keys: {', '.join(v['missing'])}."))
    # recompute the bound and the ceiling from the EVAL counts (independent cross-check)
    counts = v["counts"] or {}
    c = {k: integer(counts.get(k)) for k in ("tp", "fp", "tn", "fn")}
    entry["recomputed_epsilon_lower_bound"] = None
    delta = v["delta"]
    conf = v["confidence"]
    if all(x is not None for x in c.values()) and delta is not None and conf is not None and 0 < conf < 1:
        rec = stats.epsilon_lower_bound(tp=c["tp"], fp=c["fp"], tn=c["tn"], fn=c["fn"], delta=delta, confidence=conf)
        entry["recomputed_epsilon_lower_bound"] = rec
        if entry["ceiling"] is None:
            entry["ceiling"] = stats.ceiling(n_in=c["tp"] + c["fn"], n_out=c["fp"] + c["tn"], delta=delta, confidence=conf)
            entry["ceiling_source"] = "computed by the report from the EVAL counts"
        stored = v["epsilon_lower_bound"]
        if stored is not None and abs(stored - rec) > 0.01 + 1e-3 * abs(rec):
            notes.append(Note("warning", "audit", f"{label}: stored eps_LB {stored:.4f} differs from the Clopper-Pearson bound "
                                                  f"{rec:.4f} recomputed from its counts (two-sided split of significance)."))
    elif entry["ceiling"] is None:
        notes.append(Note("warning", "audit", f"{label}: no ceiling and no complete counts; whether the audit could detect a violation is unknown."))
    # the verdict of this one audit
    lb, claim = v["epsilon_lower_bound"], entry["compared_claim"]
    rec = entry["recomputed_epsilon_lower_bound"]
    entry["role"] = v["role"]
    if v["role"] != "main" or not v["noise"] or not v["canary_inserted"]:
        status = "control"
        notes.append(Note("info", "verdict", f"{label} is a control run (role {v['role']}, noise {'on' if v['noise'] else 'off'}, "
                                             f"canary {'inserted' if v['canary_inserted'] else 'not inserted'}); no privacy claim applies to it."))
    elif lb is None or claim is None or (isinstance(lb, float) and math.isnan(lb)):
        status = "incomplete"
        why = "no eps_LB" if lb is None or math.isnan(lb) else "no claimed epsilon"
        notes.append(Note("error", "verdict", f"{label}: {why}; the verdict for {v['mechanism']} is INCONCLUSIVE."))
    elif lb > claim:
        status = "violation"
    elif rec is not None and rec > claim:
        status = "incomplete"
        notes.append(Note("error", "verdict", f"{label}: stored eps_LB {lb:.4f} <= claim {claim:.4f} but its own counts give {rec:.4f} > claim; INCONCLUSIVE."))
    elif v["mechanism"] is None:
        status = "incomplete"  # no mechanism: no claim it could support (a violation above is still shown)
    else:
        status = "no-evidence"
    entry["status"] = status
    ceil = entry["ceiling"]
    entry["underpowered"] = bool(ceil is not None and claim is not None and ceil < claim)
    nn = v["no_noise"]
    if nn is not None and nn.get("epsilon_lower_bound") is not None and nn["epsilon_lower_bound"] < 0.1:
        notes.append(Note("warning", "audit", f"{label}: the no-noise control found almost no leakage (eps_LB {nn['epsilon_lower_bound']:.3f}); "
                                              "the attack may be too weak to detect a violation."))
    elif nn is None:
        notes.append(Note("info", "audit", f"{label}: no no-noise control recorded."))
    # plot data: the audit's own ROC (on EVAL trials) when stored, else one from the raw EVAL
    # scores; the in/out histogram from the raw scores of all trials.
    entry["direction"] = v["direction"]
    entry["roc"] = v["roc"]
    entry["histogram"] = None
    entry["roc_source"] = "audit record (EVAL trials)" if v["roc"] else None
    if with_scores:
        sf = scores_file(la.path, la.record)
        if sf is None:
            notes.append(Note("info", "audit", f"{label}: no raw scores file; no score histogram."))
        else:
            try:
                raw = read_scores(sf)
                entry["histogram"] = stats.histograms(raw["scores"], raw["worlds"])
                if entry["roc"] is None:
                    ev = ~raw["select"] if raw["select"] is not None else slice(None)
                    sign = -1.0 if v["direction"] == "less" else 1.0
                    entry["roc"] = stats.roc_points(sign * raw["scores"][ev], raw["worlds"][ev])
                    entry["roc_source"] = f"raw scores ({sf.name})" + (", EVAL trials" if raw["select"] is not None else ", all trials")
                if entry["auc"] is None and entry["roc"] is not None:
                    entry["auc"] = entry["roc"].get("auc")
            except DPAuditError as e:
                notes.append(Note("error", "audit", f"{label}: {e}"))
    return entry


def _table16(entries: list[dict]) -> dict:
    """Rows per (mechanism, task), one column group per canary: private / no-noise eps_LB, ceiling."""
    canaries: list[str] = []
    rows: "OrderedDict[tuple, dict]" = OrderedDict()
    for e in entries:
        can = e["canary"] or "unnamed canary"
        if can not in canaries:
            canaries.append(can)
        task = e["task"] or e["dataset"] or "-"
        key = (e["mechanism"] or "unknown", task, e["compared_claim"])
        n = 1
        while key in rows and can in rows[key]["cells"]:  # a second audit of the same cell gets its own row
            n += 1
            key = (e["mechanism"] or "unknown", f"{task} [{e['label']}]", e["compared_claim"], n)
        row = rows.setdefault(key, {"mechanism": key[0], "task": key[1], "claimed_epsilon": e["compared_claim"], "cells": {}})
        nn = e["no_noise"] or {}
        row["cells"][can] = {
            "private": e["epsilon_lower_bound"], "no_noise": nn.get("epsilon_lower_bound"), "ceiling": e["ceiling"],
            "confidence": e["confidence"], "trials": e["trials"], "status": e["status"],
        }
    out_rows = list(rows.values())
    max_row: dict = {"mechanism": "max over tasks", "task": "", "claimed_epsilon": None, "cells": {}}
    for can in canaries:
        cells = [r["cells"][can] for r in out_rows if can in r["cells"]]

        def _mx(k: str) -> float | None:
            vals = [c[k] for c in cells if c[k] is not None]
            return max(vals) if vals else None

        max_row["cells"][can] = {"private": _mx("private"), "no_noise": _mx("no_noise"), "ceiling": _mx("ceiling"),
                                 "confidence": None, "trials": None, "status": None}
    return {"canaries": canaries, "rows": out_rows, "max": max_row if len(out_rows) > 1 else None}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else ("inf" if math.isinf(x) else f"{x:.3f}")


def _verdicts(inputs: Inputs, claims: list[dict], links: dict[int, LoadedRelease | None], notes: list[Note],
              with_scores: bool) -> tuple[list[dict], list[dict]]:
    groups: "OrderedDict[str, dict]" = OrderedDict()

    def group(name: Any) -> dict:
        key = canonical_mechanism(name)
        return groups.setdefault(key, {"key": key, "names": [], "releases": [], "non_private": [], "audits": []})

    for lr in inputs.releases:
        g = group(lr.release.mechanism)
        if lr.release.mechanism not in g["names"]:
            g["names"].append(lr.release.mechanism)
        (g["non_private"] if lr.release.non_private else g["releases"]).append(lr.release)
    for i, la in enumerate(inputs.audits):
        mech = la.view["mechanism"]
        if mech is None:
            notes.append(Note("error", "verdict", f"audit {la.path} names no mechanism; it is matched to no release and cannot support any verdict."))
        g = group(mech if mech is not None else "unknown")
        if mech is not None and mech not in g["names"]:
            g["names"].append(mech)
        g["audits"].append(i)

    claim_by_id = {c["release_id"]: c for c in claims}
    entries: list[dict] = []
    verdicts: list[dict] = []
    for key, g in groups.items():
        name = " / ".join(g["names"]) or key
        g_entries = []
        covered_ids: set[str] = set()
        for i in g["audits"]:
            la = inputs.audits[i]
            link = links.get(i)
            if link is not None and canonical_mechanism(link.release.mechanism) == key:
                covered = [link.release]
            else:
                covered = [r for r in g["releases"] if _close(la.view["claimed_epsilon"], num(r.epsilon), CLAIM_MATCH_RTOL)
                           or _close(la.view["claimed_epsilon"], num(r.target_epsilon), CLAIM_MATCH_RTOL)]
                if covered:
                    notes.append(Note("info", "audit", f"audit {la.path} is matched to {len(covered)} release(s) by mechanism and epsilon only "
                                                       "(it records no release id): check that it audited the same configuration."))
            covered_ids.update(r.id for r in covered)
            for r in covered:
                ad, rd = la.view["delta"], num(r.delta)
                if ad is not None and rd is not None and not _close(ad, rd, 1e-9):
                    notes.append(Note("warning", "audit", f"audit {la.path} bounds epsilon at delta={ad:g} but release {r.id[:12]} claims "
                                                          f"delta={rd:g}; the comparison is only exact at equal delta."))
                aa = la.view.get("adjacency")
                if aa and str(aa) != str(r.adjacency):
                    notes.append(Note("warning", "audit", f"audit {la.path} uses adjacency {aa} but release {r.id[:12]} claims "
                                                          f"{r.adjacency}; the comparison is not like for like."))
            e = _audit_entry(i, la, covered, notes, with_scores)
            g_entries.append(e)
        entries.extend(g_entries)
        if g["audits"] and not g["releases"] and (g["non_private"] or inputs.releases):
            if key != "unknown":
                notes.append(Note("warning", "verdict", f"audit(s) of {name} match no private release of {name} among the inputs; "
                                                        "the verdict uses the audits' own claimed epsilon."))
        uncovered = [r for r in g["releases"] if r.id not in covered_ids]
        for r in uncovered:
            notes.append(Note("warning", "verdict", f"release {r.id[:12]} ({r.mechanism}, eps={_fmt(num(r.epsilon))}) has no audit "
                                                    "among the inputs (none of its mechanism at its epsilon)."))
        mismatched = [claim_by_id[r.id] for r in g["releases"] if r.id in claim_by_id and claim_by_id[r.id]["accounting_check"]["status"] == "mismatch"]
        parts: list[str] = []
        flags: list[str] = []
        violations = [e for e in g_entries if e["status"] == "violation"]
        incomplete = [e for e in g_entries if e["status"] == "incomplete"]
        ok = [e for e in g_entries if e["status"] == "no-evidence"]
        controls_only = bool(g_entries) and all(e["status"] == "control" for e in g_entries)
        if mismatched:
            flags.append("accounting-mismatch")
            parts.append("ACCOUNTING MISMATCH: " + "; ".join(c["accounting_check"]["message"] for c in mismatched))
        if violations:
            worst = max(violations, key=lambda e: e["epsilon_lower_bound"] - e["compared_claim"])
            status = "violation"
            where = ", ".join(x for x in (f"canary {worst['canary']}" if worst["canary"] else "", f"task {worst['task']}" if worst["task"] else "") if x)
            parts.append(f"VIOLATION: eps_LB {_fmt(worst['epsilon_lower_bound'])} > claimed {_fmt(worst['compared_claim'])}"
                         + (f" ({where})" if where else "")
                         + (f"; {len(violations)} of {len(g_entries)} audits exceed their claim" if len(g_entries) > 1 else ""))
        elif incomplete:
            status = "inconclusive"
            parts.append(f"INCONCLUSIVE: {len(incomplete)} of {len(g_entries)} audit record(s) cannot be judged (see notes)")
        elif ok:
            status = "no-evidence"
            best = max(ok, key=lambda e: e["epsilon_lower_bound"] - e["compared_claim"])
            parts.append(f"no evidence of a violation (max eps_LB {_fmt(best['epsilon_lower_bound'])} <= claimed {_fmt(best['compared_claim'])})")
        elif g["releases"] or controls_only:
            status = "not-audited"
            parts.append("NOT AUDITED: only control runs of this mechanism among the inputs" if controls_only
                         else "NOT AUDITED: no audit of this mechanism among the inputs")
        else:
            status = "no-claim"
            parts.append("non-private reference only (no privacy claim)")
        if status == "no-evidence":
            weak = [e for e in ok if e["underpowered"]]
            if weak:
                w = min(weak, key=lambda e: e["ceiling"])
                parts.append(f"audit underpowered: ceiling {_fmt(w['ceiling'])} < claimed {_fmt(w['compared_claim'])}")
                flags.append("underpowered")
            unknown = [e for e in ok if e["ceiling"] is None]
            if unknown:
                parts.append(f"ceiling unknown for {len(unknown)} audit(s)")
                flags.append("ceiling-unknown")
        if uncovered and g_entries:
            parts.append(f"{len(uncovered)} release(s) not audited at their epsilon")
            flags.append("releases-not-audited")
        if mismatched and status in ("no-evidence", "not-audited", "no-claim"):
            status = "accounting-mismatch"
        lbs = [e["epsilon_lower_bound"] for e in g_entries if e["epsilon_lower_bound"] is not None]
        verdicts.append({
            "mechanism": name, "key": key, "status": status, "flags": flags,
            "line": f"{name}: " + "; ".join(parts),
            "max_epsilon_lower_bound": max(lbs) if lbs else None,
            "claimed_epsilons": sorted({e["compared_claim"] for e in g_entries if e["compared_claim"] is not None}
                                       | {num(r.epsilon) for r in g["releases"] if num(r.epsilon) is not None}),
            "releases": [r.id for r in g["releases"]], "non_private_releases": [r.id for r in g["non_private"]],
            "audits": [e["path"] for e in g_entries],
        })
    return verdicts, entries


def _reproduce(inputs: Inputs, report_command: str | None, notes: list[Note], extra: list[dict] | None = None) -> list[dict]:
    out = []
    for lr in inputs.releases:
        cmd = _command_str(lr.release.command)
        out.append({"kind": "release", "mechanism": lr.release.mechanism, "id": lr.release.id, "path": str(lr.path), "command": cmd,
                    "seed": lr.release.seed, "noise": _noise_label(lr.release.noise_source)[0],
                    "dpaudit_version": lr.release.dpaudit_version, "git_commit": lr.release.git_commit})
        if cmd is None:
            notes.append(Note("warning", "reproduce", f"release {lr.release.id[:12]} records no command."))
    for la in inputs.audits:
        cmd = _command_str(la.view["command"])
        cfg = la.record.get("config") if isinstance(la.record.get("config"), dict) else None
        out.append({"kind": "audit", "mechanism": la.view["mechanism"], "id": la.view["id"], "path": str(la.path), "command": cmd,
                    "seed": la.view["seeds"], "noise": None, "dpaudit_version": la.record.get("dpaudit_version"),
                    "git_commit": la.record.get("git_commit"),
                    "parameters": {k: la.record.get(k) for k in ("canary", "runs", "confidence", "delta", "claimed_epsilon", "select_fraction",
                                                                  "task", "dataset") if k in la.record} | ({"config": cfg} if cfg else {})})
        if cmd is None:
            notes.append(Note("warning", "reproduce", f"audit {la.path} records no command; its recorded parameters are listed instead."))
    out.extend(extra or [])
    if report_command:
        out.append({"kind": "report", "mechanism": None, "id": None, "path": None, "command": report_command, "seed": None,
                    "noise": None, "dpaudit_version": __version__, "git_commit": None})
    return out


# ------------------------------------------------------------------ entry point


def build_report(
    paths: Iterable[str | os.PathLike],
    *,
    ledger_path: str | os.PathLike | None = None,
    title: str | None = None,
    command: str | None = None,
    with_scores: bool = True,
) -> dict:
    """Build the JSON report model from release/audit paths (files or folders, searched recursively).

    ``ledger_path``: the ledger to summarise; None uses ``$DPAUDIT_LEDGER`` or the default path
    when it exists (a missing default is a note; a missing explicit path is a UsageError).
    ``command``: the command line that produced this report (shown under "Reproduce").
    Raises :class:`~dpaudit.errors.UsageError` / :class:`~dpaudit.errors.DataError` (one line)
    only when nothing readable is found; every other problem becomes a note.
    """
    inputs = load_inputs(paths)
    notes: list[Note] = list(inputs.notes)
    cache = _EpsCache()
    claims = [_claim_card(lr, cache, notes) for lr in inputs.releases]
    links = _link_audits(inputs, notes)
    verdicts, audit_entries = _verdicts(inputs, claims, links, notes, with_scores)
    # A sweep's releases are summarised (sections.sweep), not carded; they still count in the
    # provenance and in the composition of everything this report covers.
    sweep_releases = [lr for sw in inputs.sweeps for lr in sw.releases]
    datasets = []
    for lr in inputs.releases + sweep_releases:
        n = _dataset_name(lr.release.dataset)
        if n not in datasets:
            datasets.append(n)
    ledger = _ledger_budget(ledger_path, ledger_path is not None, datasets,
                            [lr.release.id for lr in inputs.releases], notes)
    fingerprints = ledger.pop("dataset_fingerprints", {})
    budget = {**ledger, "composition": _release_composition(inputs.releases + sweep_releases, cache, notes), "datasets": datasets}
    sweeps = [sweep_section(sw, cache, notes, ledger_path=ledger["ledger"] if ledger["available"] else None) for sw in inputs.sweeps]
    verdicts = verdicts + [sweep_verdict(e) for e in sweeps]
    points = [{"mechanism": e["mechanism"], "canary": e["canary"], "task": e["task"], "claimed_epsilon": e["compared_claim"],
               "epsilon_lower_bound": e["epsilon_lower_bound"], "no_noise": (e["no_noise"] or {}).get("epsilon_lower_bound"),
               "ceiling": e["ceiling"], "status": e["status"]} for e in audit_entries]
    sections = {
        "verdict": verdicts,
        "claim": claims,
        "provenance": _provenance(inputs.releases + sweep_releases, inputs.audits, notes, fingerprints),
        "budget": budget,
        "utility": _utility(inputs.releases, notes),
        "audit": {"table16": _table16(audit_entries), "audits": audit_entries, "eps_points": points},
        "reproduce": _reproduce(inputs, command, notes, extra=[sweep_reproduce(e) for e in sweeps]),
    }
    if sweeps:
        sections["sweep"] = sweeps
    report = {
        "schema": SCHEMA,
        "title": title or "dpaudit reviewer report",
        "generated_at": now_utc(),
        "dpaudit_version": __version__,
        "git_commit": git_commit(),
        "inputs": {
            "paths": inputs.paths,
            "releases": [{"id": lr.release.id, "mechanism": lr.release.mechanism, "path": str(lr.path)} for lr in inputs.releases],
            "audits": [{"id": la.view["id"], "mechanism": la.view["mechanism"], "path": str(la.path)} for la in inputs.audits],
            "sweeps": [{"name": e["name"], "path": e["path"], "store": e["store"], "releases": e["releases"]} for e in sweeps],
            "ledger": budget["ledger"],
        },
        "sections": sections,
        "notes": [n.to_dict() for n in notes],
    }
    return _json_safe(report)


def read_report(path: str | os.PathLike) -> dict:
    """Read a report written with ``--format json`` (so HTML/Markdown can be re-rendered from it)."""
    from ..errors import DataError
    from ..records import read_json

    data = read_json(path, "report")
    if data.get("schema") != SCHEMA:
        raise DataError(f"report schema must be {SCHEMA}, got {data.get('schema')!r}.")
    return data
