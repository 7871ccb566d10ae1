"""Shared test set-up: one thread (2-core CI), isolated caches and ledgers, real-data paths."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from pathlib import Path

import pytest
import torch

import dpaudit

torch.set_num_threads(1)

_REPO = Path(__file__).resolve().parents[1]


def _real_data_dir() -> Path | None:
    env = os.environ.get("DPAUDIT_DATA_DIR")
    for cand in ([Path(env)] if env else []) + [_REPO.parent / "shared" / "data"]:
        if cand.is_dir():
            return cand
    return None


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("dpaudit-cache")


@pytest.fixture(autouse=True)
def _isolate(tmp_path_factory, monkeypatch, _session_cache):
    """Each test gets its own ledger; the calibration cache is shared by the session only. No
    declared terminal width: pytest-xdist's workers set COLUMNS=80, which would wrap messages that
    a plain pipe (and ``pytest -n 0``) keeps on one line; tests that want a width declare one."""
    root = tmp_path_factory.mktemp("dpaudit-home")
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("DPAUDIT_LEDGER", str(root / "ledger.sqlite"))
    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(_session_cache))
    yield


@pytest.fixture
def data_dir() -> Path:
    """Directory with the real datasets; the test is skipped, visibly, when it is absent."""
    d = _real_data_dir()
    if d is None:
        pytest.skip(
            "real data not found: set DPAUDIT_DATA_DIR or place ../shared/data beside the checkout"
        )
    return d


def require_file(data_dir: Path, rel: str) -> Path:
    p = data_dir / rel
    if not p.exists():
        pytest.skip(f"real data file {rel} not found under {data_dir}")
    return p


# ------------------------------------------------------------------ planted faults (test fixtures only)

#: Faults :func:`plant` knows, each patching one shared piece of the one DP-SGD loop (record and user
#: heads, modules; releases and audits alike): "skip-clip" leaves the last unit of every clipped batch
#: unclipped (an off-by-one in :func:`dpaudit.mechanisms.dpsgd.core.clip_factors`, the one clipping rule);
#: "half-noise" halves the standard deviation of every step's Gaussian noise (the one noise filler
#: of the noisy step) while the release still claims the calibrated noise multiplier; "double-rate"
#: makes the loop's Poisson sampler include every unit at twice the rate the accountant is told.
FAULTS = ("skip-clip", "half-noise", "double-rate")


def plant(monkeypatch, name: str) -> None:
    """Plant fault ``name`` (:data:`FAULTS`) for the rest of the test (undone by ``monkeypatch``)."""
    from dpaudit.mechanisms.dpsgd import core as dpsgd_core

    if name == "skip-clip":
        real_clip = dpsgd_core.clip_factors

        def skip_last(norms, clipping_norm):
            c = real_clip(norms, clipping_norm)
            c[-1] = 1.0
            return c

        monkeypatch.setattr(dpsgd_core, "clip_factors", skip_last)
    elif name == "half-noise":
        real_fill = dpsgd_core.gaussian_filler
        monkeypatch.setattr(
            dpsgd_core, "gaussian_filler", lambda noise, out, std: real_fill(noise, out, std / 2.0)
        )
    elif name == "double-rate":
        real_batch = dpsgd_core.poisson_batch
        monkeypatch.setattr(
            dpsgd_core,
            "poisson_batch",
            lambda noise, runs, n, q: real_batch(noise, runs, n, min(1.0, 2.0 * q)),
        )
    else:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {name!r}.")


@pytest.fixture
def plant_fault(monkeypatch):
    """``plant_fault("skip-clip")`` / ``plant_fault("half-noise")``: :func:`plant` for this test."""
    return lambda name: plant(monkeypatch, name)


def _patch_everywhere(monkeypatch, owner, name: str, value) -> None:
    """``owner.name = value`` and the same for every dpaudit module that bound the original at its top (dpaudit imports its
    own modules at module top, tests/test_import_graph.py: patching the defining module alone misses those bindings).
    Every dpaudit module is imported first, so none binds ``value`` for good while it is set."""
    for info in pkgutil.walk_packages(dpaudit.__path__, "dpaudit."):
        importlib.import_module(info.name)
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, value)
    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("dpaudit")
            and vars(module).get(name) is original
        ):
            monkeypatch.setattr(module, name, value)


@pytest.fixture
def patch_everywhere(monkeypatch):
    """``patch_everywhere(owner, name, value)``: :func:`_patch_everywhere` for this test."""
    return lambda owner, name, value: _patch_everywhere(monkeypatch, owner, name, value)
