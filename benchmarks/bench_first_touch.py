"""First touch of an MNIST run's large arrays: NumPy's huge-page advice vs ordinary pages.

``data.base.empty_small_pages`` gives the run's large arrays (the training pixels, the feature
matrix) ordinary pages. This times allocating and filling the ~560 MB of an MNIST DP-RVFL run both
ways, each in a fresh process (the first touch is what a command pays). Huge pages are fast once
the machine's memory has been used, slow before (a VM whose host has not backed the memory yet,
or fragmented memory that must be compacted); ordinary pages cost the same every time.

    python benchmarks/bench_first_touch.py --rounds 3
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

SHAPES = (
    (51_000, 784),
    (9_000, 784),
    (10_000, 784),
    (51_000, 985),
)  # x_train, x_val, x_test, z_train (float32)


def _child(mode: str) -> None:
    import mmap

    import numpy as np

    t = time.perf_counter()
    kept = []
    for shape in SHAPES:
        if mode == "huge":
            a = np.empty(shape, np.float32)
        else:
            a = np.frombuffer(mmap.mmap(-1, shape[0] * shape[1] * 4), np.float32).reshape(shape)
        a[...] = 1.0
        kept.append(a)
    print(f"{time.perf_counter() - t:.3f}")


def main() -> None:
    if sys.argv[1:2] == ["--_child"]:
        return _child(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    times = {"huge": [], "ordinary": []}
    for _ in range(a.rounds):
        for mode in times:
            out = subprocess.run(
                [sys.executable, __file__, "--_child", mode],
                check=True,
                capture_output=True,
                text=True,
            )
            times[mode].append(float(out.stdout))
    for mode, ts in times.items():
        print(f"{mode} pages: " + " / ".join(f"{t:.3f}" for t in ts) + " s")


if __name__ == "__main__":
    main()
