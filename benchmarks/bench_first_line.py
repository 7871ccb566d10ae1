"""Seconds from launching a long dpaudit command to its first line on stderr, in a pipe.

    PYTHONPATH=src python benchmarks/bench_first_line.py --old-src /tmp/base/src --rounds 3

Each command is started as a fresh process (the installed ``dpaudit`` script with PYTHONPATH set to
the tree under test), its stderr read through a pipe until the first line, then killed. Old and new
trees alternate, so machine load hits both alike. The issue's goal: the first line within 2 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

COMMANDS = (
    "train dp-rvfl --eps 2 --epochs 1 --out {dir}/release",
    "audit dp-rvfl --runs 40 --out {dir}/audit",
    "calibrate --eps 2 --sample-rate 0.005 --steps 2000",
)


def first_line_seconds(src: str, command: str, work: Path) -> float:
    env = {**os.environ, "PYTHONPATH": src, "DPAUDIT_LEDGER": str(work / "ledger.sqlite")}
    started = time.monotonic()
    proc = subprocess.Popen(
        [shutil.which("dpaudit") or "dpaudit", *command.format(dir=work).split()],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stderr.readline()
    elapsed = time.monotonic() - started
    proc.kill()
    proc.wait()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--new-src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--old-src", default="", help="the tree to compare with (its src folder)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    trees = {"new": args.new_src, **({"old": args.old_src} if args.old_src else {})}
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for command in COMMANDS:
                for name, src in trees.items():
                    work = Path(tmp) / f"{name}{i}{len(seconds[name])}"
                    work.mkdir()
                    seconds[name].append(first_line_seconds(src, command, work))
    load = os.getloadavg()[0]
    for name, values in seconds.items():
        print(
            f"{name}: first line median {statistics.median(values):.2f} s, max {max(values):.2f} s, "
            f"min {min(values):.2f} s over {len(values)} launches (load {load:.1f})"
        )


if __name__ == "__main__":
    main()
