"""The audit engine: trials, SELECT/EVAL split, bounds, controls, checkpoints, audit.json.

One audit (Jagielski, Ullman & Oprea 2020; DP-MixMin paper appendix A.8):
  1. ``runs`` trials; exactly half have the canary in (the world of each trial is a seeded,
     public permutation). Each trial re-runs the mechanism with fresh private noise and fresh
     Poisson sampling; nothing else changes between trials.
  2. Trials are split (seeded, stratified by world) into disjoint SELECT (default 30 %) and EVAL sets.
  3. The statistics (:func:`evaluate_scores`): with a claimed event (the target's ``claimed_event``,
     the release's DP event) the claimed-curve test decides ``violated``
     (:func:`dpaudit.audits.curves.curve_test`); the published eps_LB is :func:`general_bound`'s,
     valid for any mechanism; the Clopper–Pearson eps_LB of the rule chosen on SELECT and bounded
     on EVAL (:mod:`dpaudit.audits.stats`) is always reported, as are the ceiling, the ROC/AUC on
     EVAL, a Gaussian-DP *estimate* and :func:`stats.comparison_statistics`.
  4. Controls, each a full audit of its own: ``no-noise`` (the mechanism without its DP noise:
     must find large leakage, else the canary/score is too weak to mean anything) and ``null``
     (worlds assigned but the canary never inserted: must find none, else the pipeline leaks
     the world label some other way).

Trials run in chunks (one batched call of the target per chunk), optionally on a process pool.
With ``out_dir`` every finished chunk is written to ``out_dir/.checkpoint/`` at once, so an
interrupted audit resumes where it stopped (only when its full public configuration matches).

audit.json schema (``"schema": "dpaudit.audit/1"``); floats that are infinite are strings:
  mechanism, canary, role ("main" | "no-noise" | "null"), noise (bool: DP noise on),
  canary_inserted (bool: false for the null control), runs, claimed_epsilon (null if none),
  delta, adjacency, confidence, threat_model ("final-model": the adversary sees the released
  model only; "trajectory": every iterate), statistic ("claimed-curve" when the claim is known
  as an event, else "clopper-pearson"; files without it are "clopper-pearson": the statistic that
  decides ``violated``), method (of the deciding statistic), epsilon_lower_bound (eps_LB: a lower
  bound on the epsilon of ANY mechanism at delta, whatever the claim's shape), general_bound
  (:func:`general_bound`; recomputable at another confidence, :func:`dpaudit.audits.verdicts.decision_at`),
  claim_family_bound (:func:`claim_family_bound`; null without an event), claimed_curve (the block
  of :func:`dpaudit.audits.curves.curve_test`; null without an event; files before the general bound:
  :func:`read_record`), clopper_pearson_epsilon (the SELECT/EVAL
  Clopper–Pearson eps_LB below; files without it: = epsilon_lower_bound), comparison
  (:func:`stats.comparison_statistics`; {} in older files); the Clopper–Pearson test: threshold
  (float or "inf"/"-inf"), direction ("greater": canary in iff score >= threshold; "less": iff
  score <= threshold), select_epsilon (biased, for information), counts {tp, fp, tn, fn} (EVAL),
  fpr_upper, fnr_upper, ceiling (of that test; general_bound.ceiling is the published eps_LB's),
  underpowered (ceiling < claimed), gdp_estimate (:func:`stats.gdp_estimate` on all trials: an
  estimate, never a bound), roc {fpr, tpr} and auc (EVAL, oriented so that higher = "in"),
  select_size, eval_size, select_fraction, trials_per_world {in, out}, seeds {public, noise
  {source, seed, secret}}, task, dataset, config, canary_info, scores_file, timings {seconds,
  trials_per_second, chunk_size, workers, compute_seconds and cpu_seconds (inside batched calls;
  resumed chunks not counted), executor ("built-in" or the executor's describe())}, controls
  {"no-noise": {...}, "null": {...}} (the same keys, without "controls"), command (re-creates the
  audit), release_id, release_path (the audited release, if any), id, created_at,
  dpaudit_version, git_commit, plan, power (main role: :mod:`dpaudit.audits.power`, what an audit
  of ``runs`` trials of this claim can detect), sequential (``--sequential`` only: the mode, trials
  used, why it stopped, :func:`dpaudit.audits.sequential.record`; then ``runs`` is the trials used,
  eps_LB, the claimed-curve block and the counts are the sequential test's, valid at the stop, and
  ``general_bound`` / ``clopper_pearson_epsilon`` are null: fixed-N bounds are not valid after
  optional stopping; the main role is not checkpointed).
What is written is split (:mod:`dpaudit.audit_outputs`): audit.json holds the shareable keys only,
``audit_local.json`` (like scores.npz, not for publication) the rest; :func:`read_audit` puts them
back when the file is there. ``violated`` is derived, never stored (:func:`dpaudit.audits.verdicts.violated`).

scores.npz holds, per role r in (main, no_noise, null): ``{r}_score`` (float64), ``{r}_world``
(bool: canary-in world), ``{r}_select`` (bool: SELECT trial), ``{r}_inserted`` (bool).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import secrets
import shutil
import tempfile
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

from .. import __version__
from ..accounting import compute_epsilon
from ..audit_outputs import AUDIT_LOCAL_FILE, local_document, merge_local, shareable_audit
from ..audit_outputs import split_audit
from ..claims import number
from ..errors import DataError, UsageError
from ..grouped import Grouped
from ..lazy import lazy_import
from ..progress import JobProgress, phase
from ..noise import NoiseSource, public_rng
from ..records import _json_safe, git_commit, now_utc, read_json, write_json_atomic
from ..requests import THREAT_MODELS
from ..threads import limited_threads, set_threads
from ..validation import non_negative_int, one_of, open_unit, positive_int
from . import power, sequential, stats
from .cost import record_audit_cost
from .curves import claimed_curve, curve_test, family_statement
from .targets import AuditTarget, CallableTarget
from .verdicts import eval_counts, violated

np = lazy_import("numpy")

AUDIT_FILE = "audit.json"
SCORES_FILE = "scores.npz"
SCHEMA = "dpaudit.audit/1"
METHOD = (
    "Jagielski et al. 2020: threshold and direction chosen on SELECT; one-sided Clopper-Pearson "
    "(beta) upper bounds on FPR and FNR on EVAL, significance split between them; delta term kept"
)
#: Share of each world's trials that choose the test (SELECT); the rest (EVAL) bound it. Choosing
#: a threshold needs fewer trials than bounding it: measured on 2,000 trials (seeds 0-9), 0.3
#: instead of 0.5 raised the claimed-curve eps_LB of an exact Gaussian at eps 2 from 0.82 to 1.06
#: and of the DP-RVFL digits trajectory scores (20 seeds) from 0.61 to 1.05, and the
#: Clopper-Pearson eps_LB with them (benchmarks/bench_select_fraction.py). Any split is sound.
SELECT_FRACTION = 0.3
CONTROLS = ("no-noise", "null")
_ROLE_TAG = {"main": 1, "no-noise": 2, "null": 3}


# ------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class ClopperPearsonTest:
    """The threshold rule chosen on SELECT and its Clopper–Pearson bounds on EVAL."""

    threshold: float | None  # score units: in the local file only, None when read from audit.json
    direction: str
    select_epsilon: float  # biased (chosen on SELECT), for information
    counts: dict
    fpr_upper: float
    fnr_upper: float
    ceiling: float
    clopper_pearson_epsilon: float | None = None  # its eps_LB (None only if never computed)


@dataclass(frozen=True)
class TrialSplit:
    """How the trials were split into worlds and SELECT / EVAL, and seeded."""

    select_size: int
    eval_size: int
    select_fraction: float
    trials_per_world: dict
    seeds: dict


@dataclass(frozen=True)
class Evidence:
    """What else the scores show besides eps_LB, and how eps_LB was reached."""

    gdp_estimate: dict  # an estimate, never a bound
    roc: dict
    auc: float
    method: str = METHOD
    claimed_curve: dict | None = None  # curves.curve_test's block (None without a claimed event)
    comparison: dict = field(default_factory=dict)  # stats.comparison_statistics
    general_bound: dict | None = None  # how eps_LB is computed and recomputed
    claim_family_bound: dict | None = None  # the claimed-curve result in the claim's units
    epsilon_lower_bound_note: str | None = None  # set when an old file's eps_LB was re-read
    sequential: dict | None = None  # sequential mode: trials used, why it stopped
    power: dict | None = None  # what this audit could detect (dpaudit.audits.power.AuditPower)


@dataclass(frozen=True)
class Provenance:
    """Where the audit came from: the target's description, the run and what re-creates it."""

    task: str | None = None
    dataset: str | None = None
    config: dict = field(default_factory=dict)
    canary_info: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    scores_file: str | None = None
    command: str | None = None  # the command line that re-creates this audit (CLI)
    release_id: str | None = None  # the audited release, when the configuration came from one
    release_path: str | None = None
    created_at: str = field(default_factory=now_utc)
    dpaudit_version: str = __version__
    git_commit: str | None = None
    plan: dict | None = None  # a pre-registered run: plan id, revealed salt and seeds


#: audit.json's keys in their written order (between "schema" and "underpowered", "controls").
KEYS = tuple(
    """mechanism canary role noise canary_inserted runs claimed_epsilon delta adjacency confidence
    epsilon_lower_bound threshold direction select_epsilon counts fpr_upper fnr_upper ceiling
    gdp_estimate roc auc select_size eval_size select_fraction trials_per_world seeds task dataset
    config canary_info timings scores_file method command release_id release_path id created_at
    dpaudit_version git_commit statistic claimed_curve comparison clopper_pearson_epsilon
    threat_model general_bound claim_family_bound epsilon_lower_bound_note plan sequential
    power""".split()
)
REQUIRED_KEYS = (
    "mechanism canary runs claimed_epsilon delta epsilon_lower_bound confidence counts ceiling"
).split()


@dataclass(frozen=True)
class AuditResult(Grouped):
    """The outcome of one audit (or control). ``violated`` is derived, never stored.

    Its details are grouped (``test``, ``split``, ``evidence``, ``provenance``); every audit.json
    key also reads as an attribute (``result.counts``), and :meth:`of` / :meth:`replace` take them.
    """

    GROUPS = {
        "test": ClopperPearsonTest,
        "split": TrialSplit,
        "evidence": Evidence,
        "provenance": Provenance,
    }

    mechanism: str
    canary: str
    role: str
    noise: bool
    canary_inserted: bool
    runs: int
    claimed_epsilon: float | None
    delta: float
    adjacency: str
    confidence: float
    epsilon_lower_bound: float
    test: ClopperPearsonTest
    split: TrialSplit
    evidence: Evidence
    provenance: Provenance = field(default_factory=Provenance)
    #: the deciding statistic: "claimed-curve" (a claimed event was tested) or "clopper-pearson"
    statistic: str = "clopper-pearson"
    threat_model: str = "final-model"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    controls: dict = field(default_factory=dict)  # role -> AuditResult

    @property
    def violated(self) -> bool:
        """eps_LB above the claim on the real (noised, canary-inserted) mechanism."""
        return violated(self.to_dict())

    @property
    def underpowered(self) -> bool:
        return self.claimed_epsilon is not None and self.ceiling < self.claimed_epsilon

    def to_dict(self) -> dict:
        flat = self.flat()
        d = {"schema": SCHEMA, **{k: flat[k] for k in KEYS}}
        if d["sequential"] is None:
            del d["sequential"]  # fixed-N records keep their layout
        d["underpowered"] = self.underpowered
        if self.role == "main":
            d["controls"] = {k: v.to_dict() for k, v in self.controls.items()}
        return _json_safe(d)

    @classmethod
    def from_dict(cls, data: dict) -> "AuditResult":
        """The result an audit.json of any version records, read through :func:`read_record`.

        Raises:
            DataError: a required key is absent.
        """
        return cls._of_record(read_record(data))

    @classmethod
    def _of_record(cls, data: dict) -> "AuditResult":
        """The result of a record already in today's layout (its controls too)."""
        absent = [k for k in REQUIRED_KEYS if k not in data]
        if absent:
            raise DataError(f"audit is missing required keys: {', '.join(absent)}.")
        keys = {k: data[k] for k in KEYS if k in data}
        keys["controls"] = {k: cls._of_record(v) for k, v in (data.get("controls") or {}).items()}
        return cls.of(**_older_layout(keys, data))


def read_record(record: Any) -> Any:
    """An audit.json dict of any version or writer in today's layout, its controls (a dict or a
    list of them) too: the one migration of audit records, which :meth:`AuditResult.from_dict`,
    the reports and the verdict functions (:mod:`dpaudit.audits.verdicts`) read through. The
    record given is not changed; anything but a dict (a control given as a number) is returned
    as it is.

    Records written before the general bound (no ``general_bound``): their top-level eps_LB was,
    for a claimed-curve audit, the epsilon of the claim-family member ruled out, not a bound for
    any mechanism. They are read with the Clopper-Pearson bound of their EVAL counts as eps_LB (a
    valid bound; None when nothing valid is recorded) and the old figure kept as
    ``claimed_curve.family_epsilon``.
    """
    if not isinstance(record, dict):
        return record
    rec = dict(record)
    if isinstance(rec.get("claimed_curve"), dict):
        rec["claimed_curve"] = _family_epsilon_named(rec["claimed_curve"])
    if "general_bound" not in rec and rec.get("statistic") == "claimed-curve":
        rec["epsilon_lower_bound"] = _eval_counts_bound(rec)
        rec["epsilon_lower_bound_note"] = (
            "written before the general bound: eps_LB is the Clopper-Pearson bound of its EVAL counts; "
            "the figure it published was the claim family's (claimed_curve.family_epsilon)"
        )
    if "controls" in rec:
        rec["controls"] = _read_controls(rec["controls"])
    return rec


def _family_epsilon_named(curve: dict) -> dict:
    """An older claimed-curve block's ``epsilon_lower_bound`` under today's name, family_epsilon."""
    if "family_epsilon" in curve or "epsilon_lower_bound" not in curve:
        return curve
    renamed = {k: v for k, v in curve.items() if k != "epsilon_lower_bound"}
    return {**renamed, "family_epsilon": curve["epsilon_lower_bound"]}


def _read_controls(controls: Any) -> Any:
    """Each control of a dict or list of them through :func:`read_record`."""
    if isinstance(controls, dict):
        return {name: read_record(c) for name, c in controls.items()}
    return [read_record(c) for c in controls] if isinstance(controls, list) else controls


def _eval_counts_bound(rec: dict) -> float | None:
    """An old claimed-curve record's recorded Clopper-Pearson eps_LB, else its EVAL counts' one."""
    recorded, counts = number(rec.get("clopper_pearson_epsilon")), eval_counts(rec)
    delta, confidence = number(rec.get("delta")), number(rec.get("confidence"))
    if recorded is not None or None in (counts, delta, confidence):
        return recorded
    return stats.epsilon_lower_bound(**counts, delta=delta, confidence=confidence).epsilon


def _older_layout(keys: dict, data: dict) -> dict:
    """The keys as numbers (infinities are stored as strings; the shareable part has no
    threshold: score units) and those older files lack, as those files meant them."""
    keys.setdefault("threshold", None)
    for k in ("threshold", "epsilon_lower_bound", "clopper_pearson_epsilon"):
        if isinstance(keys.get(k), str):
            keys[k] = float(keys[k])
    # before the claimed-curve statistic the Clopper–Pearson eps_LB decided
    keys.setdefault("statistic", "clopper-pearson")
    old_cp = keys["statistic"] == "clopper-pearson" and "general_bound" not in data
    if keys.get("clopper_pearson_epsilon") is None and old_cp:
        keys["clopper_pearson_epsilon"] = float(keys["epsilon_lower_bound"])
    curve = keys.get("claimed_curve")
    if keys.get("claim_family_bound") is None and isinstance(curve, dict) and "family" in curve:
        keys["claim_family_bound"] = claim_family_bound(curve)
    if keys.get("comparison") is None:
        keys["comparison"] = {}
    return keys


def read_audit(path: str | os.PathLike, *, local: bool = True) -> AuditResult:
    """Read ``audit.json`` (or a directory holding one); with ``local`` (the operator's view) the
    private parts in ``audit_local.json`` beside it are put back when that file is there."""
    p = Path(path)
    p = p / AUDIT_FILE if p.is_dir() else p
    data = read_json(p, "audit")
    lp = p.parent / AUDIT_LOCAL_FILE
    if local and lp.is_file():
        private = read_json(lp, "audit local file")
        if private.get("audit_id") in (None, data.get("id")):
            data = merge_local(
                data,
                {k: v for k, v in private.items() if k not in ("audit_id", "not_for_publication")},
            )
    return AuditResult.from_dict(data)


# ---------------------------------------------------------------------------------- trial plan


@dataclass(frozen=True)
class TrialPlan:
    """Public, seeded assignment of worlds and of the SELECT/EVAL split."""

    world: np.ndarray  # bool (runs,): canary-in world
    select: np.ndarray  # bool (runs,): SELECT (True) or EVAL (False)


#: Fewest trials an audit can split into both worlds and SELECT / EVAL halves.
MIN_RUNS = 4


def plan_trials(runs: int, *, seed: int, select_fraction: float = SELECT_FRACTION) -> TrialPlan:
    """Exactly runs//2 canary-in trials (random order), split per world into SELECT and EVAL."""
    runs = positive_int("runs", runs, MIN_RUNS)
    open_unit("select_fraction", select_fraction)
    rng = public_rng(seed, 0xA0D17)
    world = (np.arange(runs) < runs // 2)[rng.permutation(runs)]  # exactly runs // 2 in, shuffled
    return TrialPlan(world=world, select=_select(rng, world, select_fraction))


def _select(rng: np.random.Generator, world: np.ndarray, select_fraction: float) -> np.ndarray:
    """The SELECT mask: per world (in, then out) a random share ``select_fraction`` of its trials, at least one, never all."""
    select = np.zeros(world.size, dtype=bool)
    for w in (True, False):
        idx = np.flatnonzero(world == w)
        n_sel = power.select_count(idx.size, select_fraction)
        select[rng.choice(idx, size=n_sel, replace=False)] = True
    return select


# --------------------------------------------------------------------------------- evaluation


def evaluate_scores(
    scores,
    world,
    select,
    *,
    delta: float,
    confidence: float = 0.95,
    event=None,
    accountant: str = "rdp",
    adjacency: str = "add-remove-record",
    seed: int = 0,
) -> dict:
    """All statistics of one audit from per-trial scores, worlds and the SELECT mask.

    ``event`` (the claim as a DP event, with the ``accountant`` of its claimed epsilon and its
    ``adjacency``): the claimed-curve test on the same SELECT/EVAL split decides
    (``statistic`` "claimed-curve", ``epsilon_lower_bound`` its eps_LB). Without an event the
    Clopper–Pearson eps_LB decides (``statistic`` "clopper-pearson"). The Clopper–Pearson eps_LB
    is reported either way (``clopper_pearson_epsilon``), and the comparison statistics
    (``comparison``; ``seed``: public seed of its bootstrap) with the direction chosen on SELECT.
    """
    s, w, sel = np.asarray(scores, float), np.asarray(world, bool), np.asarray(select, bool)
    level = {"delta": delta, "confidence": confidence}  # of every bound below
    thr = stats.select_threshold(s[sel], w[sel], **level)
    ev = ~sel
    tp, fp, tn, fn = stats.confusion(s[ev], w[ev], thr.threshold, thr.direction)
    bound = stats.epsilon_lower_bound(tp=tp, fp=fp, tn=tn, fn=fn, **level)
    roc = stats.roc(s[ev], w[ev], thr.direction)
    tested = {"event": event, "accountant": accountant, "adjacency": adjacency}
    curve = None if event is None else curve_test(s, w, sel, **tested, **level)
    general = general_bound(s, w, bound.counts, **level)
    return {
        "statistic": "claimed-curve" if curve is not None else "clopper-pearson",
        "method": curve["method"] if curve is not None else METHOD,
        "epsilon_lower_bound": general["epsilon_lower_bound"],
        "general_bound": general,
        "claim_family_bound": claim_family_bound(curve),
        "claimed_curve": curve,
        "clopper_pearson_epsilon": bound.epsilon,
        "comparison": stats.comparison_statistics(s, w, sel, thr.direction, seed=seed, **level),
        **dataclasses.asdict(thr),  # threshold, direction, select_epsilon
        **{name: getattr(bound, name) for name in ("counts", "fpr_upper", "fnr_upper")},
        "ceiling": stats.ceiling(tp + fn, tn + fp, **level),
        "gdp_estimate": stats.gdp_estimate(s, w, thr.direction, **level),
        "roc": {"fpr": roc["fpr"], "tpr": roc["tpr"]},
        "auc": roc["auc"],
        "select_size": int(sel.sum()),
        "eval_size": int(ev.sum()),
        "trials_per_world": {"in": int(w.sum()), "out": int((~w).sum())},
    }


def general_bound(
    s: np.ndarray, w: np.ndarray, counts: dict, *, delta: float, confidence: float
) -> dict:
    """audit.json "general_bound": the published eps_LB, a lower bound on the epsilon of ANY
    mechanism at ``delta`` (:func:`stats.general_epsilon`: the SELECT-chosen rule's EVAL counts and
    the all-threshold band on all trials, their significances split by :func:`stats.general_split`),
    with what recomputes it."""
    box_conf, band_conf = stats.general_split(int(w.sum()), int((~w).sum()), confidence)
    band = stats.band_bound(s, w, delta=delta, confidence=band_conf)
    keep = """cells events trials_per_world calibration epsilon_lower_bound direction fp_at_most
    fn_at_most per_bound_significance""".split()
    # a perfect test on these trials (no error on EVAL nor on all trials): the largest eps_LB they can certify
    perfect = {
        "cells": {"greater": [[0, 0]], "less": []},
        "events": band["events"],
        "trials_per_world": band["trials_per_world"],
    }
    n_in, n_out = counts["tp"] + counts["fn"], counts["tn"] + counts["fp"]
    level = {"confidence": confidence, "delta": delta}  # of both bounds, recorded in this order
    return {
        "epsilon_lower_bound": stats.general_epsilon(counts, band, **level),
        "ceiling": stats.general_epsilon(
            {"tp": n_in, "fp": 0, "tn": n_out, "fn": 0}, perfect, **level
        ),
        **level,
        "rule_epsilon": stats.epsilon_lower_bound(
            **counts, delta=delta, confidence=box_conf
        ).epsilon,
        "band": {k: band[k] for k in keep},
        "method": (
            "valid for any mechanism: the larger of (a) Clopper-Pearson on the EVAL counts of the rule chosen on SELECT and "
            "(b) the simultaneous Clopper-Pearson band over every threshold rule on all trials (exactly calibrated), their "
            "significances adding up to 1 - confidence (the band's share: half, more below ~30 trials per world); eps_LB = max(0, ln((1 - delta - FNR_hi)/FPR_hi), ln((1 - delta - FPR_hi)/FNR_hi))"
        ),
    }


def claim_family_bound(curve: dict | None) -> dict | None:
    """audit.json "claim_family_bound": what the claimed-curve test rules out, in the claim's units
    ("noise_multiplier >= X ruled out"); it decides the verdict (``violated``). None without an event."""
    if curve is None:
        return None
    fam = curve["family"]
    return {
        "parameter": fam["parameter"],
        "claimed": fam["claimed"],
        "ruled_out_from": fam["lower_bound"],
        "scale_lower_bound": curve.get("scale_lower_bound"),
        "family_epsilon": curve.get("family_epsilon"),
        "violated": curve.get("violated") is True,
        "statement": family_statement(fam),
    }


#: What :func:`audit_scores` and :func:`audit_callable` record the claim under, by default.
_LABELS = dict(mechanism="custom", canary="custom", adjacency="add-remove-record", accountant="rdp")


def _labels(given: dict) -> dict:
    unknown = sorted(set(given) - set(_LABELS))
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(unknown)} (allowed: {', '.join(_LABELS)})."
        )
    return {**_LABELS, **given}


def _claimed_epsilon(given: float | None, claim, delta: float, labels: dict) -> float | None:
    """The claimed epsilon: as given, else the claim's at ``delta`` under the labels' accountant."""
    if claim is None or given is not None:
        return given
    stated = {k: labels[k] for k in ("accountant", "adjacency")}
    return float(compute_epsilon(claim, delta=delta, **stated).epsilon)


def audit_scores(
    scores_in,
    scores_out,
    *,
    delta: float,
    claimed_epsilon: float | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    select_fraction: float = SELECT_FRACTION,
    claim=None,
    **labels,
) -> AuditResult:
    """Audit scores computed elsewhere (one per trial, for each world; higher or lower = "in",
    the direction is chosen on SELECT).

    ``claim``: the claim as a DP event (:mod:`dpaudit.accounting.events`, e.g.
    ``SubsampledGaussian(sigma, 1.0, 1)`` for one Gaussian release, ``SubsampledGaussian(sigma,
    q, T)``, ``PureEpsilon(eps)``, a ``Composed`` one) with the ``accountant`` that states its
    epsilon: its whole trade-off curve is tested (``statistic`` "claimed-curve") and, when
    ``claimed_epsilon`` is None, the claimed epsilon is the event's at ``delta`` under that
    accountant. Without a claim the statistic is the Clopper–Pearson eps_LB ("clopper-pearson").
    ``labels``: ``mechanism``, ``canary``, ``adjacency``, ``accountant`` (defaults: :data:`_LABELS`).
    """
    lab = _labels(labels)
    claimed_epsilon = _claimed_epsilon(claimed_epsilon, claim, delta, lab)
    s_in, s_out = np.asarray(scores_in, float).ravel(), np.asarray(scores_out, float).ravel()
    s = np.concatenate([s_in, s_out])
    world = np.concatenate([np.ones(s_in.size, bool), np.zeros(s_out.size, bool)])
    for n in (s_in.size, s_out.size):
        if n < 2:
            raise UsageError(f"trials per world must be >= 2, got {n}.")
    select = _select(public_rng(seed, 0x5E1EC7), world, select_fraction)
    tested = {"event": claim, **{k: lab[k] for k in ("accountant", "adjacency")}, "delta": delta}
    result = _judged(
        (s, world, select),
        tested,
        confidence=confidence,
        seeds={"public": seed, "noise": None},
        **{k: lab[k] for k in ("mechanism", "canary")},
        role="main",
        noise=True,
        canary_inserted=True,
        runs=int(s.size),
        claimed_epsilon=claimed_epsilon,
        select_fraction=select_fraction,
    )
    return _with_power(result, tested, int(s.size), select_fraction)


# ------------------------------------------------------------------------------ running trials


def _chunk_noise(noise_seed: int | None, role: str, chunk: int) -> NoiseSource:
    """Private randomness of one chunk: fresh OS entropy, or derived from the seed when reproducible.

    Derivation from (seed, role, chunk) makes a resumed reproducible audit identical to an
    uninterrupted one.
    """
    if noise_seed is None:  # fresh entropy, never recorded
        return NoiseSource("reproducible", seed=secrets.randbits(63))
    seq = np.random.SeedSequence([int(noise_seed), _ROLE_TAG[role], int(chunk)])
    word = seq.generate_state(1, np.uint64)[0]
    return NoiseSource("reproducible", seed=int(word >> np.uint64(1)))


_WORKER_TARGETS: dict[str, AuditTarget] = {}


def _worker_init(targets: dict[str, AuditTarget]) -> None:
    # two processes on two cores: one thread each (torch, when a target uses it, and BLAS)
    set_threads(1)
    _WORKER_TARGETS.clear()
    _WORKER_TARGETS.update(targets)
    for t in targets.values():
        t.prepare()


def _worker_run(
    role: str, chunk: int, inserted: np.ndarray, noise_seed: int | None
) -> tuple[str, int, np.ndarray, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    noise = _chunk_noise(noise_seed, role, chunk)
    s = np.asarray(_WORKER_TARGETS[role].scores(inserted, noise), dtype=float).reshape(-1)
    if s.shape != inserted.shape:
        raise DataError(
            f"target scores must have one value per trial, got shape {s.shape} for {inserted.size} trials."
        )
    # CPU seconds as well as wall seconds: on a shared machine the CPU time is the fairer speed figure
    return role, chunk, s, time.perf_counter() - t0, time.process_time() - c0


def _executor_chunk(targets: dict, item: tuple) -> tuple[str, int, np.ndarray, float, float]:
    """One chunk on an external executor (``Executor.map_chunks(fn, chunks, shared=targets)``)."""
    role = item[0]
    if _WORKER_TARGETS.get(role) is not targets[role]:
        targets[role].prepare()
        _WORKER_TARGETS[role] = targets[role]
    return _worker_run(*item)


def _fingerprint(target: AuditTarget, role: str, runs: int, o: AuditOptions) -> str:
    """The digest of everything public that fixes a role's trials: a checkpoint resumes only
    under the same one."""
    claim = ("mechanism", "canary", "claimed_epsilon", "delta", "adjacency", "noise")
    payload = {
        **{name: getattr(target, name) for name in claim},
        "role": role,
        "runs": runs,
        **{name: getattr(o, name) for name in ("seed", "select_fraction", "chunk_size")},
        "noise_seed": o.trial_noise_seed,
        "reproducible": o.trial_noise_seed is not None,
        "describe": target.describe(),
    }
    text = json.dumps(_json_safe(payload), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class _Checkpoint:
    """Finished chunks of one role under ``dir``; a plan.json fingerprint guards resumption."""

    def __init__(self, root: Path, role: str, fingerprint: str):
        self.dir = root / ".checkpoint" / role
        plan = self.dir / "plan.json"
        if plan.exists():
            try:
                old = read_json(plan, "checkpoint plan").get("fingerprint")
            except DataError:
                old = None
            if old != fingerprint:  # a different audit was interrupted here: start over
                shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(plan, {"fingerprint": fingerprint})

    @classmethod
    def of_roles(cls, root: Path | None, prints: dict, roles) -> dict:
        """role -> its checkpoint under the output folder ``root`` (none without one)."""
        return {} if root is None else {r: cls(root, r, prints[r]) for r in roles}

    def done(self) -> dict[int, np.ndarray]:
        out: dict[int, np.ndarray] = {}
        for p in sorted(self.dir.glob("chunk_*.npy")):
            try:
                out[int(p.stem.split("_")[1])] = np.load(p)
            except (ValueError, OSError):
                p.unlink(missing_ok=True)  # a torn file from a crash: recompute that chunk
        return out

    def save(self, chunk: int, scores: np.ndarray) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".chunk.", suffix=".npy")
        with os.fdopen(fd, "wb") as f:
            np.save(f, scores)
        os.replace(tmp, self.dir / f"chunk_{chunk:05d}.npy")


def _run_roles(jobs: dict, o: AuditOptions, checkpoints: dict[str, _Checkpoint]) -> tuple:
    """Scores for every role (role -> (target, inserted mask)), resuming from its checkpoint (if any), with
    the chunk size, workers, executor and noise seed of ``o``: (role -> scores, busy, cpu)."""
    results, pending = _resumed(jobs, o, checkpoints)
    busy = cpu = 0.0
    targets = {r: t for r, (t, _) in jobs.items()}
    with JobProgress("trials", enabled=o.progress) as bar:
        tasks = {
            r: bar.add(f"audit {r}", v.size, completed=int(np.sum(~np.isnan(v))))
            for r, v in results.items()
        }

        def finish(role: str, c: int, s: np.ndarray, dt: float, dc: float) -> None:
            nonlocal busy, cpu
            busy += dt
            cpu += dc
            results[role][c * o.chunk_size : c * o.chunk_size + s.size] = s
            if role in checkpoints:
                checkpoints[role].save(c, s)
            bar.update(tasks[role], advance=s.size)

        # an executor (dpaudit.sweeps.executors: local pool or Dask): same chunks, same noise
        if o.executor is not None:
            o.executor.map_chunks(
                _executor_chunk,
                pending,
                shared=targets,
                on_done=lambda outcome: finish(*outcome.value) if outcome.ok else None,
            )
        elif o.workers <= 1 or len(pending) <= 1:
            _run_here(targets, pending, finish)
        else:
            _run_pool(targets, pending, finish, o.workers)
    return results, busy, cpu


def _resumed(jobs: dict, o: AuditOptions, checkpoints: dict) -> tuple[dict, list]:
    """(role -> scores, NaN where still to run; the (role, chunk, inserted, noise seed) chunks
    still to run)."""
    results: dict[str, np.ndarray] = {}
    pending: list[tuple[str, int, np.ndarray, int | None]] = []
    for role, (_, inserted) in jobs.items():
        results[role] = np.full(inserted.size, np.nan)
        done = checkpoints[role].done() if role in checkpoints else {}
        for c in range(-(-inserted.size // o.chunk_size)):
            sl = slice(c * o.chunk_size, min((c + 1) * o.chunk_size, inserted.size))
            if c in done and done[c].shape == (sl.stop - sl.start,):
                results[role][sl] = done[c]
            else:
                pending.append((role, c, inserted[sl], o.trial_noise_seed))
    return results, pending


def _run_here(targets: dict, pending: list, finish) -> None:
    """The chunks in this process. Trials are many skinny matrix products: one thread each, as in
    the worker processes; extra intra-op threads only spin against other jobs on a busy machine
    (measured about 10x slower for the MNIST head audit with 2 threads under load)."""
    _WORKER_TARGETS.clear()
    _WORKER_TARGETS.update(targets)
    with limited_threads(1):
        for chunk in pending:
            finish(*_worker_run(*chunk))


def _run_pool(targets: dict, pending: list, finish, workers: int) -> None:
    """The chunks on a process pool, a bounded queue of them at a time (checkpoints stay fresh).
    Fork where the platform has it: workers inherit the prepared targets without pickling (and
    closures work); elsewhere the targets are pickled once per worker."""
    fork = "fork" in multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if fork else None)
    with ProcessPoolExecutor(
        max_workers=workers, initializer=_worker_init, initargs=(targets,), mp_context=ctx
    ) as pool:
        todo, running = list(pending), set()
        while todo or running:
            while todo and len(running) < 2 * workers:
                running.add(pool.submit(_worker_run, *todo.pop(0)))
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                finish(*fut.result())


@dataclass(frozen=True)
class AuditOptions:
    """How :func:`run_audit` runs an audit (never what a trial is).

    ``seed`` fixes the public parts of the audit (worlds, SELECT/EVAL split). DP noise and
    sampling come from fresh OS entropy per chunk, unless ``reproducible_noise`` (then derived
    from ``noise_seed``, default ``seed``). ``controls`` run besides the main audit, each with
    ``control_runs`` trials (default ``runs``). ``workers``, ``chunk_size`` and ``executor`` (an
    object with ``map_chunks``, :mod:`dpaudit.sweeps.executors`, instead of the built-in pool)
    never change a trial. With ``out_dir``, chunks are checkpointed and an interrupted audit with
    the same configuration resumes. ``command``, ``release_id`` and ``release_path`` are recorded.

    ``plan`` (a :class:`dpaudit.audit_plans.PlanRun`): a pre-registered run, recorded under its plan
    before any trial and with its result's digest after; audit.json reveals its seeds and salt.
    ``record`` (default): the ``audit`` ledger entry at ``ledger_path`` of a target that trains on
    private data, written before any trial runs (:mod:`dpaudit.audits.cost`); its id is the audit's.
    """

    runs: int = 1000
    confidence: float = 0.95
    seed: int = 0
    select_fraction: float = SELECT_FRACTION
    controls: tuple[str, ...] = CONTROLS
    control_runs: int | None = None
    workers: int = 1
    chunk_size: int | None = None
    out_dir: str | os.PathLike | None = None
    reproducible_noise: bool = False
    noise_seed: int | None = None
    progress: bool = False
    command: str | None = None
    release_id: str | None = None
    release_path: str | None = None
    executor: Any = None
    record: bool = True
    ledger_path: str | os.PathLike | None = None
    plan: Any = None
    sequential: bool = False

    def checked(self, target: AuditTarget) -> "AuditOptions":
        """Validated, with the target's defaults filled in (control runs, chunk size; no no-noise
        control for a target that already is noiseless)."""
        runs = positive_int("runs", self.runs, MIN_RUNS)
        checked = dict(
            runs=runs,
            confidence=open_unit("confidence", self.confidence),
            seed=non_negative_int("seed", self.seed),
            workers=positive_int("workers", self.workers),
            control_runs=runs
            if self.control_runs is None
            else positive_int("control_runs", self.control_runs, MIN_RUNS),
        )
        controls = tuple(one_of("control", c, CONTROLS) for c in self.controls)
        # a noiseless main audit is its own control
        controls = tuple(c for c in controls if target.noise or c != "no-noise")
        chunk = target.default_chunk_size if self.chunk_size is None else self.chunk_size
        checked["chunk_size"] = positive_int("chunk_size", chunk)
        if self.sequential:
            _check_sequential(target, runs)
        return dataclasses.replace(self, controls=controls, **checked)

    @property
    def trial_noise_seed(self) -> int | None:
        """The seed the trials' noise derives from (None: fresh OS entropy)."""
        if not self.reproducible_noise:
            return None
        return self.seed if self.noise_seed is None else int(self.noise_seed)


def run_audit(target: AuditTarget, options: AuditOptions | None = None, /, **fields) -> AuditResult:
    """Run a canary audit of ``target`` and (optionally) write ``audit.json`` + ``scores.npz``.

    ``options`` (:class:`AuditOptions`), with ``fields`` (its field names) overriding them, say
    how. The deciding statistic is the claimed-curve test of ``target.claimed_event`` (with
    ``target.accountant`` and ``target.adjacency``) when the target has one, else the
    Clopper–Pearson eps_LB (``statistic`` says which); every role (the controls too) is tested
    against the main target's claim. ``threat_model`` is the target's (default "final-model").
    """
    o = dataclasses.replace(options or AuditOptions(), **fields).checked(target)
    root = Path(o.out_dir) if o.out_dir is not None else None
    roles = _roles(target, o)
    seq = sequential.plan_sequential(o.runs, seed=o.seed) if o.sequential else None
    plans = _trial_plans(roles, o, seq)
    prints = {r: _fingerprint(t, r, n, o) for r, (t, n) in roles.items()}
    audit_id = _started(target, roles, prints, o)
    t0 = time.perf_counter()
    fixed = _fixed_jobs(roles, plans, seq)
    scores, busy, cpu = _run_roles(fixed, o, _Checkpoint.of_roles(root, prints, fixed))
    stop = _run_sequential_main(target, seq, o, scores, roles, plans)
    phase("computing the bounds and writing the results")
    timings = _timings(o, time.perf_counter() - t0, sum(n for _, n in roles.values()), busy, cpu)
    main = _main_result(target, roles, scores, plans, o, timings, audit_id, seq, stop)
    if root is not None:
        columns = {
            r: (scores[r], plans[r].world, plans[r].select, _inserted(r, plans[r])) for r in roles
        }
        write_audit(main, root, scores=columns)
        shutil.rmtree(root / ".checkpoint", ignore_errors=True)
    if o.plan is not None:
        o.plan.finished(main.id, shareable_audit(main.to_dict()))
    return main


def _trial_plans(roles: dict, o: AuditOptions, seq) -> dict[str, TrialPlan]:
    """Each role's worlds and SELECT / EVAL split (a sequential main role: its plan's)."""
    plans = {
        r: plan_trials(n, seed=o.seed, select_fraction=o.select_fraction)
        for r, (_, n) in roles.items()
    }
    if seq is not None:
        plans["main"] = TrialPlan(seq.world, np.arange(seq.max_trials) < seq.select_trials)
    return plans


def _fixed_jobs(roles: dict, plans: dict, seq) -> dict:
    """role -> (target, inserted mask) of every role but a sequential main one (that one runs
    batch by batch, without checkpoints)."""
    fixed = {r: t for r, (t, _) in roles.items() if seq is None or r != "main"}
    return {r: (t, _inserted(r, plans[r])) for r, t in fixed.items()}


def _inserted(role: str, plan: TrialPlan) -> np.ndarray:
    """Which trials insert the canary: the canary-in worlds (none for the null control)."""
    return np.zeros(plan.world.size, dtype=bool) if role == "null" else plan.world.copy()


def _started(target: AuditTarget, roles: dict, prints: dict, o: AuditOptions) -> str:
    """The audit's id, after its ledger entry (the cap check, when it counts audits) and its
    pre-registered plan's start are recorded: before any trial."""
    audit_id = uuid.uuid4().hex
    if o.record:
        plan_key = hashlib.sha256(json.dumps(prints, sort_keys=True).encode()).hexdigest()
        audit_id = record_audit_cost(target, roles, audit_id, o, plan_key)
    if o.plan is not None:
        o.plan.started(audit_id)
    return audit_id


def _main_result(target, roles, scores, plans, o: AuditOptions, timings, audit_id, seq, stop):
    """Every role's result, the main one (which carries the audit's id) with its sequential
    stop, its power and the others as its controls."""
    ids = {r: uuid.uuid4().hex for r in roles} | {"main": audit_id}
    results = {
        r: _role_result(target, r, t, n, scores[r], plans[r], o, timings=timings, audit_id=ids[r])
        for r, (t, n) in roles.items()
    }
    main = results.pop("main")
    if seq is not None:
        main = _sequential_result(main, target, seq, stop)
    main = _with_power(main, _tested(target), o.runs, o.select_fraction, o.sequential)
    return main.replace(controls=results)


def _tested(target: AuditTarget) -> dict:
    """The claim every role of an audit of ``target`` is tested against (the main target's)."""
    stated = ("accountant", "adjacency", "delta")
    return {"event": target.claimed_event, **{name: getattr(target, name) for name in stated}}


def _with_power(result: AuditResult, tested: dict, trials: int, select_fraction, seq_mode=False):
    """``result`` with audit.json "power": what an audit of ``trials`` trials of the ``tested``
    claim can detect (:mod:`dpaudit.audits.power`)."""
    event = tested["event"]
    curve = None if event is None else claimed_curve(event, tested["adjacency"])
    block = power.audit_power(
        trials=trials,
        **{k: getattr(result, k) for k in ("delta", "claimed_epsilon", "confidence")},
        curve=curve,
        select_fraction=select_fraction,
        sequential_mode=seq_mode,
    )
    return result.replace(power=block.to_dict())


def _check_sequential(target: AuditTarget, runs: int) -> None:
    """Sequential mode needs a claimed event (its curve is what the test stops on) and room for a look."""
    if target.claimed_event is None:
        raise UsageError(
            "sequential must only be used with a claimed event (the release's DP event), got a target without one."
        )
    positive_int("runs", runs, sequential.SELECT_TRIALS + sequential.BATCH)


def _run_sequential_main(target: AuditTarget, plan, o: AuditOptions, scores, roles, plans):
    """Run a sequential main role batch by batch until its test stops and put its trials used in
    place; the stop: (test, last look, reason), None for a fixed-N audit (``plan`` None). Batch c
    draws its noise as chunk c does (:func:`_chunk_noise`)."""
    if plan is None:
        return None
    curve = claimed_curve(target.claimed_event, target.adjacency)
    test = sequential.SequentialTest(
        curve, plan, confidence=o.confidence, criterion=sequential.criterion_for(curve)
    )
    _WORKER_TARGETS["main"] = target

    def draw(start: int, stop: int) -> np.ndarray:
        parts = []
        for c in range(start // plan.batch, -(-stop // plan.batch)):
            sl = slice(c * plan.batch, min((c + 1) * plan.batch, stop))
            parts.append(_worker_run("main", c, plan.world[sl], o.trial_noise_seed)[2])
        return np.concatenate(parts)

    with limited_threads(1):
        scores["main"], look, reason = sequential.run_sequential(draw, test)
    used = scores["main"].size
    roles["main"] = (target, used)
    plans["main"] = TrialPlan(world=plan.world[:used], select=plans["main"].select[:used])
    return test, look, reason


def _sequential_result(result: AuditResult, target: AuditTarget, plan, stop) -> AuditResult:
    """The main result with its deciding statistic and eps_LB replaced by the sequential test's,
    valid at the stopping time (the fixed-N bounds are not: optional stopping)."""
    fields = sequential.audit_fields(result.claimed_curve, plan, stop, _tested(target))
    if stop[2] != "completed":
        # the comparison block's fixed-N bounds (Bonferroni Clopper-Pearson...) are not valid after an early stop
        fields["comparison"] = {}
    return result.replace(**fields, claim_family_bound=claim_family_bound(fields["claimed_curve"]))


def _roles(target: AuditTarget, o: AuditOptions) -> dict:
    """role -> (target, trials): the main audit and its controls (the null control: no canary)."""
    target.prepare()
    roles = {"main": (target, o.runs)}
    if "no-noise" in o.controls:
        roles["no-noise"] = (target.without_noise(), o.control_runs)
    if "null" in o.controls:
        roles["null"] = (target, o.control_runs)
    return roles


def _timings(o: AuditOptions, seconds: float, trials: int, busy: float, cpu: float) -> dict:
    return {
        "seconds": seconds,
        "trials_per_second": trials / max(seconds, 1e-9),
        "chunk_size": o.chunk_size,
        "workers": o.workers if o.executor is None else getattr(o.executor, "workers", None),
        "compute_seconds": busy,
        "cpu_seconds": cpu,
        "executor": "built-in"
        if o.executor is None
        else getattr(o.executor, "describe", lambda: type(o.executor).__name__)(),
    }


def _role_result(
    target, role, t, n, scores, plan, o: AuditOptions, *, timings, audit_id
) -> AuditResult:
    """One role's result: its scores evaluated against the main target's claim (the controls are
    judged against the same curve: how far the no-noise control lies below it shows the power)."""
    nseed = o.trial_noise_seed
    source = "reproducible" if nseed is not None else "os-entropy"
    noise_rec = {"source": source, "seed": nseed, "secret": nseed is None}
    desc = t.describe()
    return _judged(
        (scores, plan.world, plan.select),
        _tested(target),
        confidence=o.confidence,
        seeds={"public": o.seed, "noise": noise_rec},
        **{k: getattr(target, k) for k in ("mechanism", "canary", "claimed_epsilon")},
        **{k: getattr(o, k) for k in ("select_fraction", "command", "release_id", "release_path")},
        role=role,
        noise=t.noise,
        canary_inserted=role != "null",
        runs=n,
        **{k: desc.get(k) for k in ("task", "dataset")},
        **{k: desc.get(k, {}) for k in ("config", "canary_info")},
        scores_file=SCORES_FILE if o.out_dir is not None else None,
        timings=timings,
        threat_model=one_of(
            "threat_model", getattr(target, "threat_model", "final-model"), THREAT_MODELS
        ),
        id=audit_id,
        plan=o.plan.reveal if o.plan is not None and role == "main" else None,
    )


def _judged(
    trials: tuple, tested: dict, *, confidence: float, seeds: dict, **fields
) -> AuditResult:
    """The result of one role's ``trials`` (scores, worlds, SELECT mask) evaluated against the
    ``tested`` claim (its ``event``, ``accountant``, ``adjacency`` and ``delta``), with the
    record's other ``fields``; the bootstrap of the comparison statistics uses the public seed."""
    evaluated = evaluate_scores(*trials, confidence=confidence, seed=seeds["public"], **tested)
    return AuditResult.of(
        delta=tested["delta"],
        adjacency=tested["adjacency"],
        confidence=confidence,
        seeds=seeds,
        git_commit=git_commit(),
        **fields,
        **evaluated,
    )


def write_audit(
    result: AuditResult, out_dir: str | os.PathLike, *, scores: dict | None = None
) -> Path:
    """Write ``audit.json`` (shareable), ``audit_local.json`` (not for publication) and, when
    per-trial scores are given, ``scores.npz`` (not for publication) under ``out_dir``
    (:mod:`dpaudit.audit_outputs` says which key goes where)."""
    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    if scores:
        kinds = {"score": float, "world": bool, "select": bool, "inserted": bool}
        arrays = {
            f"{role.replace('-', '_')}_{name}": np.asarray(column, kind)
            for role, columns in scores.items()
            for (name, kind), column in zip(kinds.items(), columns)
        }
        fd, tmp = tempfile.mkstemp(dir=root, prefix=".scores.", suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez_compressed(f, **arrays)
        os.replace(tmp, root / SCORES_FILE)
    public, local = split_audit(result.to_dict())
    write_json_atomic(root / AUDIT_LOCAL_FILE, local_document(result.id, local))
    return write_json_atomic(root / AUDIT_FILE, public)


def audit_callable(
    mechanism,
    score,
    runs: int,
    *,
    delta: float,
    claimed_epsilon: float | None = None,
    claim=None,
    noiseless_mechanism=None,
    controls: tuple[str, ...] | list[str] | None = None,
    **kw,
) -> AuditResult:
    """Bring your own mechanism: audit ``mechanism(include_canary: bool, rng) -> release``.

    ``score(release) -> float`` is the attack's statistic (computed from the release alone).
    ``rng`` is a fresh numpy Generator per trial from the audit's private noise source; the
    mechanism must draw all its randomness from it. The null control runs by default; the
    no-noise control also runs when ``noiseless_mechanism`` is given. Other keyword arguments
    go to :func:`run_audit` (``confidence``, ``seed``, ``out_dir``, ``workers``, ...), except the
    target's labels ``mechanism_name``, ``canary``, ``adjacency`` and ``accountant``. ``claim``
    and ``claimed_epsilon``: as in :func:`audit_scores`.
    """
    keys = ("mechanism_name", "canary", "adjacency", "accountant")  # mechanism_name: the label
    lab = _labels({k.removesuffix("_name"): kw.pop(k) for k in keys if k in kw})
    target = CallableTarget(
        mechanism_fn=mechanism,
        score_fn=score,
        claimed_epsilon=_claimed_epsilon(claimed_epsilon, claim, delta, lab),
        delta=delta,
        noiseless_mechanism=noiseless_mechanism,
        claimed_event=claim,
        **lab,
    )
    if controls is None:
        controls = CONTROLS if noiseless_mechanism is not None else ("null",)
    return run_audit(target, runs=runs, controls=controls, **kw)
