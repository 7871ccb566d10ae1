"""Claimed-curve audits: power against today's Clopper–Pearson eps_LB, and speed.

For seeds 0-4 at 2,000 trials (1,000 per world, SELECT/EVAL halves from engine.plan_trials),
95 % confidence, delta 1e-5, it prints today's statistic (engine.evaluate_scores: the
SELECT/EVAL Clopper–Pearson eps_LB) beside the claimed-curve eps_LB (curves.curve_test) for
  - the exact Gaussian mechanism claimed at eps 2 and at eps 4 (score = the output);
  - the unclipped canary: a Gaussian sum claimed at eps 1 whose canary has 3x the sensitivity;
  - null data (identical score distributions), claim: the eps-1 Gaussian;
  - a DP-RVFL-like subsampled Gaussian, SubsampledGaussian(0.88, 0.005, 2000), score = the sum of
    the canary's noisy gradient coordinate over the steps (what the final model shows), correct
    and with the noise multiplier halved (claim unchanged);
and the wall time of each curve_test. ``--soundness`` also prints the false-violation rates over
200 seeds (the test suite's cases).

Gaussian claims use the pld accountant (the exact epsilon of one Gaussian: the audit's gaussian
target does the same); the DP-RVFL-like event uses rdp (the release's accountant).

Usage (from the repository root):
  .venv/bin/python benchmarks/bench_claimed_curve.py [--soundness]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from dpaudit.accounting.accountants import compute_epsilon
from dpaudit.accounting.events import PureEpsilon, SubsampledGaussian
from dpaudit.audits import curves
from dpaudit.audits.engine import evaluate_scores, plan_trials
from dpaudit.audits.stats import gdp_mu_for_epsilon

DELTA = 1e-5
RUNS = 2000


def sigma_for(eps: float) -> float:
    return 1.0 / gdp_mu_for_epsilon(eps, DELTA)


def case(name: str, gen, event, accountant: str, seeds=range(5)) -> None:
    claim = compute_epsilon(event, delta=DELTA, accountant=accountant).epsilon
    cps, lbs, flags, times, cpu = [], [], [], [], []
    for seed in seeds:
        plan = plan_trials(RUNS, seed=seed)
        rng = np.random.default_rng(seed)
        s = gen(rng, plan.world)
        cps.append(evaluate_scores(s, plan.world, plan.select, delta=DELTA)["epsilon_lower_bound"])
        t0, c0 = time.perf_counter(), time.process_time()
        r = curves.curve_test(
            s, plan.world, plan.select, event=event, delta=DELTA, accountant=accountant
        )
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        lbs.append(r["family_epsilon"])
        flags.append(r["violated"])
    fmt = lambda xs: " ".join(f"{x:5.2f}" for x in xs)  # noqa: E731
    print(
        f"{name:<34} claim {claim:5.2f} | CP eps_LB {fmt(cps)} (mean {np.mean(cps):.2f}) | "
        f"curve eps_LB {fmt(lbs)} (mean {np.mean(lbs):.2f}) | violated {sum(flags)}/{len(flags)} | "
        f"curve_test wall {np.median(times):.3f} s median / {max(times):.3f} s max, "
        f"CPU {np.median(cpu):.3f} / {max(cpu):.3f} s"
    )


def rvfl_like(sigma_scores: float, q: float = 0.005, steps: int = 2000):
    def gen(rng, w):
        inc = rng.binomial(steps, q, size=w.size) * w  # steps in which the canary was sampled
        return rng.normal(inc.astype(float), sigma_scores * np.sqrt(steps))

    return gen


def soundness() -> None:
    from dpaudit.audits.curves import claimed_curve, eval_box

    seeds = range(200)
    sg2 = sigma_for(2.0)
    rates = {}
    t0 = time.perf_counter()
    v = z = 0
    for seed in seeds:
        plan = plan_trials(RUNS, seed=seed)
        rng = np.random.default_rng(seed)
        v += curves.curve_test(
            rng.normal(plan.world.astype(float), sg2),
            plan.world,
            plan.select,
            event=SubsampledGaussian(sg2, 1.0, 1),
            delta=DELTA,
        )["violated"]
    rates["exact Gaussian eps 2: violated"] = v / len(seeds)
    v = 0
    for seed in seeds:
        plan = plan_trials(RUNS, seed=seed)
        rng = np.random.default_rng(seed)
        v += curves.curve_test(
            rng.laplace(plan.world.astype(float), 1.0),
            plan.world,
            plan.select,
            event=PureEpsilon(1.0),
            delta=0.0,
            accountant="pure",
        )["violated"]
    rates["Laplace eps 1: violated"] = v / len(seeds)
    sigma, q, steps = 1.0, 0.1, 20
    curve = claimed_curve(SubsampledGaussian(sigma, q, steps))
    boxes = []
    for seed in seeds:
        plan = plan_trials(RUNS, seed=seed)
        rng = np.random.default_rng(seed)
        inc = (rng.random((RUNS, steps)) < q) & plan.world[:, None]
        x = rng.normal(inc.astype(float), sigma)
        lr = np.sum(np.log1p(q * np.expm1((2 * x - 1) / (2 * sigma**2))), axis=1)
        b = eval_box(lr, plan.world, plan.select, criterion="gdp-mu")
        boxes.append((b.fpr_upper, b.fnr_upper))
    a, b = np.array(boxes).T
    rates["subsampled Gaussian (1, 0.1, 20), LR score: violated"] = float(
        curve.violated_by(a, b).mean()
    )
    for ev, acc, dl, label in (
        (SubsampledGaussian(1.0, 1.0, 1), "rdp", DELTA, "Gaussian"),
        (PureEpsilon(1.0), "pure", 0.0, "pure eps 1"),
    ):
        z = 0
        for seed in seeds:
            plan = plan_trials(RUNS, seed=seed)
            rng = np.random.default_rng(seed)
            z += (
                curves.curve_test(
                    rng.normal(size=RUNS),
                    plan.world,
                    plan.select,
                    event=ev,
                    delta=dl,
                    accountant=acc,
                )["family_epsilon"]
                == 0.0
            )
        rates[f"null data, {label} claim: eps_LB == 0"] = z / len(seeds)
    for k, val in rates.items():
        print(f"  {k:<58} {val:.3f}")
    print(f"  ({time.perf_counter() - t0:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--soundness", action="store_true", help="also the 200-seed false-violation rates"
    )
    args = ap.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; "
        f"{RUNS} trials, confidence 0.95, delta {DELTA}, seeds 0-4"
    )
    # warm-up: imports (dp-accounting, statsmodels) outside the timings
    plan = plan_trials(RUNS, seed=99)
    curves.curve_test(
        np.random.default_rng(0).normal(size=RUNS),
        plan.world,
        plan.select,
        event=SubsampledGaussian(1.0, 0.5, 2),
        delta=DELTA,
    )
    for eps in (2.0, 4.0):
        sg = sigma_for(eps)
        case(
            f"Gaussian, exact, claimed eps {eps:g}",
            lambda rng, w, sg=sg: rng.normal(w.astype(float), sg),
            SubsampledGaussian(sg, 1.0, 1),
            "pld",
        )
    sg1 = sigma_for(1.0)
    case(
        "unclipped canary (3x), claim eps 1",
        lambda rng, w: rng.normal(3.0 * w.astype(float), sg1),
        SubsampledGaussian(sg1, 1.0, 1),
        "pld",
    )
    case(
        "null data, claim eps 1 Gaussian",
        lambda rng, w: rng.normal(0.0, 1.0, size=w.size),
        SubsampledGaussian(sg1, 1.0, 1),
        "pld",
    )
    ev = SubsampledGaussian(0.88, 0.005, 2000)
    case("DP-RVFL-like (0.88, 0.005, 2000)", rvfl_like(0.88), ev, "rdp")
    case("DP-RVFL-like, noise halved", rvfl_like(0.44), ev, "rdp")
    if args.soundness:
        print("soundness, 200 seeds:")
        soundness()


if __name__ == "__main__":
    main()
