"""Accountants under both adjacencies: each accountant's epsilon for the
Poisson-subsampled Gaussian against the independent numerical privacy profile of
tests/accounting/privacy_profile.py (written from the definitions, no accountant library), and
the wall time of one pld call.

    python benchmarks/bench_accountants_adjacency.py [--h 2e-4]

Columns: ``ref`` is the reference estimate (loss grid ``--h``, rounded to nearest); rdp and prv
(upper bound) are add/remove only (they decline replace-one with q < 1); pld is the pessimistic
PLD of dp-accounting at dpaudit's discretisation (PLD_VALUE_DISCRETIZATION).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

from dpaudit.accounting import SubsampledGaussian, compute_epsilon
from dpaudit.errors import UnsupportedEventError

CONFIGS = [
    (0.8794, 0.005, 2000),
    (1.0, 0.005, 2000),
    (2.0, 0.005, 2000),
    (0.6, 0.00532, 5640),
    (1.0, 0.01, 1),
    (0.8794, 0.01, 100),
    (2.0, 0.01, 100),
    (1.0, 0.25, 120),
]


def _profile():
    path = Path(__file__).resolve().parents[1] / "tests" / "accounting" / "privacy_profile.py"
    spec = importlib.util.spec_from_file_location("privacy_profile", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--h", type=float, default=2e-4, help="loss grid of the reference")
    ap.add_argument("--delta", type=float, default=1e-5)
    a = ap.parse_args()
    prof = _profile()
    print("| sigma | q | T | adjacency | ref | pld | pld/ref | pld s | rdp | prv (upper) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for sigma, q, steps in CONFIGS:
        ev = SubsampledGaussian(sigma, q, steps)
        for adj in ("add-remove-record", "replace-record"):
            ref = prof.subsampled_gaussian_epsilon(
                sigma, q, steps, a.delta, replace=adj == "replace-record", h=a.h
            )
            t = time.perf_counter()
            pld = compute_epsilon(ev, delta=a.delta, accountant="pld", adjacency=adj).epsilon
            dt = time.perf_counter() - t
            others = []
            for name in ("rdp", "prv"):
                try:
                    others.append(
                        f"{compute_epsilon(ev, delta=a.delta, accountant=name, adjacency=adj).epsilon:.4f}"
                    )
                except UnsupportedEventError:
                    others.append("declines")
            print(
                f"| {sigma:g} | {q:g} | {steps} | {adj} | {ref:.4f} | {pld:.4f} | {pld / ref:.4f} | {dt:.2f} | {others[0]} | {others[1]} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
