"""Whole-command wall time of ``dpaudit train dp-rvfl --dataset mnist`` and its torch-thread default.

Each run is a fresh ``dpaudit`` process (start-up, data load, features, training, claim check,
ledger, publication: what a user waits for), timed from outside; runs of the compared settings are
interleaved, so machine load hits them alike. ``--neighbour`` runs one busy-loop process beside
each timed run (a 2-core machine shared with another job). ``--profile`` writes a cProfile of one
run and prints the 25 largest cumulative entries.

    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --runs 5
    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --threads 1 2 --neighbour
    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --trees /tmp/before/src src
    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --profile /tmp/train.prof

Figures go to BENCHMARKS.md, section 4 with the command, the date and ``uptime``'s load.
"""

from __future__ import annotations

import argparse
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DPAUDIT = Path(sys.executable).with_name("dpaudit")


def _argv(data_dir: str, out: Path, threads: int | None) -> list[str]:
    extra = [] if threads is None else ["--threads", str(threads)]
    return [str(DPAUDIT), "train", "dp-rvfl", "--dataset", "mnist", "--data-dir", data_dir, "--eps", "2", "--out", str(out),
            "--ledger", str(out.parent / "ledger.sqlite"), "--json", *extra]


def _one(data_dir: str, root: Path, threads: int | None, neighbour: bool, tree: str | None = None) -> float:
    out = Path(tempfile.mkdtemp(dir=root)) / "r"
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if neighbour else None
    env = dict(os.environ, **({"PYTHONPATH": tree} if tree else {}))
    try:
        t0 = time.perf_counter()
        subprocess.run(_argv(data_dir, out, threads), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        return time.perf_counter() - t0
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("DPAUDIT_DATA_DIR"), required="DPAUDIT_DATA_DIR" not in os.environ)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, nargs="*", default=[None], help="torch threads to compare (default: the command's own).")
    ap.add_argument("--trees", nargs="*", default=[None], help="source trees (PYTHONPATH) to compare, e.g. before/after a change")
    ap.add_argument("--neighbour", action="store_true", help="one busy-loop process beside each timed run")
    ap.add_argument("--profile", type=Path, help="write a cProfile of one in-process run here and print its top entries")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if a.profile:
            subprocess.run([sys.executable, "-m", "cProfile", "-o", str(a.profile), *_argv(a.data_dir, root / "p", None)],
                           check=True, stdout=subprocess.DEVNULL)
            pstats.Stats(str(a.profile)).sort_stats("cumulative").print_stats(25)
            return
        for tree in a.trees:  # untimed: bytecode and calibration caches as after a first use
            _one(a.data_dir, root, a.threads[0], False, tree)
        times: dict = {(tree, t): [] for tree in a.trees for t in a.threads}
        for _ in range(a.runs):
            for tree, t in times:
                times[tree, t].append(_one(a.data_dir, root, t, a.neighbour, tree))
    load = os.getloadavg()[0]
    for (tree, t), ts in times.items():
        print(f"tree={tree or 'installed'} threads={t or 'default'} neighbour={a.neighbour}: median {statistics.median(ts):.2f} s "
              f"(min {min(ts):.2f}, max {max(ts):.2f}, n={len(ts)}); load {load:.2f}")


if __name__ == "__main__":
    main()
