"""Time `dpaudit report` over K trial audits of N trials each (written with the library, not by running trials).

    PYTHONPATH=src python benchmarks/bench_report_many_audits.py --audits 10 --trials 100000

Prints the seconds to write the audit files and to build and write the HTML report. Each audit's
scores are two Gaussians one sigma apart, tested against a Gaussian claim (sigma 2).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits.engine import audit_scores, write_audit
from dpaudit.reports import build_report, write_report


def write_audits(root: Path, audits: int, trials: int) -> float:
    t0 = time.perf_counter()
    for i in range(audits):
        rng = np.random.default_rng(i)
        res = audit_scores(rng.normal(1.0, 1.0, trials // 2), rng.normal(0.0, 1.0, trials // 2), delta=1e-5,
                           claim=SubsampledGaussian(2.0, 1.0, 1), seed=i, mechanism="gaussian", canary="shift")
        write_audit(res, root / f"audit{i}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--audits", type=int, default=10)
    ap.add_argument("--trials", type=int, default=100_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print(f"wrote {a.audits} audits of {a.trials} trials in {write_audits(root / 'audits', a.audits, a.trials):.1f} s", flush=True)
        t0 = time.perf_counter()
        model = build_report([root / "audits"], ledger_path=None)
        write_report(model, root / "report.html", fmt="html")
        print(f"report over {a.audits} audits of {a.trials} trials: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
