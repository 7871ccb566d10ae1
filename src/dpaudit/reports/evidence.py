"""Readers of the issue-15 evidence blocks a report draws and tabulates: audit.json's
``claimed_curve`` and ``comparison`` blocks, its ``statistic``, and one-run records
(``one_run.json``, read by :mod:`.inputs`).

A loader-layer module (of :mod:`dpaudit.reports` it imports only :mod:`.audit_view`): every reader is lenient
and returns plain, validated values, or None when a block is absent or malformed, so the
report says "not recorded" / writes a note instead of drawing or tabulating a guess. Nothing
here recomputes a bound; the numbers are the record's own.
"""

from __future__ import annotations

import math
from typing import Any

from ..claims import integer, number as num
from .audit_view import name_of

#: The statistics an audit.json may name as the one that decided its eps_LB.
STATISTICS = ("claimed-curve", "clopper-pearson")


def _floats(xs: Any) -> list[float] | None:
    if not isinstance(xs, list):
        return None
    out = [num(x) for x in xs]
    return None if any(v is None or math.isnan(v) for v in out) else out


def _pairs(d: Any) -> dict | None:
    """{"fpr": [...], "fnr": [...]} with equal-length float lists, values in [0, 1], else None."""
    if not isinstance(d, dict):
        return None
    fpr, fnr = _floats(d.get("fpr")), _floats(d.get("fnr"))
    if fpr is None or fnr is None or len(fpr) != len(fnr) or not fpr:
        return None
    if any(not 0.0 <= v <= 1.0 for v in fpr + fnr):
        return None
    return {"fpr": fpr, "fnr": fnr}


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _dict(v: Any) -> dict | None:
    return v if isinstance(v, dict) else None


def _unit(v: float | None) -> bool:
    return v is not None and 0.0 <= v <= 1.0


def _point(p: Any) -> dict | None:
    """The chosen test's point: fpr_upper and fnr_upper in [0, 1] (else None); fpr / fnr outside [0, 1] read as None."""
    p = _dict(p) or {}
    point = {k: num(p.get(k)) for k in ("fpr", "fnr", "fpr_upper", "fnr_upper")}
    if not (_unit(point["fpr_upper"]) and _unit(point["fnr_upper"])):
        return None
    return {k: v if k.endswith("_upper") or _unit(v) else None for k, v in point.items()}


def curve_view(block: Any) -> dict | None:
    """A validated, plain copy of an audit.json ``claimed_curve`` block, or None when it cannot
    be drawn (absent, or malformed: the report says so in a note instead of drawing a guess).

    Needs ``curve`` (FPR/FNR lists in [0, 1]), ``point`` (fpr_upper and fnr_upper in [0, 1])
    and a boolean ``violated``; everything else is optional and read leniently.
    """
    if not isinstance(block, dict):
        return None
    curve, point = _pairs(block.get("curve")), _point(block.get("point"))
    if curve is None or not isinstance(block.get("violated"), bool) or point is None:
        return None
    fam = _dict(block.get("family")) or {}
    return {
        "statistic": str(block.get("statistic") or "claimed-curve"),
        "method": _str(block.get("method")),
        "violated": block["violated"],
        # the epsilon of the claim-family member ruled out (files before issue 23: epsilon_lower_bound)
        "family_epsilon": num(block.get("family_epsilon", block.get("epsilon_lower_bound"))),
        "scale_lower_bound": num(block.get("scale_lower_bound")),
        "family": {"parameter": _str(fam.get("parameter")), "claimed": num(fam.get("claimed")), "lower_bound": num(fam.get("lower_bound"))},
        "accountant": _str(block.get("accountant")),
        "adjacency": _str(block.get("adjacency")),
        "delta": num(block.get("delta")),
        "confidence": num(block.get("confidence")),
        "event": _dict(block.get("event")),
        "direction": block.get("direction") if block.get("direction") in ("greater", "less") else None,
        "point": point,
        "points": _pairs(block.get("points")),
        "curve": curve,
        "curve_at_lower_bound": _pairs(block.get("curve_at_lower_bound")),
        "select_size": integer(block.get("select_size")),
        "eval_size": integer(block.get("eval_size")),
    }


def _steinke(st: dict) -> dict:
    return {"epsilon_lower_bound": num(st.get("epsilon_lower_bound")), "ceiling": num(st.get("ceiling")),
            "guesses": integer(st.get("guesses")), "correct": integer(st.get("correct")),
            "k_pos": integer(st.get("k_pos")), "k_neg": integer(st.get("k_neg")), "method": _str(st.get("method"))}


def _fdp(fd: dict) -> dict:
    return {"epsilon_lower_bound": num(fd.get("epsilon_lower_bound")), "violated": fd.get("violated") if isinstance(fd.get("violated"), bool) else None,
            "guesses": integer(fd.get("guesses")), "correct": integer(fd.get("correct")), "method": _str(fd.get("method"))}


def _maybe(read, block: Any) -> dict | None:
    return None if not isinstance(block, dict) else read(block)


def one_run_view(record: Any) -> dict | None:
    """The numbers of a one_run.json dict a reviewer reads (lenient; None when it is not one)."""
    if not isinstance(record, dict):
        return None
    st, fd = _maybe(_steinke, record.get("steinke")), _maybe(_fdp, record.get("fdp"))
    if st is None and fd is None:
        return None
    info = _dict(record.get("info")) or {}
    return {
        "mechanism": name_of(record.get("mechanism") or info.get("mechanism") or info.get("model")),
        "kind": name_of(record.get("kind")),
        "canaries": integer(record.get("canaries")),
        "included": integer(record.get("included")),
        "claimed_epsilon": num(record.get("claimed_epsilon")),
        "delta": num(record.get("delta")),
        "confidence": num(record.get("confidence")),
        "steinke": st,
        "fdp": fd,
    }


def statistic_of(record: dict) -> str:
    """The statistic that decided ``record``'s top-level eps_LB: its ``statistic`` field; an
    audit.json written before claimed-curve audits existed has none and means Clopper-Pearson."""
    s = record.get("statistic")
    return s if s in STATISTICS else ("clopper-pearson" if s is None else f"unknown ({s})")


def _interval(iv: Any) -> list | None:
    return [num(x) for x in iv] if isinstance(iv, list) and len(iv) == 2 else None


def _tpr_at_fpr(ts: Any) -> list[dict]:
    return [{"fpr": num(t["fpr"]), "tpr": num(t.get("tpr")), "tpr_interval": _interval(t.get("tpr_interval"))}
            for t in ts or [] if isinstance(t, dict) and num(t.get("fpr")) is not None]


def _cp_bonferroni(cp: dict) -> dict:
    return {"epsilon_lower_bound": num(cp.get("epsilon_lower_bound")), "thresholds_tested": integer(cp.get("thresholds_tested")),
            "method": _str(cp.get("method"))}


def _auroc(au: dict) -> dict:
    return {"auc": num(au.get("auc")), "interval": _interval(au.get("interval")), "bootstrap": integer(au.get("bootstrap")),
            "confidence": num(au.get("confidence"))}


def _gdp(gd: dict) -> dict:
    return {"kind": "estimate (not a bound)", "epsilon": num(gd.get("epsilon")), "mu": num(gd.get("mu")),
            "epsilon_interval": _interval(gd.get("epsilon_interval"))}


def comparison_view(block: Any) -> dict | None:
    """The cross-tool statistics of audit.json's ``comparison`` block (each part None when absent)."""
    if not isinstance(block, dict):
        return None
    return {"cp_bonferroni": _maybe(_cp_bonferroni, block.get("cp_bonferroni")), "tpr_at_fpr": _tpr_at_fpr(block.get("tpr_at_fpr")),
            "auroc": _maybe(_auroc, block.get("auroc")), "gdp_estimate": _maybe(_gdp, block.get("gdp_estimate"))}
