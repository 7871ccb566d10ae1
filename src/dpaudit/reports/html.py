"""Self-contained HTML: inline CSS, figures as base64 PNG data URIs, no script, no network.

The first screen is the verdict table; notes fold into one line each section, every section after
the verdict folds (``<details>``: open them before printing). Cells wrap, so no table is wider than
the page. Colours survive grey-scale printing because every verdict also carries a word.
"""

from __future__ import annotations

import base64
import html

from .blocks import VERDICT_WORDS, Block, layout
from .format import render_block
from .plots import Figure, all_figures

CSS = """
:root { --fg:#1b1b1b; --muted:#5f6368; --line:#d0d4d9; --bad:#b71c1c; --warn:#8a5300; --ok:#1b5e20; --bg:#ffffff; }
* { box-sizing: border-box; }
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; color: var(--fg); background: var(--bg);
       max-width: 1100px; margin: 24px auto; padding: 0 20px; line-height: 1.45; font-size: 14px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; border-bottom: 2px solid var(--fg); padding-bottom: 3px; margin-top: 34px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: var(--muted); font-size: 12px; }
.verdict { border: 2px solid var(--line); border-left-width: 10px; padding: 8px 12px; margin: 8px 0; font-weight: 600; }
.verdict.violation, .verdict.accounting-mismatch { border-color: var(--bad); color: var(--bad); }
.verdict.inconclusive, .verdict.not-audited { border-color: var(--warn); color: var(--warn); }
.verdict.no-evidence { border-color: var(--ok); color: var(--ok); }
.verdict.no-claim { border-color: var(--muted); color: var(--muted); }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 12.5px; width: auto; max-width: 100%; }
th, td { overflow-wrap: break-word; } table.many th, table.many td, td.long { overflow-wrap: anywhere; } table.many { font-size: 11.5px; }
td.violation, td.accounting-mismatch { color: var(--bad); font-weight: 600; }
td.inconclusive, td.not-audited { color: var(--warn); font-weight: 600; } td.no-evidence { color: var(--ok); }
details.section > summary { cursor: pointer; border-bottom: 2px solid var(--fg); margin-top: 26px; }
details.section > summary h2 { display: inline; border: 0; }
details.notes > summary { cursor: pointer; font-size: 12.5px; color: var(--muted); }
caption { text-align: left; font-weight: 600; padding: 4px 0; caption-side: top; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f1f3f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { width: 290px; font-weight: 500; }
pre { background: #f6f8fa; border: 1px solid var(--line); padding: 8px 10px; white-space: pre-wrap; word-break: break-all; font-size: 12px; }
.notes { list-style: none; padding: 0; margin: 6px 0 12px; }
.notes li { padding: 4px 8px; margin: 3px 0; border-left: 4px solid var(--line); background: #fafafa; font-size: 12.5px; }
.notes li.error { border-color: var(--bad); } .notes li.warning { border-color: var(--warn); } .notes li.info { border-color: #90a4ae; }
.notes b { text-transform: uppercase; font-size: 11px; }
figure { margin: 10px 0 18px; display: inline-block; max-width: 100%; vertical-align: top; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { font-size: 12px; color: var(--muted); max-width: 700px; }
nav.toc { font-size: 13px; margin: 10px 0; } nav.toc a { margin-right: 12px; color: #1f4e79; }
@media print {
  body { margin: 0; max-width: none; font-size: 11px; }
  h2 { break-after: avoid; page-break-after: avoid; }
  table, figure, .verdict, pre { break-inside: avoid; page-break-inside: avoid; }
  nav.toc { display: none; }
  table { font-size: 8.5px; max-width: 100%; }
  th, td { padding: 2px 3px; }
  figure img { max-width: 90%; }
}
@page { margin: 14mm 12mm; }
"""


def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


def _is_num(s: str) -> bool:
    try:
        float(s.replace("±", "").split()[0])
        return True
    except (ValueError, IndexError):
        return False


#: First-table verdict words -> the status class that colours the cell.
_STATUS = {w: k for k, w in VERDICT_WORDS.items()}


def _td(c: object) -> str:
    cls = ("num" if _is_num(str(c)) else _STATUS.get(str(c).split(":")[0], "")) + " long" * any(
        len(w) > 24 for w in str(c).split()
    )
    return f'<td class="{cls}">{_e(c)}</td>' if cls else f"<td>{_e(c)}</td>"


def _table(b: Block) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in b.headers)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in b.rows)
    cap = f"<caption>{_e(b.caption)}</caption>" if b.caption else ""
    # so many columns that only breaking inside words fits them in the page
    many = ' class="many"' * (len(b.headers) > 14)
    return f"<table{many}>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(fig: Figure) -> str:
    data = base64.b64encode(fig.png).decode("ascii")
    return (
        f'<figure id="fig-{_e(fig.name)}"><img alt="{_e(fig.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption><b>{_e(fig.title)}.</b> {_e(fig.caption)}</figcaption></figure>"
    )


def _kv(b: Block) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in b.pairs)
    return f'<table class="kv"><caption>{_e(b.caption)}</caption><tbody>{rows}</tbody></table>'


def notes_summary(notes: list[dict]) -> str:
    """ "2 errors, 3 warnings, 4 notes": the one line a section's notes fold into."""
    words = {"error": "error", "warning": "warning", "info": "note"}  # by level
    counts = ((w, sum(1 for x in notes if x["level"] == level)) for level, w in words.items())
    return ", ".join(f"{k} {w}{'s' * (k > 1)}" for w, k in counts if k)


def _notes(b: Block) -> str:
    items = "".join(
        f'<li class="{_e(n["level"])}"><b>{_e(n["level"])}</b> {_e(n["message"])}</li>'
        for n in b.notes
    )
    return f'<details class="notes"><summary>{_e(notes_summary(b.notes))} (expand)</summary><ul class="notes">{items}</ul></details>'


#: Block kind -> its HTML (figures are drawn by :func:`_figures`).
RENDER = {
    "p": lambda b: f"<p>{_e(b.text)}</p>",
    "h3": lambda b: f"<h3>{_e(b.text)}</h3>",
    "verdict": lambda b: (
        f'<div class="verdict {_e(b.status)}" data-status="{_e(b.status)}">{_e(b.text)}</div>'
    ),
    "more": lambda b: (
        f'<details class="notes"><summary>{_e(b.text)} (expand)</summary><p>{_e(b.caption)}</p></details>'
    ),
    "table": _table,
    "kv": _kv,
    "code": lambda b: f"<pre><code>{_e(b.text)}</code></pre>",
    "notes": _notes,
}


def _figures(shown: list[Figure]) -> str:
    return "".join(map(_figure, shown)) or "<p>No figure: the inputs hold no data to plot.</p>"


def inputs_meta(report: dict) -> str:
    """What the report was built from: "2 release(s) and 1 audit(s)", and its sweeps if any."""
    given, sw = report["inputs"], report["inputs"].get("sweeps") or []
    counts = f"{len(given['releases'])} release(s) and {len(given['audits'])} audit(s)"
    n = sum(int(x.get("releases") or 0) for x in sw)
    return counts + (f" and {len(sw)} sweep(s) of {n} releases" if sw else "")


def render_html(report: dict, figures: list[Figure] | None = None) -> str:
    """One self-contained HTML document (string) for the report model (``figures``: pre-drawn)."""
    figures = all_figures(report) if figures is None else figures
    secs = layout(report)
    toc = "".join(f'<a href="#{k}">{_e(h)}</a>' for k, h, _ in secs)
    body = []
    for key, heading, blocks in secs:
        fold = key != "verdict"
        body.append(
            f'<section id="{key}" data-section="{key}">'
            + ('<details class="section"><summary>' * fold)
            + f"<h2>{_e(heading)}</h2>"
            + "</summary>" * fold
        )
        body.extend(render_block(b, RENDER, _figures, figures) for b in blocks)
        body.append("</details>" * fold + "</section>")
    meta = (
        f"generated {_e(report['generated_at'])} by dpaudit {_e(report['dpaudit_version'])}"
        + (f" (commit {_e(str(report['git_commit'])[:12])})" if report.get("git_commit") else "")
        + f" from {inputs_meta(report)}"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(report['title'])}</title><style>{CSS}</style></head><body>"
        f'<header><h1>{_e(report["title"])}</h1><div class="meta">{meta}</div><nav class="toc">{toc}</nav></header>'
        + "".join(body)
        + "</body></html>\n"
    )
