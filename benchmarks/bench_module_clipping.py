"""DP-SGD steps of whole networks, dpaudit's ghost kernel against the vmap kernel, Opacus
and the non-private step; and the MNIST dp-cnn release / one-run audit, old code against new.

    DPAUDIT_DATA_DIR=/work/shared/data PYTHONPATH=src .venv/bin/python benchmarks/bench_module_clipping.py steps --rounds 20
    ... bench_module_clipping.py memory            # peak RSS, one subprocess per (model, mode)
    ... bench_module_clipping.py release --old-src /work/main/src --steps 30 --repeats 2
    ... bench_module_clipping.py difference --steps 30    # ghost vs vmap: clipped sums, trained weights

``steps``: in one process, one thread, MNIST (N = 60,000, 28x28), the same initial model for
every mode; each round draws one Poisson batch (q = 255/N, mean 255) that every mode then trains
on, in rotating order (timed: gather, gradient, noise, Adam): (a) non-private (forward, backward,
``torch.optim.Adam``), (b) dpaudit ghost kernel (:func:`~dpaudit.mechanisms.dpsgd.ghost_clip.module_clipped_sum`
+ :class:`~dpaudit.mechanisms.dpsgd.core.NoisyStep`), (c) dpaudit vmap kernel
(:func:`~dpaudit.mechanisms.dpsgd.core.per_sample_clipped_sum`, today's release kernel for dp-cnn
and dp-attention) + NoisyStep, (d) Opacus ``grad_sample_mode="ghost"``, (e) Opacus hooks.
Medians and ratios to (a), wall and this thread's CPU time; ``--images cifar-shaped``: random
CIFAR-10-shaped inputs (timing only). ``--modes`` picks modes; ``--batch``
the expected batch (default 256); ``--device cuda`` runs every mode on that device (data gathered
on the CPU and moved per step, the noise drawn on the CPU, as a release with ``--device cuda``);
``--heap``: glibc's heap settings for every mode (default: those a dpaudit module training sets,
:func:`~dpaudit.mechanisms.dpsgd.module_training.keep_freed_tensor_memory`).
``release``: ``train_module_dp_sgd`` (what a release runs) and
``modules_one_run`` (1,000 canaries) for ``--steps`` steps of the MNIST dp-cnn schedule, in
subprocesses alternating between ``--old-src`` and this checkout; per-step times extrapolated to 2,000 steps.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Full backward hook")

import numpy as np
import torch

from dpaudit.data import load_dataset
from dpaudit.mechanisms.dpsgd import module_training as dpsgd, core as dpsgd_core
from dpaudit.mechanisms.dpsgd.module_training import train_module_dp_sgd
from dpaudit.mechanisms.dpsgd.core import DPSGDConfig, NoisyStep, poisson_batch
from dpaudit.mechanisms.dpsgd.models import build_module
from dpaudit.mechanisms.dpsgd.one_run_modules import module_config, modules_one_run
from dpaudit.noise import NoiseSource

try:
    from dpaudit.mechanisms.dpsgd import ghost_clip
except (
    ImportError
):  # children running the old code (``release``, ``difference``): no ghost kernel there
    ghost_clip = None

MODES = ("non-private", "dpaudit ghost", "dpaudit vmap", "opacus ghost", "opacus hooks")
B, C, SIGMA = 255, 1.0, 1.0


def _data():
    d = load_dataset("mnist")
    return torch.as_tensor(np.asarray(d.x_train, dtype=np.float32)).reshape(
        -1, 1, 28, 28
    ), torch.as_tensor(d.y_train)


def _dpaudit(model, x, y, kernel):
    names = [n for n, p in model.named_parameters()]
    params = [p.detach() for p in model.parameters()]
    cfg = DPSGDConfig(
        sample_rate=B / x.shape[0],
        steps=10**6,
        normalizer=B,
        noise_multiplier=SIGMA,
        clipping_norm=C,
    )
    sanitise, t = NoisyStep(params, cfg, noise=NoiseSource("os-entropy")), [0]

    def step(idx):
        pd = dict(zip(names, params))
        if kernel == "ghost":
            sums = ghost_clip.module_clipped_sum(model, pd, x, y, idx, C)
        else:
            j = torch.as_tensor(idx)
            dev = params[0].device
            sums = dpsgd_core.per_sample_clipped_sum(model, pd, x[j].to(dev), y[j].to(dev), C)
        for buf, n in zip(sanitise.sums, names):
            buf.copy_(sums[n])
        t[0] += 1
        sanitise.apply(t[0])

    return step


def _torch_step(model, x, y, opt, loss_fn):
    def step(idx):
        j = torch.as_tensor(idx)
        device = next(model.parameters()).device
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[j].to(device)), y[j].to(device)).backward()
        opt.step()

    return step


def _opacus(model, x, y, mode):
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(x, y), batch_size=B)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = PrivacyEngine(accountant="rdp").make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=SIGMA,
            max_grad_norm=C,
            grad_sample_mode=mode,
            criterion=torch.nn.CrossEntropyLoss(),
        )
    model, opt = out[0], out[1]
    return _torch_step(model, x, y, opt, out[2] if mode == "ghost" else torch.nn.CrossEntropyLoss())


def make_step(mode, model, x, y):
    if mode == "non-private":
        return _torch_step(
            model, x, y, torch.optim.Adam(model.parameters(), lr=1e-3), torch.nn.CrossEntropyLoss()
        )
    if mode.startswith("dpaudit"):
        return _dpaudit(model, x, y, mode.split()[1])
    return _opacus(model, x, y, mode.split()[1])


def _model(name, shape=(1, 28, 28)):
    return build_module(
        name, kind="image", n_features=int(np.prod(shape)), n_classes=10, image_shape=shape, seed=0
    ).train()


def steps(args):
    global B
    B = args.batch
    if args.heap == "dpaudit" and hasattr(dpsgd, "keep_freed_tensor_memory"):
        # held for good: every mode trains under it, as a release's training does (old code: set once)
        getattr(dpsgd.keep_freed_tensor_memory(), "__enter__", lambda: None)()
    if args.images == "cifar-shaped":  # timing only: random 3x32x32 inputs, CIFAR-10's train size
        x, y = torch.rand(50000, 3, 32, 32), torch.randint(0, 10, (50000,))
    else:
        x, y = _data()
    rng = np.random.default_rng(0)
    modes = ("non-private", *(m for m in args.modes if m != "non-private"))
    # a step ends when the device is done
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    out = {}
    for name in args.models:
        base = _model(name, tuple(x.shape[1:]))
        runs = {m: make_step(m, copy.deepcopy(base).to(args.device), x, y) for m in modes}
        times, cpu = {m: [] for m in modes}, {m: [] for m in modes}
        for r in range(args.rounds + 3):
            idx, _ = poisson_batch(
                NoiseSource("reproducible", seed=int(rng.integers(2**31))),
                1,
                x.shape[0],
                B / x.shape[0],
            )
            order = modes[r % len(modes) :] + modes[: r % len(modes)]
            for m in order:
                t, c = time.perf_counter(), time.thread_time()
                runs[m](idx)
                sync()
                if r >= 3:
                    times[m].append(time.perf_counter() - t)
                    cpu[m].append(time.thread_time() - c)  # CPU time: less sensitive to other jobs
        med, med_cpu = ({m: float(np.median(v)) * 1e3 for m, v in d.items()} for d in (times, cpu))
        out[name] = {
            m: {
                "median_ms": round(med[m], 1),
                "ratio": round(med[m] / med["non-private"], 2),
                "cpu_median_ms": round(med_cpu[m], 1),
                "cpu_ratio": round(med_cpu[m] / med_cpu["non-private"], 2),
            }
            for m in modes
        }
        print(
            json.dumps({name: out[name], "batch": B, "device": args.device, "heap": args.heap}),
            flush=True,
        )
    return out


def memory(args):
    """Peak RSS per (model, mode), each in its own process: the child's ru_maxrss after 5 steps of
    batch 255 (and its rise over the set-up's peak: what the steps themselves need)."""
    for name in args.models:
        for mode in MODES:
            r = subprocess.run(
                [sys.executable, __file__, "child-memory", name, mode],
                capture_output=True,
                text=True,
                check=True,
            )
            print(r.stdout.strip(), flush=True)


def child_memory(name, mode):
    x, y = (
        torch.randn(3000, 1, 28, 28),
        torch.randint(0, 10, (3000,)),
    )  # MNIST-shaped; loading MNIST would set the peak
    step = make_step(mode, _model(name), x, y)
    idx = np.arange(B)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(5):
        step(idx)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "model": name,
                "mode": mode,
                "peak_rss_mb": round(peak / 1024),
                "step_peak_over_setup_mb": round((peak - before) / 1024),
            }
        )
    )


def release(args):
    """New and old (``--old-src``) code, alternating subprocesses, each timing ``--steps`` steps."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    res = {"old": [], "new": []}
    for _ in range(args.repeats):
        for tag, src in (("new", here), ("old", args.old_src)):
            env = {**os.environ, "PYTHONPATH": src}
            r = subprocess.run(
                [sys.executable, __file__, "child-release", str(args.steps), *args.parts],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            res[tag].append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(tag, res[tag][-1], flush=True)
    for what in args.parts:
        old, new = (min(v[what]["extrapolated_2000_s"] for v in res[t]) for t in ("old", "new"))
        old_cpu, new_cpu = (min(v[what]["cpu_s_per_step"] for v in res[t]) for t in ("old", "new"))
        print(
            json.dumps(
                {
                    what: {
                        "old_2000_steps_s": old,
                        "new_2000_steps_s": new,
                        "speedup": round(old / new, 2),
                        "old_cpu_s_per_step": old_cpu,
                        "new_cpu_s_per_step": new_cpu,
                        "cpu_speedup": round(old_cpu / new_cpu, 2),
                    }
                }
            )
        )


def child_release(n_steps, parts):
    torch.set_num_threads(1)
    data = load_dataset("mnist")
    plan, _ = module_config("dp-cnn", data, epsilon=8.0, delta=1e-5)
    cfg = DPSGDConfig.from_dict(plan.to_dict(), steps=n_steps)
    m = build_module(
        "cnn", kind="image", n_features=784, n_classes=10, image_shape=(1, 28, 28), seed=0
    )
    x = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32)).reshape(-1, 1, 28, 28)
    out = {
        "sample_rate": cfg.sample_rate,
        "normalizer": cfg.normalizer,
        "steps": n_steps,
        "plan_steps": plan.steps,
    }
    for what, run in (
        (
            "release",
            lambda p: train_module_dp_sgd(
                m,
                x,
                torch.as_tensor(data.y_train),
                cfg,
                noise=NoiseSource("os-entropy"),
                progress=p,
            ),
        ),
        (
            "one_run",
            lambda p: modules_one_run(
                "dp-cnn",
                data,
                cfg,
                canaries=1000,
                noise=NoiseSource("os-entropy"),
                seed=0,
                progress=p,
            ),
        ),
    ):
        if what not in parts:
            continue
        stamps, cpu, t = [], [], time.perf_counter()
        # after every step up to 200 steps, then every steps/200
        run(
            lambda done, total, stamps=stamps, cpu=cpu: (
                stamps.append(time.perf_counter()),
                cpu.append(time.process_time()),
            )
        )
        reported = n_steps - n_steps / len(stamps)  # steady state: after the first report
        per, cpu_per = (stamps[-1] - stamps[0]) / reported, (cpu[-1] - cpu[0]) / reported
        total = time.perf_counter() - t
        out[what] = {
            "s_per_step": round(per, 4),
            "cpu_s_per_step": round(cpu_per, 4),
            "fixed_s": round(total - n_steps * per, 2),
            "extrapolated_2000_s": round(total - n_steps * per + 2000 * per),
            "peak_rss_mb_so_far": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        }
    print(json.dumps(out))


def difference(args):
    """Ghost vs vmap kernel in float32 on one MNIST batch (dropout off: both kernels then compute the
    same function), against a float64 reference; then the final weights of a short reproducible-noise
    training with the old code (``--old-src``) and the new, in subprocesses (dropout on, as released)."""
    x, y = _data()
    j = torch.as_tensor(
        poisson_batch(NoiseSource("reproducible", seed=3), 1, x.shape[0], B / x.shape[0])[0]
    )
    for name in args.models:
        m = _model(name).eval()
        p32 = {n: p.detach() for n, p in m.named_parameters()}
        new = ghost_clip.ghost_clipped_sum(m, x[j], y[j], C)
        old = dpsgd_core.per_sample_clipped_sum(m, p32, x[j], y[j], C)
        ref = ghost_clip.ghost_clipped_sum(copy.deepcopy(m).double(), x[j].double(), y[j], C)
        err = {
            k: max(float((v[n].double() - ref[n]).abs().max()) for n in ref)
            for k, v in (("ghost", new), ("vmap", old))
        }
        print(
            json.dumps(
                {
                    "model": name,
                    "batch": int(j.numel()),
                    "max_abs_ghost_minus_vmap": max(
                        float((new[n] - old[n]).abs().max()) for n in new
                    ),
                    "max_abs_vs_float64": err,
                    "max_abs_entry": max(float(v.abs().max()) for v in ref.values()),
                }
            ),
            flush=True,
        )
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    for name in args.models:
        w = []
        for src in (args.old_src, here):
            subprocess.run(
                [sys.executable, __file__, "child-train", name, str(args.steps), "/tmp/_w.npy"],
                env={**os.environ, "PYTHONPATH": src},
                check=True,
            )
            w.append(np.load("/tmp/_w.npy"))
        print(
            json.dumps(
                {
                    "model": name,
                    "steps": args.steps,
                    "max_abs_weight_diff_old_vs_new": float(np.abs(w[0] - w[1]).max()),
                    "max_abs_weight": float(np.abs(w[0]).max()),
                }
            ),
            flush=True,
        )


def child_train(name, n_steps, out):
    x, y = _data()
    m = _model(name)
    train_module_dp_sgd(
        m,
        x,
        y,
        DPSGDConfig(
            sample_rate=B / x.shape[0], steps=n_steps, normalizer=B, noise_multiplier=SIGMA
        ),
        noise=NoiseSource("reproducible", seed=7),
    )
    np.save(out, torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy())


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "child-memory":
        return child_memory(sys.argv[2], sys.argv[3])
    if sys.argv[1] == "child-release":
        return child_release(int(sys.argv[2]), sys.argv[3:])
    if sys.argv[1] == "child-train":
        return child_train(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["steps", "memory", "release", "difference"])
    p.add_argument("--models", nargs="+", default=["cnn", "dense", "attention"])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--heap",
        default="dpaudit",
        choices=["dpaudit", "glibc-default"],
        help="steps: glibc's heap as a dpaudit module training sets it, or its defaults",
    )
    p.add_argument("--batch", type=int, default=256, help="steps: expected batch (q = batch / N)")
    p.add_argument("--images", default="mnist", choices=["mnist", "cifar-shaped"])
    p.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="steps: where every mode runs (data and noise moved per step)",
    )
    p.add_argument("--old-src", default="/work/main/src")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--parts", nargs="+", default=["release", "one_run"], choices=["release", "one_run"]
    )
    args = p.parse_args()
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "opacus": __import__("opacus").__version__,
                "threads": torch.get_num_threads(),
                "load": os.getloadavg(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            }
        ),
        flush=True,
    )
    {"steps": steps, "memory": memory, "release": release, "difference": difference}[args.what](
        args
    )


if __name__ == "__main__":
    main()
