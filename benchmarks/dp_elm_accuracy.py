"""DP-ELM test accuracy at eps = 2 for every width, seeds 42-46, next to the published Table 5.

DP-RVFL paper (001), section 4.5, Table 5: mean +/- SD over five seeds (MNIST, Cardio columns).
Each run: public features from the seed, fresh secret noise (os-entropy), exact discrete Laplace
sampler (default) -- add ``--sampler textbook`` for the published float64 sampler, and
``--non-private`` for the closed-form reference without noise. No ledger is written.
Run:  .venv/bin/python benchmarks/dp_elm_accuracy.py --data-dir ../shared/data [--datasets mnist cardio]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dpaudit.data import load_dataset
from dpaudit.mechanisms.elm.mechanism import ELM_WIDTHS, fit_dp_elm
from dpaudit.noise import NoiseSource

PUBLISHED = {  # Table 5, eps = 2, accuracy % mean +/- SD over seeds 42-46
    "mnist": {1: (10.08, 0.16), 3: (18.47, 1.80), 5: (25.26, 1.44), 10: (38.17, 2.56)},
    "cardio": {1: (49.82, 0.27), 3: (53.30, 2.88), 5: (58.75, 3.59), 10: (58.61, 5.42)},
    "heart": {1: (48.26, 9.53), 3: (59.57, 9.79), 5: (51.74, 16.66), 10: (41.30, 13.40)},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--datasets", nargs="+", default=["mnist", "cardio"])
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44, 45, 46])
    ap.add_argument("--widths", type=int, nargs="+", default=list(ELM_WIDTHS))
    ap.add_argument(
        "--sampler", default="discrete-laplace", choices=["discrete-laplace", "textbook"]
    )
    ap.add_argument("--noise-source", default="os-entropy", choices=["os-entropy", "cryptographic"])
    ap.add_argument("--non-private", action="store_true")
    args = ap.parse_args()
    eps = None if args.non_private else args.epsilon
    label = (
        "non-private"
        if eps is None
        else f"eps={eps:g}, sampler {args.sampler}, noise {args.noise_source}"
    )
    print(f"# DP-ELM test accuracy (%), {label}, seeds {args.seeds}")
    print(
        f"{'dataset':8s} {'L':>3s} {'ours mean +/- SD':>18s} {'published (eps=2)':>18s} {'per-seed':>40s} {'fit s':>7s}"
    )
    for name in args.datasets:
        data = load_dataset(name, data_dir=args.data_dir)
        for width in args.widths:
            accs, secs = [], []
            for seed in args.seeds:
                t = time.perf_counter()
                r = fit_dp_elm(
                    data.x_train,
                    data.y_train,
                    data.n_classes,
                    width,
                    eps,
                    seed=seed,
                    noise=None if eps is None else NoiseSource(args.noise_source),
                    sampler=args.sampler,
                )
                secs.append(time.perf_counter() - t)
                accs.append(100.0 * float(np.mean(r.predict(data.x_test) == data.y_test)))
            pub = PUBLISHED.get(name, {}).get(width)
            pub_s = f"{pub[0]:.2f} +/- {pub[1]:.2f}" if pub else "-"
            print(
                f"{name:8s} {width:3d} {statistics.mean(accs):9.2f} +/- {statistics.stdev(accs):5.2f} {pub_s:>18s} "
                f"{' '.join(f'{a:.2f}' for a in accs):>40s} {statistics.mean(secs):7.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
