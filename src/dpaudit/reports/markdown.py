"""Markdown rendering: the same blocks as the HTML, figures written as PNG files beside it."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

from .blocks import layout
from .format import render_block
from .html import inputs_meta, notes_summary
from .plots import Figure, all_figures

_BADGE = {
    "violation": "🛑",
    "accounting-mismatch": "🛑",
    "inconclusive": "⚠️",
    "not-audited": "⚠️",
    "no-evidence": "✅",
    "no-claim": "ℹ️",
}


def _cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[str]], caption: str = "") -> str:
    out = ([f"**{caption}**", ""] if caption else []) + [
        "| " + " | ".join(_cell(h) for h in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    return "\n".join(out + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows])


#: Block kind -> its Markdown (figures are written by :func:`_figures`).
RENDER = {
    "p": lambda b: b.text,
    "h3": lambda b: f"### {b.text}",
    "verdict": lambda b: f"> {_BADGE.get(b.status, '')} **{b.text}**",
    "more": lambda b: f"<details><summary>{b.text} (expand)</summary>\n\n{b.caption}\n\n</details>",
    "table": lambda b: _table(b.headers, b.rows, b.caption),
    "kv": lambda b: _table(["", ""], [[f"**{k}**", v] for k, v in b.pairs], b.caption),
    "code": lambda b: f"```sh\n{b.text}\n```",
    "notes": lambda b: (
        f"<details><summary>{notes_summary(b.notes)} (expand)</summary>\n\n"
        + "\n".join(f"- **{n['level'].upper()}** {n['message']}" for n in b.notes)
        + "\n\n</details>"
    ),
}


def _figures(shown: list[Figure], asset_rel: str) -> str:
    """The figures' links to their PNG files in ``asset_rel``, with their captions."""
    linked = (f"![{t.title}]({asset_rel}/{t.name}.png)\n\n*{t.title}.* {t.caption}" for t in shown)
    return "\n\n".join(linked) or "_No figure: the inputs hold no data to plot._"


def render_markdown(
    report: dict, out_file: str | os.PathLike, figures: list[Figure] | None = None
) -> Path:
    """Write ``out_file`` (Markdown) and its PNG figures in ``<stem>_files/`` beside it."""
    out_file = Path(out_file)
    assets = out_file.parent / f"{out_file.stem}_files"
    figures = all_figures(report) if figures is None else figures
    if figures:
        assets.mkdir(parents=True, exist_ok=True)
        for fig in figures:
            (assets / f"{fig.name}.png").write_bytes(fig.png)
    parts = [
        f"# {report['title']}",
        "",
        f"_generated {report['generated_at']} by dpaudit {report['dpaudit_version']} from "
        f"{inputs_meta(report)}_",
        "",
    ]
    draw = partial(_figures, asset_rel=assets.name)
    for _key, heading, blocks in layout(report):
        parts += [f"## {heading}", ""]
        for b in blocks:
            parts += [render_block(b, RENDER, draw, figures), ""]
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text("\n".join(parts))
    return out_file
