"""The Sweep section laid out as blocks: per sweep its counts, budget, ledger record, failures
and its tables (Table 3 comparison, cells per metric, paired contrasts, win/tie/loss)."""

from __future__ import annotations

from typing import Any

from .format import (
    DASH,
    Block,
    as_stored,
    as_stored_columns,
    columns,
    composition_columns,
    declined,
    either,
    eps_label,
    f,
    finite,
    g,
    num,
    p,
    pct,
    pval,
    signed,
    table,
    val,
)

TABLES_JSON = {
    "matches": " (tables.json agrees)",
    "differs": " (tables.json differs: see notes)",
    "unreadable": " (tables.json unreadable)",
}
IN_SPEC = {True: "yes", False: "no (earlier spec)"}


def _prv(b: dict) -> str:
    prv = b.get("prv")
    return f(prv) if prv is not None else declined((b.get("errors") or {}).get("prv"))


BUDGET_COLUMNS = composition_columns(
    "dataset partition adjacency", ("largest single eps", "max_single_epsilon", f), prv=(None, _prv)
)
CONTRAST_COLUMNS = [
    ("dataset", "dataset", as_stored),
    ("eps", "epsilon", eps_label),
    ("metric", "metric", as_stored),
    ("contrast", None, lambda c: f"{c['reference']} − {c['comparator']}"),
    ("n", "n", val),
    ("mean diff", "mean_difference", signed),
    ("p (sign-flip)", "p_value", pval),
    ("p (Holm)", "p_holm", pval),
    ("W/T/L seeds", None, lambda c: f"{c['wins']}/{c['ties']}/{c['losses']}"),
]
WIN_TIE_LOSS_COLUMNS = [
    *as_stored_columns("reference", "comparator", "metric"),
    ("higher", "wins", val),
    ("tied", "ties", val),
    ("lower", "losses", val),
    ("conditions", "conditions", val),
]
LEDGER_COMPOSITION_COLUMNS = composition_columns("dataset partition")
LEDGER_SUMMARY_COLUMNS = [
    ("dataset", "dataset", str),
    ("partition", "partition", str),
    ("releases", "releases_subtree", val),
    ("composed eps", "epsilon", f),
    ("bound by", "bound_by", val),
    ("naive sum of eps", "naive_epsilon", f),
    ("delta", "delta", g),
]
MISMATCH_COLUMNS = [
    ("release", "release_id", lambda rid: str(rid)[:12]),
    ("mechanism", "mechanism", str),
    ("claimed eps", "epsilon", lambda eps: f(eps, 4)),
    ("problem", "message", str),
    ("directory", "path", str),
]
FAILED_TASK_COLUMNS = [
    ("model", "model", str),
    ("dataset", "dataset", str),
    ("eps", "epsilon", eps_label),
    ("seed", "seed", val),
    ("in current spec", "in_current_spec", lambda in_spec: IN_SPEC.get(in_spec, DASH)),
    ("error", "error", str),
]


def _table3_row(r: dict) -> list[str]:
    sd = f" ± {f(r.get('sd'), 2)}" if finite(r.get("sd")) else ""
    ours = "not run" if r.get("mean") is None else f(r["mean"], 2) + sd
    ci = either(finite(r.get("ci_low")), f"[{f(r.get('ci_low'), 2)}, {f(r.get('ci_high'), 2)}]")
    pub = "not in Table 3"
    if r.get("published_mean") is not None:
        pub = f"{f(r['published_mean'], 2)} ± {f(r['published_sd'], 2)}"
        # another table's value, e.g. attention (Table 9) or DP-ELM widths (Table 5)
        if r.get("published_source") not in (None, "Table 3"):
            pub += f" ({r['published_source']})"
    return [
        str(r.get("label")),
        str(r.get("dataset")),
        ours,
        ci,
        val(r.get("n")),
        pub,
        signed(r.get("difference"), 2),
    ]


def _table3_block(t3: dict) -> Block:
    rows = [_table3_row(r) for r in t3.get("rows") or []]
    if not rows:
        return p(f"Table 3 comparison: no finished task at eps = {g(t3.get('epsilon'))}.")
    return table(
        f"Table 3 comparison: accuracy (%) at eps = {g(t3.get('epsilon'))}, mean ± SD over seeds, "
        f"95 % t-interval, next to the published values. Source: {t3.get('citation')}",
        ["model", "dataset", "dpaudit", "95 % t-interval", "seeds", "published", "difference"],
        rows,
    )


def _cell_text(c: dict, scale: float) -> str:
    s = c["summary"]
    if s.get("n", 0) < 2 or not finite(s.get("sd")):
        return f"{pct(s['mean'], scale)} (n={s.get('n')})"
    return f"{pct(s['mean'], scale)} ± {pct(s['sd'], scale)} [{pct(s['ci_low'], scale)}, {pct(s['ci_high'], scale)}] (n={s['n']})"


def _metric_rows(cells: list[dict], eps: list, scale: float) -> list[list[str]]:
    keyed = {(c["dataset"], c["model"], c["epsilon"]): c for c in cells}
    pairs = [
        (ds, model)
        for ds in sorted({c["dataset"] for c in cells})
        for model in sorted({c["model"] for c in cells if c["dataset"] == ds})
    ]
    return [
        [ds, model]
        + [_cell_text(keyed[(ds, model, e)], scale) if (ds, model, e) in keyed else "" for e in eps]
        for ds, model in pairs
    ]


def _metric_block(cells: list[dict], metric: str) -> Block:
    scale = 100.0 if metric == "accuracy" else 1.0
    eps = sorted({c["epsilon"] for c in cells}, key=lambda e: (e is not None, num(e) or 0.0))
    return table(
        f"{metric}{' (%)' if scale == 100.0 else ''} per cell: mean ± sample SD [95 % Student-t interval] (n seeds)",
        ["dataset", "model"] + [f"eps = {eps_label(e)}" for e in eps],
        _metric_rows(cells, eps, scale),
    )


def _contrast_table(family: list[dict], what: str, size: Any, floor: str) -> Block:
    return columns(
        f"Paired contrasts{what} (reference minus comparator, paired by seed): exact sign-flip p and Holm-adjusted p "
        f"over the whole family of {size}; W/T/L = seeds won/tied/lost"
        + (f" ({floor})" if floor else ""),
        CONTRAST_COLUMNS,
        family,
    )


def _contrast_blocks(t: dict) -> list[Block]:
    floor = "; ".join(
        f"n = {n}: smallest attainable p = {pval(v)}"
        for n, v in (t.get("min_attainable_p") or {}).items()
    )
    cons, wtl, np_cons = (
        t.get(k) or [] for k in ("contrasts", "win_tie_loss", "non_private_contrasts")
    )
    if not cons:
        none = "no comparator shares at least two seeds with the reference in any condition."
        out = [p(f"No paired contrast: {none}")]
    else:
        out = [_contrast_table(cons, "", t.get("contrast_family_size"), floor)]
    if cons and wtl:
        caption = "Win/tie/loss across conditions by mean (descriptive only)"
        out.append(columns(caption, WIN_TIE_LOSS_COLUMNS, wtl))
    if np_cons:
        what = ", non-private conditions (a separate Holm family)"
        out.append(_contrast_table(np_cons, what, t.get("non_private_family_size"), floor))
    return out


def _sweep_table_blocks(t: dict) -> list[Block]:
    """Table 3 comparison, cells per metric, paired contrasts and win/tie/loss of one sweep."""
    out = [_table3_block(t.get("table3") or {})]
    for metric in t.get("metrics") or []:
        cells = [c for c in t.get("cells") or [] if c.get("metric") == metric]
        if cells:
            out.append(_metric_block(cells, metric))
    return out + _contrast_blocks(t) + [p(str(n)) for n in t.get("notes") or []]


def _sweep_card(sw: dict) -> Block:
    c, acc = sw.get("counts") or {}, sw.get("accounting") or {}
    spec = sw.get("spec") if isinstance(sw.get("spec"), dict) else {}
    tasks = " / ".join(val(c.get(k)) for k in ("done", "failed", "pending"))
    pairs = [
        ("folder / store", f"{sw['path']} / {sw['store']}"),
        ("tasks done / failed / pending (total)", tasks + f" ({val(c.get('total'))})"),
        ("releases found below the folder", val(sw.get("releases"))),
        ("accounting check", f"{str(acc.get('status', 'n/a')).upper()}: {acc.get('line', '')}"),
        ("tables", "recomputed from the store" + TABLES_JSON.get(str(sw.get("tables_json")), "")),
    ]
    pairs += [
        (label, str(spec[k]))
        for k, label in (("description", "spec"), ("source", "spec source"))
        if spec.get(k)
    ]
    return Block("kv", caption=f"Sweep {sw['name']}", pairs=pairs)


def _budget_blocks(bud: list[dict]) -> list[Block]:
    if not bud:
        none = "No release below this sweep's folder (e.g. a selftest sweep): nothing to account."
        return [p(none)]
    caption = (
        "Budget of this sweep: every task is a separate release on the same partition, so they compose "
        "(recomputed from the releases' stored events)"
    )
    return [columns(caption, BUDGET_COLUMNS, bud)] + [p(b["sentence"]) for b in bud]


def _ledger_tables(led: dict) -> list[Block]:
    comp = led.get("composition") or []
    summ = [r for r in led.get("summary") or [] if r.get("partition") != "*"]
    out = []
    if comp:
        caption = "What the ledger recorded for this sweep (its stored events, composed)"
        out.append(columns(caption, LEDGER_COMPOSITION_COLUMNS, comp))
    if summ:
        caption = "The ledger's own summary of this sweep (ledger summary --sweep)"
        out.append(columns(caption, LEDGER_SUMMARY_COLUMNS, summ))
    return out


def _ledger_blocks(sw: dict) -> list[Block]:
    led = sw.get("ledger")
    if not isinstance(led, dict) or led.get("error"):
        return []
    total = (sw.get("releases") or 0) + len(sw.get("missing_releases") or [])
    recorded = (
        f"Ledger {led['ledger']} has recorded {led['recorded']} of the {total} "
        f"releases of this sweep; {led['tagged']} ledger entries carry the sweep's tag; {led['voided']} voided."
    )
    return [p(recorded)] + _ledger_tables(led)


def _problem_blocks(sw: dict) -> list[Block]:
    """The releases whose accounting fails and the failed tasks (the first 50)."""
    out = []
    mm = (sw.get("accounting") or {}).get("mismatches") or []
    if mm:
        caption = "Releases of this sweep whose accounting does NOT check out"
        out.append(columns(caption, MISMATCH_COLUMNS, mm))
    fails = sw.get("failures") or []
    if fails:
        caption = f"Failed tasks ({len(fails)}; retried only with --retry-failed)"
        out.append(columns(caption, FAILED_TASK_COLUMNS, fails[:50]))
    return out


def _one_sweep(sw: dict) -> list[Block]:
    out = [Block("h3", text=f"Sweep {sw['name']}"), _sweep_card(sw)]
    if sw.get("error"):
        still = "no tables; its releases are still checked and composed"
        out.append(p(f"The sweep store could not be read ({sw['error']}): {still}."))
    out += _budget_blocks(sw.get("budget") or []) + _ledger_blocks(sw) + _problem_blocks(sw)
    return out + (_sweep_table_blocks(sw["tables"]) if sw.get("tables") else [])


def sweep_blocks(report: dict) -> list[Block]:
    return [b for sw in report["sections"].get("sweep") or [] for b in _one_sweep(sw)]
