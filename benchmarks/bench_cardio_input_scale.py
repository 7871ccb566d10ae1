"""How much does Cardio's DP-RVFL accuracy at small eps depend on the (unpublished) input bounds?

The paper's Table S2 (its fixed bounds for each numerical field) is not in the available text,
so dpaudit's Cardio bounds are its own (see dpaudit.data.tabular). Wider bounds map the same
records onto a narrower part of [-1, 1]. This script simulates bounds k times wider around the
same midpoint by multiplying the encoded numerical features by 1/k (one-hot indicators are left
alone), then trains DP-RVFL with the paper's protocol at each budget for seeds 42-46.

    python benchmarks/bench_cardio_input_scale.py --data-dir ../shared/data [--eps 0.1 --eps 2]

Prints mean +/- SD accuracy (%) per (eps, widening factor). Releases go to a temporary folder and
are not recorded in any ledger (record=False): this is a sensitivity study, not a release.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

import numpy as np
import torch

from dpaudit.data import load_dataset
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest


def widened(data, factor: float):
    """Numerical columns (name without '=') scaled by 1/factor: bounds `factor` times wider."""
    names = data.feature_names or ()
    numeric = np.array([("=" not in n) and not n.endswith("__missing") for n in names])
    scale = np.where(numeric, 1.0 / factor, 1.0).astype(np.float32)
    return dataclasses.replace(
        data, x_train=data.x_train * scale, x_val=data.x_val * scale, x_test=data.x_test * scale
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--eps", type=float, action="append")
    ap.add_argument("--factor", type=float, action="append")
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44, 45, 46])
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = load_dataset("cardio", data_dir=args.data_dir)
    names = base.feature_names or ()
    print(
        f"cardio: {base.x_train.shape[0]} training records, numerical columns: "
        f"{[n for n in names if '=' not in n and not n.endswith('__missing')]}"
    )
    for eps in args.eps or [0.1, 2.0]:
        for factor in args.factor or [1.0, 2.0, 4.0]:
            data = widened(base, factor)
            accs, t0 = [], time.perf_counter()
            for seed in args.seeds:
                with tempfile.TemporaryDirectory() as tmp:
                    rel = release(
                        "dp-rvfl",
                        DPSGDRequest(
                            model="dp-rvfl",
                            dataset="cardio",
                            epsilon=eps,
                            seed=seed,
                            data_dir=args.data_dir,
                        ),
                        prepared=data,
                        out_dir=tmp,
                        record=False,
                        progress=False,
                    )
                accs.append(100 * rel.metrics["accuracy"])
            sd = statistics.stdev(accs) if len(accs) > 1 else float("nan")
            print(
                f"eps={eps:g} bounds x{factor:g}: accuracy {statistics.mean(accs):.2f} ± {sd:.2f} "
                f"(seeds {args.seeds}; {time.perf_counter() - t0:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
