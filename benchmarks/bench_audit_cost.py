"""Cost of a DP-RVFL MNIST max-clip audit with its two controls: old tree against new.

For each source tree (``--trees OLD/src NEW/src``, each run in a fresh process with that
``PYTHONPATH``) it runs ``run_audit`` of ``build_target("dp-rvfl", canary="max-clip",
dataset="mnist")`` with both controls (``--runs`` trials per role, so 3 x runs trials), reproducible
noise and ``--workers`` processes, and prints: wall seconds (set-up included), the trials' CPU
seconds per trial (``timings.cpu_seconds``, summed in the workers) and the release's own training
loop (``train_heads`` of one run on the same features, no canary) in CPU seconds; then the ratio of
the trees and of audit trial to release loop, the extrapolation to ``--target-runs`` trials per role
on ``--workers`` cores, and whether the main role's scores of the trees are equal (same noise seed).

    .venv/bin/python benchmarks/bench_audit_cost.py --data-dir ../shared/data --runs 32 \\
        --trees /tmp/old/src src

Figures go to BENCHMARKS.md, section 4 (say "loaded" with the printed load when other jobs ran).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, time
import numpy as np
from dpaudit.auditing import build_target
from dpaudit.audits.engine import run_audit
from dpaudit.mechanisms.dpsgd.loop import train_heads
from dpaudit.mechanisms.dpsgd.core import head_threads
from dpaudit.noise import NoiseSource
data_dir, out = sys.argv[1], sys.argv[5]
runs, workers, chunk = (int(v) for v in sys.argv[2:5])
t0 = time.perf_counter()
target = build_target("dp-rvfl", canary="max-clip", dataset="mnist", data_dir=data_dir)
result = run_audit(target, runs=runs, workers=workers, chunk_size=chunk, record=False,
                   reproducible_noise=True, noise_seed=7, out_dir=out)
wall = time.perf_counter() - t0
with head_threads():
    c0 = time.process_time()
    train_heads(target._z, target._y, target._n_classes, target._config, init=target._init,
                noise=NoiseSource("reproducible", seed=1), binary_logit=target._binary)
    release = time.process_time() - c0
tm = result.timings
per_trial = tm["cpu_seconds"] / (3 * runs)
row = {"wall": wall, "trials": 3 * runs, "cpu_per_trial": per_trial, "release_cpu": release}
print(json.dumps(row))
"""


def _run(tree: str, args, out: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    sizes = [str(v) for v in (args.runs, args.workers, args.chunk_size)]
    cmd = [sys.executable, "-c", _CHILD, args.data_dir, *sizes, out]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--trees", nargs="+", required=True, help="source trees (old first)")
    p.add_argument("--runs", type=int, default=32, help="trials per role (main, no-noise, null)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=16)
    p.add_argument("--target-runs", type=int, default=1000)
    args = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="bench_audit_cost.")
    rows = []
    for i, tree in enumerate(args.trees):
        print(f"load before {tree}: {_load()}", flush=True)
        row = _run(tree, args, os.path.join(root, str(i)))
        rows.append(row)
        whole = 3 * args.target_runs * row["cpu_per_trial"] / args.workers
        per, release = row["cpu_per_trial"], row["release_cpu"]
        print(
            f"{tree}: wall {row['wall']:.1f} s for {row['trials']} trials, "
            f"{per:.3f} CPU-s per trial, release loop {release:.3f} CPU-s "
            f"(trial / release {per / release:.2f}); {args.target_runs} trials per role "
            f"on {args.workers} cores: ~{whole / 60:.1f} min of trials",
            flush=True,
        )
    print(f"load after: {_load()}")
    if len(rows) > 1:
        import numpy as np

        cpu = rows[-1]["cpu_per_trial"] / rows[0]["cpu_per_trial"]
        wall = rows[-1]["wall"] / rows[0]["wall"]
        print(f"CPU per trial, last / first tree: {cpu:.3f}; wall: {wall:.3f}")
        scores = [np.load(os.path.join(root, str(i), "scores.npz")) for i in range(len(rows))]
        for role in ("main", "no_noise", "null"):
            key = f"{role}_score"
            same = all(np.array_equal(s[key], scores[0][key]) for s in scores[1:])
            print(f"{role} scores equal across trees: {same}")


if __name__ == "__main__":
    main()
