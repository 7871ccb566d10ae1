"""The reviewer's picture of one audit: the claimed trade-off curve against the audit's evidence
(the test it pictures, and the schema: :mod:`dpaudit.audits.curves`). The figure draws the curve,
the family member at the certified lower bound, the EVAL points (descriptive: all thresholds) and
the confidence box, in :data:`VIOLATION_COLOR` exactly when the stored test says it is below the
curve; nothing here recomputes a bound. Matplotlib's object API on an Agg canvas, never ``pyplot``.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

from ..audits.engine import read_record
from ..errors import UsageError
from .audit_view import curve_view, name_of as _name, num, one_run_view

#: One figure style for every picture dpaudit draws (the report's figures and an audit's tradeoff.png).
DPI = 110


def new_figure(figsize, layout: str | None = "constrained"):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=figsize, dpi=DPI, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def style_axes(ax, title: str, xlabel: str, ylabel: str, *, size: float = 11) -> None:
    """Title, unit-labelled axes, light grid, no top/right spines; ``size`` is the title's font size."""
    ax.set_title(title, fontsize=size)
    ax.set_xlabel(xlabel, fontsize=size - 1)
    ax.set_ylabel(ylabel, fontsize=size - 1)
    ax.tick_params(labelsize=size - 2)
    ax.grid(True, which="major", alpha=0.3, linewidth=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


#: File name of the picture written next to audit.json.
TRADEOFF_FILE = "tradeoff.png"
ONE_RUN_FILE = "one_run.png"
VIOLATION_COLOR = "#c0392b"  # red: the box is below the claimed curve (the claim is falsified)
CONSISTENT_COLOR = "#1f4e79"  # blue: the box reaches the curve (no evidence against the claim)
CURVE_COLOR = "#1b1b1b"
LOWER_BOUND_COLOR = "#d35400"
POINTS_COLOR = "#7f8c8d"
FIGSIZE = (11.0, 4.6)
#: Marks a figure :func:`tradeoff_figure` made (the only kind it redraws).
TRADEOFF_GID = "dpaudit-tradeoff"
#: Smallest value drawn on the log axes (the claimed curve's grid starts at 1e-6).
LOG_FLOOR = 1e-6


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or math.isinf(x):
        return "n/a" if x is None else "inf"
    return f"{x:.{digits}g}" if x != 0 and abs(x) < 1e-3 else f"{x:.{digits}f}"


def _family_label(cv: dict) -> str:
    fam = cv["family"]
    par, lb = fam["parameter"] or "scale", fam["lower_bound"]
    # the evidence rules out the claim's family members with at least this much noise (a
    # larger noise multiplier / noise scale, or a smaller pure epsilon): they are too private
    # to have produced a box this low
    rel = "<=" if par == "epsilon" else ">="
    ruled_out = f": {par} {rel} {_fmt(lb)} ruled out" if lb is not None else ""
    return f"curve at the lower bound{ruled_out} (family epsilon {_fmt(cv['family_epsilon'])})"


def _clip(
    xs: list[float], ys: list[float], log: bool, floor: float
) -> tuple[list[float], list[float]]:
    """Log axes cannot show zeros: clip them to the floor (drawn on the axis)."""
    return ([max(x, floor) for x in xs], [max(y, floor) for y in ys]) if log else (xs, ys)


#: The style of each line of a panel (by its gid): the chance line, the claimed curve and the
#: claim's family member at the certified lower bound.
LINE_STYLES = {
    "chance": {"color": "#aaaaaa", "linestyle": ":", "linewidth": 1.0},
    "claimed-curve": {"color": CURVE_COLOR, "linewidth": 1.8},
    "lower-bound-curve": {"color": LOWER_BOUND_COLOR, "linestyle": "--", "linewidth": 1.4},
}


#: The EVAL points (every threshold's empirical rates).
POINTS_STYLE = {"s": 7, "color": POINTS_COLOR, "alpha": 0.7, "linewidths": 0}
POINTS_STYLE |= {"label": "EVAL empirical (FPR, FNR), all thresholds", "gid": "eval-points"}
POINTS_STYLE |= {"zorder": 2}


def _draw_curves(ax, cv: dict, log: bool, floor: float) -> None:
    """The chance line, the claimed curve, the curve at the lower bound and the EVAL points."""
    # no privacy at all: the chance line FNR = 1 - FPR (a box must be below it to rule out anything)
    gx = [floor * (10 ** (k / 50 * -math.log10(floor))) for k in range(51)] if log else [0.0, 1.0]
    lines = {
        "chance": ({"fpr": gx, "fnr": [1.0 - x for x in gx]}, "no privacy (FNR = 1 - FPR)"),
        "claimed-curve": (cv["curve"], "claimed curve (the release's event)"),
        "lower-bound-curve": (cv["curve_at_lower_bound"], _family_label(cv)),
    }
    for gid, (rates, label) in lines.items():
        if rates is not None:
            xy = _clip(rates["fpr"], rates["fnr"], log, floor)
            ax.plot(*xy, **LINE_STYLES[gid], label=label, gid=gid)
    if cv["points"] is not None:
        ax.scatter(*_eval_points(cv["points"], log), **POINTS_STYLE)


def _eval_points(pts: dict, log: bool) -> tuple[list[float], list[float]]:
    """The EVAL points; on log axes only those with both rates above 0."""
    keep = [(x, y) for x, y in zip(pts["fpr"], pts["fnr"]) if not log or (x > 0 and y > 0)]
    return [x for x, _ in keep], [y for _, y in keep]


#: The box corner's mark and the VIOLATION label beside it.
CORNER_STYLE = {"s": 60, "edgecolors": "white", "linewidths": 0.6, "zorder": 6, "gid": "box-corner"}
VIOLATION_LABEL = {"xytext": (8, -14), "textcoords": "offset points", "color": VIOLATION_COLOR}
VIOLATION_LABEL |= {"fontsize": 10, "fontweight": "bold", "gid": "violation-label", "zorder": 7}


def _draw_box(ax, cv: dict, log: bool, floor: float) -> None:
    """The chosen test's confidence box [0, FPR_hi] x [0, FNR_hi], its EVAL point and its corner."""
    from matplotlib.patches import Rectangle

    viol = cv["violated"]
    color = VIOLATION_COLOR if viol else CONSISTENT_COLOR
    p = cv["point"]
    fu, nu = p["fpr_upper"], p["fnr_upper"]
    x0 = floor if log else 0.0
    w, h = max(fu, x0) - x0, max(nu, x0) - x0
    box = {"xy": (x0, x0), "width": w, "height": h, "edgecolor": color, "linewidth": 1.6}
    label = "confidence box " + (
        "BELOW the claimed curve: VIOLATION" if viol else "of the chosen test"
    )
    fill = {"facecolor": color, "alpha": 0.18 if viol else 0.12, "label": label}
    ax.add_patch(Rectangle(**box, **fill, zorder=3, gid="confidence-box"))
    ax.add_patch(Rectangle(**box, facecolor="none", zorder=4, gid="confidence-box-edge"))
    if p["fpr"] is not None and p["fnr"] is not None:
        _draw_chosen(ax, p, color, log, floor)
    corner = (max(fu, floor), max(nu, floor)) if log else (fu, nu)
    label = f"box corner (FPR_hi {_fmt(fu)}, FNR_hi {_fmt(nu)})"
    ax.scatter(*corner, marker="X" if viol else "s", color=color, label=label, **CORNER_STYLE)
    if viol:
        ax.annotate("VIOLATION", xy=corner, **VIOLATION_LABEL)


#: The chosen test's EVAL point and its error bars.
CHOSEN_STYLE = {"fmt": "o", "markersize": 5, "elinewidth": 1.2, "capsize": 3, "zorder": 5}
CHOSEN_STYLE |= {
    "label": "chosen test: EVAL point, one-sided CP upper bounds",
    "gid": "chosen-point",
}


def _draw_chosen(ax, p: dict, color: str, log: bool, floor: float) -> None:
    """The chosen test's EVAL point with its one-sided error bars up to the box corner."""
    fu, nu = p["fpr_upper"], p["fnr_upper"]
    px, py = (max(p["fpr"], floor), max(p["fnr"], floor)) if log else (p["fpr"], p["fnr"])
    xerr, yerr = [[0.0], [max(max(fu, floor) - px, 0.0)]], [[0.0], [max(max(nu, floor) - py, 0.0)]]
    ax.errorbar([px], [py], xerr=xerr, yerr=yerr, color=color, ecolor=color, **CHOSEN_STYLE)


#: (title, x label, y label) of the linear (False) and the log-log (True) panel.
PANEL_LABELS = {
    False: (
        "linear",
        "false positive rate (canary out, test says in)",
        "false negative rate (canary in, test says out)",
    ),
    True: (
        "log-log (the corners where large epsilons live)",
        "false positive rate (log scale)",
        "false negative rate (log scale)",
    ),
}


def _draw_panel(ax, cv: dict, *, log: bool, floor: float) -> None:
    _draw_curves(ax, cv, log, floor)
    _draw_box(ax, cv, log, floor)
    if log:
        ax.set(xscale="log", yscale="log", xlim=(floor, 1.3), ylim=(floor, 1.3))
    else:
        ax.set(xlim=(0.0, 1.0), ylim=(0.0, 1.0), aspect="equal")
    style_axes(ax, *PANEL_LABELS[log], size=10)


def _log_floor(cv: dict) -> float:
    """Lower limit of the log axes: a decade below the box corner and half the smallest non-zero rate, in [LOG_FLOOR, 1e-2]."""
    p, pts = cv["point"], cv["points"]
    cands = [1e-2] + [v / 10 for v in (p["fpr_upper"], p["fnr_upper"]) if v is not None and v > 0]
    nz = [v for v in pts["fpr"] + pts["fnr"] if v > 0] if pts is not None else []
    return max(LOG_FLOOR, min(cands + ([min(nz) / 2] if nz else [])))


def title_of(audit: dict, cv: dict) -> str:
    mech = _name(audit.get("mechanism")) or "unknown mechanism"
    can = _name(audit.get("canary"))
    claim = num(audit.get("claimed_epsilon"))
    conf = cv["confidence"] if cv["confidence"] is not None else num(audit.get("confidence"))
    head = f"{mech}" + (f" · canary {can}" if can else "") + f" · statistic {cv['statistic']}"
    # the bound for any mechanism (old files: re-read)
    lb = num(read_record(audit).get("epsilon_lower_bound"))
    verdict = (
        "VIOLATION: the claim is falsified" if cv["violated"] else "no evidence against the claim"
    )
    delta = num(audit.get("delta"))
    tail = f"eps_LB {_fmt(lb)} vs claimed eps {_fmt(claim)}"
    tail += f" (delta {delta:g})" if delta is not None else ""
    tail += f", {100 * conf:g} % confidence" if conf is not None else ""
    return f"{head}\n{tail} — {verdict}"


def tradeoff_figure(audit: dict, figure=None):
    """The trade-off figure (a ``matplotlib.figure.Figure`` on an Agg canvas) of one audit.json dict;
    a UsageError when it has no drawable ``claimed_curve`` block (no claimed event, or an old
    audit.json). ``figure``: one this function returned before, cleared and redrawn (its ticks,
    renderer and text measurements are reused: several audits are drawn in a fraction of the time;
    the picture is the one a fresh figure gets)."""
    if not isinstance(audit, dict):
        raise UsageError(f"audit must be an audit.json dict, got {type(audit).__name__}.")
    cv = curve_view(audit.get("claimed_curve"))
    if cv is None:
        raise UsageError(
            "audit must carry a claimed_curve block with curve, point (fpr_upper, fnr_upper) and violated, "
            f"got {'none' if audit.get('claimed_curve') is None else 'a malformed one'}."
        )
    if figure is not None and getattr(figure, "get_gid", lambda: None)() != TRADEOFF_GID:
        raise UsageError(
            f"figure must be one tradeoff_figure returned, got {type(figure).__name__}."
        )
    fig = _cleared(figure) if figure is not None else _new_tradeoff_figure()
    ax_lin, ax_log = fig.axes
    _draw_panel(ax_lin, cv, log=False, floor=0.0)
    _draw_panel(ax_log, cv, log=True, floor=_log_floor(cv))
    fig.suptitle(
        title_of(audit, cv), fontsize=10.5, color=VIOLATION_COLOR if cv["violated"] else CURVE_COLOR
    )
    handles, labels = ax_log.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7.5, frameon=False)
    return fig


def _new_tradeoff_figure():
    # a fixed layout: the constrained one doubles the drawing time of these tick-heavy log axes
    fig = new_figure(FIGSIZE, layout=None)
    fig.set_gid(TRADEOFF_GID)
    margins = {"left": 0.065, "right": 0.985, "top": 0.83, "bottom": 0.28, "wspace": 0.22}
    fig.subplots(1, 2, gridspec_kw=margins)
    return fig


def _cleared(fig):
    """``fig`` without what :func:`tradeoff_figure` drew into it (axes, ticks and canvas kept)."""
    for ax in fig.axes:
        for container in list(ax.containers):  # first: an error bar's container owns its lines
            container.remove()
        for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts]:
            artist.remove()
    for legend in list(fig.legends):
        legend.remove()
    return fig


def write_tradeoff_png(audit_dict: dict, path: str | os.PathLike) -> Path | None:
    """Write the trade-off figure of ``audit_dict`` as a PNG at ``path`` (a file, or a folder:
    then ``<folder>/tradeoff.png``); returns the path, or None (nothing written) when the audit
    has no ``claimed_curve`` block — an audit without a claimed event has no curve to draw."""
    if not isinstance(audit_dict, dict) or audit_dict.get("claimed_curve") is None:
        return None
    return _write_png(tradeoff_figure(audit_dict), path, TRADEOFF_FILE)


def write_one_run_png(record: dict, path: str | os.PathLike) -> Path:
    """Write :func:`one_run_figure` of a one-run record as a PNG at ``path`` (a file, or a folder: ``<folder>/one_run.png``)."""
    return _write_png(one_run_figure(record), path, ONE_RUN_FILE)


def _write_png(fig, path: str | os.PathLike, default_name: str) -> Path:
    out = Path(path) / default_name if Path(path).is_dir() else Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(png_bytes(fig))
    os.replace(tmp, out)  # never a half-written PNG beside the audit's record
    return out


def _bar(label: str, lb: float, bad: bool, gid: str) -> tuple[str, float, str, str]:
    return (label, lb, VIOLATION_COLOR if bad else CONSISTENT_COLOR, gid)


def _fdp_decides(record: dict, fd_lb: float | None) -> bool:
    """The analysis fixed in advance to decide (the record's rule): f-DP when it was computed."""
    statistic = record.get("statistic")
    return statistic == "f-dp" or (statistic is None and fd_lb is not None)


def _above(lb: float, claim: float | None) -> bool:
    return claim is not None and lb > claim


def _one_run_bars(v: dict, record: dict) -> list[tuple[str, float, str, str]]:
    """(label, value, colour, gid) of each bar: the two analyses' eps_LB and the (eps, delta) ceiling."""
    claim, st, fd = v["claimed_epsilon"], v["steinke"] or {}, v["fdp"] or {}
    st_lb, fd_lb = st.get("epsilon_lower_bound"), fd.get("epsilon_lower_bound")
    fdp = _fdp_decides(record, fd_lb)
    rows = []
    if st_lb is not None:
        label = "eps_LB (eps, delta)" + ("" if fdp else " (decides)")
        rows.append(_bar(label, st_lb, _above(st_lb, claim), "steinke"))
    if fd_lb is not None:
        label = "eps_LB f-DP" + (" (decides)" if fdp else "")
        rows.append(_bar(label, fd_lb, bool(fd["violated"]) or _above(fd_lb, claim), "fdp"))
    if st.get("ceiling") is not None:
        rows.append(("(eps, delta) ceiling (all correct)", st["ceiling"], "#9e9e9e", "ceiling"))
    return rows


def _one_run_subtitle(v: dict) -> str:
    st = v["steinke"] or {}
    guesses, correct = st.get("guesses"), st.get("correct")
    head = f"{_fmt(v['canaries'], 0)} canaries ({v['kind'] or 'kind n/a'})"
    if guesses is None or correct is None:
        return head
    return head + f", {_fmt(correct, 0)} of {_fmt(guesses, 0)} guesses correct"


#: The claimed epsilon's line on a one-run figure.
CLAIM_LINE = {"color": CURVE_COLOR, "linestyle": "--", "linewidth": 1.2, "gid": "claim-line"}


def one_run_figure(record: dict):
    """Bars of a one-run audit (one_run.json): claimed epsilon, the (eps, delta) lower bound of
    Steinke, Nasr & Jagielski 2023 and its all-correct ceiling for this m, and the f-DP lower
    bound (Mahloujifar et al. 2024) when present. A bound above the claim is drawn in red."""
    v = one_run_view(record)
    if v is None:
        raise UsageError("one-run record must carry a steinke or fdp block, got neither.")
    claim = v["claimed_epsilon"]
    rows = _one_run_bars(v, record)
    fig = new_figure((7.6, 1.3 + 0.55 * max(len(rows), 1)))
    ax = fig.add_subplot()
    claim_shown = claim is not None and math.isfinite(claim)
    shown = [r[1] for r in rows if math.isfinite(r[1])] + ([claim] if claim_shown else [])
    top = max(shown + [0.1]) * 1.15
    for i, (lab, val, col, gid) in enumerate(rows):
        ax.barh([i], [min(val, top)], color=col, alpha=0.85, gid=f"bar-{gid}")
        ax.text(min(val, top), i, f"  {_fmt(val)}", va="center", fontsize=8.5)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8.5)
    ax.invert_yaxis()
    if claim_shown:
        ax.axvline(claim, label=f"claimed eps {_fmt(claim)}", **CLAIM_LINE)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_xlim(0, top)
    title = f"One-run audit: {v['mechanism'] or 'unknown mechanism'}\n{_one_run_subtitle(v)}"
    style_axes(ax, title, "epsilon (nats)", "", size=10)
    return fig
