"""Readers of the issue-15 evidence blocks a report draws and tabulates: audit.json's
``claimed_curve`` and ``comparison`` blocks, its ``statistic``, and one-run records
(``one_run.json``, read by :mod:`.inputs`).

A loader-layer module (imports nothing of :mod:`dpaudit.reports`): every reader is lenient
and returns plain, validated values, or None when a block is absent or malformed, so the
report says "not recorded" / writes a note instead of drawing or tabulating a guess. Nothing
here recomputes a bound; the numbers are the record's own.
"""

from __future__ import annotations

import math
from typing import Any

from ..claims import integer, number as num

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


def curve_view(block: Any) -> dict | None:
    """A validated, plain copy of an audit.json ``claimed_curve`` block, or None when it cannot
    be drawn (absent, or malformed: the report says so in a note instead of drawing a guess).

    Needs ``curve`` (FPR/FNR lists in [0, 1]), ``point`` (fpr_upper and fnr_upper in [0, 1])
    and a boolean ``violated``; everything else is optional and read leniently.
    """
    if not isinstance(block, dict):
        return None
    curve = _pairs(block.get("curve"))
    p = block.get("point") if isinstance(block.get("point"), dict) else {}
    point = {k: num(p.get(k)) for k in ("fpr", "fnr", "fpr_upper", "fnr_upper")}
    if curve is None or not isinstance(block.get("violated"), bool):
        return None
    if any(point[k] is None or not 0.0 <= point[k] <= 1.0 for k in ("fpr_upper", "fnr_upper")):
        return None
    for k in ("fpr", "fnr"):
        if point[k] is not None and not 0.0 <= point[k] <= 1.0:
            point[k] = None
    fam = block.get("family") if isinstance(block.get("family"), dict) else {}
    return {
        "statistic": str(block.get("statistic") or "claimed-curve"),
        "method": block.get("method") if isinstance(block.get("method"), str) else None,
        "violated": block["violated"],
        # the epsilon of the claim-family member ruled out (files before issue 23: epsilon_lower_bound)
        "family_epsilon": num(block.get("family_epsilon", block.get("epsilon_lower_bound"))),
        "scale_lower_bound": num(block.get("scale_lower_bound")),
        "family": {"parameter": fam.get("parameter") if isinstance(fam.get("parameter"), str) else None,
                   "claimed": num(fam.get("claimed")), "lower_bound": num(fam.get("lower_bound"))},
        "accountant": block.get("accountant") if isinstance(block.get("accountant"), str) else None,
        "adjacency": block.get("adjacency") if isinstance(block.get("adjacency"), str) else None,
        "delta": num(block.get("delta")),
        "confidence": num(block.get("confidence")),
        "event": block.get("event") if isinstance(block.get("event"), dict) else None,
        "direction": block.get("direction") if block.get("direction") in ("greater", "less") else None,
        "point": point,
        "points": _pairs(block.get("points")),
        "curve": curve,
        "curve_at_lower_bound": _pairs(block.get("curve_at_lower_bound")),
        "select_size": integer(block.get("select_size")),
        "eval_size": integer(block.get("eval_size")),
    }


def name_of(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, dict):
        return str(v.get("name") or v.get("kind") or v.get("type") or "unnamed")
    return str(v)



def one_run_view(record: Any) -> dict | None:
    """The numbers of a one_run.json dict a reviewer reads (lenient; None when it is not one)."""
    if not isinstance(record, dict):
        return None
    st = record.get("steinke") if isinstance(record.get("steinke"), dict) else None
    fd = record.get("fdp") if isinstance(record.get("fdp"), dict) else None
    if st is None and fd is None:
        return None
    info = record.get("info") if isinstance(record.get("info"), dict) else {}
    return {
        "mechanism": name_of(record.get("mechanism") or info.get("mechanism") or info.get("model")),
        "kind": name_of(record.get("kind")),
        "canaries": integer(record.get("canaries")),
        "included": integer(record.get("included")),
        "claimed_epsilon": num(record.get("claimed_epsilon")),
        "delta": num(record.get("delta")),
        "confidence": num(record.get("confidence")),
        "steinke": None if st is None else {
            "epsilon_lower_bound": num(st.get("epsilon_lower_bound")), "ceiling": num(st.get("ceiling")),
            "guesses": integer(st.get("guesses")), "correct": integer(st.get("correct")),
            "k_pos": integer(st.get("k_pos")), "k_neg": integer(st.get("k_neg")),
            "method": st.get("method") if isinstance(st.get("method"), str) else None},
        "fdp": None if fd is None else {
            "epsilon_lower_bound": num(fd.get("epsilon_lower_bound")),
            "violated": fd.get("violated") if isinstance(fd.get("violated"), bool) else None,
            "guesses": integer(fd.get("guesses")), "correct": integer(fd.get("correct")),
            "method": fd.get("method") if isinstance(fd.get("method"), str) else None},
    }



def statistic_of(record: dict) -> str:
    """The statistic that decided ``record``'s top-level eps_LB: its ``statistic`` field; an
    audit.json written before claimed-curve audits existed has none and means Clopper-Pearson."""
    s = record.get("statistic")
    return s if s in STATISTICS else ("clopper-pearson" if s is None else f"unknown ({s})")


def comparison_view(block: Any) -> dict | None:
    """The cross-tool statistics of audit.json's ``comparison`` block (each part None when absent)."""
    if not isinstance(block, dict):
        return None
    cp = block.get("cp_bonferroni") if isinstance(block.get("cp_bonferroni"), dict) else None
    tprs = []
    for t in block.get("tpr_at_fpr") or []:
        if isinstance(t, dict) and num(t.get("fpr")) is not None:
            iv = t.get("tpr_interval")
            iv = [num(x) for x in iv] if isinstance(iv, list) and len(iv) == 2 else None
            tprs.append({"fpr": num(t["fpr"]), "tpr": num(t.get("tpr")), "tpr_interval": iv})
    au = block.get("auroc") if isinstance(block.get("auroc"), dict) else None
    auiv = au.get("interval") if au is not None else None
    gd = block.get("gdp_estimate") if isinstance(block.get("gdp_estimate"), dict) else None
    gdiv = gd.get("epsilon_interval") if gd is not None else None
    return {
        "cp_bonferroni": None if cp is None else {
            "epsilon_lower_bound": num(cp.get("epsilon_lower_bound")), "thresholds_tested": integer(cp.get("thresholds_tested")),
            "method": cp.get("method") if isinstance(cp.get("method"), str) else None},
        "tpr_at_fpr": tprs,
        "auroc": None if au is None else {
            "auc": num(au.get("auc")), "interval": [num(x) for x in auiv] if isinstance(auiv, list) and len(auiv) == 2 else None,
            "bootstrap": integer(au.get("bootstrap")), "confidence": num(au.get("confidence"))},
        "gdp_estimate": None if gd is None else {
            "kind": "estimate (not a bound)", "epsilon": num(gd.get("epsilon")), "mu": num(gd.get("mu")),
            "epsilon_interval": [num(x) for x in gdiv] if isinstance(gdiv, list) and len(gdiv) == 2 else None},
    }
