"""Per-step cost of OpacusCanaries (+ PipelineCheck) on full-size MNIST, in one process.

One Opacus training of the example CNN (examples/opacus_one_run_mnist.py) on the 60,000 MNIST records
(Poisson batches, expected size 256), ``--canaries`` canaries in fc1.weight and a PipelineCheck attached.
Blocks of ``--block`` steps alternate between the hooks on (the DPOptimizer's hooked ``add_noise`` and
``clip_and_accumulate``) and off (the class's own methods), ``--rounds`` times, so load drifts hit both
alike; reported: median seconds per step of each and their ratio.

Usage:
  DPAUDIT_DATA_DIR=/work/shared/data .venv/bin/python benchmarks/bench_opacus_overhead.py [--rounds 5] [--block 10] [--canaries 1000]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
from opacus import PrivacyEngine
from torch import nn

from dpaudit.data import load_dataset
from dpaudit.integrations.opacus import OpacusCanaries
from dpaudit.integrations.pipeline import PipelineCheck

_spec = importlib.util.spec_from_file_location(
    "example", Path(__file__).parents[1] / "examples" / "opacus_one_run_mnist.py"
)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
HOOKS = ("add_noise", "clip_and_accumulate")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--canaries", type=int, default=1000)
    a = ap.parse_args()
    torch.manual_seed(0)
    data = load_dataset("mnist")
    train = torch.utils.data.TensorDataset(
        torch.as_tensor(data.x_train, dtype=torch.float32), torch.as_tensor(data.y_train)
    )
    model = example.SmallCNN()
    canaries = OpacusCanaries(model, canaries=a.canaries, seed=0, tensors=["fc1.weight"])
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
        max_grad_norm=1.0,
        data_loader=torch.utils.data.DataLoader(train, batch_size=256),
        noise_multiplier=1.0,
    )
    canaries.attach(opt, data_loader=loader)
    check = PipelineCheck().attach(opt, data_loader=loader, accountant=engine.accountant)
    hooked = {h: getattr(opt, h) for h in HOOKS}
    batches = iter(loader)
    times = {"on": [], "off": []}
    for _ in range(a.rounds):
        for mode in ("on", "off"):
            for h in HOOKS:
                if mode == "on":
                    setattr(opt, h, hooked[h])
                else:
                    opt.__dict__.pop(h, None)
            for _ in range(a.block):
                xb, yb = next(batches)
                t = time.perf_counter()
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                times[mode].append(time.perf_counter() - t)
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    print(
        f"{a.rounds} rounds x {a.block} steps each: median s/step hooks on {on:.4f}, off {off:.4f}, ratio {on / off:.3f} "
        f"({canaries.steps} hooked steps, {len(check.noised)} recorded by the check)"
    )


if __name__ == "__main__":
    main()
