"""The DP Gaussian sampler (dpaudit.noise): speed against torch's float32
``randn`` (the old DP noise path), its effect on DP-RVFL training, and the tail delta of every
built-in configuration.

Parts (all by default):

- ``generators``: bulk uniform bits (ns per 64 bits) of the candidate generators.
- ``speed``: values per second, one thread, the two samplers interleaved in one process
  (median of ``--repeats``), at three sizes: one DP-SGD step of the MNIST DP-RVFL head
  (10 x 985 = 9,850 values), one step of the batched trainer (R = 64: 630,400) and 1M.
  "torch.randn f32" is exactly the old trainers' draw (``torch.randn(out=)`` then ``* sigma``);
  "dpaudit f32" is the new one (``NoiseSource.gaussian_into`` on a float32 buffer, the chunked
  refills included); "dpaudit f64" is ``gaussian_numpy``; "cryptographic f32" the same draw on a
  cryptographic source.
- ``e2e`` (needs ``--data-dir``): ``train_heads`` (one run) on MNIST DP-RVFL features (sigma
  0.8794, q 0.005), ``--steps`` steps, CPU time per step with the old filler (torch.randn) and
  with the new one, interleaved, medians.
- ``tails``: noise_tail_delta of each built-in configuration (dimensions from the code).

    python benchmarks/bench_noise_sampler.py [--parts generators,speed,e2e,tails] [--data-dir ../shared/data] [--repeats 7] [--steps 400]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch


def _cpu(f, reps: int) -> float:
    t = time.process_time()
    for _ in range(reps):
        f()
    return (time.process_time() - t) / reps


def generators(repeats: int) -> None:
    """Bulk uniform bits: why the sampler reads an AES-256-CTR keystream."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    n = 1 << 20  # bytes per call
    zeros, buf = memoryview(bytes(n + 16)), bytearray(n + 16)
    aes = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(bytes(16))).encryptor()
    chacha = Cipher(algorithms.ChaCha20(os.urandom(32), bytes(16)), mode=None).encryptor()
    pcg, sfc = np.random.PCG64(1), np.random.SFC64(1)
    cases = {
        "AES-256-CTR (OpenSSL)": lambda: aes.update_into(zeros[:n], buf),
        "ChaCha20 (OpenSSL)": lambda: chacha.update_into(zeros[:n], buf),
        "numpy PCG64 random_raw": lambda: pcg.random_raw(n // 8),
        "numpy SFC64 random_raw": lambda: sfc.random_raw(n // 8),
    }
    res = {k: [] for k in cases}
    for _ in range(repeats):
        for k, f in cases.items():
            res[k].append(_cpu(f, 8) / (n // 8))
    print(f"{'generator':>24s} {'ns per 64 bits':>15s}  (median of {repeats})")
    for k, v in res.items():
        print(f"{k:>24s} {statistics.median(v) * 1e9:15.2f}", flush=True)


def speed(repeats: int) -> None:
    from dpaudit.noise import NoiseSource

    src, crypto = NoiseSource("os-entropy"), NoiseSource("cryptographic")
    g = torch.Generator()
    g.manual_seed(int(src.aux_seed()))
    sigma = 0.8794
    print(
        f"{'values':>9s} {'sampler':>18s} {'Mvalues/s':>10s} {'ns/value':>9s}  (median of {repeats}, one thread, CPU time)"
    )
    for size in (9_850, 630_400, 1_048_576):
        out = np.empty(size, dtype=np.float32)
        out_t = torch.from_numpy(out)

        def old():
            torch.randn((size,), generator=g, dtype=torch.float32, out=out_t)
            np.multiply(out, sigma, out=out)

        reps = max(3, 4_000_000 // size)
        cases = {
            "torch.randn f32": old,
            "dpaudit f32": lambda: src.gaussian_into(out, sigma),
            "dpaudit f64": lambda: src.gaussian_numpy(size, sigma),
            "cryptographic f32": lambda: crypto.gaussian_into(out, sigma),
        }
        res = {k: [] for k in cases}
        for f in cases.values():
            f()
        for _ in range(repeats):
            for k, f in cases.items():
                res[k].append(_cpu(f, reps) / size)
        for k, v in res.items():
            m = statistics.median(v)
            print(f"{size:9d} {k:>18s} {1e-6 / m:10.1f} {m * 1e9:9.2f}")
        print(
            f"{'':9s} ratio dpaudit f32 / torch.randn f32 (time per value): "
            f"{statistics.median(res['dpaudit f32']) / statistics.median(res['torch.randn f32']):.2f}",
            flush=True,
        )


def e2e(data_dir: str, repeats: int, steps: int) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_rvfl_vs_opacus as b

    from dpaudit.mechanisms.dpsgd import module_training as dpsgd, core as dpsgd_core
    from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
    from dpaudit.mechanisms.dpsgd.loop import train_heads
    from dpaudit.mechanisms.dpsgd.core import init_head
    from dpaudit.mechanisms.dpsgd.features import build_features
    from dpaudit.noise import NoiseSource, public_rng

    data = b._load(data_dir)
    sched, sigma = b._protocol(data)
    feats = build_features("rvfl", data.n_features, 42)
    init = init_head(feats.output_dim, 10, public_rng(42, 0x48454144))
    z = feats.transform(data.x_train, bias_column=True)
    cfg = DPSGDConfig(
        sample_rate=sched.sample_rate,
        steps=steps,
        normalizer=sched.normalizer,
        noise_multiplier=sigma,
    )
    new_filler = dpsgd_core.gaussian_filler

    def old_filler(noise, out, std):  # the trainers' old draw (torch.randn float32)
        out_t, gen, shape = torch.from_numpy(out), noise.torch, tuple(out.shape)

        def fill():
            torch.randn(shape, generator=gen, dtype=out_t.dtype, out=out_t)
            return np.multiply(out, std, out=out)

        return fill

    res = {"torch.randn (old)": [], "dpaudit sampler (new)": []}
    try:
        for i in range(repeats):
            arms = list(zip(res, (old_filler, new_filler)))
            for name, f in arms if i % 2 == 0 else arms[::-1]:  # alternate the order
                dpsgd_core.gaussian_filler = f
                t = time.process_time()
                train_heads(
                    z, data.y_train, 10, cfg, noise=NoiseSource(), init=init, z_has_bias_column=True
                )
                res[name].append((time.process_time() - t) / steps)
    finally:
        dpsgd_core.gaussian_filler = new_filler
    print(
        f"MNIST DP-RVFL head (10 x {feats.output_dim + 1}), sigma {sigma:.4f}, q {sched.sample_rate}, {steps} steps, median of {repeats}:"
    )
    for k, v in res.items():
        print(
            f"  {k:22s} {statistics.median(v) * 1e3:.3f} ms CPU per step  ({', '.join(f'{x * 1e3:.3f}' for x in v)})"
        )
    ratio = statistics.median(res["dpaudit sampler (new)"]) / statistics.median(
        res["torch.randn (old)"]
    )
    print(f"  new / old per-step CPU time: {ratio:.3f}", flush=True)


def tails() -> None:
    from dpaudit.accounting import dp_sgd_schedule
    from dpaudit.mechanisms.dpsgd.features import build_features
    from dpaudit.mechanisms.mixmin.mechanism import default_downstream, default_mixture
    from dpaudit.mechanisms.mixmin.tasks import load_task
    from dpaudit.noise import GAUSSIAN_SAMPLER, MAX_RADIUS, noise_tail_delta

    mnist_head = 10 * (build_features("rvfl", 784, 42).output_dim + 1)
    cardio_head = build_features("rvfl", 32, 42).output_dim + 1
    mnist, cardio, users = (
        dp_sgd_schedule(51_200, 256, 10),
        dp_sgd_schedule(48_120, 256, 30),
        dp_sgd_schedule(8_933, 256, 30),
    )
    digits = load_task("digits-mix", seed=42)
    mix, ds = default_mixture("digits-mix"), default_downstream(digits)
    ft = dp_sgd_schedule(len(digits.train_idx), ds.finetune_batch_size, ds.finetune_epochs)
    from dpaudit.mechanisms.dpsgd.models import build_module

    def params(model):  # every trainable parameter is noised at every step
        m = build_module(
            model, kind="image", n_features=784, n_classes=10, image_shape=(1, 28, 28), seed=42
        )
        return sum(p.numel() for p in m.parameters() if p.requires_grad)

    rows = [
        ("DP-RVFL MNIST (headline)", mnist, mnist_head, 2.0),
        ("DP-RVFL MNIST", mnist, mnist_head, 8.0),
        ("DP-Dense MNIST (all weights private)", mnist, params("dense"), 8.0),
        ("DP-CNN MNIST", mnist, params("cnn"), 8.0),
        ("DP-attention MNIST", mnist, params("attention"), 8.0),
        ("DP-RVFL Cardio", cardio, cardio_head, 2.0),
        ("DP-RVFL Cardio, user level (8,933 users)", users, cardio_head, 2.0),
        ("DP-MixMin digits-mix, mixture", mix.steps, digits.k, 1.0),
        ("DP-MixMin digits-mix, fine-tuning (D_ft <= 539)", ft, ds.hidden + 1, 1.0),
        ("DP-MixMin mnist-mix, mixture", default_mixture("mnist-mix").steps, 10, 1.0),
    ]
    print(
        f"sampler {GAUSSIAN_SAMPLER}: |z| <= {MAX_RADIUS:.4f} sigma, tail mass 2^-106 per value; delta = 1e-5"
    )
    print(
        f"| configuration | steps | noised values / step | values N | epsilon | noise_tail_delta | / delta |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, sched, d, eps in rows:
        steps = sched if isinstance(sched, int) else sched.steps
        tail = noise_tail_delta(steps * d, eps, 1e-5)
        print(
            f"| {name} | {steps} | {d} | {steps * d:.3g} | {eps:g} | {tail:.2e} | {tail / 1e-5:.1e} |"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="generators,speed,e2e,tails")
    ap.add_argument("--data-dir", default=os.environ.get("DPAUDIT_DATA_DIR"))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    parts = args.parts.split(",")
    load0 = os.getloadavg()[0]
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, numpy {np.__version__}, "
        f"load average {load0:.2f} (other processes share the machine)",
        flush=True,
    )
    if "generators" in parts:
        generators(args.repeats)
    if "speed" in parts:
        speed(args.repeats)
    if "e2e" in parts:
        if not args.data_dir:
            print("e2e skipped: --data-dir (MNIST) not given")
        else:
            e2e(args.data_dir, args.repeats, args.steps)
    if "tails" in parts:
        tails()
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
