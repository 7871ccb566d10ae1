"""Tables of a finished (or partly finished) sweep: JSON first (:func:`sweep_tables`), Markdown and HTML rendered from it.

What they hold is in docs/sweeps.md ("Tables"): cells, the private Holm family of paired contrasts and a separate non-private
one (a different experiment never enlarges or shrinks the paper's family), win/tie/loss, and the eps = 2 accuracy slice beside
the published Tables 3, 5 and 9, each row naming its source. A non-default preprocessing profile is kept apart (dataset
``"cardio (authors)"``). Metrics are stored as fractions; accuracy is shown in percent like the paper."""

from __future__ import annotations

import html
import math
from typing import Iterable, Sequence

from .published import (
    TABLE3,
    TABLE3_CITATION,
    TABLE3_COLUMN_LABELS,
    TABLE3_EPSILON,
    TABLE3_ROW_LABELS,
    TABLE5_CITATION,
    TABLE5_DP_ELM,
    TABLE5_EPSILON,
    TABLE5_NOTE,
    TABLE5_ROW_LABELS,
    TABLE9_ATTENTION,
    TABLE9_NOTE,
)
from .stats import (
    PRIMARY_METRICS,
    cells,
    eps_key,
    min_attainable_pvalue,
    paired_contrasts,
    summarize,
    win_tie_loss,
)

NOTES = (
    "Mean +/- sample SD over training seeds; 95% Student-t intervals (n-1 degrees of freedom) describe "
    "seed variability on a fixed public test partition, not population uncertainty.",
    "Paired contrasts align seeds within each dataset-budget condition; exact two-sided sign-flip tests over "
    "all 2^n sign assignments (n = 5 seeds: smallest attainable p = 0.0625, so p < 0.05 is impossible); "
    "Holm adjustment across the whole reported family.",
    "Win/tie/loss counts are descriptive; absence of significance is not evidence of equivalence.",
    "The Holm family covers private conditions only; non-private references (no clipping, no noise) are "
    "contrasted in a separate family.",
    "DP-ELM (dp-elm-L*) is the closed-form Laplace mechanism with a pure-DP guarantee (delta = 0): "
    "not an equal-guarantee, equal-width or equal-loss comparison with the DP-SGD models (paper, Table 5).",
    "Each task is a separate private release on the same training partition: the sweep's composed privacy "
    "cost is far above any single run's epsilon (see `dpaudit ledger summary`).",
)


def _eps_label(e) -> str:
    return "non-private" if e is None else f"{e:g}"


def _fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _pm(mean: float, sd: float | None, digits: int = 2) -> str:
    return (
        f"{_fmt(mean, digits)} (n=1)"
        if sd is None or math.isnan(sd)
        else f"{_fmt(mean, digits)} ± {_fmt(sd, digits)}"
    )


def dataset_label(dataset: str, profile: str | None) -> str:
    """The dataset of a cell: its name, plus the profile when it is not the default one."""
    return dataset if profile is None else f"{dataset} ({profile})"


def _by_profile(records: Iterable[dict]) -> list[dict]:
    """Records whose dataset names the profile, so cells and contrasts never mix two profiles."""
    return [
        r
        if r.get("profile") is None
        else {**r, "dataset": dataset_label(r["dataset"], r["profile"])}
        for r in records
    ]


#: Published values a slice row is compared with, in order: (table[model][dataset], source, budget it was published at; None:
#: compared at any budget).
_PUBLISHED = (
    (TABLE3, "Table 3", None),
    ({"dp-attention": TABLE9_ATTENTION}, TABLE9_NOTE, TABLE3_EPSILON),
    (
        {m: TABLE5_DP_ELM[int(m.rsplit("L", 1)[1])] for m in TABLE5_ROW_LABELS},
        TABLE5_NOTE,
        TABLE5_EPSILON,
    ),
)


def _published(model: str, dataset: str, epsilon: float) -> tuple[tuple | None, str | None]:
    """(mean, SD) of ``model`` on ``dataset`` in the first published table that has it, and its source."""
    for table, source, at in _PUBLISHED:
        pub = table.get(model, {}).get(dataset) if at is None or math.isclose(epsilon, at) else None
        if pub:
            return pub, source
    return None, None


def _accuracy_by_cell(records: Iterable[dict], epsilon: float) -> dict:
    """{(model, (dataset, profile)): {seed: accuracy %}} of the finite accuracies at ``epsilon``."""
    by: dict = {}
    for r in records:
        acc = (
            r.get("metrics", {}).get("accuracy")
            if r["epsilon"] is not None and math.isclose(r["epsilon"], epsilon)
            else None
        )
        if acc is not None and math.isfinite(float(acc)):
            by.setdefault((r["model"], (r["dataset"], r.get("profile"))), {})[int(r["seed"])] = (
                100.0 * float(acc)
            )
    return by


def _slice_row(model: str, dataset: str, profile: str | None, epsilon: float, by: dict):
    """The slice row of ``model`` on (``dataset``, ``profile``): our seeds' accuracies (``by``) beside
    the published value; None when neither exists."""
    ours = by.get((model, (dataset, profile)))
    pub, source = _published(model, dataset, epsilon)
    if not (ours or pub):
        return None
    row = {
        "model": model,
        "label": TABLE3_ROW_LABELS.get(model) or TABLE5_ROW_LABELS.get(model, model),
        "dataset": dataset,
        **({} if profile is None else {"profile": profile}),
        "published_mean": pub[0] if pub else None,
        "published_sd": pub[1] if pub else None,
        "published_source": source,
        "mean": None,
        "sd": None,
        "n": 0,
        "seeds": [],
        "difference": None,
    }
    if ours:
        s = summarize(list(ours.values()))
        row.update(
            mean=s.mean,
            sd=s.sd,
            n=s.n,
            seeds=sorted(ours),
            ci_low=s.ci_low,
            ci_high=s.ci_high,
            difference=s.mean - pub[0] if pub else None,
        )
    return row


def _slice_axes(by: dict) -> tuple[list[str], list[tuple]]:
    """Rows: every Table 3 model, the DP-ELM widths when any ran, then the other models that ran;
    columns: only the (dataset, profile) pairs with results (all published models shown for them)."""
    ran = {m for m, _ in by}
    elm = list(TABLE5_ROW_LABELS) if ran & set(TABLE5_ROW_LABELS) else []
    order = {d: i for i, d in enumerate(TABLE3_COLUMN_LABELS)}
    return (
        list(TABLE3_ROW_LABELS) + elm + sorted(ran - set(TABLE3_ROW_LABELS) - set(elm)),
        sorted(
            {d for _, d in by},
            key=lambda dp: (order.get(dp[0], len(order)), dp[0], dp[1] is not None, dp[1] or ""),
        ),
    )


def table3_slice(records: Iterable[dict], *, epsilon: float = TABLE3_EPSILON) -> dict:
    """The eps = 2 accuracy slice (percent) beside the published Table 3 values. Every Table 3 model is listed for each dataset
    the slice has results for (``not run`` where missing); the DP-ELM widths are listed next to Table 5 when the sweep has any
    DP-ELM result at this budget; other models (e.g. the attention control, Table 9) only where they ran."""
    by = _accuracy_by_cell(records, epsilon)
    models, datasets = _slice_axes(by)
    rows = [_slice_row(m, d, profile, epsilon, by) for m in models for d, profile in datasets]
    rows = [r for r in rows if r is not None]
    citation = TABLE3_CITATION + (
        " " + TABLE5_CITATION if any(r["published_source"] == TABLE5_NOTE for r in rows) else ""
    )
    return {"epsilon": epsilon, "metric": "accuracy (%)", "citation": citation, "rows": rows}


def _reference_and_metrics(
    records: list[dict], reference: str, metrics: Sequence[str]
) -> tuple[str, list[str]]:
    """The reference model (else the first model, e.g. of a selftest sweep) and the metrics the records have."""
    models = sorted({r["model"] for r in records})
    present = {k for r in records for k in r.get("metrics", {})}
    return reference if reference in models or not models else models[0], [
        m for m in metrics if m in present
    ]


def _families(records: list[dict], reference: str, metrics: list[str]) -> tuple[list, list]:
    """The two Holm families: private conditions (the paper's primary family) and non-private ones."""
    private = [r for r in records if r["epsilon"] is not None]
    non_private = [r for r in records if r["epsilon"] is None]
    return (
        paired_contrasts(private, reference=reference, metrics=metrics),
        paired_contrasts(non_private, reference=reference, metrics=metrics) if non_private else [],
    )


def sweep_tables(
    records: Iterable[dict],
    *,
    metrics: Sequence[str] = PRIMARY_METRICS,
    reference: str = "dp-rvfl",
    name: str | None = None,
) -> dict:
    """All tables of a sweep as one JSON-able dict (see the module docstring)."""
    original = list(records)
    records = _by_profile(original)
    reference, use_metrics = _reference_and_metrics(records, reference, metrics)
    contrasts, np_contrasts = _families(records, reference, use_metrics)
    return {
        "sweep": name,
        "tasks_with_results": len(records),
        "metrics": use_metrics,
        "reference": reference,
        "cells": _dicts(c for m in use_metrics for c in cells(records, m)),
        "contrasts": _dicts(contrasts),
        "contrast_family_size": len(contrasts),
        "min_attainable_p": {
            str(n): min_attainable_pvalue(n)
            for n in sorted({c.n for c in contrasts + np_contrasts})
        },
        "win_tie_loss": _dicts(win_tie_loss(contrasts)),
        "non_private_contrasts": _dicts(np_contrasts),
        "non_private_family_size": len(np_contrasts),
        "table3": table3_slice(original),
        "notes": list(NOTES),
    }


def _dicts(items: Iterable) -> list[dict]:
    return [x.to_dict() for x in items]


# ---- Rows of the rendered tables (Markdown and HTML render the same cells)

T3_HEADER = ["model", "dataset", "dpaudit", "seeds", "published", "difference"]
CONTRAST_HEADER = [
    "dataset",
    "eps",
    "metric",
    "contrast",
    "n",
    "mean diff",
    "p (sign-flip)",
    "p (Holm)",
    "W/T/L seeds",
]


def _t3_cells(r: dict, unpublished: str) -> list[str]:
    pub = (
        unpublished if r["published_mean"] is None else _pm(r["published_mean"], r["published_sd"])
    )
    if r["published_mean"] is not None and r.get("published_source") not in (None, "Table 3"):
        pub += f" ({r['published_source']})"
    return [
        r["label"],
        dataset_label(TABLE3_COLUMN_LABELS.get(r["dataset"], r["dataset"]), r.get("profile")),
        "not run" if r["mean"] is None else _pm(r["mean"], r["sd"]),
        str(r["n"]),
        pub,
        "" if r["difference"] is None else f"{r['difference']:+.2f}",
    ]


def _contrast_cells(c: dict) -> list[str]:
    return [
        c["dataset"],
        _eps_label(c["epsilon"]),
        c["metric"],
        f"{c['reference']} − {c['comparator']}",
        str(c["n"]),
        f"{c['mean_difference']:+.4f}",
        f"{c['p_value']:.4f}",
        f"{c['p_holm']:.4f}",
        f"{c['wins']}/{c['ties']}/{c['losses']}",
    ]


def _cell_text(c: dict | None, metric: str) -> str:
    if c is None:
        return ""
    scale, digits = (100.0, 2) if metric == "accuracy" else (1.0, 3)
    s = c["summary"]
    return _pm(scale * s["mean"], scale * s["sd"], digits) + f" (n={s['n']})"


# ---- Markdown


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def table3_markdown(t3: dict) -> str:
    head = f"Accuracy (%) at eps = {t3['epsilon']:g}, mean ± SD over seeds, next to the published values.\n\nSource: {t3['citation']}\n\n"
    return head + _md_table(T3_HEADER, [_t3_cells(r, "not in Table 3") for r in t3["rows"]])


def cells_markdown(cell_rows: list[dict], metric: str) -> str:
    cell = {(c["dataset"], c["model"], c["epsilon"]): c for c in cell_rows if c["metric"] == metric}
    if not cell:
        return f"(no results for {metric})"
    epsilons = sorted({e for _, _, e in cell}, key=eps_key)
    pairs = sorted({key[:2] for key in cell})
    lines = [
        [ds, model] + [_cell_text(cell.get((ds, model, e)), metric) for e in epsilons]
        for ds, model in pairs
    ]
    unit = " (%)" if metric == "accuracy" else ""
    return _md_table(
        [f"dataset ({metric}{unit})", "model"] + [f"eps={_eps_label(e)}" for e in epsilons], lines
    )


def contrasts_markdown(contrast_rows: list[dict], *, limit: int | None = None) -> str:
    return _md_table(CONTRAST_HEADER, [_contrast_cells(c) for c in contrast_rows[:limit]])


def win_tie_loss_markdown(wtl: list[dict]) -> str:
    keys = ("reference", "comparator", "metric", "wins", "ties", "losses", "conditions")
    rows = [[str(w[k]) for k in keys] for w in wtl]
    return _md_table(
        ["reference", "comparator", "metric", "higher", "tied", "lower", "conditions"], rows
    )


def render_markdown(tables: dict) -> str:
    """The whole sweep report in Markdown (rendered from the JSON of :func:`sweep_tables`)."""
    sections = [("Table 3 slice", table3_markdown(tables["table3"]))]
    sections += [(f"{m} per cell", cells_markdown(tables["cells"], m)) for m in tables["metrics"]]
    if tables["contrasts"]:
        size = tables["contrast_family_size"]
        sections += [
            (
                f"Paired contrasts ({size} in the Holm family)",
                contrasts_markdown(tables["contrasts"]),
            ),
            (
                "Win/tie/loss across conditions (by mean)",
                win_tie_loss_markdown(tables["win_tie_loss"]),
            ),
        ]
    if tables.get("non_private_contrasts"):
        title = f"Non-private paired contrasts ({tables['non_private_family_size']} in their own Holm family)"
        sections.append((title, contrasts_markdown(tables["non_private_contrasts"])))
    parts = [
        f"# Sweep {tables.get('sweep') or ''}".rstrip(),
        "",
        f"{tables['tasks_with_results']} finished tasks.",
        "",
    ]
    for title, body in sections:
        parts += [f"## {title}", "", body, ""]
    parts += ["## Notes", ""] + [f"- {n}" for n in tables["notes"]]
    return "\n".join(parts) + "\n"


# ---- HTML fragment (for the reviewer report; no scripts, no external resources)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(tables: dict) -> str:
    """An HTML fragment (tables only) that a report can embed; all text is escaped."""
    e = html.escape
    t3 = tables["table3"]
    parts = [
        f"<section class='sweep'><h2>Sweep {e(str(tables.get('sweep') or ''))}</h2>",
        f"<h3>Accuracy (%) at eps = {t3['epsilon']:g} next to Table 3</h3><p>{e(t3['citation'])}</p>",
        _html_table(T3_HEADER, [_t3_cells(r, "—") for r in t3["rows"]]),
    ]
    families = [
        ("contrasts", f"Paired contrasts (Holm family of {tables['contrast_family_size']})"),
        (
            "non_private_contrasts",
            f"Non-private paired contrasts (own Holm family of {tables.get('non_private_family_size', 0)})",
        ),
    ]
    for key, title in ((k, t) for k, t in families if tables.get(k)):
        parts += [
            f"<h3>{e(title)}</h3>",
            _html_table(CONTRAST_HEADER, [_contrast_cells(c) for c in tables[key]]),
        ]
    parts += ["<ul>" + "".join(f"<li>{e(n)}</li>" for n in tables["notes"]) + "</ul></section>"]
    return "\n".join(parts)
