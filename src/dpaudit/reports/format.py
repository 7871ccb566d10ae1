"""How the report's numbers are worded and rounded, and the :class:`Block` every renderer draws."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .inputs import num

DASH = "n/a"


@dataclass
class Block:
    # p | verdict | table | kv | code | figures | notes | h3 | more (text, folded caption)
    kind: str
    text: str = ""
    status: str = ""
    caption: str = ""
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # figure names (section-local order)
    notes: list[dict] = field(default_factory=list)


def p(text: str) -> Block:
    return Block("p", text=text)


def table(caption: str, headers: list[str], rows: list[list[str]]) -> Block:
    return Block("table", caption=caption, headers=headers, rows=rows)


def columns(caption: str, spec: list[tuple], rows: list[dict]) -> Block:
    """A table of ``rows``; ``spec`` holds a (header, key, show) per column: the cell is
    ``show(row.get(key))``, or ``show(row)`` when the key is None."""
    cells = [[show(r if key is None else r.get(key)) for _, key, show in spec] for r in rows]
    return table(caption, [header for header, *_ in spec], cells)


def as_stored(x: Any) -> Any:
    """A cell shown as the model holds it (the renderers write its text)."""
    return x


def as_stored_columns(*keys: str) -> list[tuple]:
    """Columns headed by their key whose cells show the value as stored."""
    return [(key, key, as_stored) for key in keys]


def status_word(row: dict) -> str:
    """A row's status in capitals (as the tables show it)."""
    return str(row.get("status", "")).upper()


def finite(x: Any) -> bool:
    """A number that is not NaN (inf counts)."""
    v = num(x)
    return v is not None and not math.isnan(v)


def _fixed(v: float, x: Any, digits: int) -> str:
    if v != 0 and (abs(v) < 10**-digits or abs(v) >= 1e6):
        return f"{v:.{digits}g}"
    if float(v).is_integer() and not isinstance(x, float):
        return str(int(v))
    return f"{v:.{digits}f}"


def f(x: Any, digits: int = 3) -> str:
    """A number for people: None -> n/a, inf -> inf, else ``digits`` significant decimals."""
    v = num(x)
    if v is None:
        return DASH if x is None else str(x)
    if math.isnan(v) or math.isinf(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return _fixed(v, x, digits)


def g(x: Any) -> str:
    v = num(x)
    return DASH if v is None else f"{v:g}"


def ms(s: dict | None) -> str:
    """mean +/- SD (n seeds)."""
    if not s or num(s.get("mean")) is None:
        return DASH
    sd = num(s.get("sd"))
    return f"{f(s['mean'])}" + (f" ± {f(sd)}" if sd is not None else "") + f" (n={s.get('n')})"


def val(v: Any) -> str:
    """Any recorded value: n/a, yes/no, a number, JSON of a container, else its text."""
    if v is None:
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float) or num(v) is not None and not isinstance(v, str):
        return f(v, 4)
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _finite_or_dash(x: Any, fmt: str) -> str:
    return format(num(x), fmt) if finite(x) else DASH


def pct(x: Any, scale: float) -> str:
    return DASH if not finite(x) else f"{scale * num(x):.{2 if scale == 100.0 else 3}f}"


def pval(x: Any) -> str:
    return _finite_or_dash(x, ".4f")


def signed(x: Any, digits: int = 4) -> str:
    return _finite_or_dash(x, f"+.{digits}f")


def eps_label(e: Any) -> str:
    return "non-private" if e is None else g(e)


def with_interval(x: Any, iv: Any, digits: int = 3) -> str:
    if num(x) is None:
        return DASH
    whole = isinstance(iv, list) and len(iv) == 2 and all(num(v) is not None for v in iv)
    return f(x, digits) + (f" [{f(iv[0], digits)}, {f(iv[1], digits)}]" if whole else "")


def declined(error: Any) -> str:
    """Why an accountant gave no number: it declined the event, or its numerics failed."""
    return DASH if not error else "failed" if "failed" in str(error) else "declined"


def either(cond: Any, text: Any, otherwise: str = DASH) -> str:
    """``text`` when ``cond`` holds (the value is formatted before the test: cheap callers only)."""
    return text if cond else otherwise


def text(x: Any) -> str:
    """A recorded name, or n/a when it is empty."""
    return str(x or DASH)


def verdict_word(violated: Any) -> str:
    return "VIOLATED" if violated else "not violated"


def chosen(b: Block, figures: list) -> list:
    """The figures a ``figures`` block names (by name prefix, in the block's order)."""
    return [fig for prefix in b.figures for fig in figures if fig.name.startswith(prefix)]


def render_block(b: Block, kinds: dict, draw, figures: list) -> str:
    """``b`` in one renderer's words: ``kinds`` maps a block kind to its text; ``draw`` gives
    the text of the figures a ``figures`` block names (:func:`chosen` among ``figures``)."""
    if b.kind == "figures":
        return draw(chosen(b, figures))
    return kinds[b.kind](b)


def composition_columns(keys: str, *before: tuple, prv: tuple = ()) -> list[tuple]:
    """The columns of a composition table (the report's, a sweep's, a sweep's ledger record): the
    group ``keys`` as stored, the releases, ``before``, the naive sum and the rdp epsilon, the prv
    epsilon when ``prv`` gives its (key, show), and the delta."""
    cols = [*as_stored_columns(*keys.split()), ("releases", "releases", val), *before]
    cols += [("naive sum of eps", "naive_sum", f), ("composed eps (rdp)", "rdp", f)]
    return cols + ([("composed eps (prv)", *prv)] if prv else []) + [("at delta", "delta", g)]
