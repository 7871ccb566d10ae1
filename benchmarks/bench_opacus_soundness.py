"""Soundness: one-run audits of correct Opacus pipelines never exceed the claim.

A tiny Opacus run (N = 105 synthetic records, batch 10, Poisson sampling, sigma ``--sigma``, ``--epochs``
epochs) with ``--canaries`` gradient canaries on a weight the data never moves (the strongest place for
them), per seed: the pipeline check's findings (expected: none) and the deciding one-run eps_LB against
the claim. Usage: .venv/bin/python benchmarks/bench_opacus_soundness.py [--seeds 20] [--sigma 0.8] [--epochs 6] [--canaries 400]
[--entry]. ``--entry``: the same training as a plain Opacus script (this file with ``--train SEED``) audited through
``dpaudit audit opacus``'s library entry (``dpaudit.integrations.opacus_script.audit_script``).
"""

from __future__ import annotations

import argparse

import torch
from opacus import PrivacyEngine
from torch import nn

from dpaudit.integrations.opacus import OpacusCanaries
from dpaudit.integrations.opacus_script import audit_script
from dpaudit.integrations.pipeline import PipelineCheck


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.side = (
            nn.Linear(4, 2),
            nn.Linear(200, 2),
        )  # side: its inputs are zero in every record

    def forward(self, x):
        return self.fc(x[:, :4]) + self.side(x[:, 4:])


def train(seed: int, a, hook=None) -> None:
    """The plain Opacus run; ``hook(model)`` before make_private returns what to call with (engine, optimizer, loader) after it."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1)
    x = torch.zeros(105, 204)
    x[:, :4] = torch.randn(105, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, torch.randint(0, 2, (105,), generator=g))
    model = Tiny()
    after = hook(model) if hook else None
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        noise_multiplier=a.sigma,
        max_grad_norm=1.0,
        data_loader=torch.utils.data.DataLoader(data, batch_size=10),
    )
    if after:
        after(engine, opt, loader)
    for _ in range(a.epochs):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()


def run(seed: int, a) -> tuple:
    if a.entry:
        r, _ = audit_script(
            __file__,
            ["--train", str(seed), "--sigma", str(a.sigma), "--epochs", str(a.epochs)],
            out=f"/tmp/opacus-soundness-{seed}",
            canaries=a.canaries,
            tensors=["side.weight"],
            seed=seed,
        )
    else:
        made = {}

        def hook(model):
            made["c"] = OpacusCanaries(
                model, canaries=a.canaries, seed=seed, tensors=["side.weight"]
            )
            return lambda engine, opt, loader: made.update(
                c=made["c"].attach(opt, data_loader=loader),
                check=PipelineCheck().attach(opt, data_loader=loader, accountant=engine.accountant),
            )

        train(seed, a, hook)
        r = made["c"].audit(delta=1e-5, pipeline=made["check"])
    return (
        r.epsilon_lower_bound,
        r.bounds["claimed_epsilon"],
        r.violated,
        [f["code"] for f in r.bounds["findings"]],
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--sigma", type=float, default=0.8)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--canaries", type=int, default=400)
    ap.add_argument(
        "--entry",
        action="store_true",
        help="audit through dpaudit audit opacus's entry (audit_script)",
    )
    ap.add_argument(
        "--train",
        type=int,
        default=None,
        help="SEED: the plain training alone (the script --entry audits)",
    )
    a = ap.parse_args()
    if a.train is not None:
        return train(a.train, a)
    rows = [run(s, a) for s in range(a.seeds)]
    for s, (lb, claim, bad, found) in enumerate(rows):
        print(f"seed {s}: eps_LB {lb:.3f} / claim {claim:.3f}, violated {bad}, findings {found}")
    print(
        f"max eps_LB {max(r[0] for r in rows):.3f}, claim {rows[0][1]:.3f}, violations {sum(r[2] for r in rows)} / {a.seeds}, "
        f"runs with findings {sum(bool(r[3]) for r in rows)}"
    )


if __name__ == "__main__":
    main()
