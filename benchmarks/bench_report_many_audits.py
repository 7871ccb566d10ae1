"""Time `dpaudit report` over K trial audits of N trials each (written with the library, not by running trials).

    PYTHONPATH=src python benchmarks/bench_report_many_audits.py --audits 10 --trials 100000 \
        [--compare OTHER/src] [--dir DIR]

Prints the seconds to write the audit files (into DIR, reused when it holds them), then the wall and
CPU seconds (and the CPU seconds of its two steps) to build and write the HTML report in a fresh process (cold caches, as `dpaudit report`
runs), for this tree and, with ``--compare``, for the library at OTHER/src on the same audit files,
taken in turns, with the load average. Each audit's scores are two Gaussians one sigma apart,
tested against a Gaussian claim (sigma 2).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits.engine import audit_scores, write_audit

# prints: wall seconds, then CPU seconds of building the model and of drawing and writing it
REPORT = (
    "import sys, time; from pathlib import Path; "
    "from dpaudit.reports import build_report, write_report; t = time.perf_counter(); "
    "c = time.process_time(); model = build_report([Path(sys.argv[1])], ledger_path=None); "
    "b = time.process_time(); write_report(model, Path(sys.argv[2]), fmt='html'); "
    "print(time.perf_counter() - t, b - c, time.process_time() - b)"
)


def write_audits(root: Path, audits: int, trials: int) -> float:
    t0 = time.perf_counter()
    for i in range(audits):
        if (root / f"audit{i}").exists():
            continue
        rng = np.random.default_rng(i)
        res = audit_scores(
            rng.normal(1.0, 1.0, trials // 2),
            rng.normal(0.0, 1.0, trials // 2),
            delta=1e-5,
            claim=SubsampledGaussian(2.0, 1.0, 1),
            seed=i,
            mechanism="gaussian",
            canary="shift",
        )
        write_audit(res, root / f"audit{i}")
    return time.perf_counter() - t0


def report_seconds(src: str | None, audits: Path, out: Path) -> tuple[float, ...]:
    """(wall, CPU, CPU building the model, CPU drawing and writing it) seconds of build_report +
    write_report over ``audits`` in a fresh process, with the library at ``src`` (None: this one);
    CPU includes the interpreter's start and imports."""
    env = dict(os.environ, PYTHONPATH=src) if src else dict(os.environ)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [sys.executable, "-c", REPORT, str(audits), str(out)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    wall, build, write = (float(x) for x in run.stdout.split()[-3:])
    return wall, cpu, build, write


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--audits", type=int, default=10)
    ap.add_argument("--trials", type=int, default=100_000)
    ap.add_argument("--compare", help="another tree's src folder, timed on the same audits")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--dir", help="the audits' folder, reused when it holds them (default: temporary)"
    )
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        audits = Path(a.dir or Path(tmp) / "audits")
        seconds = write_audits(audits, a.audits, a.trials)
        print(f"wrote {a.audits} audits of {a.trials} trials in {seconds:.1f} s", flush=True)
        for _ in range(a.rounds):
            for src in [None] + ([a.compare] if a.compare else []):
                wall, cpu, build, write = report_seconds(src, audits, Path(tmp) / "report.html")
                print(
                    f"report over {a.audits} audits of {a.trials} trials ({src or 'this tree'}): "
                    f"{wall:.1f} s, CPU {cpu:.1f} s (model {build:.1f}, figures and HTML {write:.1f}), "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
