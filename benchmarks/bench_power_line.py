"""Time and values of the power line of every audit kind (dpaudit.audits.power, .power_runs).

Each case: one warm-up call (imports), then the median of --repeat calls, each with the privacy
loss distributions' cache cleared (a PLD claim's curves are computed afresh every call; the record
caches its line per configuration).

    PYTHONPATH=src python benchmarks/bench_power_line.py --repeat 3
    python benchmarks/bench_power_line.py --compare OLD/src NEW/src   # one case, side by side
    python benchmarks/bench_power_line.py --compare OLD/src NEW/src --case "one-run, Opacus ..."
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from dpaudit.accounting.events import PureEpsilon, SubsampledGaussian
from dpaudit.audits import curves
from dpaudit.audits.curves import claimed_curve
from dpaudit.audits.gaussian import calibrate_exact
from dpaudit.audits.power import audit_power

DELTA = 1e-5
TRIAL_CASE = "trials, Gaussian claim 4, N 2,000"
MNIST_2 = SubsampledGaussian(0.8794, 0.005, 2000)  # dp-dense / dp-cnn MNIST, claim 2 (rdp)
OPACUS_8 = SubsampledGaussian(0.527, 0.005, 1000)  # the Opacus example, 5 epochs, claim 8


def trial_case():
    """The one case an older source tree has too (no one-run or white-box power line there)."""
    curve = claimed_curve(SubsampledGaussian(calibrate_exact(4.0, DELTA), 1.0, 1))
    return lambda: audit_power(trials=2000, delta=DELTA, claimed_epsilon=4.0, curve=curve)


def cases() -> dict:
    from dpaudit.audits.power_runs import one_run_power, white_box_power  # absent from older trees

    gauss = {e: SubsampledGaussian(calibrate_exact(e, DELTA), 1.0, 1) for e in (2.0, 8.0)}
    return {
        TRIAL_CASE: trial_case(),
        "trials, Laplace (pure) claim 1, N 2,000": lambda: audit_power(
            trials=2000, delta=DELTA, claimed_epsilon=1.0, curve=claimed_curve(PureEpsilon(1.0))
        ),
        "trials, DP-SGD claim (sigma 1, q 0.01, T 1,000), N 2,000": lambda: audit_power(
            trials=2000,
            delta=DELTA,
            claimed_epsilon=2.1,
            curve=claimed_curve(SubsampledGaussian(1.0, 0.01, 1000)),
        ),
        "one-run, Gaussian claim 8, m 1,000": lambda: one_run_power(
            1000, delta=DELTA, claim=gauss[8.0]
        ),
        "one-run, Gaussian claim 2, m 1,000": lambda: one_run_power(
            1000, delta=DELTA, claim=gauss[2.0]
        ),
        "one-run, pure claim 2, m 1,000": lambda: one_run_power(
            1000, delta=DELTA, claim=PureEpsilon(2.0)
        ),
        "one-run, no event, claim 2, m 1,000": lambda: one_run_power(
            1000, delta=DELTA, claimed_epsilon=2.0
        ),
        "one-run, Opacus example claim 8 (PLD), m 1,000": lambda: one_run_power(
            1000, delta=DELTA, claim=OPACUS_8
        ),
        "white-box, MNIST claim 2, M 5,000": lambda: white_box_power(MNIST_2, 5000, delta=DELTA),
        "crafted-final, MNIST claim 2, M 18,000": lambda: white_box_power(
            MNIST_2, 18000, threat_model="crafted-final", delta=DELTA
        ),
    }


def compare(sources: list[str], case: str = TRIAL_CASE, rounds: int = 3) -> None:
    """``case`` under each source tree, in alternating subprocesses (median of 5 calls each)."""
    code = (
        "import statistics, time, bench_power_line as b\n"
        f"call = b.trial_case() if {case!r} == b.TRIAL_CASE else b.cases()[{case!r}]\n"
        "call(); ts = []\n"
        "for _ in range(5):\n"
        "    t = time.perf_counter(); p = b.uncached(call); ts.append(time.perf_counter() - t)\n"
        "print(f'{1000 * statistics.median(ts):.0f} ms', p.at_claim, p.smallest_factor, p.trials_for_90)"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    for r in range(rounds):
        for src in sources:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, here])}
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True
            )
            print(r, src, out.stdout.strip() or out.stderr[-400:], flush=True)


def uncached(call):
    curves._branch_profile.cache_clear()
    return call()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--compare", nargs="+", metavar="SRC", help="source trees to time --case under")
    ap.add_argument("--case", default=TRIAL_CASE, help="the case --compare times")
    args = ap.parse_args()
    if args.compare:
        return compare(args.compare, args.case)
    for name, call in cases().items():
        call()
        times = []
        for _ in range(args.repeat):
            curves._branch_profile.cache_clear()
            t0 = time.perf_counter()
            line = call().line()
            times.append(time.perf_counter() - t0)
        print(f"{name}: {1000 * statistics.median(times):.0f} ms\n  {line}", flush=True)


if __name__ == "__main__":
    main()
