"""What an audit record decides, and what several audits of one mechanism decide together.

One definition of "violated" (:func:`violated`), read by the engine, the CLI and the reports:

- a claimed-curve audit (``statistic`` "claimed-curve"): its claimed event is ruled out, i.e. the
  EVAL box lies strictly below the claimed trade-off curve, which is the same as the family search's
  ``scale_lower_bound`` <= 1 (non-strict: s_LB = 1 means the claimed event itself was verified to
  be ruled out). The published eps_LB plays no part: it bounds any mechanism, not the claim's family;
- otherwise: the published eps_LB (valid for any mechanism) above the claimed epsilon.

Only the real mechanism can violate: a control (no noise, no canary, role other than "main") never does.

Several audits (:func:`family_verdict`): each audit's decision is recomputed from its stored counts
at confidence 1 - (1 - confidence) / K (Bonferroni over the K audits), so that the chance of any
false VIOLATION among K audits of a correct claim stays below 1 - confidence. Nothing beyond the
counts the record already holds is needed (:func:`decision_at`).

Every function here takes a record in today's layout, as :func:`dpaudit.audits.engine.read_record`
(the one reader of audit records) returns it; a record written before the general bound reads
otherwise (its published eps_LB was the claim family's).
"""

from __future__ import annotations

import math

from ..accounting.events import event_from_dict
from ..claims import number
from . import sequential, stats
from .curves import BOX_COUNTS, claimed_curve


def eval_counts(rec: dict) -> dict | None:
    """The EVAL counts {tp, fp, tn, fn} of ``rec`` as non-negative ints with both worlds seen, else None."""
    c = rec.get("counts")
    if not isinstance(c, dict):
        return None
    out = {k: c.get(k) for k in ("tp", "fp", "tn", "fn")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in out.values()):
        return None
    return out if out["tp"] + out["fn"] > 0 and out["tn"] + out["fp"] > 0 else None


def is_private_run(rec: dict) -> bool:
    """The real mechanism: role "main", DP noise on, canary inserted."""
    return (
        rec.get("role", "main") == "main"
        and rec.get("noise", True) is True
        and rec.get("canary_inserted", True) is True
    )


def violated(rec: dict) -> bool:
    """THE verdict of one audit record (today's layout) at its own confidence (module docstring)."""
    if not is_private_run(rec) or rec.get("claimed_epsilon") is None:
        return False
    cc = rec.get("claimed_curve")
    if rec.get("statistic") == "claimed-curve" and isinstance(cc, dict):
        return cc.get("violated") is True
    lb = number(rec.get("epsilon_lower_bound"))
    return lb is not None and lb > float(rec["claimed_epsilon"])


def general_epsilon_at(rec: dict, confidence: float) -> float | None:
    """The published eps_LB of ``rec`` recomputed at ``confidence`` from its stored counts (None
    when they are missing): the general bound's two halves (the EVAL counts of the chosen rule,
    the all-threshold band), or, in a record older than the general bound, the EVAL counts' bound."""
    counts, delta = eval_counts(rec), number(rec.get("delta"))
    if counts is None or delta is None:
        return None
    # stopped by a sequential test: only its anytime box is valid
    if isinstance(rec.get("sequential"), dict):
        return float(
            stats.epsilon_from_rates(*sequential.box_at(rec["sequential"], confidence), delta)
        )
    gb = rec.get("general_bound")
    if isinstance(gb, dict) and isinstance(gb.get("band"), dict):
        return stats.general_epsilon(counts, gb["band"], delta=delta, confidence=confidence)
    return stats.epsilon_lower_bound(**counts, delta=delta, confidence=confidence).epsilon


def box_counts(rec: dict) -> dict | None:
    """(fp, n_out, fn, n_in) of the claimed-curve box; older records: from its rates and the EVAL size."""
    cc = rec.get("claimed_curve") or {}
    bc = cc.get("counts")
    if isinstance(bc, dict) and all(isinstance(bc.get(k), int) for k in BOX_COUNTS):
        return bc
    c, p = eval_counts(rec), cc.get("point") if isinstance(cc.get("point"), dict) else {}
    fpr, fnr = number(p.get("fpr")), number(p.get("fnr"))
    if c is None or fpr is None or fnr is None:
        return None
    n_out, n_in = c["tn"] + c["fp"], c["tp"] + c["fn"]  # the same EVAL trials
    return dict(zip(BOX_COUNTS, (int(round(fpr * n_out)), n_out, int(round(fnr * n_in)), n_in)))


def box_uppers(rec: dict, confidence: float) -> tuple[float, float] | None:
    """(FPR, FNR) upper corners of the claimed-curve box at ``confidence``, from the stored counts:
    Clopper-Pearson, or a sequential audit's anytime-valid sequences (None: no counts)."""
    if isinstance(rec.get("sequential"), dict):
        return sequential.box_at(rec["sequential"], confidence)
    box = box_counts(rec)
    if box is None:
        return None
    return (
        stats.cp_upper(box["fp"], box["n_out"], confidence, split=2),
        stats.cp_upper(box["fn"], box["n_in"], confidence, split=2),
    )


def _curve_violated_at(rec: dict, confidence: float) -> bool | None:
    cc = rec.get("claimed_curve") or {}
    box = box_uppers(rec, confidence)
    if box is None or not isinstance(cc.get("event"), dict):
        return None
    adjacency = cc.get("adjacency") or rec.get("adjacency") or "add-remove-record"
    return bool(claimed_curve(event_from_dict(cc["event"]), adjacency).violated_by(*box))


def decision_at(rec: dict, confidence: float) -> dict:
    """The record's decision recomputed at ``confidence``: {"violated" (None: not recomputable),
    "epsilon_lower_bound", "confidence"}; an old layout reads as :func:`violated` reads it."""
    lb = general_epsilon_at(rec, confidence)
    if not is_private_run(rec) or rec.get("claimed_epsilon") is None:
        v: bool | None = False
    elif rec.get("statistic") == "claimed-curve" and isinstance(rec.get("claimed_curve"), dict):
        v = _curve_violated_at(rec, confidence)
    else:
        v = None if lb is None else lb > float(rec["claimed_epsilon"])
    if v is None and not violated(rec):
        v = False  # at a stricter confidence every bound only weakens: no violation stays none
    return {"violated": v, "epsilon_lower_bound": lb, "confidence": confidence}


def family_verdict(records: list[dict]) -> dict:
    """The verdict over K audit records of one claim family with Bonferroni (see the module docstring).

    Returns {"audits": K, "violated" (any adjusted decision violated; None when one could not be
    recomputed and none violated), "decisions" (one per record), "method"}. Controls are not counted.
    """
    judged = [r for r in records if is_private_run(r) and r.get("claimed_epsilon") is not None]
    k = len(judged)
    decisions = [_decision(r, k) for r in judged]
    bounds = [d["epsilon_lower_bound"] for d in decisions]
    return {
        "audits": k,
        "violated": _any_violated([d["violated"] for d in decisions]),
        "decisions": decisions,
        "method": _family_method(judged),
        "epsilon_lower_bound": max(
            (b for b in bounds if b is not None and not math.isnan(b)), default=None
        ),
    }


def _family_method(judged: list[dict]) -> str:
    k = len(judged)
    if k <= 1:
        return "one audit, at its own confidence"
    alpha = max(1.0 - (number(r.get("confidence")) or 0.95) for r in judged)
    return (
        f"family-wise error controlled at {alpha:.0%} over {k} audits (Bonferroni: each at confidence "
        f"1 - {alpha:g}/{k})"
    )


def _decision(record: dict, audits: int) -> dict:
    """One record's decision at its share of the family's error (its own verdict when alone); a
    confidence outside (0, 1) counts as 0.95."""
    conf = number(record.get("confidence"))
    conf = 0.95 if conf is None or not 0.0 < conf < 1.0 else conf
    if audits > 1:
        return decision_at(record, 1.0 - (1.0 - conf) / audits)
    return {**decision_at(record, conf), "violated": violated(record)}


def _any_violated(flags: list) -> bool | None:
    """True when one decision violated; else None when one could not be recomputed; else False."""
    if any(f is True for f in flags):
        return True
    return None if any(f is None for f in flags) else False
