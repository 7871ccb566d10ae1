"""Published values the sweeps are compared against (data only, with their source).

TABLE3: "Table 3. Private test accuracy (%) at eps = 2 and delta = 1e-5 in the primary suite, mean +/- SD over five seeds" of the
DP-RVFL paper (``shared/papers/001_5ae1aa25002ee196.txt``, section 4.3). Every row is a Gaussian-gradient-mechanism model; seeds
42-46; suite 1. The attention control is not in Table 3: it is reported separately in Table 9 ("Compact attention-control results,
mean +/- SD accuracy (%) over three seeds in the separate attention stage", eps = 2, delta = 1e-5, seeds 42-44, section 4.8), kept
here as TABLE9_ATTENTION.
TABLE5: "Table 5. Numerical DP-ELM test accuracy (%) at eps = 2 for each fixed width, mean +/- SD over five seeds" (section 4.5):
the closed-form Laplace DP-ELM, pure DP (delta = 0), widths L in {1, 3, 5, 10}, seeds 42-46, suite 1. The paper stresses that
these are not an equal-guarantee, equal-width or equal-loss comparison with Table 3, so tables label them with their source.
Values are (mean, SD) in percent, transcribed verbatim from the paper's tables."""

from __future__ import annotations

TABLE3_CITATION = (
    "DP-RVFL paper (shared/papers/001_5ae1aa25002ee196.txt), Table 3: private test accuracy (%) "
    "at eps = 2, delta = 1e-5, primary suite, mean +/- SD over five seeds (42-46)."
)
TABLE3_EPSILON = 2.0

#: dpaudit model name -> the paper's row label.
TABLE3_ROW_LABELS = {
    "dp-dense": "Dense",
    "dp-cnn": "CNN",
    "dp-rvfl": "RVFL",
    "dp-elm-sgd": "ELM-SGD",
    "frozen-dense-matched": "FrozenDenseMatched",
    "logistic-projected": "LogisticProjected",
    "logistic-raw": "LogisticRaw",
}
#: dpaudit dataset name -> the paper's column label.
TABLE3_COLUMN_LABELS = {
    "mnist": "MNIST",
    "cifar10": "CIFAR-10",
    "cardio": "Cardio",
    "heart": "Heart",
}


def _row(*cells: tuple[float, float]) -> dict[str, tuple[float, float]]:
    """One row of a published table: its (mean %, SD %) cells in the column order of Table 3."""
    return dict(zip(TABLE3_COLUMN_LABELS, cells))


#: TABLE3[model][dataset] = (mean %, SD %)
TABLE3: dict[str, dict[str, tuple[float, float]]] = {
    "dp-dense": _row((90.69, 0.17), (37.93, 0.34), (73.14, 0.04), (46.52, 4.76)),
    "dp-cnn": _row((91.80, 0.33), (39.13, 0.89), (68.73, 0.18), (50.43, 8.75)),
    "dp-rvfl": _row((90.30, 0.16), (38.61, 0.24), (72.99, 0.20), (63.48, 12.43)),
    "dp-elm-sgd": _row((87.43, 0.29), (33.72, 0.65), (72.92, 0.16), (62.17, 8.64)),
    "frozen-dense-matched": _row((91.96, 0.11), (38.83, 0.45), (72.96, 0.19), (69.13, 11.02)),
    "logistic-projected": _row((90.04, 0.12), (36.93, 0.35), (70.93, 0.19), (66.09, 6.26)),
    "logistic-raw": _row((90.06, 0.08), (37.06, 0.39), (70.98, 0.19), (65.65, 7.28)),
}

#: Table 9, private column (eps = 2): TABLE9_ATTENTION[dataset] = (mean %, SD %), three seeds.
TABLE9_ATTENTION: dict[str, tuple[float, float]] = {
    "mnist": (29.12, 1.95),
    "cifar10": (25.70, 3.11),
}
TABLE9_NOTE = "Table 9, attention stage, 3 seeds"

#: Table 5: TABLE5[width L][dataset] = (mean %, SD %), pure eps = 2, five seeds.
TABLE5_DP_ELM: dict[int, dict[str, tuple[float, float]]] = {
    1: _row((10.08, 0.16), (10.20, 0.23), (49.82, 0.27), (48.26, 9.53)),
    3: _row((18.47, 1.80), (12.53, 1.10), (53.30, 2.88), (59.57, 9.79)),
    5: _row((25.26, 1.44), (15.29, 1.83), (58.75, 3.59), (51.74, 16.66)),
    10: _row((38.17, 2.56), (17.39, 2.17), (58.61, 5.42), (41.30, 13.40)),
}
TABLE5_EPSILON = 2.0
TABLE5_NOTE = "Table 5, DP-ELM, pure DP"
TABLE5_CITATION = (
    "DP-RVFL paper, Table 5: closed-form Laplace DP-ELM test accuracy (%) at pure eps = 2 (delta = 0) per width L, "
    "mean +/- SD over five seeds; not an equal-guarantee comparison with Table 3."
)
#: dpaudit sweep model name of a DP-ELM width -> row label.
TABLE5_ROW_LABELS = {f"dp-elm-L{w}": f"DP-ELM L={w}" for w in TABLE5_DP_ELM}
