"""Bit-identity check of the DP-SGD loop: release weights and audit scores under
reproducible noise, saved on one checkout and compared bit for bit on another.

Covers dp-rvfl record / user level / SGD with momentum, dp-dense record / user level, dp-cnn,
record- and user-level head trials (mislabeled, max-clip, trajectory, no-noise control), head and
module one-run audits (gradient and input canaries). About 15 s on one thread.

  PYTHONPATH=OLD/src python benchmarks/check_bit_identity.py save /tmp/before.npz
  PYTHONPATH=NEW/src python benchmarks/check_bit_identity.py compare /tmp/before.npz   # exit 1 on any difference
"""

import sys, tempfile
from pathlib import Path
import numpy as np
import torch

torch.set_num_threads(1)
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest
from dpaudit.noise import NoiseSource
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
from dpaudit.mechanisms.dpsgd.user_head_audit import UserHeadTarget
from dpaudit.mechanisms.dpsgd.one_run_heads import heads_one_run
from dpaudit.mechanisms.dpsgd.one_run_modules import module_config, modules_one_run
from dpaudit.data import load_dataset

out = {}
tmp = Path(tempfile.mkdtemp())
np.save(tmp / "ids.npy", np.arange(1797) // 4)


def rel(tag, model, **kw):
    d = tmp / tag
    release(
        model,
        DPSGDRequest(model=model, reproducible_noise=True, seed=3, **kw),
        out_dir=d,
        record=False,
    )
    if (d / "weights.npz").exists():
        with np.load(d / "weights.npz") as z:
            for k in z.files:
                out[f"{tag}/{k}"] = np.asarray(z[k])
    else:
        for k, v in torch.load(d / "model.pt", weights_only=True).items():
            out[f"{tag}/{k}"] = v.numpy()


rel("rvfl-record", "dp-rvfl", epochs=2)
rel(
    "rvfl-user",
    "dp-rvfl",
    epochs=2,
    privacy_unit="user",
    records_per_user=4,
    reference_size=315,
    user_ids=str(tmp / "ids.npy"),
)
rel("rvfl-sgd", "dp-rvfl", epochs=1, optimizer="sgd", momentum=0.9)
rel("dense-record", "dp-dense", epochs=1)
rel(
    "dense-user",
    "dp-dense",
    epochs=1,
    privacy_unit="user",
    records_per_user=4,
    reference_size=315,
    user_ids=str(tmp / "ids.npy"),
)
rel("cnn-record", "dp-cnn", epochs=1, batch_size=400)
worlds = np.array([True, False] * 4)
for canary in ("mislabeled", "max-clip"):
    out[f"head-trials/{canary}"] = HeadTarget(
        model="dp-rvfl", dataset="digits", canary=canary, epochs=1
    ).scores(worlds, NoiseSource("reproducible", seed=0))
    user_target = UserHeadTarget(
        model="dp-rvfl",
        dataset="digits",
        canary=canary,
        epochs=1,
        records_per_user=4,
        reference_size=315,
    )
    out[f"user-trials/{canary}"] = user_target.scores(worlds, NoiseSource("reproducible", seed=0))
out["head-trials/trajectory"] = HeadTarget(
    model="dp-rvfl", dataset="digits", canary="max-clip", epochs=1, threat_model="trajectory"
).scores(worlds, NoiseSource("reproducible", seed=0))
out["head-trials/nonoise"] = (
    HeadTarget(model="dp-rvfl", dataset="digits", canary="max-clip", epochs=1)
    .without_noise()
    .scores(worlds, NoiseSource("reproducible", seed=0))
)
for kind in ("gradient", "input-mislabeled"):
    r = heads_one_run(
        HeadTarget(model="dp-rvfl", dataset="digits", epochs=1),
        canaries=40,
        noise=NoiseSource("reproducible", seed=2),
        seed=0,
        kind=kind,
    )
    out[f"head-one-run/{kind}"] = r.scores
    out[f"head-one-run/{kind}/in"] = r.included
user_target = UserHeadTarget(
    model="dp-rvfl", dataset="digits", epochs=1, records_per_user=4, reference_size=315
)
r = heads_one_run(user_target, canaries=40, noise=NoiseSource("reproducible", seed=2), seed=0)
out["user-one-run/gradient"] = r.scores
digits = load_dataset("digits")
cfg, _ = module_config("dp-dense", digits, epsilon=2.0, delta=1e-5, epochs=1)
for kind in ("gradient", "input-mislabeled"):
    r = modules_one_run(
        "dp-dense",
        digits,
        cfg,
        canaries=20,
        noise=NoiseSource("reproducible", seed=1),
        seed=0,
        kind=kind,
    )
    out[f"module-one-run/{kind}"] = r.scores
    out[f"module-one-run/{kind}/in"] = r.included

if sys.argv[1] == "save":  # else "compare"
    np.savez(sys.argv[2], **out)
    print("saved", len(out), "arrays")
else:
    ref = np.load(sys.argv[2])
    bad = [
        k
        for k in ref.files
        if k not in out
        or out[k].dtype != ref[k].dtype
        or out[k].shape != ref[k].shape
        or out[k].tobytes() != ref[k].tobytes()
    ]
    extra = sorted(set(out) - set(ref.files))
    print(
        f"compared {len(ref.files)} arrays bit for bit: {len(bad)} differ {bad}; new keys {extra}"
    )
    for k in bad:  # how far: the largest difference against the array's scale
        if k in out and out[k].shape == ref[k].shape:
            a, b = np.asarray(out[k], dtype=np.float64), np.asarray(ref[k], dtype=np.float64)
            print(
                f"  {k}: max |new - old| {np.max(np.abs(a - b)):.3g} (max |old| {np.max(np.abs(b)):.3g}), "
                f"{np.count_nonzero(a != b)} of {a.size} values differ"
            )
    sys.exit(1 if bad or extra else 0)
