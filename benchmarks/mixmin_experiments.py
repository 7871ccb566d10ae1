"""DP-MixMin acceptance experiments on mnist-mix (real MNIST; needs --data-dir or $DPAUDIT_DATA_DIR).

Part 1 (cosine): eps = 1, rho = 0.1, 5 seeds. For every target, lambda_DP (Algorithm 1 on D_mix,
default settings: B = 1000, C = 13, eta = 0.5, 200 steps) against the non-private lambda*
computed on the whole private training split; mean / std / min cosine similarity.
Part 2 (pipeline): eps in {1, 2, 5} x 3 seeds x targets: test AUC after DP fine-tuning for
DP-MixMin, uniform, random search (m = 8, non-private selection), random init and non-private
MixMin (parallel composition, rho = 0.1), reported as measured.

Seeds vary the D_mix / D_ft split, the downstream initialisation and the DP noise (reproducible
noise derived from the seed, so reruns give the same numbers); the public half and the proxies
use task seed 42 throughout.

    python benchmarks/mixmin_experiments.py --data-dir ../shared/data [--part cosine|pipeline|all] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from scipy.spatial.distance import cosine

from dpaudit.mechanisms.mixmin.solver import solve_mixmin
from mixmin_baselines import METHODS, learn_mixture, run_method

from dpaudit.mechanisms.mixmin.tasks import MixtureSettings
from dpaudit.mechanisms.mixmin.tasks import load_task, mixture_split, train_proxies
from dpaudit.noise import NoiseSource


def _cosine_similarity(a, b) -> float:
    """Cosine similarity of two weight vectors (scipy's cosine distance, subtracted from 1)."""
    return float(1.0 - cosine(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)))


def cosine_part(task, probs, seeds, epsilon=1.0, rho=0.1):
    rows = {}
    settings = MixtureSettings()
    for target in task.targets:
        y = task.targets[target][task.train_idx].astype(float)
        star = solve_mixmin(probs, y, settings.loss, steps=5000)
        cos = []
        for s in seeds:
            mix, _ = mixture_split(task.train_record_ids, rho, s)
            res, cfg, cal = learn_mixture(
                probs[mix],
                y[mix],
                epsilon=epsilon,
                delta=1e-5,
                settings=settings,
                noise=NoiseSource("reproducible", seed=s),
            )
            cos.append(_cosine_similarity(res.weights, star))
        rows[target] = {
            "kind": task.target_kinds[target],
            "cosines": cos,
            "mean": float(np.mean(cos)),
            "std": float(np.std(cos)),
            "min": float(np.min(cos)),
            "lambda_star": star.round(4).tolist(),
            "sigma": cfg.noise_multiplier,
            "sample_rate": cfg.sample_rate,
            "n_mix": int(len(mix)),
        }
        print(
            f"{target:12s} ({task.target_kinds[target]:7s}) cosine mean {np.mean(cos):.4f} +- {np.std(cos):.4f} min {np.min(cos):.4f}",
            flush=True,
        )
    return rows


def pipeline_part(task, probs, seeds, epsilons, rho=0.1, targets=None):
    out = {}
    for target in targets or list(task.targets):
        for s in seeds:
            cache = {}
            for eps in epsilons:
                for m in METHODS:
                    t = time.perf_counter()
                    r = run_method(
                        m,
                        task,
                        target,
                        probs,
                        epsilon=eps,
                        delta=1e-5,
                        rho=rho,
                        seed=s,
                        noise=NoiseSource("reproducible", seed=1000 * s + int(10 * eps)),
                        cache=cache,
                    )
                    out.setdefault(target, {}).setdefault(str(eps), {}).setdefault(m, []).append(
                        r.auc_finetuned
                    )
                    print(
                        f"{target} seed={s} eps={eps} {m:18s} auc={r.auc_finetuned:.4f} ({time.perf_counter() - t:.1f}s)",
                        flush=True,
                    )
    return out


def composition_part(data_dir, seeds, targets, epsilon=1.0, rho=0.1):
    """Appendix A.7 through the release path: parallel (disjoint splits, eps each) vs sequential
    (all data, eps split rho / 1 - rho). No ledger records (record=False)."""
    import tempfile

    from dpaudit.releasing import release
    from dpaudit.requests import MixMinRequest

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for target in targets:
            for comp in ("parallel", "sequential"):
                for s in seeds:
                    t = time.perf_counter()
                    req = MixMinRequest(
                        task="mnist-mix",
                        target=target,
                        epsilon=epsilon,
                        rho=rho,
                        stage="pipeline",
                        composition=comp,
                        seed=s,
                        reproducible_noise=True,
                        data_dir=data_dir,
                    )
                    r = release("mixmin", req, out_dir=f"{tmp}/{target}-{comp}-{s}", record=False)
                    e2e = r.metrics["end_to_end"]["epsilon"]["rdp"]
                    out.setdefault(target, {}).setdefault(comp, []).append(
                        {"auc": r.metrics["auc"]["finetuned"], "end_to_end_epsilon": e2e}
                    )
                    print(
                        f"{target} {comp} seed={s} auc={r.metrics['auc']['finetuned']:.4f} end-to-end eps={e2e:.4f} ({time.perf_counter() - t:.1f}s)",
                        flush=True,
                    )
    print(
        "\n| target | composition | AUC (mean ± std) | end-to-end epsilon (rdp) |\n|---|---|---|---|"
    )
    for target, by in out.items():
        for comp, rows in by.items():
            a = [r["auc"] for r in rows]
            print(
                f"| {target} | {comp} | {np.mean(a):.4f} ± {np.std(a):.4f} | {max(r['end_to_end_epsilon'] for r in rows):.4f} |"
            )
    return out


def print_tables(cos, pipe):
    if cos:
        print("\n| target | kind | mean cosine | std | min |\n|---|---|---|---|---|")
        for t, r in cos.items():
            print(f"| {t} | {r['kind']} | {r['mean']:.4f} | {r['std']:.4f} | {r['min']:.4f} |")
    if pipe:
        print("\n| target | eps | " + " | ".join(METHODS) + " |\n|---|---|" + "---|" * len(METHODS))
        for t, by_eps in pipe.items():
            for eps, by_m in by_eps.items():
                cells = [f"{np.mean(by_m[m]):.4f} ± {np.std(by_m[m]):.4f}" for m in METHODS]
                print(f"| {t} | {eps} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--part", choices=["cosine", "pipeline", "composition", "all"], default="all")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--targets", nargs="*", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    if a.part == "composition":
        comp = composition_part(
            a.data_dir, seeds=[0, 1, 2], targets=a.targets or ["loops-0689", "ink-heavy"]
        )
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"composition": comp}, f, indent=2)
        print(f"\ntotal {time.perf_counter() - t0:.1f}s")
        return
    task = load_task("mnist-mix", seed=42, data_dir=a.data_dir)
    probs = train_proxies(task).predict(task.private_x[task.train_idx])
    print(f"task + proxies ready in {time.perf_counter() - t0:.1f}s", flush=True)
    cos = cosine_part(task, probs, seeds=[0, 1, 2, 3, 4]) if a.part in ("cosine", "all") else {}
    pipe = (
        pipeline_part(task, probs, seeds=[0, 1, 2], epsilons=[1.0, 2.0, 5.0], targets=a.targets)
        if a.part in ("pipeline", "all")
        else {}
    )
    print_tables(cos, pipe)
    print(f"\ntotal {time.perf_counter() - t0:.1f}s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cosine": cos, "pipeline": pipe}, f, indent=2)


if __name__ == "__main__":
    main()
