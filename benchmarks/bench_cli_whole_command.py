"""Whole-command wall time of ``dpaudit train dp-rvfl --dataset mnist`` and its torch-thread default.

Each run is a fresh ``dpaudit`` process (start-up, data load, features, training, claim check,
ledger, publication: what a user waits for), timed from outside; runs of the compared settings are
interleaved, so machine load hits them alike. The runs share a cache folder of their own (the MNIST
decompression and the calibration, filled by an untimed first run); ``--memory cold`` removes the
remembered prv comparison before each run (a first run with these public parameters: a forked
child computes it beside the training), ``warm`` keeps it (every later run). ``--neighbour`` runs one busy-loop process beside
each timed run (a 2-core machine shared with another job). ``--profile`` writes a cProfile of one
run and prints the 25 largest cumulative entries.

    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --runs 5
    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --runs 5 --memory cold warm
    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --threads 1 2 --neighbour
    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --trees /tmp/before/src src
    .venv/bin/python benchmarks/bench_cli_whole_command.py --data-dir ../shared/data --profile /tmp/train.prof

Figures go to BENCHMARKS.md, section 4 with the command, the date and ``uptime``'s load (printed:
the 1-minute load before and after the timed runs; on a loaded machine only the per-run ratios of
interleaved settings mean something).
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
    return [
        str(DPAUDIT),
        "train",
        "dp-rvfl",
        "--dataset",
        "mnist",
        "--data-dir",
        data_dir,
        "--eps",
        "2",
        "--out",
        str(out),
        "--ledger",
        str(out.parent / "ledger.sqlite"),
        "--json",
        *extra,
    ]


def _one(
    data_dir: str,
    root: Path,
    threads: int | None,
    neighbour: bool,
    tree: str | None = None,
    memory: str = "warm",
) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one command: the CPU time of the process and its children
    (user + system), less sensitive to the other jobs on a loaded machine than the wall time."""
    out = Path(tempfile.mkdtemp(dir=root)) / "r"
    if (
        memory == "cold"
    ):  # the prv comparison not remembered: computed by the forked child, as on first use
        (root / "cache" / "prv_results.json").unlink(missing_ok=True)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if neighbour else None
    env = dict(
        os.environ, DPAUDIT_CACHE_DIR=str(root / "cache"), **({"PYTHONPATH": tree} if tree else {})
    )
    try:
        c0, t0 = _children_cpu(), time.perf_counter()
        subprocess.run(
            _argv(data_dir, out, threads),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        return time.perf_counter() - t0, _children_cpu() - c0
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


_MARK = "---- phases"
#: (module, function) pairs timed by ``--phases``; inner ones run inside outer ones.
PHASES = (
    ("dpaudit.mechanisms.registry", "mechanism"),
    ("dpaudit.releasing", "release"),
    ("dpaudit.mechanisms.dpsgd.mechanism", "DPSGDMechanism.load"),
    ("dpaudit.mechanisms.dpsgd.mechanism", "DPSGDMechanism.plan"),
    ("dpaudit.releasing", "_reserve_plan"),
    ("dpaudit.mechanisms.dpsgd.mechanism", "DPSGDMechanism.run"),
    ("dpaudit.mechanisms.dpsgd.mechanism", "train_heads"),
    ("dpaudit.releasing", "verify_planned_claim"),
    ("dpaudit.releasing", "_publish_all"),
    ("dpaudit.data.registry", "_load"),
    ("dpaudit.data.base", "array_sha256"),
    ("dpaudit.ledger.rows", "hash_rows"),
    ("dpaudit.mechanisms.dpsgd.features", "FrozenFeatures.transform"),
    ("dpaudit.mechanisms.dpsgd.mechanism", "head_probabilities"),
    ("dpaudit.mechanisms.dpsgd.mechanism", "classification_metrics"),
)


def _cpu_line() -> str:
    """CPU seconds (user + system) of this process and of its reaped children (a forked helper):
    less sensitive to machine load than wall times; the process's own CPU is the critical path."""
    import resource

    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return f"CPU s: this process {own.ru_utime + own.ru_stime:.3f}, its children {kids.ru_utime + kids.ru_stime:.3f}"


def _phases_child(argv: list[str]) -> None:
    """Run ``dpaudit argv`` in this process, timing :data:`PHASES` and the imports before them."""
    import atexit
    import functools
    import importlib

    t0, marks = time.perf_counter(), []
    import dpaudit.cli as cli

    marks.append(("start-up and CLI import", 0.0, time.perf_counter() - t0))

    def timed(owner, name, label):
        f = getattr(owner, name)

        @functools.wraps(f)
        def g(*args, **kw):
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                marks.append((label, t - t0, time.perf_counter() - t))

        setattr(owner, name, g)

    for mod, attr in PHASES:
        owner = importlib.import_module(mod)
        *path, name = attr.split(".")
        for p in path:
            owner = getattr(owner, p)
        timed(owner, name, attr)
    t_imports = time.perf_counter() - t0 - marks[0][2]
    atexit.register(
        lambda: print(
            "\n".join(
                [
                    _MARK,
                    f"{'phase':34s} {'starts at':>9s} {'takes':>7s}",
                    f"{'imports of the timed modules (torch)':34s} {'':>9s} {t_imports:7.3f}",
                ]
                + [f"{n:34s} {at:9.3f} {d:7.3f}" for n, at, d in sorted(marks, key=lambda m: m[1])]
                + [
                    f"{'whole process (from its first line)':34s} {'':>9s} {time.perf_counter() - t0:7.3f}",
                    _cpu_line(),
                ]
            )
        )
    )
    sys.argv = ["dpaudit", *argv]
    cli.main()


def main() -> None:
    if sys.argv[1:2] == ["--_phases-child"]:
        return _phases_child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data-dir",
        default=os.environ.get("DPAUDIT_DATA_DIR"),
        required="DPAUDIT_DATA_DIR" not in os.environ,
    )
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--threads",
        type=int,
        nargs="*",
        default=[None],
        help="torch threads to compare (default: the command's own).",
    )
    ap.add_argument(
        "--trees",
        nargs="*",
        default=[None],
        help="source trees (PYTHONPATH) to compare, e.g. before/after a change",
    )
    ap.add_argument(
        "--neighbour", action="store_true", help="one busy-loop process beside each timed run"
    )
    ap.add_argument(
        "--profile",
        type=Path,
        help="write a cProfile of one in-process run here and print its top entries",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="one run (of the first tree) with wall-clock times of its phases (no profiler overhead)",
    )
    ap.add_argument(
        "--memory",
        nargs="*",
        default=["warm"],
        choices=["warm", "cold"],
        help="the prv comparison remembered from an earlier run (warm, as every run after the first with the same public "
        "parameters) or not (cold: the first run; its child computes it); both may be compared",
    )
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if a.phases:
            env = dict(
                os.environ,
                DPAUDIT_CACHE_DIR=str(root / "cache"),
                **({"PYTHONPATH": a.trees[0]} if a.trees[0] else {}),
            )
            for _ in range(2):  # the first warms caches; the second is shown
                out = root / f"ph{_}"
                if a.memory[0] == "cold":
                    (root / "cache" / "prv_results.json").unlink(missing_ok=True)
                proc = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--_phases-child",
                        *_argv(a.data_dir, out, a.threads[0])[1:],
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=env,
                )
            print(proc.stdout.split(_MARK)[-1].strip())
            return
        if a.profile:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "cProfile",
                    "-o",
                    str(a.profile),
                    *_argv(a.data_dir, root / "p", None),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            pstats.Stats(str(a.profile)).sort_stats("cumulative").print_stats(25)
            return
        for tree in a.trees:  # untimed: bytecode and calibration caches as after a first use
            _one(a.data_dir, root, a.threads[0], False, tree)
        times: dict = {(tree, t, m): [] for tree in a.trees for t in a.threads for m in a.memory}
        load = [os.getloadavg()[0]]
        for i in range(a.runs):
            for tree, t, m in (
                list(times) if i % 2 == 0 else reversed(list(times))
            ):  # alternate which goes first
                times[tree, t, m].append(_one(a.data_dir, root, t, a.neighbour, tree, m))
        load.append(os.getloadavg()[0])
    print(
        f"uptime load (1 min) {load[0]:.2f} before, {load[1]:.2f} after, {os.cpu_count()} cores"
        + (
            ""
            if max(load) < 0.5
            else ": NOT a quiet machine, so compare the interleaved ratios, not the absolute times"
        )
    )
    for (tree, t, m), runs in times.items():
        ts, cpu = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"tree={tree or 'installed'} threads={t or 'default'} comparison={m} neighbour={a.neighbour}: median {statistics.median(ts):.2f} s "
            f"(min {min(ts):.2f}, max {max(ts):.2f}, n={len(ts)}); CPU median {statistics.median(cpu):.2f} s (min {min(cpu):.2f})"
        )
    first = next(iter(times.values()))
    for key, runs in list(times.items())[
        1:
    ]:  # runs i of both settings ran back to back: their ratio shares the load
        wall = statistics.median(b[0] / f[0] for f, b in zip(first, runs))
        cpu = statistics.median(b[1] / f[1] for f, b in zip(first, runs))
        print(f"{key} / {next(iter(times))}: median per-run ratio {wall:.3f} wall, {cpu:.3f} CPU")


if __name__ == "__main__":
    main()
