"""A white-box audit catches shuffled fixed-size batches behind Poisson accounting.

Each trial trains a small DP-SGD (logistic regression, N public synthetic records, d features, clipping
norm C, noise multiplier sigma, ``1/q`` steps per epoch, ``epochs`` epochs, T = epochs / q steps) with a
Dirac gradient canary: one extra record whose clipped gradient is C e_j at a weight j no data record
touches (its feature is zero in every record). The adversary sees the trajectory (white-box): the
noisy clipped-gradient sum at coordinate j at every step, x_t = C [canary in batch t] + N(0, (sigma C)^2).
Score: the log-likelihood ratio of the Poisson claim (``trajectory_log_lr``: the Neyman-Pearson
statistic of the claimed mechanism, fixed before looking). Two samplers, one claim:

- ``poisson``: every record (the canary too) joins each batch independently with probability q;
- ``shuffle``: each epoch a fresh permutation split into 1/q batches: the canary is in exactly one
  batch per epoch, with certainty, where Poisson sampling skips it for a whole epoch with chance
  (1 - q)^(1/q) ~ 1/e.

Claim for both: SubsampledGaussian(sigma, q, T) (what a Poisson accountant reports). The audit is
dpaudit's engine (``run_audit`` on a ``CallableTarget``), claimed-curve statistic at 95 % confidence.

Usage:
  .venv/bin/python benchmarks/bench_sampler_mismatch.py [--runs 2000] [--sigma 0.6] [--q 0.25] [--epochs 1]
      [--n 12] [--seeds 0] [--samplers shuffle poisson]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

from dpaudit.accounting.accountants import compute_epsilon
from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits.engine import run_audit
from dpaudit.audits.targets import CallableTarget
from dpaudit.mechanisms.dpsgd.head_audit import trajectory_log_lr

DELTA, C, D, LR = 1e-5, 1.0, 4, 0.5


def _data(n: int):
    """Public synthetic records: d features (the canary's feature d is zero in all of them) and labels."""
    g = np.random.default_rng(12345)
    x = np.zeros((n, D + 1))
    x[:, :D] = g.normal(size=(n, D))
    return x, (x[:, 0] + 0.5 * g.normal(size=n) > 0).astype(float)


def _batches(sampler: str, records: int, q: float, epochs: int, rng: np.random.Generator):
    per_epoch = round(1 / q)
    for _ in range(epochs):
        if sampler == "shuffle":
            yield from np.array_split(rng.permutation(records), per_epoch)
        else:
            for _ in range(per_epoch):
                yield np.flatnonzero(rng.random(records) < q)


def train(
    canary: bool,
    rng: np.random.Generator,
    *,
    sampler: str,
    n: int,
    q: float,
    epochs: int,
    sigma: float,
) -> np.ndarray:
    """One DP-SGD run; returns the noisy clipped-gradient sums at the canary's coordinate, per step.
    Record n (present iff ``canary``) is the Dirac canary: its clipped gradient is C e_D."""
    x, y = _data(n)
    w = np.zeros(D + 1)
    out = []
    for batch in _batches(sampler, n + int(canary), q, epochs, rng):
        data = batch[batch < n]
        p = 1 / (1 + np.exp(-x[data] @ w))
        g = (p - y[data])[:, None] * x[data]
        g *= np.minimum(1.0, C / np.maximum(np.linalg.norm(g, axis=1), 1e-12))[:, None]
        s = g.sum(axis=0)
        s[D] += C * int(len(batch) > len(data))
        s += rng.normal(0.0, sigma * C, size=D + 1)
        out.append(s[D])
        w -= LR * s / max(1.0, n * q)  # a public normaliser
    return np.asarray(out)


def score(x: np.ndarray, *, q: float, sigma: float) -> float:
    return float(trajectory_log_lr(x, sample_rate=q, noise_multiplier=sigma, clipping_norm=C))


def shuffle_score(x: np.ndarray, *, q: float, sigma: float) -> float:
    """The log-likelihood ratio if the canary is in exactly one uniformly placed batch per epoch:
    sum over epochs of log mean_t exp((x_t C - C^2/2) / (sigma C)^2)."""
    a = (x * C - 0.5 * C * C) / (sigma * C) ** 2
    return float(
        np.sum(np.logaddexp.reduce(a.reshape(-1, round(1 / q)), axis=1) - np.log(round(1 / q)))
    )


SCORES = {"poisson-lr": score, "shuffle-lr": shuffle_score}


def target(
    sampler: str, *, n: int, q: float, epochs: int, sigma: float, statistic: str = "poisson-lr"
) -> CallableTarget:
    claim = SubsampledGaussian(sigma, q, epochs * round(1 / q))
    eps = float(compute_epsilon(claim, delta=DELTA).epsilon)
    return CallableTarget(
        mechanism_fn=functools.partial(
            train, sampler=sampler, n=n, q=q, epochs=epochs, sigma=sigma
        ),
        score_fn=functools.partial(SCORES[statistic], q=q, sigma=sigma),
        claimed_epsilon=eps,
        delta=DELTA,
        claimed_event=claim,
        mechanism=f"dp-sgd-{sampler}",
        canary="dirac-gradient",
        info={
            "sampler": sampler,
            "n": n,
            "q": q,
            "epochs": epochs,
            "sigma": sigma,
            "statistic": statistic,
        },
    )


def audit(sampler: str, *, runs: int, seed: int, **cfg) -> dict:
    res = run_audit(
        target(sampler, **cfg), runs=runs, seed=seed, controls=(), reproducible_noise=True
    )
    r = res.to_dict()
    fam = r["claim_family_bound"] or {}
    return {
        "sampler": sampler,
        "seed": seed,
        "claimed": r["claimed_epsilon"],
        "eps_lb": r["epsilon_lower_bound"],
        "family_eps": fam.get("family_epsilon") or 0.0,
        "ruled_out": fam.get("ruled_out_from"),
        "violated": bool(res.violated),
        "auc": r["auc"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--sigma", type=float, default=0.6)
    ap.add_argument("--q", type=float, default=0.25)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--samplers", nargs="+", default=["shuffle", "poisson"])
    ap.add_argument("--statistic", choices=sorted(SCORES), default="poisson-lr")
    a = ap.parse_args()
    cfg = {"n": a.n, "q": a.q, "epochs": a.epochs, "sigma": a.sigma, "statistic": a.statistic}
    print(
        f"config {cfg}, T {a.epochs * round(1 / a.q)}, delta {DELTA}, {a.runs} trials, 95 % confidence, claimed-curve statistic"
    )
    print(
        "| sampler | seed | claimed eps (Poisson, rdp) | eps_LB | family eps_LB (sigma ruled out from) | verdict | AUC | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for sampler in a.samplers:
        for seed in a.seeds:
            t0 = time.perf_counter()
            r = audit(sampler, runs=a.runs, seed=seed, **cfg)
            print(
                f"| {sampler} | {seed} | {r['claimed']:.3f} | {r['eps_lb']:.3f} | {r['family_eps']:.3f} ({r['ruled_out'] or '-'}) | {'VIOLATED' if r['violated'] else 'not flagged'} | "
                f"{r['auc']:.3f} | {time.perf_counter() - t0:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
