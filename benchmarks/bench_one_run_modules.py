"""One-run audits of the trainable DP-SGD modules: control, soundness, MNIST CNN.

    .venv/bin/python benchmarks/bench_one_run_modules.py control            # digits dp-dense, no noise
    .venv/bin/python benchmarks/bench_one_run_modules.py soundness --seeds 20
    DPAUDIT_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/bench_one_run_modules.py mnist-cnn --epochs 10

Every run trains ONCE; the one-run bound is :func:`dpaudit.audits.one_run.one_run_bounds`.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import torch

from dpaudit.audits.one_run import one_run_bounds
from dpaudit.mechanisms.dpsgd.one_run_modules import module_config, modules_one_run
from dpaudit.data import load_dataset
from dpaudit.noise import NoiseSource

DELTA = 1e-5


def control(args):
    data = load_dataset("digits")
    cfg, event = module_config("dp-dense", data, epsilon=2.0, delta=DELTA)
    t = time.perf_counter()
    r = modules_one_run(
        "dp-dense",
        data,
        cfg,
        canaries=args.canaries,
        noise=NoiseSource("reproducible", seed=0),
        seed=0,
        noise_on=False,
    )
    b = one_run_bounds(r, delta=DELTA)["steinke"]
    print(
        json.dumps(
            {
                "what": "no-noise control digits dp-dense",
                "m": args.canaries,
                "eps_lb": b["epsilon_lower_bound"],
                "ceiling": b["ceiling"],
                "ratio": b["epsilon_lower_bound"] / b["ceiling"],
                "seconds": time.perf_counter() - t,
            }
        )
    )


def soundness(args):
    data = load_dataset("digits")
    for eps in (1.0, 2.0):
        cfg, event = module_config("dp-dense", data, epsilon=eps, delta=DELTA)
        rows = []
        for seed in range(args.seeds):
            r = modules_one_run(
                "dp-dense",
                data,
                cfg,
                canaries=args.canaries,
                noise=NoiseSource("reproducible", seed=1000 + seed),
                seed=seed,
            )
            b = one_run_bounds(r, delta=DELTA, claim=event if args.fdp else None)
            rows.append(
                (b["steinke"]["epsilon_lower_bound"], (b["fdp"] or {}).get("epsilon_lower_bound"))
            )
        st = [a for a, _ in rows]
        fd = [f for _, f in rows if f is not None]
        print(
            json.dumps(
                {
                    "what": "soundness digits dp-dense",
                    "claim": eps,
                    "seeds": args.seeds,
                    "m": args.canaries,
                    "steinke_max": max(st),
                    "steinke_mean": sum(st) / len(st),
                    "steinke_violations": sum(x > eps for x in st),
                    "fdp_max": max(fd) if fd else None,
                    "fdp_violations": sum(x > eps for x in fd) if fd else None,
                }
            )
        )


def mnist_cnn(args):
    data = load_dataset("mnist")
    cfg, event = module_config("dp-cnn", data, epsilon=8.0, delta=DELTA, epochs=args.epochs)
    t = time.perf_counter()
    r = modules_one_run(
        "dp-cnn", data, cfg, canaries=args.canaries, noise=NoiseSource("os-entropy"), seed=0
    )
    train_s = time.perf_counter() - t
    b = one_run_bounds(r, delta=DELTA, claim=event)
    print(
        json.dumps(
            {
                "what": "mnist dp-cnn one-run",
                "epochs": args.epochs,
                "steps": cfg.steps,
                "sigma": cfg.noise_multiplier,
                "m": args.canaries,
                "one_run_train_seconds": train_s,
                "steinke_eps_lb": b["steinke"]["epsilon_lower_bound"],
                "fdp_eps_lb": (b["fdp"] or {}).get("epsilon_lower_bound"),
                "claimed": b["claimed_epsilon"],
            }
        )
    )


def overhead(args):
    """Side by side, interleaved: one plain dp-cnn training on MNIST vs the same training as a one-run
    audit with m canaries (--steps of the eps-8 schedule; CPU seconds, one thread)."""
    import dataclasses

    from dpaudit.mechanisms.dpsgd.module_training import train_module_dp_sgd
    from dpaudit.mechanisms.dpsgd.models import build_module

    data = load_dataset("mnist")
    cfg, _ = module_config("dp-cnn", data, epsilon=8.0, delta=DELTA, epochs=args.epochs)
    cfg = dataclasses.replace(cfg, steps=args.steps)
    x = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32))
    y = torch.as_tensor(np.asarray(data.y_train, dtype=np.int64))
    rows = []
    for rep in range(args.repeats):
        c = time.process_time()
        module = build_module(
            "cnn",
            kind=data.kind,
            n_features=data.n_features,
            n_classes=int(data.n_classes),
            image_shape=data.image_shape,
            seed=rep,
        )
        train_module_dp_sgd(
            module, x, y, cfg, noise=NoiseSource("os-entropy"), loss="cross_entropy"
        )
        plain = time.process_time() - c
        c = time.process_time()
        modules_one_run(
            "dp-cnn", data, cfg, canaries=args.canaries, noise=NoiseSource("os-entropy"), seed=rep
        )
        one = time.process_time() - c
        rows.append((plain, one))
        print(
            json.dumps(
                {
                    "what": "dp-cnn mnist plain vs one-run",
                    "steps": cfg.steps,
                    "m": args.canaries,
                    "plain_cpu_s": plain,
                    "one_run_cpu_s": one,
                    "ratio": one / plain,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    torch.set_num_threads(1)
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["control", "soundness", "mnist-cnn", "overhead"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--canaries", type=int, default=500)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--fdp", action="store_true")
    a = p.parse_args()
    {"control": control, "soundness": soundness, "mnist-cnn": mnist_cnn, "overhead": overhead}[
        a.what
    ](a)
