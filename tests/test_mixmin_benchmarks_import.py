"""docs/experiments.md's DP-MixMin benchmarks start: their imports resolve against the library as it is, and the cosine
they report is the cosine similarity (checked here on vectors with a known answer)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("name", ["mixmin_experiments", "bench_mixmin_defaults"])
def test_mixmin_benchmark_imports_and_measures_cosine(name, monkeypatch):
    monkeypatch.syspath_prepend(
        str(BENCHMARKS)
    )  # they import their shared baselines module as the docs run them
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    assert callable(module.main)
    assert module._cosine_similarity([1.0, 0.0], [0.0, 2.0]) == pytest.approx(0.0, abs=1e-12)
    a, b = np.array([0.2, 0.5, 0.3]), np.array([0.1, 0.1, 0.8])
    assert module._cosine_similarity(a, b) == pytest.approx(
        a @ b / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-12
    )
