"""The Audit section laid out as blocks: the Table-16-shaped table, every audit in detail, the
statistics behind each verdict, and the one-run audits."""

from __future__ import annotations

from typing import Any

from ..audit_outputs import NOT_COVERED
from ..audits.power import power_cell
from .format import DASH, Block, either, f, g, num, p, table, text, val, verdict_word, with_interval

DETAIL_HEADERS = [
    "audit",
    "mechanism / canary / task",
    "claim (delta)",
    "eps_LB",
    "deciding statistic, recomputed from the counts",
    "null ctrl",
    "confidence",
    "trials (EVAL)",
    "TP/FP/TN/FN",
    "ceiling",
    "GDP est. / AUC",
    "power (what this N can detect)",
    "method",
    "status",
]
STATISTIC_HEADERS = [
    "audit",
    "statistic (decides)",
    "eps_LB",
    "claim",
    "claim's family: ruled out (family epsilon, not a bound)",
    "CP eps_LB (SELECT/EVAL)",
    "CP eps_LB (Bonferroni)",
    "TPR at FPR 0.1 % [CI]",
    "TPR at FPR 1 % [CI]",
    "AUROC [bootstrap CI]",
    "GDP eps (estimate)",
    "threat model",
]
ONE_RUN_HEADERS = [
    "record",
    "mechanism",
    "canary kind",
    "m",
    "included",
    "claim",
    "delta",
    "confidence",
    "correct / guesses",
    "eps_LB (eps, delta)",
    "ceiling",
    "eps_LB (f-DP)",
    "claimed curve (f-DP)",
    "statistic (decides)",
    "power (what this m can detect)",
    "status",
]
WHITE_BOX_HEADERS = [
    "record",
    "mechanism",
    "threat model",
    "canaries",
    "steps",
    "claim",
    "delta",
    "confidence",
    "eps_LB",
    "noise multiplier <=",
    "sensitivity >=",
    "sample rate >=",
    "controls (no-noise / null)",
    "power (what these canaries can detect)",
    "status",
]


def _table16_cells(cell: dict | None) -> list[str]:
    if cell is None:
        return ["—", "—", "—"]
    return [
        f(cell["private"]) + (" (VIOLATION)" if cell.get("status") == "violation" else ""),
        f(cell["no_noise"]),
        f(cell["ceiling"], 2),
    ]


def _joined(cells: list[dict | None], key: str, fmt) -> str:
    return " / ".join(
        sorted({fmt(c[key]) for c in cells if c is not None and c.get(key) is not None})
    )


def _table16_block(t: dict) -> Block:
    headers = (
        ["mechanism", "task / target", "claimed eps"]
        + [
            f"{c}: {what}"
            for c in t["canaries"]
            for what in ("private eps_LB", "no-noise ctrl", "ceiling")
        ]
        + ["confidence", "trials"]
    )
    rows = []
    for r in t["rows"] + ([t["max"]] if t.get("max") else []):
        cells = [r["cells"].get(c) for c in t["canaries"]]
        rows.append(
            [r["mechanism"], r["task"], f(r["claimed_epsilon"])]
            + [x for c in cells for x in _table16_cells(c)]
            + [_joined(cells, "confidence", g), _joined(cells, "trials", str)]
        )
    return table(
        "Empirical privacy audit (shape of DP-MixMin Table 16): Clopper–Pearson eps_LB of the private mechanism and of its "
        "no-noise control, per task and canary",
        headers,
        rows,
    )


def _method_ref(method: Any, methods: list[str]) -> str:
    """Long method descriptions go below the table once; the cell holds a reference [k]."""
    if not method:
        return DASH
    methods += [] if str(method) in methods else [str(method)]
    return f"[{methods.index(str(method)) + 1}]"


def _recomputed(r: dict | None) -> str:
    """The deciding statistic recomputed by the report (the claimed-curve search, or the eps_LB)."""
    if not r:
        return DASH
    if "statement" in r:
        return f"{r['statistic']}: {r['statement']}: {verdict_word(r['violated'])}"
    return f"{r['statistic']}: eps_LB {f(r.get('epsilon_lower_bound'))}"


def _sequential_note(seq: dict | None) -> str:
    """A sequential audit's stop, after its trials: "; sequential, stopped (violation) of 2000"."""
    return (
        ""
        if not seq
        else f"; sequential, stopped ({text(seq.get('stopped'))}) of {val(seq.get('max_trials'))}"
    )


def _detail_row(e: dict, methods: list[str]) -> list[str]:
    cnt = e.get("counts") or {}
    what = " / ".join(
        text(x) for x in (e.get("mechanism"), e.get("canary"), e.get("task") or e.get("dataset"))
    )
    return [
        text(e.get("label")),
        what,
        f"{f(e.get('compared_claim'))} ({g(e.get('delta'))})",
        f(e.get("epsilon_lower_bound")),
        _recomputed(e.get("recomputed")),
        f((e.get("null") or {}).get("epsilon_lower_bound")),
        g(e.get("confidence")),
        f"{val(e.get('trials'))} ({val(e.get('eval_trials'))})"
        + _sequential_note(e.get("sequential")),
        either(cnt, "/".join(val(cnt.get(k)) for k in ("tp", "fp", "tn", "fn"))),
        f(e.get("ceiling"), 2),
        f"{f(e.get('gdp_estimate'))} / {f(e.get('auc'))}",
        power_cell(e.get("power")),
        _method_ref(e.get("method"), methods),
        e.get("status", "").upper(),
    ]


def audit_blocks(report: dict) -> list[Block]:
    a = report["sections"]["audit"]
    entries, one_runs, white_boxes = a["audits"], a.get("one_run") or [], a.get("white_box") or []
    covered = p(a.get("not_covered") or NOT_COVERED)
    if not entries:
        runs = _one_run_blocks(one_runs) + _white_box_blocks(white_boxes)
        return (
            [p("No trial-based audit among the inputs."), covered]
            if runs
            else [p("No audit among the inputs.")]
        ) + runs
    methods: list[str] = []
    det = [_detail_row(e, methods) for e in entries]
    return (
        [
            covered,
            _table16_block(a["table16"]),
            table(
                "Every audit in detail (the statistic that decided it recomputed by this report from the stored counts)",
                DETAIL_HEADERS,
                det,
            ),
        ]
        + [
            Block("more", text=f"Method [{k}]: {m.split(';')[0]}", caption=m)
            for k, m in enumerate(methods, 1)
        ]
        + _statistic_blocks(entries)
        + [Block("figures", figures=["eps_lb_vs_claimed", "roc"])]
        + _one_run_blocks(one_runs)
        + _white_box_blocks(white_boxes)
    )


def _comparison_cells(cmp_: dict) -> list[str]:
    """CP Bonferroni, TPR at FPR 0.1 % and 1 %, AUROC and the GDP estimate of a comparison block."""
    tprs = {
        round(num(t["fpr"]), 6): t
        for t in cmp_.get("tpr_at_fpr") or []
        if num(t.get("fpr")) is not None
    }
    t01, t1 = tprs.get(0.001) or {}, tprs.get(0.01) or {}
    au, gd, cpb = (cmp_.get(k) or {} for k in ("auroc", "gdp_estimate", "cp_bonferroni"))
    return [
        either(
            cpb,
            f"{f(cpb.get('epsilon_lower_bound'))} ({val(cpb.get('thresholds_tested'))} thresholds)",
        ),
        with_interval(t01.get("tpr"), t01.get("tpr_interval")),
        with_interval(t1.get("tpr"), t1.get("tpr_interval")),
        with_interval(au.get("auc"), au.get("interval")),
        either(gd, with_interval(gd.get("epsilon"), gd.get("epsilon_interval")) + " (estimate)"),
    ]


def _statistic_row(e: dict) -> list[str]:
    cv = e.get("claimed_curve") or {}
    cfb = e.get("claim_family_bound") or {}
    fam = either(
        cfb,
        f"{cfb.get('statement')} ({f(cv.get('family_epsilon'))}): {verdict_word(cfb.get('violated'))}",
    )
    return (
        [
            text(e.get("label")),
            text(e.get("statistic")),
            f(e.get("epsilon_lower_bound")),
            f(e.get("compared_claim")),
            fam,
            f(e.get("clopper_pearson_epsilon")),
        ]
        + _comparison_cells(e.get("comparison") or {})
        + [text(e.get("threat_model"))]
    )


def _statistic_blocks(entries: list[dict]) -> list[Block]:
    """Which statistic decided each audit, the claimed-curve test beside today's Clopper-Pearson
    bound, the statistics reviewers compare across tools, and the trade-off figures. Shown only
    when some audit records them (an audit.json from before claimed-curve audits has none)."""
    if not any(
        e.get("claimed_curve") or e.get("comparison") or e.get("statistic") == "claimed-curve"
        for e in entries
    ):
        return []
    out = [
        table(
            "Statistic that decided each audit, and those reviewers compare across tools (claimed-curve: the box of one "
            "test chosen on SELECT against the claimed curve; eps_LB: a bound for any mechanism; family epsilon: no bound; "
            "GDP: an estimate)",
            STATISTIC_HEADERS,
            [_statistic_row(e) for e in entries],
        )
    ]
    if any(e.get("claimed_curve") for e in entries):
        out += [
            p(
                "Trade-off figures: the claimed curve, the EVAL points and the confidence box (red: wholly below the curve, "
                "the claim is falsified)."
            ),
            Block("figures", figures=["tradeoff"]),
        ]
    return out


def _one_run_row(e: dict) -> list[str]:
    st, fd = e.get("steinke") or {}, e.get("fdp") or {}
    fdp_flag = either(fd.get("violated") is not None, verdict_word(fd.get("violated")))
    return [
        text(e.get("label")),
        text(e.get("mechanism")),
        text(e.get("kind")),
        f(e.get("canaries")),
        f(e.get("included")),
        f(e.get("claimed_epsilon")),
        g(e.get("delta")),
        g(e.get("confidence")),
        either(st, f"{f(st.get('correct'))} / {f(st.get('guesses'))}"),
        either(st, f(st.get("epsilon_lower_bound"))),
        either(st, f(st.get("ceiling"), 2)),
        either(fd, f(fd.get("epsilon_lower_bound")), "not computed"),
        either(fd, fdp_flag),
        text(e.get("statistic")),
        power_cell(e.get("power")),
        str(e.get("status", "")).upper(),
    ]


def _one_run_blocks(entries: list[dict]) -> list[Block]:
    """One-run audits (one_run.json): both analyses' bounds against the claim."""
    if not entries:
        return []
    return [
        table(
            "One-run audits (Steinke, Nasr & Jagielski 2023; f-DP analysis: Mahloujifar et al. 2024): "
            "m canaries each included with probability 1/2, one training run",
            ONE_RUN_HEADERS,
            [_one_run_row(e) for e in entries],
        ),
        Block("figures", figures=["onerun"]),
    ]


def _control_cell(controls: dict) -> str:
    words = {True: "as expected", False: "FAILED"}
    return " / ".join(words.get(controls.get(c), "not run") for c in ("no-noise", "null"))


def _white_box_row(e: dict) -> list[str]:
    words = [text(e.get(k)) for k in ("label", "mechanism", "threat_model")]
    numbers = [f(e.get(k)) for k in ("canaries", "steps", "claimed_epsilon")]
    general = [g(e.get(k)) for k in ("delta", "confidence")]
    ingredients = [
        g(e.get(k)) for k in ("noise_multiplier_upper", "sensitivity_lower", "sample_rate_lower")
    ]
    return (
        words
        + numbers
        + general
        + [f(e.get("epsilon_lower_bound"))]
        + ingredients
        + [
            _control_cell(e.get("controls_ok") or {}),
            power_cell(e.get("power")),
            str(e.get("status", "")).upper(),
        ]
    )


def _white_box_blocks(entries: list[dict]) -> list[Block]:
    """White-box and crafted-final audits (white_box.json): the bound and its three ingredients."""
    if not entries:
        return []
    return [
        table(
            "White-box and crafted-final audits (docs/white_box.md): Dirac canaries seen at "
            "every step, or only in the final model; eps_LB = epsilon of the subsampled "
            "Gaussian with noise multiplier s_hi / d_lo and rate q_lo",
            WHITE_BOX_HEADERS,
            [_white_box_row(e) for e in entries],
        )
    ]
