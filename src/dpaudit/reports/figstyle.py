"""One figure style for every picture dpaudit draws (reports and the trade-off PNG of an audit).

Matplotlib's object API with the Agg canvas, never ``pyplot``: drawing never changes a user's
matplotlib state or global backend.
"""

from __future__ import annotations

import io

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
