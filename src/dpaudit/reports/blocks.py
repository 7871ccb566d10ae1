"""The report model laid out as blocks (paragraphs, tables, key-value cards, code, figures).

HTML and Markdown render the same blocks, so both formats always show the same numbers in
the same order. Only :mod:`.model` decides *what* the numbers are; this module decides how
they are worded and rounded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..audit_outputs import NOT_COVERED
from .inputs import num
from .model import METRIC_ORDER, SECTIONS

DASH = "n/a"


@dataclass
class Block:
    kind: str  # p | verdict | table | kv | code | figures | notes | h3
    text: str = ""
    status: str = ""
    caption: str = ""
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # figure names (section-local order)
    notes: list[dict] = field(default_factory=list)


def f(x: Any, digits: int = 3) -> str:
    """A number for people: None -> n/a, inf -> inf, else ``digits`` significant decimals."""
    v = num(x)
    if v is None:
        return DASH if x is None else str(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v != 0 and (abs(v) < 10 ** -digits or abs(v) >= 1e6):
        return f"{v:.{digits}g}"
    if float(v).is_integer() and abs(v) < 1e6 and not isinstance(x, float):
        return str(int(v))
    return f"{v:.{digits}f}"


def g(x: Any) -> str:
    v = num(x)
    return DASH if v is None else f"{v:g}"


def ms(s: dict | None) -> str:
    """mean +/- SD (n seeds)."""
    if not s or num(s.get("mean")) is None:
        return DASH
    sd = num(s.get("sd"))
    n = s.get("n")
    return f"{f(s['mean'])} ± {f(sd)} (n={n})" if sd is not None else f"{f(s['mean'])} (n={n})"


def _val(v: Any) -> str:
    if v is None:
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) or num(v) is not None and not isinstance(v, str):
        return f(v, 4)
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _notes_for(report: dict, section: str) -> Block | None:
    ns = [n for n in report.get("notes", []) if n.get("section") == section]
    return Block("notes", notes=ns) if ns else None


def verdict_blocks(report: dict) -> list[Block]:
    vs = report["sections"]["verdict"]
    out = [Block("verdict", text=v["line"], status=v["status"]) for v in vs]
    if not vs:
        out.append(Block("p", text="No mechanism found among the inputs."))
    out.append(Block("p", text=(
        "A VIOLATION means an audit certified (at its stated confidence) a lower bound on epsilon above the claim. "
        "“No evidence of a violation” is not a proof of privacy: it is bounded by the audit's ceiling and attack strength. "
        "Each line names the statistic that decided it: claimed-curve (the audit's confidence box tested against the claim's whole "
        "trade-off curve, reported as the strongest member of the claim's family it rules out) or clopper-pearson (one (eps, delta) "
        "point, the statistic of audits without a claimed event and of older audit records).")))
    return out


def claim_blocks(report: dict) -> list[Block]:
    out = []
    for c in report["sections"]["claim"]:
        head = f"{c['mechanism']} — release {str(c['release_id'])[:12]}"
        if c["non_private"]:
            out.append(Block("kv", caption=head + " (non-private: no privacy claim)", pairs=[
                ("dataset / partition", f"{c['dataset']} / {c['partition']}"), ("seed", _val(c["seed"])),
                ("dpaudit version / commit", f"{c['dpaudit_version']} / {str(c['git_commit'] or DASH)[:12]}"),
            ]))
            continue
        chk = c["accounting_check"]
        pairs = [
            ("privacy unit / adjacency", f"{c['privacy_unit']} / {c['adjacency']}"),
            ("accountant (claim)", str(c["accountant"])),
            ("target (epsilon, delta)", f"({f(c['target_epsilon'], 4)}, {g(c['delta'])})"),
            ("achieved (epsilon, delta)", f"({f(c['epsilon'], 4)}, {g(c['delta'])})"),
            ("accounting check", f"{chk['status'].upper()}: {chk['message']}" if chk["message"] else chk["status"].upper()),
            ("noise multiplier (std / clipping norm)", f(c["noise_multiplier"], 4)),
            ("sample rate (Poisson q)", g(c["sample_rate"])),
            ("steps executed / accounted", f"{_val(c['steps_executed'])} / {_val(c['steps_accounted'])}"),
            ("clipping norm (L2)", g(c["clipping_norm"])),
            ("normaliser", _val(c["normalizer"])),
            ("noise source", c["noise_source_label"]),
            ("sampler", _val(c["sampler"])),
            ("dataset / partition", f"{c['dataset']} / {c['partition']}"),
            ("public seed", _val(c["seed"])),
            ("dpaudit version / commit", f"{c['dpaudit_version']} / {str(c['git_commit'] or DASH)[:12]}"),
            ("created", str(c["created_at"])),
        ]
        out.append(Block("kv", caption=head, pairs=pairs))
        rows = []
        for e in c["epsilons"]:
            rows.append([
                e["accountant"] + (" (claim)" if e.get("claimed_with") else ""),
                f(e["epsilon"], 4), f(e.get("lower"), 4), f(e.get("estimate"), 4), f(e.get("stored"), 4),
                e.get("error") or "",
            ])
        out.append(Block("table", caption=f"Epsilon of the same events at delta = {g(c['delta'])}, recomputed by each accountant",
                         headers=["accountant", "epsilon (recomputed)", "lower", "estimate", "stored in release", "note"], rows=rows))
    if not out and report["sections"].get("sweep"):
        out.append(Block("p", text="The releases of the sweep(s) are summarised in the Sweep section (every one accounting-checked), "
                                   "not carded one by one."))
    elif not out:
        out.append(Block("p", text="No release among the inputs: the verdict rests on the audits' own claimed epsilon."))
    return out


def provenance_blocks(report: dict) -> list[Block]:
    out = []
    for d in report["sections"]["provenance"]:
        sizes = d.get("split_sizes")
        sizes_s = ", ".join(f"{k} {v}" for k, v in sizes.items()) if isinstance(sizes, dict) else _val(sizes)
        fps = d.get("data_versions") or []
        out.append(Block("kv", caption=f"Dataset {d['name']}", pairs=[
            ("data version(s) in the ledger", ", ".join(map(str, fps)) or DASH),
            ("kind / features / classes", f"{_val(d.get('kind'))} / {_val(d.get('n_features'))} / {_val(d.get('n_classes'))}"),
            ("preprocessing profile", _val(d.get("profile"))),
            ("split sizes", sizes_s or DASH),
            ("split seed(s)", ", ".join(map(str, d.get("split_seeds") or [])) or DASH),
            ("partitions used", ", ".join(map(str, d.get("partitions") or [])) or DASH),
            ("releases / audits", f"{len(d.get('releases') or [])} / {len(d.get('audits') or [])}"),
        ]))
        files = d.get("source_files") or []
        if files:
            out.append(Block("p", text=f"Source files of {d['name']}: {', '.join(map(str, files))}."))
        else:
            out.append(Block("p", text=f"{d['name']}: no source files recorded (embedded or synthetic data)."))
    if out:
        out.append(Block("p", text="Releases publish no hash of the private data (it would tell neighbouring datasets apart); "
                                   "nor a fingerprint of it: the data version above is a label the ledger gives each distinct "
                                   "data identity under a name. Sizes are shown because the guarantee treats them as public "
                                   "(the sampling rate q = batch / N is published)."))
    if not out:
        out.append(Block("p", text="No dataset identity recorded in the inputs."))
    return out


SUMMARY_COLUMNS = ["dataset", "partition", "adjacency", "releases_subtree", "non_private_releases", "epsilon", "bound_by", "epsilon_rdp",
                   "epsilon_prv", "epsilon_pure", "naive_epsilon", "delta", "cap", "remaining", "voided_releases", "audits",
                   "audit_epsilon", "epsilon_with_audits", "voided_epsilon", "voided_published_releases"]
SUMMARY_LABELS = {"audits": "audits", "audit_epsilon": "audits' eps", "epsilon_with_audits": "eps with audits", "releases_subtree": "releases", "non_private_releases": "non-private", "epsilon": "composed eps", "bound_by": "bound by",
                  "epsilon_rdp": "eps (rdp)", "epsilon_prv": "eps (prv)", "epsilon_pure": "eps (pure)", "naive_epsilon": "naive sum of eps",
                  "voided_releases": "voided", "voided_epsilon": "voided eps (not counted)",
                  "voided_published_releases": "voided but published (counted)"}
ENTRY_COLUMNS = ["seq", "kind", "release_id", "mechanism", "partition", "epsilon", "delta", "accountant", "non_private", "voided_by",
                 "created_at"]


def _cap(cap: Any) -> str:
    if isinstance(cap, dict):
        return f"{f(cap.get('epsilon'))} at delta {g(cap.get('delta'))}" + (", audits included" if cap.get("include_audits") else "")
    return _val(cap) if cap is not None else "none"


def _table_of(rows: list[dict], preferred: list[str], only_preferred: bool = False) -> tuple[list[str], list[list[str]]]:
    """Columns: the preferred ones present (in order); the others too unless ``only_preferred``
    and at least one preferred column exists (an unknown row shape is shown whole)."""
    cols = [c for c in preferred if any(c in r for r in rows)]
    if not (only_preferred and cols):
        for r in rows:
            for k in r:
                if k not in cols:
                    cols.append(k)
    return cols, [[_val(r.get(c)) for c in cols] for r in rows]


def budget_blocks(report: dict) -> list[Block]:
    b = report["sections"]["budget"]
    out = []
    if b.get("available"):
        ver = b.get("verify") if isinstance(b.get("verify"), dict) else None
        integrity = "" if ver is None else (" — hash chain intact" if ver.get("ok") else " — INTEGRITY CHECK FAILED (see notes)")
        out.append(Block("p", text=f"Ledger: {b['ledger']}{integrity}"))
        if b["summary"]:
            rows = [dict(r, cap=_cap(r.get("cap"))) for r in b["summary"]]
            cols, table = _table_of(rows, SUMMARY_COLUMNS, only_preferred=True)
            out.append(Block("table", caption="Ledger summary for the datasets in this report: partition * is the whole dataset "
                                              "(sequential within a partition, parallel across disjoint partitions); epsilon = the tightest bound",
                             headers=[SUMMARY_LABELS.get(c, c) for c in cols], rows=table))
            if any(r.get("audits") for r in b["summary"]):
                out.append(Block("p", text="audits: the audits recorded on the dataset (their trials train on the private data); audits' eps: "
                                           "what their trials compose to; eps with audits: releases and audits composed together. A cap "
                                           "counts releases only unless it says audits included. " + NOT_COVERED))
        entries, folded = _fold_sweep_entries(report, b["entries"])
        if entries:
            cols, table = _table_of(entries, ENTRY_COLUMNS, only_preferred=True)
            out.append(Block("table", caption="Ledger entries of these datasets (append-only)", headers=cols, rows=table))
        for name, k in folded.items():
            out.append(Block("p", text=f"{k} ledger entries of sweep {name} are summarised in the Sweep section (all are in the JSON report)."))
    comp = b.get("composition") or []
    if comp:
        out.append(Block("table", caption="Composition of the releases in this report (recomputed from their stored events; a cross-check, not the ledger)",
                         headers=["dataset", "partition", "adjacency", "releases", "naive sum of eps", "composed eps (rdp)", "composed eps (prv)", "at delta"],
                         rows=[[r["dataset"], r["partition"], r["adjacency"], _val(r["releases"]), f(r["naive_sum"]), f(r["rdp"]), f(r["prv"]), g(r["delta"])]
                               for r in comp]))
    if not out:
        out.append(Block("p", text="No private release and no ledger: nothing to account."))
    return out


def _fold_sweep_entries(report: dict, entries: list[dict]) -> tuple[list[dict], dict[str, int]]:
    """Ledger entries minus those of the sweeps in this report (hundreds of rows a reviewer reads
    as one summary), and how many were folded per sweep."""
    sweeps = report["sections"].get("sweep") or []
    if not sweeps:
        return entries, {}
    by_id = {rid: sw["name"] for sw in sweeps for rid in sw.get("release_ids") or []}
    names = {sw["name"] for sw in sweeps}
    kept, folded = [], {}
    for e in entries:
        tag = e.get("sweep")
        tag = tag.get("name") if isinstance(tag, dict) else tag
        name = by_id.get(str(e.get("release_id") or e.get("id"))) or (tag if tag in names else None)
        if name is not None and e.get("kind", "release") == "release":
            folded[name] = folded.get(name, 0) + 1
        else:
            kept.append(e)
    return kept, folded


def _pct(x: Any, scale: float) -> str:
    v = num(x)
    return DASH if v is None or math.isnan(v) else f"{scale * v:.{2 if scale == 100.0 else 3}f}"


def _eps_label(e: Any) -> str:
    return "non-private" if e is None else g(e)


def _cell_text(c: dict, scale: float) -> str:
    s = c["summary"]
    if s.get("n", 0) < 2 or num(s.get("sd")) is None or math.isnan(num(s["sd"])):
        return f"{_pct(s['mean'], scale)} (n={s.get('n')})"
    return f"{_pct(s['mean'], scale)} ± {_pct(s['sd'], scale)} [{_pct(s['ci_low'], scale)}, {_pct(s['ci_high'], scale)}] (n={s['n']})"


def _p(x: Any) -> str:
    v = num(x)
    return DASH if v is None or math.isnan(v) else f"{v:.4f}"


def _signed(x: Any, digits: int = 4) -> str:
    v = num(x)
    return DASH if v is None or math.isnan(v) else f"{v:+.{digits}f}"


def _sweep_table_blocks(t: dict) -> list[Block]:
    """Table 3 comparison, cells per metric, paired contrasts and win/tie/loss of one sweep."""
    out: list[Block] = []
    t3 = t.get("table3") or {}
    rows = []
    for r in t3.get("rows") or []:
        ours = "not run" if r.get("mean") is None else (
            f"{f(r['mean'], 2)} ± {f(r['sd'], 2)}" if num(r.get("sd")) is not None and not math.isnan(num(r["sd"])) else f"{f(r['mean'], 2)}")
        ci = f"[{f(r.get('ci_low'), 2)}, {f(r.get('ci_high'), 2)}]" if num(r.get("ci_low")) is not None and not math.isnan(num(r["ci_low"])) else DASH
        pub = "not in Table 3" if r.get("published_mean") is None else f"{f(r['published_mean'], 2)} ± {f(r['published_sd'], 2)}"
        if r.get("published_mean") is not None and r.get("published_source") not in (None, "Table 3"):
            pub += f" ({r['published_source']})"  # e.g. attention (Table 9) or DP-ELM widths (Table 5)
        rows.append([str(r.get("label")), str(r.get("dataset")), ours, ci, _val(r.get("n")), pub, _signed(r.get("difference"), 2)])
    if rows:
        out.append(Block("table", caption=f"Table 3 comparison: accuracy (%) at eps = {g(t3.get('epsilon'))}, mean ± SD over seeds, "
                                          f"95 % t-interval, next to the published values. Source: {t3.get('citation')}",
                         headers=["model", "dataset", "dpaudit", "95 % t-interval", "seeds", "published", "difference"], rows=rows))
    else:
        out.append(Block("p", text=f"Table 3 comparison: no finished task at eps = {g(t3.get('epsilon'))}."))
    for metric in t.get("metrics") or []:
        cells = [c for c in t.get("cells") or [] if c.get("metric") == metric]
        if not cells:
            continue
        scale = 100.0 if metric == "accuracy" else 1.0
        eps = sorted({c["epsilon"] for c in cells}, key=lambda e: (e is not None, num(e) or 0.0))
        keyed = {(c["dataset"], c["model"], c["epsilon"]): c for c in cells}
        rows = []
        for ds in sorted({c["dataset"] for c in cells}):
            for model in sorted({c["model"] for c in cells if c["dataset"] == ds}):
                rows.append([ds, model] + [_cell_text(keyed[(ds, model, e)], scale) if (ds, model, e) in keyed else "" for e in eps])
        unit = " (%)" if scale == 100.0 else ""
        out.append(Block("table", caption=f"{metric}{unit} per cell: mean ± sample SD [95 % Student-t interval] (n seeds)",
                         headers=["dataset", "model"] + [f"eps = {_eps_label(e)}" for e in eps], rows=rows))
    cons = t.get("contrasts") or []
    mins = t.get("min_attainable_p") or {}
    floor = "; ".join(f"n = {n}: smallest attainable p = {_p(v)}" for n, v in mins.items())

    def contrast_table(family: list[dict], what: str, size) -> Block:
        rows = [[c["dataset"], _eps_label(c["epsilon"]), c["metric"], f"{c['reference']} − {c['comparator']}", _val(c.get("n")),
                 _signed(c.get("mean_difference")), _p(c.get("p_value")), _p(c.get("p_holm")), f"{c['wins']}/{c['ties']}/{c['losses']}"]
                for c in family]
        return Block("table", caption=f"Paired contrasts{what} (reference minus comparator, paired by seed): exact sign-flip p and Holm-adjusted p "
                                      f"over the whole family of {size}; W/T/L = seeds won/tied/lost" + (f" ({floor})" if floor else ""),
                     headers=["dataset", "eps", "metric", "contrast", "n", "mean diff", "p (sign-flip)", "p (Holm)", "W/T/L seeds"], rows=rows)

    if cons:
        out.append(contrast_table(cons, "", t.get("contrast_family_size")))
        wtl = t.get("win_tie_loss") or []
        if wtl:
            out.append(Block("table", caption="Win/tie/loss across conditions by mean (descriptive only)",
                             headers=["reference", "comparator", "metric", "higher", "tied", "lower", "conditions"],
                             rows=[[w["reference"], w["comparator"], w["metric"], _val(w["wins"]), _val(w["ties"]), _val(w["losses"]),
                                    _val(w["conditions"])] for w in wtl]))
    else:
        out.append(Block("p", text="No paired contrast: no comparator shares at least two seeds with the reference in any condition."))
    np_cons = t.get("non_private_contrasts") or []
    if np_cons:
        out.append(contrast_table(np_cons, ", non-private conditions (a separate Holm family)", t.get("non_private_family_size")))
    for n in t.get("notes") or []:
        out.append(Block("p", text=str(n)))
    return out


def _declined(error: Any) -> str:
    """Why an accountant gave no number: it declined the event, or its numerics failed."""
    if not error:
        return DASH
    return "failed" if "failed" in str(error) else "declined"


def sweep_blocks(report: dict) -> list[Block]:
    out: list[Block] = []
    for sw in report["sections"].get("sweep") or []:
        c = sw.get("counts") or {}
        acc = sw.get("accounting") or {}
        out.append(Block("h3", text=f"Sweep {sw['name']}"))
        spec = sw.get("spec") if isinstance(sw.get("spec"), dict) else {}
        pairs = [
            ("folder / store", f"{sw['path']} / {sw['store']}"),
            ("tasks done / failed / pending (total)", f"{_val(c.get('done'))} / {_val(c.get('failed'))} / {_val(c.get('pending'))} ({_val(c.get('total'))})"),
            ("releases found below the folder", _val(sw.get("releases"))),
            ("accounting check", f"{str(acc.get('status', 'n/a')).upper()}: {acc.get('line', '')}"),
            ("tables", "recomputed from the store" + {"matches": " (tables.json agrees)", "differs": " (tables.json differs: see notes)",
                                                      "unreadable": " (tables.json unreadable)"}.get(str(sw.get("tables_json")), "")),
        ]
        if spec.get("description"):
            pairs.append(("spec", str(spec["description"])))
        if spec.get("source"):
            pairs.append(("spec source", str(spec["source"])))
        out.append(Block("kv", caption=f"Sweep {sw['name']}", pairs=pairs))
        if sw.get("error"):
            out.append(Block("p", text=f"The sweep store could not be read ({sw['error']}): no tables; its releases are still checked and composed."))
        bud = sw.get("budget") or []
        if bud:
            out.append(Block("table", caption="Budget of this sweep: every task is a separate release on the same partition, so they compose "
                                              "(recomputed from the releases' stored events)",
                             headers=["dataset", "partition", "adjacency", "releases", "largest single eps", "naive sum of eps",
                                      "composed eps (rdp)", "composed eps (prv)", "at delta"],
                             rows=[[b["dataset"], b["partition"], b["adjacency"], _val(b["releases"]), f(b.get("max_single_epsilon")),
                                    f(b.get("naive_sum")), f(b.get("rdp")),
                                    f(b.get("prv")) if b.get("prv") is not None else _declined((b.get("errors") or {}).get("prv")),
                                    g(b.get("delta"))] for b in bud]))
            for b in bud:
                out.append(Block("p", text=b["sentence"]))
        else:
            out.append(Block("p", text="No release below this sweep's folder (e.g. a selftest sweep): nothing to account."))
        led = sw.get("ledger")
        if isinstance(led, dict) and not led.get("error"):
            total = sw.get("releases") or 0
            out.append(Block("p", text=f"Ledger {led['ledger']} has recorded {led['recorded']} of the {total + len(sw.get('missing_releases') or [])} "
                                       f"releases of this sweep; {led['tagged']} ledger entries carry the sweep's tag; {led['voided']} voided."))
            comp = led.get("composition") or []
            if comp:
                out.append(Block("table", caption="What the ledger recorded for this sweep (its stored events, composed)",
                                 headers=["dataset", "partition", "releases", "naive sum of eps", "composed eps (rdp)", "at delta"],
                                 rows=[[r["dataset"], r["partition"], _val(r["releases"]), f(r["naive_sum"]), f(r["rdp"]), g(r["delta"])] for r in comp]))
            summ = [r for r in led.get("summary") or [] if r.get("partition") != "*"] if led.get("summary") else []
            if summ:
                out.append(Block("table", caption="The ledger's own summary of this sweep (ledger summary --sweep)",
                                 headers=["dataset", "partition", "releases", "composed eps", "bound by", "naive sum of eps", "delta"],
                                 rows=[[str(r.get("dataset")), str(r.get("partition")), _val(r.get("releases_subtree")), f(r.get("epsilon")),
                                        _val(r.get("bound_by")), f(r.get("naive_epsilon")), g(r.get("delta"))] for r in summ]))
        mm = acc.get("mismatches") or []
        if mm:
            out.append(Block("table", caption="Releases of this sweep whose accounting does NOT check out",
                             headers=["release", "mechanism", "claimed eps", "problem", "directory"],
                             rows=[[str(m["release_id"])[:12], str(m["mechanism"]), f(m.get("epsilon"), 4), str(m["message"]), str(m["path"])] for m in mm]))
        fails = sw.get("failures") or []
        if fails:
            out.append(Block("table", caption=f"Failed tasks ({len(fails)}; retried only with --retry-failed)",
                             headers=["model", "dataset", "eps", "seed", "in current spec", "error"],
                             rows=[[str(x["model"]), str(x["dataset"]), _eps_label(x.get("epsilon")), _val(x.get("seed")),
                                    {True: "yes", False: "no (earlier spec)"}.get(x.get("in_current_spec"), DASH), str(x.get("error"))]
                                   for x in fails[:50]]))
        if sw.get("tables"):
            out.extend(_sweep_table_blocks(sw["tables"]))
    return out


def utility_blocks(report: dict) -> list[Block]:
    u = report["sections"]["utility"]
    rows = u["rows"]
    if not rows:
        if report["sections"].get("sweep"):
            return [Block("p", text="The utility of the sweep(s) is in their tables (Sweep section).")]
        return [Block("p", text="No release among the inputs: no utility to report.")]
    names: list[str] = []
    for r in rows:
        for m in r["metrics"]:
            if m not in names:
                names.append(m)
    names.sort(key=lambda k: (METRIC_ORDER.index(k) if k in METRIC_ORDER else len(METRIC_ORDER), k))
    table = [[r["mechanism"], r["dataset"], "non-private" if r["non_private"] else f(r["epsilon"]), _val(r["n"])]
             + [ms(r["metrics"].get(m)) for m in names] for r in rows]
    out = [Block("table", caption="Test metrics, mean ± SD over seeds (sample SD; n = number of releases)",
                 headers=["mechanism", "dataset", "epsilon", "n"] + names, rows=table)]
    if u["curves"]:
        out.append(Block("figures", figures=["utility"]))
    else:
        out.append(Block("p", text="No privacy-utility curve: no group of releases differing only in epsilon."))
    return out


def audit_blocks(report: dict) -> list[Block]:
    a = report["sections"]["audit"]
    entries = a["audits"]
    if not entries:
        return [Block("p", text="No audit among the inputs." if not a.get("one_run") else "No trial-based audit among the inputs.")] \
            + ([Block("p", text=a.get("not_covered") or NOT_COVERED)] if a.get("one_run") else []) + _one_run_blocks(a.get("one_run") or [])
    t = a["table16"]
    headers = ["mechanism", "task / target", "claimed eps"]
    for c in t["canaries"]:
        headers += [f"{c}: private eps_LB", f"{c}: no-noise ctrl", f"{c}: ceiling"]
    headers += ["confidence", "trials"]
    rows = []
    for r in t["rows"] + ([t["max"]] if t.get("max") else []):
        row = [r["mechanism"], r["task"], f(r["claimed_epsilon"])]
        confs, trials = set(), set()
        for c in t["canaries"]:
            cell = r["cells"].get(c)
            if cell is None:
                row += ["—", "—", "—"]
                continue
            lb = f(cell["private"])
            if cell.get("status") == "violation":
                lb += " (VIOLATION)"
            row += [lb, f(cell["no_noise"]), f(cell["ceiling"], 2)]
            if cell.get("confidence") is not None:
                confs.add(g(cell["confidence"]))
            if cell.get("trials") is not None:
                trials.add(str(cell["trials"]))
        row += [" / ".join(sorted(confs)) or "", " / ".join(sorted(trials)) or ""]
        rows.append(row)
    out = [Block("p", text=a.get("not_covered") or NOT_COVERED),
           Block("table", caption="Empirical privacy audit (shape of DP-MixMin Table 16): Clopper–Pearson eps_LB of the private mechanism and of its no-noise control, per task and canary",
                 headers=headers, rows=rows)]
    det = []
    methods: list[str] = []
    for e in entries:
        cnt = e.get("counts") or {}
        det.append([
            str(e.get("label") or DASH), str(e.get("mechanism")), str(e.get("canary") or DASH), str(e.get("task") or e.get("dataset") or DASH),
            f(e.get("compared_claim")), g(e.get("delta")), f(e.get("epsilon_lower_bound")), f(e.get("recomputed_epsilon_lower_bound")),
            f((e.get("null") or {}).get("epsilon_lower_bound")), g(e.get("confidence")), _val(e.get("trials")), _val(e.get("eval_trials")),
            "/".join(_val(cnt.get(k)) for k in ("tp", "fp", "tn", "fn")) if cnt else DASH,
            f(e.get("ceiling"), 2), f(e.get("gdp_estimate")), f(e.get("auc")),
            _method_ref(e.get("method"), methods), e.get("status", "").upper(),
        ])
    out.append(Block("table", caption="Every audit in detail (eps_LB recomputed by this report from the stored EVAL counts as a cross-check)",
                     headers=["audit", "mechanism", "canary", "task", "claim", "delta", "eps_LB", "eps_LB (recomputed)", "null ctrl", "confidence",
                              "trials", "EVAL trials", "TP/FP/TN/FN", "ceiling", "GDP est.", "AUC", "method", "status"], rows=det))
    for k, m in enumerate(methods, 1):
        out.append(Block("p", text=f"Method [{k}]: {m}"))
    out.extend(_statistic_blocks(entries))
    out.append(Block("figures", figures=["eps_lb_vs_claimed", "roc"]))
    out.extend(_one_run_blocks(a.get("one_run") or []))
    return out


def _with_interval(x: Any, iv: Any, digits: int = 3) -> str:
    if num(x) is None:
        return DASH
    if isinstance(iv, list) and len(iv) == 2 and all(num(v) is not None for v in iv):
        return f"{f(x, digits)} [{f(iv[0], digits)}, {f(iv[1], digits)}]"
    return f(x, digits)


def _statistic_blocks(entries: list[dict]) -> list[Block]:
    """Which statistic decided each audit, the claimed-curve test beside today's Clopper-Pearson
    bound, the statistics reviewers compare across tools, and the trade-off figures. Shown only
    when some audit records them (an audit.json from before claimed-curve audits has none)."""
    if not any(e.get("claimed_curve") or e.get("comparison") or e.get("statistic") == "claimed-curve" for e in entries):
        return []
    rows = []
    for e in entries:
        cv = e.get("claimed_curve") or {}
        cmp_ = e.get("comparison") or {}
        fam = cv.get("family") or {}
        tprs = {round(num(t["fpr"]), 6): t for t in cmp_.get("tpr_at_fpr") or [] if num(t.get("fpr")) is not None}
        t01, t1 = tprs.get(0.001) or {}, tprs.get(0.01) or {}
        au = cmp_.get("auroc") or {}
        gd = cmp_.get("gdp_estimate") or {}
        cpb = cmp_.get("cp_bonferroni") or {}
        fam_s = DASH
        if fam.get("parameter"):
            rel = "<=" if fam["parameter"] == "epsilon" else ">="
            fam_s = (f"{fam['parameter']} {rel} {f(fam.get('lower_bound'), 4)} ruled out (claimed {f(fam.get('claimed'), 4)})"
                     if fam.get("lower_bound") is not None else f"nothing ruled out (claimed {fam['parameter']} {f(fam.get('claimed'), 4)})")
        rows.append([
            str(e.get("label") or DASH), str(e.get("statistic") or DASH), f(e.get("epsilon_lower_bound")), f(e.get("compared_claim")),
            f(cv.get("family_epsilon")) if cv else DASH, fam_s,
            ("VIOLATED" if cv.get("violated") else "not violated") if cv else DASH,
            f(e.get("clopper_pearson_epsilon")),
            (f"{f(cpb.get('epsilon_lower_bound'))} ({_val(cpb.get('thresholds_tested'))} thresholds)" if cpb else DASH),
            _with_interval(t01.get("tpr"), t01.get("tpr_interval")), _with_interval(t1.get("tpr"), t1.get("tpr_interval")),
            _with_interval(au.get("auc"), au.get("interval")),
            (_with_interval(gd.get("epsilon"), gd.get("epsilon_interval")) + " (estimate)") if gd else DASH,
            str(e.get("threat_model") or DASH),
        ])
    out = [Block("table", caption="Statistic that decided each audit, and the statistics reviewers compare across tools "
                                  "(claimed-curve: the confidence box of one test chosen on SELECT against the claimed trade-off curve; "
                                  "it decides; eps_LB: a lower bound on epsilon for any mechanism; family epsilon: the epsilon of the "
                                  "strongest member of the claim's family ruled out, a statement about that family only, no bound on "
                                  "epsilon; Clopper-Pearson: the SELECT/EVAL rule's eps_LB; the GDP value is an estimate, not a bound)",
                 headers=["audit", "statistic (decides)", "eps_LB", "claim", "family epsilon (not a bound)", "claim's family", "claimed curve",
                          "CP eps_LB (SELECT/EVAL)", "CP eps_LB (Bonferroni)", "TPR at FPR 0.1 % [CI]", "TPR at FPR 1 % [CI]",
                          "AUROC [bootstrap CI]", "GDP eps (estimate)", "threat model"], rows=rows)]
    if any(e.get("claimed_curve") for e in entries):
        out.append(Block("p", text="Trade-off figures: the claimed curve (FNR against FPR) with the audit's EVAL points and the "
                                   "chosen test's confidence box [0, FPR_hi] x [0, FNR_hi]; a box wholly below the claimed curve "
                                   "falsifies the claim at the audit's confidence and is drawn in red."))
        out.append(Block("figures", figures=["tradeoff"]))
    return out


def _one_run_blocks(entries: list[dict]) -> list[Block]:
    """One-run audits (one_run.json): both analyses' bounds against the claim."""
    if not entries:
        return []
    rows = []
    for e in entries:
        st = e.get("steinke") or {}
        fd = e.get("fdp") or {}
        rows.append([
            str(e.get("label") or DASH), str(e.get("mechanism") or DASH), str(e.get("kind") or DASH), f(e.get("canaries")),
            f(e.get("included")), f(e.get("claimed_epsilon")), g(e.get("delta")), g(e.get("confidence")),
            f"{f(st.get('correct'))} / {f(st.get('guesses'))}" if st else DASH,
            f(st.get("epsilon_lower_bound")) if st else DASH, f(st.get("ceiling"), 2) if st else DASH,
            f(fd.get("epsilon_lower_bound")) if fd else "not computed",
            (("VIOLATED" if fd.get("violated") else "not violated") if fd.get("violated") is not None else DASH) if fd else DASH,
            str(e.get("statistic") or DASH), str(e.get("status", "")).upper(),
        ])
    return [Block("table", caption="One-run audits (Steinke, Nasr & Jagielski 2023; f-DP analysis: Mahloujifar et al. 2024): "
                                   "m canaries each included with probability 1/2, one training run",
                  headers=["record", "mechanism", "canary kind", "m", "included", "claim", "delta", "confidence", "correct / guesses",
                           "eps_LB (eps, delta)", "ceiling", "eps_LB (f-DP)", "claimed curve (f-DP)", "statistic (decides)", "status"],
                  rows=rows),
            Block("figures", figures=["onerun"])]


def _method_ref(method: Any, methods: list[str]) -> str:
    """Long method descriptions go below the table once; the cell holds a reference [k]."""
    if not method:
        return DASH
    m = str(method)
    if m not in methods:
        methods.append(m)
    return f"[{methods.index(m) + 1}]"


def reproduce_blocks(report: dict) -> list[Block]:
    out = []
    for r in report["sections"]["reproduce"]:
        what = {"release": "Release", "audit": "Audit", "sweep": "Sweep", "report": "This report"}.get(r["kind"], r["kind"])
        head = f"{what}: {r['mechanism']}" if r.get("mechanism") else what
        if r.get("id"):
            head += f" ({r['id']})" if r["kind"] == "sweep" else f" ({str(r['id'])[:12]})"
        meta = []
        if r.get("path"):
            meta.append(f"directory {r['path']}")
        if r.get("seed") is not None:
            meta.append(f"seed {_val(r['seed'])}")
        if r.get("noise"):
            meta.append(f"noise: {r['noise']}")
        if r.get("git_commit"):
            meta.append(f"commit {str(r['git_commit'])[:12]}")
        out.append(Block("h3", text=head))
        if meta:
            out.append(Block("p", text="; ".join(meta)))
        if r["command"]:
            out.append(Block("code", text=r["command"]))
        elif r.get("parameters"):
            params = dict(r["parameters"])
            cfg = params.pop("config", None)
            lines = ["# command not recorded; the audit's recorded parameters:"]
            lines += [f"#   {k} = {json.dumps(v, default=str)}" for k, v in sorted(params.items())]
            if cfg is not None:
                lines.append("#   config = " + json.dumps(cfg, sort_keys=True, default=str))
            out.append(Block("code", text="\n".join(lines)))
        else:
            out.append(Block("code", text="# command not recorded"))
    out.append(Block("p", text="With secret (default) noise a re-run reproduces the configuration, data and public randomness, "
                               "not the exact noise draw; metrics agree up to that noise."))
    return out


BUILDERS = {
    "verdict": verdict_blocks, "claim": claim_blocks, "provenance": provenance_blocks, "budget": budget_blocks,
    "sweep": sweep_blocks, "utility": utility_blocks, "audit": audit_blocks, "reproduce": reproduce_blocks,
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
    """(section key, heading, blocks) for every section, notes first in each."""
    out = []
    for key, heading in sections_of(report):
        blocks = []
        nb = _notes_for(report, key)
        if key == "verdict":
            extra = [n for n in report.get("notes", []) if n.get("section") == "inputs"]
            if extra:
                blocks.append(Block("notes", notes=extra))
        if nb:
            blocks.append(nb)
        blocks.extend(BUILDERS[key](report))
        out.append((key, heading, blocks))
    return out
