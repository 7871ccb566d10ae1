"""Figures of a report, drawn from the report model only (never from the raw inputs), in the one
style of :mod:`.tradeoff` (its Agg canvas, never ``pyplot``): every axis labelled with its unit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .inputs import num
from .tradeoff import new_figure, one_run_figure, png_bytes, style_axes, tradeoff_figure

PALETTE = ("#1f4e79", "#c0392b", "#2e7d32", "#8e44ad", "#d35400", "#00838f", "#6d4c41", "#546e7a")
IN_COLOR = "#c0392b"
#: The dashed grey line a figure measures against (chance, or eps_LB = claimed).
REFERENCE_LINE = {"color": "#888888", "linestyle": "--", "linewidth": 1}
FIGSIZE = (6.4, 4.0)
MAX_ROC_CURVES = 8
#: The x and y labels of the ROC, eps_LB and privacy-utility figures.
ROC_AXES = ("false positive rate (log scale)", "true positive rate (log scale)")
EPS_AXES = ("claimed epsilon (nats)", "epsilon lower bound (nats)")
UTILITY_AXES = ("epsilon (nats, at the recorded delta)", "metric value (fraction)")
ROC_LINE = {"linewidth": 1.6, "drawstyle": "steps-post"}
#: The mark of an audit's ceiling on the eps_LB figure.
CEILING_MARK = {"s": 40, "marker": "_", "color": "#444444", "zorder": 2}


#: What each kind of figure shows (a trade-off figure's names its verdict).
CAPTIONS = {
    "roc": "Membership test on the canary: TPR vs FPR over all thresholds, log-log axes (the low-FPR "
    "corner is what bounds epsilon).",
    "eps": "Each audit's certified lower bound (circles; red X = violation) and no-noise control "
    "(triangles) against the claim; points above the dashed line contradict the claim.",
    "utility": "Mean over seeds with +/- 1 SD error bars; dashed lines: the non-private reference.",
    "tradeoff": "Claimed trade-off curve (black), the curve at the certified lower bound (dashed), EVAL "
    "points (grey) and the chosen test's confidence box; {verdict}. Left linear, right log-log.",
    "onerun": "Lower bounds of one training run with m canaries against the claimed epsilon (dashed); "
    "red: above the claim.",
}


@dataclass(frozen=True)
class Figure:
    name: str  # file stem, unique within a report
    section: str  # report section key
    title: str
    caption: str
    png: bytes


def _label(e: dict) -> str:
    parts = [str(e.get("mechanism") or "?"), str(e.get("canary") or "")]
    if e.get("task"):
        parts.append(str(e["task"]))
    if num(e.get("compared_claim")) is not None:
        parts.append(f"eps {num(e['compared_claim']):.3g}")
    lab = " / ".join(p for p in parts if p)
    return f"{lab} [{e['label']}]" if e.get("label") else lab


def _roc_points(e: dict) -> list[tuple[float, float]]:
    """The audit's ROC points with both rates above 0 (drawable on log axes)."""
    pts = zip((num(x) for x in e["roc"]["fpr"]), (num(x) for x in e["roc"]["tpr"]))
    return [(f, t) for f, t in pts if f is not None and t is not None and f > 0 and t > 0]


def _roc_figure(k: int, mech: str, es: list[dict]) -> Figure:
    fig = new_figure((8.6, 4.2))
    ax = fig.add_subplot()
    floor = 1.0
    for j, e in enumerate(es[:MAX_ROC_CURVES]):
        pts = _roc_points(e)
        if not pts:
            continue
        floor = min(floor, min(p[0] for p in pts), min(p[1] for p in pts))
        auc = num(e.get("auc"))
        lab = _label(e) + (f" (AUC {auc:.3f})" if auc is not None else "")
        fpr, tpr = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(fpr, tpr, color=PALETTE[j % len(PALETTE)], **ROC_LINE, label=lab)
    floor = max(min(floor, 1e-2) / 2, 1e-6)
    ax.plot([floor, 1], [floor, 1], **REFERENCE_LINE, label="chance (TPR = FPR)")
    ax.set(xscale="log", yscale="log", xlim=(floor, 1.05), ylim=(floor, 1.05))
    style_axes(ax, f"Attack ROC: {mech}", *ROC_AXES)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    more = ""
    if len(es) > MAX_ROC_CURVES:
        more = f" Only the first {MAX_ROC_CURVES} of {len(es)} curves are drawn."
    return Figure(f"roc_{k}", "audit", f"ROC ({mech})", CAPTIONS["roc"] + more, png_bytes(fig))


def roc_figures(report: dict) -> list[Figure]:
    """One log-log ROC figure per mechanism (at most MAX_ROC_CURVES curves each)."""
    by_mech: dict[str, list[dict]] = {}
    for e in report["sections"]["audit"]["audits"]:
        if e.get("roc") and e["roc"].get("fpr"):
            by_mech.setdefault(str(e.get("mechanism") or "unknown"), []).append(e)
    return [_roc_figure(k, mech, es) for k, (mech, es) in enumerate(by_mech.items())]


def _top(pts: list[dict]) -> float:
    keys = ("epsilon_lower_bound", "no_noise", "ceiling", "claimed_epsilon")
    vals = [num(p.get(k)) for p in pts for k in keys]
    finite = [v for v in vals if v is not None and math.isfinite(v)]
    return max(max(finite) * 1.15 if finite else 1.0, 0.1)


def _scatter_point(ax, p: dict, x: float, color: str, top: float, seen: set) -> None:
    """One audit's private eps_LB, no-noise control and ceiling at claimed epsilon ``x`` (each legend entry once)."""

    def clip(v):
        return None if v is None else (top if not math.isfinite(v) else v)

    lab = str(p.get("mechanism"))
    viol = p.get("status") == "violation"
    private = {"s": 46 if viol else 34, "marker": "X" if viol else "o"}
    private |= {"color": IN_COLOR if viol else color, "zorder": 3}
    no_noise = {"s": 30, "marker": "^", "facecolors": "none", "edgecolors": color, "zorder": 3}
    marks = (
        ("epsilon_lower_bound", (lab, "lb"), f"{lab}: private eps_LB", private),
        ("no_noise", (lab, "nn"), f"{lab}: no-noise control", no_noise),
        ("ceiling", "ceiling", "ceiling (max certifiable)", CEILING_MARK),
    )
    for field, key, label, style in marks:
        v = clip(num(p.get(field)))
        if v is not None:
            ax.scatter([x], [v], label=None if key in seen else label, **style)
            seen.add(key)


def eps_figure(report: dict) -> list[Figure]:
    """eps_LB against the claimed epsilon, with the y = x line a violation must cross."""
    pts = [
        p
        for p in report["sections"]["audit"]["eps_points"]
        if num(p.get("claimed_epsilon")) is not None and math.isfinite(num(p["claimed_epsilon"]))
    ]
    if not pts:
        return []
    fig = new_figure((8.0, 4.2))
    ax = fig.add_subplot()
    top = _top(pts)
    ax.plot([0, top], [0, top], **REFERENCE_LINE, label="eps_LB = claimed (above: violation)")
    ax.fill_between([0, top], [0, top], [top, top], color=IN_COLOR, alpha=0.06)
    mechs = sorted({str(p.get("mechanism")) for p in pts})
    # a small horizontal offset per canary keeps coinciding points apart
    canaries = sorted({str(p.get("canary")) for p in pts})
    off = {c: (i - (len(canaries) - 1) / 2) * 0.012 * top for i, c in enumerate(canaries)}
    seen: set = set()
    for p in pts:
        x = num(p["claimed_epsilon"]) + off[str(p.get("canary"))]
        color = PALETTE[mechs.index(str(p.get("mechanism"))) % len(PALETTE)]
        _scatter_point(ax, p, x, color, top, seen)
    ax.set(xlim=(0, top), ylim=(0, top))
    style_axes(ax, "Empirical lower bound vs claimed epsilon", *EPS_AXES)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    title = "eps_LB vs claimed epsilon"
    return [Figure("eps_lb_vs_claimed", "audit", title, CAPTIONS["eps"], png_bytes(fig))]


def _series(eps: list, pts: list[dict], m: str) -> tuple[list, list, list]:
    """(epsilons, means, SDs) of metric ``m`` along a curve (points without it left out)."""
    keep = [
        (x, p["metrics"][m])
        for x, p in zip(eps, pts)
        if p["metrics"].get(m) and num(p["metrics"][m].get("mean")) is not None
    ]
    return (
        [x for x, _ in keep],
        [num(s["mean"]) for _, s in keep],
        [num(s.get("sd")) or 0.0 for _, s in keep],
    )


def _draw_metric(ax, m: str, color: str, series: tuple, ref: dict | None) -> None:
    xs, ys, es = series
    ax.errorbar(
        xs, ys, yerr=es, color=color, marker="o", markersize=4, capsize=3, linewidth=1.5, label=m
    )
    if ref and num(ref.get("mean")) is not None:
        ax.axhline(num(ref["mean"]), color=color, linestyle="--", linewidth=1, alpha=0.8)


def _utility_figure(k: int, c: dict) -> Figure:
    pts = c["points"]
    names = list(dict.fromkeys(m for p in pts for m in p["metrics"]))
    fig = new_figure(FIGSIZE)
    ax = fig.add_subplot()
    eps = [num(p["epsilon"]) for p in pts]
    for j, m in enumerate(names):
        ref = (c.get("reference") or {}).get(m)
        _draw_metric(ax, m, PALETTE[j % len(PALETTE)], _series(eps, pts, m), ref)
    if c.get("reference"):
        ax.plot([], [], color="#555555", linestyle="--", label="non-private reference")
    if eps and min(eps) > 0 and max(eps) / min(eps) >= 8:
        ax.set_xscale("log")
    style_axes(ax, f"Privacy-utility: {c['mechanism']} on {c['dataset']}", *UTILITY_AXES)
    ax.legend(fontsize=7, loc="lower right")
    title = f"Privacy-utility ({c['mechanism']}, {c['dataset']})"
    return Figure(f"utility_{k}", "utility", title, CAPTIONS["utility"], png_bytes(fig))


def tradeoff_figures(report: dict) -> list[Figure]:
    """One trade-off figure per audit with a claimed_curve block (:mod:`.tradeoff`), all drawn into
    one reused figure (each PNG is taken before the next audit is drawn)."""
    out, fig = [], None
    for e in report["sections"]["audit"]["audits"]:
        cv = e.get("claimed_curve")
        if not cv:
            continue
        audit = {k: e.get(k) for k in ("mechanism", "canary", "delta", "confidence")}
        audit |= {"claimed_curve": cv, "claimed_epsilon": e.get("compared_claim")}
        fig = tradeoff_figure(audit, fig)
        verdict = "VIOLATION: the box is below" if cv.get("violated") else "the box reaches"
        caption = CAPTIONS["tradeoff"].format(verdict=f"{verdict} the claimed curve")
        title = f"Trade-off ({_label(e)})"
        out.append(Figure(f"tradeoff_{e['index']}", "audit", title, caption, png_bytes(fig)))
    return out


def one_run_figures(report: dict) -> list[Figure]:
    """One bar figure per one-run record: both analyses' eps_LB, the ceiling and the claim."""
    out = []
    for e in report["sections"]["audit"].get("one_run") or []:
        shown = ("mechanism", "kind", "canaries", "claimed_epsilon", "steinke", "fdp")
        rec = {k: e.get(k) for k in shown}
        rec["statistic"] = "f-dp" if e.get("statistic") == "one-run f-DP" else "steinke"
        title = f"One-run audit ({e.get('mechanism') or 'unknown'}, {e.get('label')})"
        png = png_bytes(one_run_figure(rec))
        out.append(Figure(f"onerun_{e['index']}", "audit", title, CAPTIONS["onerun"], png))
    return out


def all_figures(report: dict) -> list[Figure]:
    utility = [_utility_figure(k, c) for k, c in enumerate(report["sections"]["utility"]["curves"])]
    audit = (eps_figure, roc_figures, tradeoff_figures, one_run_figures)  # the audit section's
    return utility + [fig for figures_of in audit for fig in figures_of(report)]
