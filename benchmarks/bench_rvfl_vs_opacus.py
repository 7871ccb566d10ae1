"""DP-RVFL on MNIST at eps = 2, full protocol: dpaudit's trainers vs an Opacus implementation.

Same process, same torch thread count (``--threads``, default 1; NumPy's BLAS is limited to the
same count by dpaudit), same data, same sigma / q / T / m0 / C / Adam settings (DP-RVFL paper,
section 3.2, Table 2: q = 0.005, T = 2000, m0 = 255). Timed: the training loop only (no data
loading, calibration or privacy-engine construction), as in the paper's section 4.6.

- ``opacus``: ``PrivacyEngine.make_private`` with Poisson sampling, an RVFL module whose frozen
  random layer is evaluated in every forward pass (the paper's setting: "no feature cache") and a
  trainable ``nn.Linear`` head; Adam(1e-3); mean loss with expected batch size m0.
- ``opacus-cached``: the same, on precomputed features z (isolates the per-example-gradient
  engine from the feature computation).
- ``dpaudit``: :func:`dpaudit.mechanisms.dpsgd.loop.train_heads` with R = 1 (closed-form clipped sums; one
  run of the head engine :func:`dpaudit.mechanisms.dpsgd.loop.train_heads`), including the one-off
  feature computation in the timed part.
- ``dpaudit-batched``: :func:`dpaudit.mechanisms.dpsgd.loop.train_heads`, R runs at once
  (the same engine, as the audits run it);
  per-model time = total / R. Peak memory of a child process that loads MNIST and trains the R
  runs is reported (ru_maxrss).

Runs are interleaved (opacus, dpaudit, opacus, dpaudit, ...) so machine load hits both alike;
medians are reported. Both wall-clock and CPU time (``time.process_time``, this process only) are
recorded: on a shared machine wall time mostly measures the neighbours, so the ratios use CPU
time (with one thread, CPU time is what the wall time would be on an idle machine).

    python benchmarks/bench_rvfl_vs_opacus.py --data-dir ../shared/data [--repeats 3] [--runs 64] [--threads 1]

``--profile-single``: instead, time one dpaudit single run by parts (feature transform, then the
training loop under cProfile; the top functions by own time) -- where the time goes.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time

import numpy as np
import torch


def _load(data_dir):
    from dpaudit.data import load_dataset

    return load_dataset("mnist", data_dir=data_dir)


def _protocol(data):
    from dpaudit.accounting import calibrate_noise_multiplier, dp_sgd_schedule

    sched = dp_sgd_schedule(len(data.y_train), 256, 10)
    cal = calibrate_noise_multiplier(
        target_epsilon=2.0, delta=1e-5, sample_rate=sched.sample_rate, steps=sched.steps
    )
    return sched, cal.noise_multiplier


class RVFLModule(torch.nn.Module):
    """RVFL with frozen random layer (buffers) and a trainable head, for the Opacus baseline."""

    def __init__(self, feats, head_init, cached: bool):
        super().__init__()
        self.cached = cached
        if not cached:
            self.register_buffer("w_r", torch.tensor(feats.weight, dtype=torch.float32))
            self.register_buffer("b_r", torch.tensor(feats.bias, dtype=torch.float32))
        k, d1 = head_init.shape
        self.head = torch.nn.Linear(d1 - 1, k)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor(head_init[:, :-1]))
            self.head.bias.copy_(torch.tensor(head_init[:, -1]))

    def forward(self, x):
        if not self.cached:
            x = torch.cat([x, torch.tanh(x @ self.w_r + self.b_r)], dim=1)
        return self.head(x)


def run_opacus(data, sched, sigma, seed, cached, feats, head_init):
    import warnings

    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    x = feats.transform(data.x_train) if cached else np.asarray(data.x_train, dtype=np.float32)
    ds = TensorDataset(torch.tensor(x), torch.tensor(data.y_train))
    loader = DataLoader(ds, batch_size=256)
    assert len(loader) == sched.batches_per_epoch
    model = RVFLModule(feats, head_init, cached)
    opt = torch.optim.Adam(
        model.head.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp")
        model, opt, loader = engine.make_private(
            module=model,
            optimizer=opt,
            data_loader=loader,
            noise_multiplier=sigma,
            max_grad_norm=1.0,
            poisson_sampling=True,
        )
    assert (
        abs(loader.sample_rate - sched.sample_rate) < 1e-12
        and opt.expected_batch_size == sched.normalizer
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    steps = 0
    t, c = time.perf_counter(), time.process_time()
    for _ in range(10):
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            opt.step()
            steps += 1
    secs, cpu = time.perf_counter() - t, time.process_time() - c
    assert steps == sched.steps, (steps, sched.steps)
    with torch.no_grad():
        xt = torch.tensor(
            feats.transform(data.x_test) if cached else np.asarray(data.x_test, dtype=np.float32)
        )
        acc = float((model(xt).argmax(1).numpy() == data.y_test).mean())
    return secs, cpu, acc


def run_dpaudit(data, sched, sigma, seed, feats, head_init):
    from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
    from dpaudit.mechanisms.dpsgd.loop import train_heads
    from dpaudit.mechanisms.dpsgd.core import head_probabilities
    from dpaudit.noise import NoiseSource

    cfg = DPSGDConfig(
        sample_rate=sched.sample_rate,
        steps=sched.steps,
        normalizer=sched.normalizer,
        noise_multiplier=sigma,
    )
    t, c = time.perf_counter(), time.process_time()
    z = feats.transform(data.x_train, bias_column=True)
    res = train_heads(
        z, data.y_train, 10, cfg, noise=NoiseSource(), init=head_init, z_has_bias_column=True
    )
    secs, cpu = time.perf_counter() - t, time.process_time() - c
    assert res.steps_executed == sched.steps
    acc = float(
        (
            head_probabilities(res.weights[0], feats.transform(data.x_test)).argmax(1)
            == data.y_test
        ).mean()
    )
    return secs, cpu, acc


def run_dpaudit_randn(data, sched, sigma, seed, feats, head_init):
    """``run_dpaudit`` with the old noise step (float32 ``torch.randn``,
    truncated at 5.77 sigma): measures what the documented sampler costs, same process."""
    from dpaudit.mechanisms.dpsgd import module_training as dpsgd, core as dpsgd_core

    def old_filler(noise, out, std):
        out_t, gen, shape = torch.from_numpy(out), noise.torch, tuple(out.shape)

        def fill():
            torch.randn(shape, generator=gen, dtype=out_t.dtype, out=out_t)
            return np.multiply(out, std, out=out)

        return fill

    new_filler = dpsgd_core.gaussian_filler
    dpsgd_core.gaussian_filler = old_filler
    try:
        return run_dpaudit(data, sched, sigma, seed, feats, head_init)
    finally:
        dpsgd_core.gaussian_filler = new_filler


def _batched_child(data_dir, runs, threads, chunk, q):
    torch.set_num_threads(threads)
    from dpaudit.mechanisms.dpsgd.loop import train_heads
    from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
    from dpaudit.mechanisms.dpsgd.core import head_probabilities, init_head
    from dpaudit.mechanisms.dpsgd.features import build_features
    from dpaudit.noise import NoiseSource, public_rng

    data = _load(data_dir)
    sched, sigma = _protocol(data)
    feats = build_features("rvfl", data.n_features, 42)
    cfg = DPSGDConfig(
        sample_rate=sched.sample_rate,
        steps=sched.steps,
        normalizer=sched.normalizer,
        noise_multiplier=sigma,
    )
    init = init_head(feats.output_dim, 10, public_rng(42, 0x48454144))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, c = time.perf_counter(), time.process_time()
    z = feats.transform(data.x_train)
    res = train_heads(
        z, data.y_train, 10, cfg, noise=NoiseSource(), runs=runs, init=init, chunk_runs=chunk
    )
    secs, cpu = time.perf_counter() - t, time.process_time() - c
    zt = feats.transform(data.x_test)
    accs = [float((head_probabilities(w, zt).argmax(1) == data.y_test).mean()) for w in res.weights]
    q.put(
        {
            "seconds": secs,
            "per_model": secs / runs,
            "cpu": cpu,
            "cpu_per_model": cpu / runs,
            "acc_mean": float(np.mean(accs)),
            "acc_sd": float(np.std(accs, ddof=1)),
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "rss_before_gib": rss0 / 2**20,
        }
    )


def profile_single(data_dir) -> int:
    """One dpaudit single run, timed by parts: feature transform (CPU s), then the head engine's
    loop under cProfile (top 12 functions by own time)."""
    import cProfile
    import pstats

    from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
    from dpaudit.mechanisms.dpsgd.loop import train_heads
    from dpaudit.mechanisms.dpsgd.core import init_head
    from dpaudit.mechanisms.dpsgd.features import build_features
    from dpaudit.noise import NoiseSource, public_rng

    data = _load(data_dir)
    sched, sigma = _protocol(data)
    cfg = DPSGDConfig(
        sample_rate=sched.sample_rate,
        steps=sched.steps,
        normalizer=sched.normalizer,
        noise_multiplier=sigma,
    )
    feats = build_features("rvfl", data.n_features, 42)
    head_init = init_head(feats.output_dim, 10, public_rng(42, 0x48454144))
    load0 = os.getloadavg()[0]
    c = time.process_time()
    z = feats.transform(data.x_train, bias_column=True)
    c_feat = time.process_time() - c
    prof = cProfile.Profile()
    c = time.process_time()
    prof.enable()
    train_heads(
        z, data.y_train, 10, cfg, noise=NoiseSource(), init=head_init, z_has_bias_column=True
    )
    prof.disable()
    c_train = time.process_time() - c
    print(
        f"features {z.shape}: {c_feat:.2f} CPU s; training loop ({sched.steps} steps, cProfile on): {c_train:.2f} CPU s; "
        f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("DPAUDIT_DATA_DIR"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-batched", action="store_true")
    ap.add_argument("--skip-cached", action="store_true")
    ap.add_argument(
        "--old-sampler-too",
        action="store_true",
        help="also time dpaudit with the old noise step (torch.randn float32), interleaved",
    )
    ap.add_argument(
        "--profile-single",
        action="store_true",
        help="profile one dpaudit single run (no Opacus) and exit",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.profile_single:
        return profile_single(args.data_dir)
    from dpaudit.mechanisms.dpsgd.core import init_head
    from dpaudit.mechanisms.dpsgd.features import build_features
    from dpaudit.noise import public_rng

    load0 = os.getloadavg()
    data = _load(args.data_dir)
    sched, sigma = _protocol(data)
    print(
        f"MNIST DP-RVFL eps=2: N0={len(data.y_train)} q={sched.sample_rate} T={sched.steps} m0={sched.normalizer} sigma={sigma:.6f} threads={args.threads}",
        flush=True,
    )
    times = {
        "opacus": [],
        "opacus-cached": [],
        "dpaudit": [],
        **({"dpaudit-randn": []} if args.old_sampler_too else {}),
    }
    cpus = {k: [] for k in times}
    accs = {k: [] for k in times}

    def record(name, s, c, a, rep):
        times[name].append(s), cpus[name].append(c), accs[name].append(a)
        print(f"  rep {rep}: {name:14s} wall {s:7.2f}s  cpu {c:7.2f}s  (acc {a:.4f})", flush=True)

    for rep in range(args.repeats):
        seed = 42 + rep
        feats = build_features("rvfl", data.n_features, seed)
        head_init = init_head(feats.output_dim, 10, public_rng(seed, 0x48454144))
        record("opacus", *run_opacus(data, sched, sigma, seed, False, feats, head_init), rep)
        record("dpaudit", *run_dpaudit(data, sched, sigma, seed, feats, head_init), rep)
        if args.old_sampler_too:
            record(
                "dpaudit-randn", *run_dpaudit_randn(data, sched, sigma, seed, feats, head_init), rep
            )
        if not args.skip_cached:
            record(
                "opacus-cached", *run_opacus(data, sched, sigma, seed, True, feats, head_init), rep
            )
    med = {k: statistics.median(v) for k, v in times.items() if v}
    cmed = {k: statistics.median(v) for k, v in cpus.items() if v}
    print()
    for k in med:
        print(
            f"{k:16s} median wall {med[k]:8.2f} s/model, cpu {cmed[k]:8.2f} s/model (mean acc {np.mean(accs[k]):.4f})"
        )
    print(
        f"speed-up dpaudit vs opacus (frozen layer in forward): cpu {cmed['opacus'] / cmed['dpaudit']:.1f}x, wall {med['opacus'] / med['dpaudit']:.1f}x"
    )
    if "dpaudit-randn" in cmed:
        print(
            f"  same, old noise step (torch.randn f32): cpu {cmed['opacus'] / cmed['dpaudit-randn']:.1f}x; "
            f"documented sampler / torch.randn CPU time: {cmed['dpaudit'] / cmed['dpaudit-randn']:.3f}"
        )
    if "opacus-cached" in med:
        print(
            f"speed-up dpaudit vs opacus-cached (precomputed features): cpu {cmed['opacus-cached'] / cmed['dpaudit']:.1f}x, wall {med['opacus-cached'] / med['dpaudit']:.1f}x"
        )
    if not args.skip_batched:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(
            target=_batched_child, args=(args.data_dir, args.runs, args.threads, args.chunk, q)
        )
        p.start()
        r = q.get()
        p.join()
        print(
            f"dpaudit-batched  R={args.runs} chunk={args.chunk}: wall {r['seconds']:.1f} s total ({r['per_model']:.3f} s/model), "
            f"cpu {r['cpu']:.1f} s ({r['cpu_per_model']:.3f} s/model), mean acc {r['acc_mean']:.4f} +/- {r['acc_sd']:.4f}, "
            f"peak RSS {r['peak_rss_gib']:.2f} GiB (child process incl. MNIST; {r['rss_before_gib']:.2f} GiB before training)"
        )
        print(
            f"speed-up dpaudit-batched vs opacus: cpu {cmed['opacus'] / r['cpu_per_model']:.1f}x, wall {med['opacus'] / r['per_model']:.1f}x per model"
        )
        if "opacus-cached" in med:
            print(
                f"speed-up dpaudit-batched vs opacus-cached: cpu {cmed['opacus-cached'] / r['cpu_per_model']:.1f}x, wall {med['opacus-cached'] / r['per_model']:.1f}x per model"
            )
    print(
        f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, os.cpu_count() {os.cpu_count()}, "
        f"load average at start {load0[0]:.2f}, at end {os.getloadavg()[0]:.2f} (1-min; other processes share the machine)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
