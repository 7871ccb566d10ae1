"""Thread counts of the numerical libraries (speed settings, never privacy ones), set without
importing torch: a linear head's release and its audits run on NumPy alone, and importing torch
only to set its thread count would cost seconds (BENCHMARKS.md, section 4)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

from .validation import positive_int

#: The variables the numerical libraries read for their thread counts when they load.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def set_threads(threads: int) -> None:
    """``threads`` threads for torch's intra-op pool and NumPy's BLAS from now on (``--threads``,
    a worker's share of the machine). Libraries not loaded yet read it from their environment when
    they load; loaded ones are set now."""
    threads = positive_int("threads", threads)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    if "numpy" in sys.modules:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads, user_api="blas")
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def limited_threads(threads: int) -> Iterator[None]:
    """``threads`` threads for NumPy's BLAS and, when it is loaded, torch's intra-op pool inside
    this block; both restored afterwards."""
    from threadpoolctl import threadpool_limits

    threads = positive_int("threads", threads)
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=threads, user_api="blas"):
        if torch is not None:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(before)
