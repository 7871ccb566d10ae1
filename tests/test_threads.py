"""Thread settings (dpaudit.threads): set without importing torch, shared by `--threads`, sweep
workers, audit workers and a head's training."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from threadpoolctl import threadpool_info

from dpaudit.errors import UsageError
from dpaudit.threads import THREAD_VARIABLES, limited_threads, set_threads


def _blas_threads() -> set[int]:
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


def test_set_threads_sets_the_environment_blas_and_a_loaded_torch(monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.setenv(name, "7")
    before_torch, before_blas = torch.get_num_threads(), max(_blas_threads())
    try:
        set_threads(2)
        assert all(os.environ[name] == "2" for name in THREAD_VARIABLES)
        assert torch.get_num_threads() == 2 and _blas_threads() == {2}
    finally:
        torch.set_num_threads(before_torch)
        set_threads(before_blas)
    with pytest.raises(UsageError, match="threads"):
        set_threads(0)


def test_limited_threads_restores_both():
    torch.set_num_threads(2)
    try:
        with limited_threads(1):
            assert torch.get_num_threads() == 1 and _blas_threads() == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_no_torch_import_for_threads():
    code = (
        "import sys, numpy\nfrom dpaudit.threads import limited_threads, set_threads\nset_threads(1)\n"
        "with limited_threads(1):\n    pass\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
