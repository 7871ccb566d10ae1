"""Tables: the published Table 3 transcription, the eps = 2 slice, Markdown/HTML/JSON rendering."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dpaudit.sweeps.published import (
    TABLE3,
    TABLE3_COLUMN_LABELS,
    TABLE3_ROW_LABELS,
    TABLE9_ATTENTION,
)
from dpaudit.sweeps.tables import render_html, render_markdown, sweep_tables, table3_slice

PAPER = Path(__file__).resolve().parents[3] / "shared" / "papers" / "001_5ae1aa25002ee196.txt"


def test_table3_transcription_matches_the_paper_text():
    if not PAPER.exists():
        pytest.skip(f"paper text not found at {PAPER}")
    text = PAPER.read_text()
    block = text[text.index("Private Model\tMNIST\tCIFAR-10\tCardio\tHeart") :]
    rows = {}
    for line in block.splitlines()[1:8]:
        label, *cols = line.split("\t")
        rows[label] = [
            tuple(float(v) for v in re.match(r"([\d.]+) ± ([\d.]+)", c).groups()) for c in cols
        ]
    assert len(rows) == 7
    for model, label in TABLE3_ROW_LABELS.items():
        assert [TABLE3[model][d] for d in TABLE3_COLUMN_LABELS] == rows[label], model


def test_table9_attention_transcription_matches_the_paper_text():
    if not PAPER.exists():
        pytest.skip(f"paper text not found at {PAPER}")
    block = PAPER.read_text().split("Table 9. Compact attention-control results", 1)[1]
    found = {}
    for line in block.splitlines()[:12]:
        m = re.match(
            r"(MNIST|CIFAR-10)\tAttention\t[\d.]+ ± [\d.]+\t([\d.]+) ± ([\d.]+)$", line.strip()
        )
        if m:
            found[{"MNIST": "mnist", "CIFAR-10": "cifar10"}[m.group(1)]] = (
                float(m.group(2)),
                float(m.group(3)),
            )
    assert found == TABLE9_ATTENTION


def _rec(model, dataset, seed, acc, eps=2.0):
    return {
        "model": model,
        "dataset": dataset,
        "epsilon": eps,
        "seed": seed,
        "metrics": {"accuracy": acc},
    }


def test_eps2_slice_is_in_percent_next_to_published_values():
    recs = [
        _rec("dp-rvfl", "heart", s, a) for s, a in zip(range(42, 47), (0.6, 0.7, 0.65, 0.5, 0.8))
    ]
    recs += [_rec("dp-rvfl", "heart", 42, 0.99, eps=8.0), _rec("dp-attention", "heart", 42, 0.5)]
    t3 = table3_slice(recs)
    by = {(r["model"], r["dataset"]): r for r in t3["rows"]}
    assert {d for _, d in by} == {"heart"}  # only datasets with results
    rv = by[("dp-rvfl", "heart")]
    assert rv["n"] == 5 and rv["mean"] == pytest.approx(65.0) and rv["published_mean"] == 63.48
    assert rv["difference"] == pytest.approx(65.0 - 63.48)
    assert (
        by[("dp-cnn", "heart")]["mean"] is None
        and by[("dp-cnn", "heart")]["published_mean"] == 50.43
    )
    assert by[("dp-attention", "heart")]["published_mean"] is None  # not in Table 3
    att = table3_slice([_rec("dp-attention", "mnist", s, 0.3) for s in (42, 43)])["rows"]
    (row,) = [r for r in att if r["model"] == "dp-attention"]
    assert (row["published_mean"], row["published_source"]) == (
        29.12,
        "Table 9, attention stage, 3 seeds",
    )
    assert row["difference"] == pytest.approx(30.0 - 29.12)
    assert all(r["published_source"] == "Table 3" for r in att if r["model"] != "dp-attention")


def test_rendered_tables_come_from_the_json():
    recs = [
        _rec(m, "heart", s, 0.5 + 0.01 * s + (0.1 if m == "dp-rvfl" else 0))
        for m in ("dp-rvfl", "dp-cnn")
        for s in range(5)
    ]
    tables = sweep_tables(recs, name="x<y>")
    json.dumps(tables)  # JSON-able
    assert tables["contrast_family_size"] == 1 and tables["min_attainable_p"] == {"5": 0.0625}
    c = tables["contrasts"][0]
    assert (c["reference"], c["comparator"], c["p_value"], c["wins"]) == (
        "dp-rvfl",
        "dp-cnn",
        0.0625,
        5,
    )
    md = render_markdown(tables)
    assert "| RVFL | Heart | 62.00 ± 1.58 | 5 | 63.48 ± 12.43 | -1.48 |" in md
    assert "| heart | dp-rvfl | 62.00 ± 1.58 (n=5) |" in md
    html = render_html(tables)
    assert "x&lt;y&gt;" in html and "<script" not in html
