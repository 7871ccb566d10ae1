"""Shared test set-up: one thread (2-core CI), isolated caches and ledgers, real-data paths."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

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
    """Each test gets its own ledger; the calibration cache is shared by the session only."""
    root = tmp_path_factory.mktemp("dpaudit-home")
    monkeypatch.setenv("DPAUDIT_LEDGER", str(root / "ledger.sqlite"))
    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(_session_cache))
    yield


@pytest.fixture
def data_dir() -> Path:
    """Directory with the real datasets; the test is skipped, visibly, when it is absent."""
    d = _real_data_dir()
    if d is None:
        pytest.skip("real data not found: set DPAUDIT_DATA_DIR or place ../shared/data beside the checkout")
    return d


def require_file(data_dir: Path, rel: str) -> Path:
    p = data_dir / rel
    if not p.exists():
        pytest.skip(f"real data file {rel} not found under {data_dir}")
    return p
