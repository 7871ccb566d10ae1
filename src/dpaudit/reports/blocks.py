"""The report model laid out as blocks (paragraphs, tables, key-value cards, code, figures): HTML
and Markdown render the same blocks, so both show the same numbers in the same order. Only
:mod:`.model` decides *what* the numbers are; the blocks decide how they are worded and rounded.
"""

from __future__ import annotations

import json
from typing import Any

from ..audit_outputs import NOT_COVERED
from .audit_blocks import audit_blocks
from .budget import release_id
from .format import DASH, Block, columns, composition_columns, f, g, ms, p, table, text, val
from .model import SECTIONS
from .utility import ordered_metrics
from .verdict import summary_rows
from .sweep_blocks import sweep_blocks


#: The captions of the budget and utility tables.
CAPTIONS = {
    "summary": "Ledger summary for the datasets in this report: partition * is the whole dataset "
    "(sequential within a partition, parallel across disjoint partitions); epsilon = the tightest "
    "bound",
    "details": "Ledger summary, details: each accountant's epsilon, voided releases and the audits' "
    "own epsilon",
    "composition": "Composition of the releases in this report (recomputed from their stored "
    "events; a cross-check, not the ledger)",
    "utility": "Test metrics, mean ± SD over seeds (sample SD; n = number of releases)",
}
#: A row's verdict as the first table words it.
VERDICT_WORDS = {
    "violation": "VIOLATION",
    "accounting-mismatch": "ACCOUNTING MISMATCH",
    "inconclusive": "INCONCLUSIVE",
    "not-audited": "NOT AUDITED",
    "no-evidence": "no evidence of a violation",
    "no-claim": "no claim (non-private)",
}
FIRST_HEADERS = [
    "release",
    "claim (eps, delta, adjacency, accountant)",
    "audited by (plan, statistic)",
    "eps_LB (ceiling)",
    "verdict",
]


def _first_row(r: dict) -> list[str]:
    many = f"{len(r['audits'])} audits: " if len(r["audits"]) > 1 else ""
    audited = many + (f"{_plans_cell(r)}; {', '.join(r['statistics'])}" if r["statistics"] else "—")
    lb, ceiling = r["epsilon_lower_bound"], r["ceiling"]
    bound = DASH if lb is None else f(lb) + (f" ({f(ceiling, 2)})" if ceiling is not None else "")
    return [
        f"{r['mechanism']} " + (str(r["release"])[:8] if r["release"] else "(no release)"),
        _claim_cell(r),
        audited,
        bound,
        VERDICT_WORDS.get(r["status"], r["status"]) + (f": {r['reason']}" if r["reason"] else ""),
    ]


def _claim_cell(r: dict) -> str:
    if r["epsilon"] is None:
        return "no claim"
    named = [str(x) for x in (r["adjacency"], r["accountant"]) if x]
    return ", ".join([f"eps {f(r['epsilon'])}", f"delta {g(r['delta'])}", *named])


def _plans_cell(r: dict) -> str:
    """The plans behind a row (how many runs of each when more than one)."""
    runs = r.get("plan_runs") or {}

    def plan(x) -> str:
        if not x:
            return "plan —"
        return (f"{runs[x]} runs of " if runs.get(x, 1) > 1 else "") + f"plan {str(x)[:12]}"

    return ", ".join(plan(x) for x in r["plans"]) or "plan —"


#: What the verdict words and statistics mean (below the verdict lines).
VERDICT_LEGEND = (
    "VIOLATION: an audit certified (at its confidence) that the claim is false. “No evidence” is no proof of privacy: it is "
    "bounded by the audit's ceiling and attack. claimed-curve: the audit's confidence box tested against the claim's whole "
    "trade-off curve; clopper-pearson: one (eps, delta) point."
)


def verdict_blocks(report: dict) -> list[Block]:
    vs = report["sections"]["verdict"]
    if not vs:
        return [p("No mechanism found among the inputs.")]
    return (
        [table("Verdict per release", FIRST_HEADERS, [_first_row(r) for r in summary_rows(vs)])]
        + [Block("verdict", text=v["line"], status=v["status"]) for v in vs]
        + [p(VERDICT_LEGEND)]
    )


def _commit(c: dict) -> str:
    return f"{c['dpaudit_version']} / {text(c['git_commit'])[:12]}"


def _claim_pairs(c: dict) -> list[tuple[str, str]]:
    chk = c["accounting_check"]
    check = chk["status"].upper() + (f": {chk['message']}" if chk["message"] else "")
    return [
        ("privacy unit / adjacency", f"{c['privacy_unit']} / {c['adjacency']}"),
        ("accountant (claim)", str(c["accountant"])),
        ("target (epsilon, delta)", f"({f(c['target_epsilon'], 4)}, {g(c['delta'])})"),
        ("achieved (epsilon, delta)", f"({f(c['epsilon'], 4)}, {g(c['delta'])})"),
        ("accounting check", check),
        ("noise multiplier (std / clipping norm)", f(c["noise_multiplier"], 4)),
        ("sample rate (Poisson q)", g(c["sample_rate"])),
        ("steps executed / accounted", f"{val(c['steps_executed'])} / {val(c['steps_accounted'])}"),
        ("clipping norm (L2)", g(c["clipping_norm"])),
        ("normaliser", val(c["normalizer"])),
        ("noise source", c["noise_source_label"]),
        ("sampler", val(c["sampler"])),
        ("dataset / partition", f"{c['dataset']} / {c['partition']}"),
        ("public seed", val(c["seed"])),
        ("dpaudit version / commit", _commit(c)),
        ("created", str(c["created_at"])),
    ]


def _four_digits(x: Any) -> str:
    return f(x, 4)


EPSILON_COLUMNS = [
    ("accountant", None, lambda e: e["accountant"] + (" (claim)" if e.get("claimed_with") else "")),
    ("epsilon (recomputed)", "epsilon", _four_digits),
    ("lower", "lower", _four_digits),
    ("estimate", "estimate", _four_digits),
    ("stored in release", "stored", _four_digits),
    ("note", "error", lambda error: error or ""),
]


def _card(c: dict) -> list[Block]:
    head = f"{c['mechanism']} — release {str(c['release_id'])[:12]}"
    if c["non_private"]:
        pairs = [
            ("dataset / partition", f"{c['dataset']} / {c['partition']}"),
            ("seed", val(c["seed"])),
            ("dpaudit version / commit", _commit(c)),
        ]
        return [Block("kv", caption=head + " (non-private: no privacy claim)", pairs=pairs)]
    caption = (
        f"Epsilon of the same events at delta = {g(c['delta'])}, recomputed by each accountant"
    )
    return [
        Block("kv", caption=head, pairs=_claim_pairs(c)),
        columns(caption, EPSILON_COLUMNS, c["epsilons"]),
    ]


def claim_blocks(report: dict) -> list[Block]:
    out = [b for c in report["sections"]["claim"] for b in _card(c)]
    if out:
        return out
    if report["sections"].get("sweep"):
        where = (
            "summarised in the Sweep section (every one accounting-checked), not carded one by one"
        )
        return [p(f"The releases of the sweep(s) are {where}.")]
    return [p("No release among the inputs: the verdict rests on the audits' own claimed epsilon.")]


def _listed(xs: Any) -> str:
    return ", ".join(map(str, xs or [])) or DASH


def _dataset_blocks(d: dict) -> list[Block]:
    sizes = d.get("split_sizes")
    sizes_s = (
        ", ".join(f"{k} {v}" for k, v in sizes.items()) if isinstance(sizes, dict) else val(sizes)
    )
    files = d.get("source_files") or []
    kind = " / ".join(val(d.get(k)) for k in ("kind", "n_features", "n_classes"))
    pairs = [
        ("data version(s) in the ledger", _listed(d.get("data_versions"))),
        ("kind / features / classes", kind),
        ("preprocessing profile", val(d.get("profile"))),
        ("split sizes", sizes_s or DASH),
        ("split seed(s)", _listed(d.get("split_seeds"))),
        ("partitions used", _listed(d.get("partitions"))),
        ("releases / audits", f"{len(d.get('releases') or [])} / {len(d.get('audits') or [])}"),
    ]
    listed = f"Source files of {d['name']}: {', '.join(map(str, files))}."
    unlisted = f"{d['name']}: no source files recorded (embedded or synthetic data)."
    return [
        Block("kv", caption=f"Dataset {d['name']}", pairs=pairs),
        p(listed if files else unlisted),
    ]


#: Why the provenance shows no hash of the data, and shows its sizes.
PROVENANCE_NOTE = (
    "Releases publish no hash of the private data (it would tell neighbouring datasets apart); "
    "nor a fingerprint of it: the data version above is a label the ledger gives each distinct "
    "data identity under a name. Sizes are shown because the guarantee treats them as public "
    "(the sampling rate q = batch / N is published)."
)


def provenance_blocks(report: dict) -> list[Block]:
    out = [b for d in report["sections"]["provenance"] for b in _dataset_blocks(d)]
    if not out:
        return [p("No dataset identity recorded in the inputs.")]
    return out + [p(PROVENANCE_NOTE)]


#: The ledger summary on screen: what a reviewer signs (spent, cap, remaining); the rest of a row is
#: in a second table below, keyed by the same dataset and partition, so neither needs to break words.
SUMMARY_COLUMNS = (
    "dataset partition adjacency releases_subtree epsilon bound_by delta cap remaining audits "
    "epsilon_with_audits"
).split()
SUMMARY_DETAIL_COLUMNS = (
    "dataset partition non_private_releases epsilon_rdp epsilon_prv epsilon_pure naive_epsilon "
    "voided_releases audit_epsilon voided_epsilon voided_published_releases"
).split()
SUMMARY_LABELS = {
    "audits": "audits",
    "audit_epsilon": "audits' eps",
    "epsilon_with_audits": "eps with audits",
    "releases_subtree": "releases",
    "non_private_releases": "non-private",
    "epsilon": "composed eps",
    "bound_by": "bound by",
    "epsilon_rdp": "eps (rdp)",
    "epsilon_prv": "eps (prv)",
    "epsilon_pure": "eps (pure)",
    "naive_epsilon": "naive sum of eps",
    "voided_releases": "voided",
    "voided_epsilon": "voided eps (not counted)",
    "voided_published_releases": "voided but published (counted)",
}
ENTRY_COLUMNS = (
    "seq kind release_id mechanism partition epsilon delta accountant non_private voided_by "
    "created_at"
).split()

COMPOSITION_COLUMNS = composition_columns("dataset partition adjacency", prv=("prv", f))


def _cap(cap: Any) -> str:
    if isinstance(cap, dict):
        audits = ", audits included" if cap.get("include_audits") else ""
        return f"{f(cap.get('epsilon'))} at delta {g(cap.get('delta'))}{audits}"
    return val(cap) if cap is not None else "none"


def _table_of(rows: list[dict], preferred: list[str]) -> tuple[list[str], list[list[str]]]:
    """Columns: the preferred ones present (in order); every column when none is (an unknown row shape is shown whole)."""
    cols = [c for c in preferred if any(c in r for r in rows)]
    cols = cols or list(dict.fromkeys(k for r in rows for k in r))
    return cols, [[val(r.get(c)) for c in cols] for r in rows]


def _integrity(ver: Any) -> str:
    if not isinstance(ver, dict):
        return ""
    return " — hash chain intact" if ver.get("ok") else " — INTEGRITY CHECK FAILED (see notes)"


def _summary_blocks(summary: list[dict]) -> list[Block]:
    """The ledger summary table, and its details table when the rows carry them."""
    if not summary:
        return []
    cols, rows = _table_of([dict(r, cap=_cap(r.get("cap"))) for r in summary], SUMMARY_COLUMNS)
    out = [table(CAPTIONS["summary"], [SUMMARY_LABELS.get(c, c) for c in cols], rows)]
    known = set(SUMMARY_COLUMNS) | set(SUMMARY_DETAIL_COLUMNS) | {"cap"}
    if set(cols) <= known and any(c in r for r in summary for c in SUMMARY_DETAIL_COLUMNS[2:]):
        dcols, drows = _table_of(summary, SUMMARY_DETAIL_COLUMNS)
        out.append(table(CAPTIONS["details"], [SUMMARY_LABELS.get(c, c) for c in dcols], drows))
    return out


#: What the ledger summary's audit columns hold.
AUDITS_NOTE = (
    "audits: the audits recorded on the dataset (their trials train on the private data); audits' eps: "
    "what their trials compose to; eps with audits: releases and audits composed together. A cap "
    "counts releases only unless it says audits included. "
)


def _ledger_blocks(report: dict, b: dict) -> list[Block]:
    out = [p(f"Ledger: {b['ledger']}{_integrity(b.get('verify'))}"), *_summary_blocks(b["summary"])]
    if any(r.get("audits") for r in b["summary"]):
        out.append(p(AUDITS_NOTE + NOT_COVERED))
    entries, folded = _fold_sweep_entries(report, b["entries"])
    if entries:
        caption = "Ledger entries of these datasets (append-only)"
        out.append(table(caption, *_table_of(entries, ENTRY_COLUMNS)))
    where = "are summarised in the Sweep section (all are in the JSON report)"
    return out + [p(f"{k} ledger entries of sweep {name} {where}.") for name, k in folded.items()]


def budget_blocks(report: dict) -> list[Block]:
    b = report["sections"]["budget"]
    out = _ledger_blocks(report, b) if b.get("available") else []
    comp = b.get("composition") or []
    if comp:
        out.append(columns(CAPTIONS["composition"], COMPOSITION_COLUMNS, comp))
    return out or [p("No private release and no ledger: nothing to account.")]


def _sweep_of_entry(e: dict, by_id: dict[str, str], names: set[str]) -> str | None:
    """The sweep of this report a ledger release entry belongs to (by release id, else by its tag)."""
    rid, tag = release_id(e), e.get("sweep")
    if rid is None:
        return None
    tag = tag.get("name") if isinstance(tag, dict) else tag
    return by_id.get(rid) or (tag if tag in names else None)


def _fold_sweep_entries(report: dict, entries: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """Ledger entries minus those of the sweeps in this report (hundreds of rows a reviewer reads
    as one summary), and how many were folded per sweep."""
    sweeps = report["sections"].get("sweep") or []
    by_id = {rid: sw["name"] for sw in sweeps for rid in sw.get("release_ids") or []}
    names = {sw["name"] for sw in sweeps}
    kept, folded = [], {}
    for e in entries:
        name = _sweep_of_entry(e, by_id, names) if sweeps else None
        if name is None:
            kept.append(e)
        else:
            folded[name] = folded.get(name, 0) + 1
    return kept, folded


def utility_blocks(report: dict) -> list[Block]:
    u = report["sections"]["utility"]
    rows = u["rows"]
    if not rows and report["sections"].get("sweep"):
        return [p("The utility of the sweep(s) is in their tables (Sweep section).")]
    if not rows:
        return [p("No release among the inputs: no utility to report.")]
    names = ordered_metrics(m for r in rows for m in r["metrics"])
    cells = [
        [r["mechanism"], r["dataset"], "non-private" if r["non_private"] else f(r["epsilon"])]
        + [val(r["n"])]
        + [ms(r["metrics"].get(m)) for m in names]
        for r in rows
    ]
    none = p("No privacy-utility curve: no group of releases differing only in epsilon.")
    curves = Block("figures", figures=["utility"]) if u["curves"] else none
    headers = ["mechanism", "dataset", "epsilon", "n"] + names
    return [table(CAPTIONS["utility"], headers, cells), curves]


REPRODUCE_KINDS = {
    "release": "Release",
    "audit": "Audit",
    "sweep": "Sweep",
    "report": "This report",
}


def _reproduce_head(r: dict) -> str:
    what = REPRODUCE_KINDS.get(r["kind"], r["kind"])
    head = f"{what}: {r['mechanism']}" if r.get("mechanism") else what
    if r.get("id"):
        head += f" ({r['id']})" if r["kind"] == "sweep" else f" ({str(r['id'])[:12]})"
    return head


def _reproduce_meta(r: dict) -> list[str]:
    meta = [f"directory {r['path']}"] if r.get("path") else []
    meta += [f"seed {val(r['seed'])}"] if r.get("seed") is not None else []
    meta += [f"noise: {r['noise']}"] if r.get("noise") else []
    return meta + ([f"commit {str(r['git_commit'])[:12]}"] if r.get("git_commit") else [])


def _reproduce_code(r: dict) -> str:
    if r["command"]:
        return r["command"]
    if not r.get("parameters"):
        return "# command not recorded"
    params = dict(r["parameters"])
    cfg = params.pop("config", None)
    lines = ["# command not recorded; the audit's recorded parameters:"]
    lines += [f"#   {k} = {json.dumps(v, default=str)}" for k, v in sorted(params.items())]
    if cfg is not None:
        lines.append("#   config = " + json.dumps(cfg, sort_keys=True, default=str))
    return "\n".join(lines)


#: What a re-run reproduces.
RERUN_NOTE = (
    "With secret (default) noise a re-run reproduces the configuration, data and public randomness, "
    "not the exact noise draw; metrics agree up to that noise."
)


def reproduce_blocks(report: dict) -> list[Block]:
    out = []
    for r in report["sections"]["reproduce"]:
        meta = _reproduce_meta(r)
        out.append(Block("h3", text=_reproduce_head(r)))
        out += [p("; ".join(meta))] if meta else []
        out.append(Block("code", text=_reproduce_code(r)))
    return out + [p(RERUN_NOTE)]


BUILDERS = {
    "verdict": verdict_blocks,
    "claim": claim_blocks,
    "provenance": provenance_blocks,
    "budget": budget_blocks,
    "sweep": sweep_blocks,
    "utility": utility_blocks,
    "audit": audit_blocks,
    "reproduce": reproduce_blocks,
}


def sections_of(report: dict) -> list[tuple[str, str]]:
    """(key, heading) of the report's sections: the seven, plus "Sweep" after "Budget" (and
    renumbered) when the report covers a sweep."""
    if not report["sections"].get("sweep"):
        return list(SECTIONS)
    keys = [(k, h.split(". ", 1)[-1]) for k, h in SECTIONS]
    at = [k for k, _ in keys].index("budget") + 1
    keys.insert(at, ("sweep", "Sweep"))
    return [(k, f"{i}. {h}") for i, (k, h) in enumerate(keys, 1)]


def layout(report: dict) -> list[tuple[str, str, list[Block]]]:
    """(section key, heading, blocks) for every section, its notes first (in the verdict section: after the first table)."""

    def notes(*sections: str) -> list[Block]:
        ns = [n for n in report.get("notes", []) if n.get("section") in sections]
        return [Block("notes", notes=ns)] if ns else []

    out = []
    for key, heading in sections_of(report):
        blocks = BUILDERS[key](report)
        at = 1 if key == "verdict" and blocks and blocks[0].kind == "table" else 0
        noted = notes(*(("inputs", key) if key == "verdict" else (key,)))
        out.append((key, heading, blocks[:at] + noted + blocks[at:]))
    return out
