"""The report's trade-off figures are drawn into one reused matplotlib figure: each must be the
picture a fresh figure of that audit gets (same plotted data, same pixels), whichever audits were
drawn before it and in whatever order the audits are read; and splitting an audit record into its
shareable and local parts (which no longer deep-copies it) leaves the record unchanged.

Audits are real engine records (``audit_scores`` on Gaussian scores, a Gaussian claim), small.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audit_outputs import split_audit, split_one_run
from dpaudit.audits.engine import audit_scores, write_audit
from dpaudit.errors import UsageError
from dpaudit.reports import build_report
from dpaudit.reports.plots import tradeoff_figures
from dpaudit.reports.tradeoff import new_figure, png_bytes, tradeoff_figure

#: IN-world shifts: one far above the claim's (a violation), one below it, one near it.
SHIFTS = (3.0, 0.2, 1.0)


def _record(shift: float, seed: int):
    rng = np.random.default_rng(seed)
    return audit_scores(
        rng.normal(shift, 1.0, 200),
        rng.normal(0.0, 1.0, 200),
        delta=1e-5,
        claim=SubsampledGaussian(2.0, 1.0, 1),
        seed=seed,
        mechanism="gaussian",
        canary="shift",
    )


@pytest.fixture(scope="module")
def audit_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reuse")
    for i, shift in enumerate(SHIFTS):
        write_audit(_record(shift, i), root / f"a{i}")
    return [root / f"a{i}" for i in range(len(SHIFTS))]


def _drawn(fig) -> list:
    """Everything a trade-off figure plots, as plain values: per axes its limits, ticks, lines,
    marker sets, patches and texts; then the figure's title and legend entries."""
    out = []
    for ax in fig.axes:
        out.append(
            (
                ax.get_xlim(),
                ax.get_ylim(),
                list(ax.get_xticks()),
                list(ax.get_yticks()),
                [
                    (ln.get_gid(), ln.get_label(), ln.get_color(), ln.get_xydata().tolist())
                    for ln in ax.lines
                ],
                [
                    (
                        c.get_gid(),
                        c.get_label(),
                        np.asarray(c.get_offsets()).tolist(),
                        [p.vertices.tolist() for p in c.get_paths()],
                    )
                    for c in ax.collections
                ],
                [(p.get_gid(), p.get_label(), p.get_bbox().bounds) for p in ax.patches],
                [(t.get_gid(), t.get_text(), t.xy) for t in ax.texts],
            )
        )
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    return out + [fig._suptitle.get_text(), legend]


def test_reused_figure_draws_what_a_fresh_one_draws():
    records = [_record(shift, i).to_dict() for i, shift in enumerate(SHIFTS[:2])]
    fresh = [tradeoff_figure(r) for r in records]
    assert _drawn(fresh[0]) != _drawn(fresh[1])  # two different pictures (log floors, colours)
    fig = None
    for k in (0, 1, 0):  # back to the first: nothing of the second may remain
        fig = tradeoff_figure(records[k], fig)
        assert _drawn(fig) == _drawn(fresh[k])
        assert png_bytes(fig) == png_bytes(fresh[k])
    with pytest.raises(UsageError, match="figure must be one tradeoff_figure returned, got Figure"):
        tradeoff_figure(records[0], new_figure((2, 2)))


def test_report_figures_do_not_depend_on_the_order_audits_are_read(audit_dirs):
    reports = [build_report(order, ledger_path=None) for order in (audit_dirs, audit_dirs[::-1])]
    entries = [
        {
            e["path"]: {k: v for k, v in e.items() if k != "index"}
            for e in rep["sections"]["audit"]["audits"]
        }
        for rep in reports
    ]
    assert entries[0] == entries[1]
    figures = [{f.title: f.png for f in tradeoff_figures(rep)} for rep in reports]
    assert len(figures[0]) == len(SHIFTS) and figures[0] == figures[1]


def test_splitting_a_record_leaves_it_unchanged(audit_dirs):
    record = _record(SHIFTS[0], 0).to_dict()
    record["controls"] = {"null": copy.deepcopy(record)}  # a control is split the same way
    record["config"] = {"n_train": 212, "reference_weights": [0.5], "reference_size": 212}
    before = copy.deepcopy(record)
    public, local = split_audit(record)
    assert record == before
    assert "n_train" not in public["config"] and local["config"]["n_train"] == 212
    assert "n_train" not in public["controls"]["null"]["config"]
    one_run = {"info": {"n_train": 212, "reference_size": 212}, "timings": {"total": 1.23456}}
    kept = copy.deepcopy(one_run)
    public, local = split_one_run(one_run)
    assert one_run == kept and public["info"] == {"reference_size": 212}
