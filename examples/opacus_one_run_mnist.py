"""Audit an Opacus-trained MNIST CNN in ONE training run with dpaudit's canaries.

    DPAUDIT_DATA_DIR=/work/shared/data python examples/opacus_one_run_mnist.py --epochs 1 --canaries 1000 [--fixed-batches]

--fixed-batches plants shuffled fixed-size batches behind Poisson accounting: the pipeline check reports it.

Or audit it from the command line as any Opacus script (--plain: the ordinary loop alone, no dpaudit lines):

    DPAUDIT_DATA_DIR=/work/shared/data dpaudit audit opacus examples/opacus_one_run_mnist.py --canaries 1000 \
        --tensors fc1.weight --out audits/mnist -- --epochs 5 --plain [--fixed-batches]

Pre-registered (docs/one_run.md): plan first, then train under the plan; one_run.json goes beside plan.json.

    dpaudit audit plan opacus --noise-multiplier 1.1 --sample-rate 0.0042553 --epochs 1 --delta 1e-5 \
        --canaries 1000 --tensors fc1.weight --out plan-mnist
    DPAUDIT_DATA_DIR=/work/shared/data python examples/opacus_one_run_mnist.py --plan plan-mnist/plan.json

MNIST is read from $DPAUDIT_DATA_DIR/mnist (the four standard .gz files; never downloaded).
The training loop below is an ordinary Opacus loop; the only dpaudit lines are marked "dpaudit".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from opacus import PrivacyEngine
from torch import nn

from dpaudit.data import load_dataset
from dpaudit.integrations.opacus import OpacusCanaries  # dpaudit
from dpaudit.integrations.pipeline import PipelineCheck  # dpaudit


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x.reshape(-1, 1, 28, 28))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--canaries", type=int, default=1000)
    p.add_argument("--epsilon", type=float, default=8.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument(
        "--max-train",
        type=int,
        default=None,
        help="use only the first N training records (a quick smoke run)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--fixed-batches",
        action="store_true",
        help="a planted mismatch: shuffled fixed-size batches behind Poisson accounting",
    )
    p.add_argument(
        "--plan",
        default=None,
        help="plan.json of `dpaudit audit plan opacus ...`: its canaries, noise multiplier and claim",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="no dpaudit lines: train and report (what `dpaudit audit opacus` audits)",
    )
    p.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="Opacus's noise multiplier (default: the one --epsilon needs)",
    )
    p.add_argument(
        "--loss-reduction",
        choices=("mean", "sum"),
        default="mean",
        help="sum: no division by Opacus's int(N q), which moves with one record (Opacus #571); Adam is scale-free",
    )
    a = p.parse_args()
    torch.manual_seed(a.seed)
    data = load_dataset(
        "mnist"
    )  # $DPAUDIT_DATA_DIR/mnist; raises a clear error when the files are missing
    x, y = data.x_train, data.y_train
    if a.max_train:
        x, y = x[: a.max_train], y[: a.max_train]
    train = torch.utils.data.TensorDataset(
        torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)
    )
    loader = torch.utils.data.DataLoader(train, batch_size=a.batch_size, shuffle=a.fixed_batches)
    model = SmallCNN()
    # dpaudit: canaries chosen and theta_0 recorded BEFORE training, at coordinates of fc1.weight.
    private = {"epochs": a.epochs, "target_epsilon": a.epsilon, "target_delta": a.delta}
    if (
        a.plan and not a.plain
    ):  # dpaudit: the plan fixes canaries, tensors, coordinates and coins, and the claim (noise multiplier, delta)
        canaries = OpacusCanaries.from_plan(model, a.plan)
        claim = json.loads(Path(a.plan).read_text())["claim"]
        a.delta, a.noise_multiplier = claim["delta"], claim["event"]["noise_multiplier"]
    else:
        canaries = (
            None
            if a.plain
            else OpacusCanaries(model, canaries=a.canaries, seed=a.seed, tensors=["fc1.weight"])
        )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    engine = PrivacyEngine(accountant="rdp")
    make = engine.make_private_with_epsilon
    if a.noise_multiplier is not None:
        make, private = engine.make_private, {"noise_multiplier": a.noise_multiplier}
    model, optimizer, loader = make(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        max_grad_norm=1.0,
        poisson_sampling=not a.fixed_batches,
        loss_reduction=a.loss_reduction,
        **private,
    )
    if canaries is not None:
        canaries.attach(
            optimizer, data_loader=loader
        )  # dpaudit: the hook into DPOptimizer.add_noise
        check = PipelineCheck().attach(
            optimizer, data_loader=loader, accountant=engine.accountant
        )  # dpaudit: the pipeline check
    t = time.perf_counter()
    for _ in range(a.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb, reduction=a.loss_reduction).backward()
            optimizer.step()
    seconds = time.perf_counter() - t
    model.eval()
    with torch.no_grad():
        acc = float((model(torch.as_tensor(data.x_test)).argmax(1).numpy() == data.y_test).mean())
    if canaries is None:
        print(
            json.dumps(
                {
                    "train_seconds": round(seconds, 1),
                    "test_accuracy": acc,
                    "opacus_epsilon": engine.get_epsilon(a.delta),
                    "noise_multiplier": optimizer.noise_multiplier,
                }
            ),
            flush=True,
        )
        return
    t = time.perf_counter()
    # dpaudit: the analysis with the pipeline findings (the check's and the canaries' own); under a plan
    # the planned analysis, one_run.json (plan id, revealed seeds) beside plan.json, its digest in the ledger
    bounds = canaries.audit(model, delta=None if a.plan else a.delta, pipeline=check).bounds
    analysis = time.perf_counter() - t
    print(
        json.dumps(
            {
                "train_seconds": round(seconds, 1),
                "analysis_seconds": round(analysis, 1),
                "test_accuracy": acc,
                "opacus_epsilon": engine.get_epsilon(a.delta),
                "noise_multiplier": optimizer.noise_multiplier,
                "steps": canaries.steps,
                "steinke_epsilon_lower_bound": bounds["steinke"]["epsilon_lower_bound"],
                "fdp_epsilon_lower_bound": (bounds["fdp"] or {}).get("epsilon_lower_bound"),
                "claimed_epsilon": bounds["claimed_epsilon"],
                "pipeline_findings": [f["code"] for f in bounds["findings"]],
                "pipeline": bounds.get("certified", "no findings"),
                "no_amplification_epsilon": (bounds.get("no_amplification") or {}).get("epsilon"),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
