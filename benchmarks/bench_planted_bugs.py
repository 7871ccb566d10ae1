"""Power of the audit on planted bugs, through the normal audit path (claimed-curve statistic).

DP-RVFL on the embedded digits, max-clip canary, claim eps = 2 (RDP, delta 1e-5), ``--runs``
trials (default 2,000), 95 % confidence, final-model threat model (and ``--trajectory`` also the
trajectory threat model). For each seed it audits the correct mechanism and the same mechanism
with the noise multiplier halved inside every DP-SGD step (the ``half-noise`` fault of ``tests/conftest.py``:
the release path's noise is halved while the claim stays the calibrated one). Acceptance: the
halved noise is caught (VIOLATED), the correct mechanism is not.

``--catalogue``: the catalogue of real DP-SGD pipeline bugs (tests/integrations/bug_catalogue.py), each
planted replica run over ``--seeds`` on its tiny Opacus pipeline and the correct pipeline over
``--correct-seeds``; prints the table (caught per bug, correct runs flagged, seconds per run).
Acceptance: 100 % caught, 0 % flagged.

Usage:
  .venv/bin/python benchmarks/bench_planted_bugs.py [--runs 2000] [--seeds 0] [--workers 2] [--trajectory]
  .venv/bin/python benchmarks/bench_planted_bugs.py --catalogue [--seeds 0 1 2 3 4] [--correct-seeds 100]
"""

from __future__ import annotations

import argparse
import time

import torch

torch.set_num_threads(1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--eps", type=float, default=2.0)
    ap.add_argument("--trajectory", action="store_true")
    ap.add_argument("--catalogue", action="store_true", help="the pipeline-bug catalogue instead")
    ap.add_argument(
        "--correct-seeds", type=int, default=100, help="correct-pipeline runs (--catalogue)"
    )
    a = ap.parse_args()
    if a.catalogue:
        catalogue(a.seeds, a.correct_seeds)
        return

    from dpaudit.audits.engine import run_audit
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
    import sys
    from pathlib import Path

    import pytest

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import (
        plant as plant_fault,
    )  # the test fixture's fault (the library has no switch that weakens it)

    base = HeadTarget(epsilon=a.eps)
    base.prepare()
    print(
        f"dp-rvfl digits, max-clip, claim eps {base.claimed_epsilon:.3f} ({base.accountant}), sigma "
        f"{base._config.noise_multiplier:.4f}, q {base._config.sample_rate:.5f}, T {base._config.steps}; {a.runs} trials"
    )
    print(
        "| mechanism | threat model | seed | claimed-curve eps_LB | family bound ruled out | CP eps_LB | GDP est. | verdict | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    models = ["final-model"] + (["trajectory"] if a.trajectory else [])
    for plant in (None, "half-noise"):
        for tm in models:
            t = base.with_threat_model(tm)
            for seed in a.seeds:
                t0 = time.perf_counter()
                with pytest.MonkeyPatch.context() as mp:  # workers fork: the plant reaches them
                    if plant:
                        plant_fault(mp, plant)
                    r = run_audit(
                        t,
                        runs=a.runs,
                        seed=seed,
                        controls=(),
                        reproducible_noise=True,
                        workers=a.workers,
                    )
                dt = time.perf_counter() - t0
                cc = r.claimed_curve or {}
                fam = cc.get("family") or {}
                lb = fam.get("lower_bound")
                verdict = "VIOLATED" if r.violated else "not flagged"
                print(
                    f"| {'noise halved (planted)' if plant else 'correct'} | {tm} | {seed} | {r.epsilon_lower_bound:.3f} | "
                    f"{fam.get('parameter')} >= {lb if lb is None else f'{lb:.4f}'} (claimed {fam.get('claimed', float('nan')):.4f}) | "
                    f"{r.clopper_pearson_epsilon:.3f} | {r.gdp_estimate['epsilon']:.2f} | {verdict} | {dt:.0f} |",
                    flush=True,
                )


def catalogue(seeds, correct_runs: int) -> None:
    """The bug catalogue over ``seeds`` and the correct pipeline over seeds 0 .. correct_runs - 1."""
    import sys
    import warnings
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integrations"))
    import bug_catalogue  # the replicas live with the tests: the library has no switch that weakens a run

    warnings.simplefilter("ignore")  # Opacus's secure-RNG note, once per run
    t0 = time.perf_counter()
    result = bug_catalogue.measure(list(seeds), range(correct_runs))
    print(bug_catalogue.table(result))
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
