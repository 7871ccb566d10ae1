"""A catalogue of real DP-SGD pipeline bugs, each a planted replica on a tiny Opacus run, with the finding
that catches it (:class:`~dpaudit.integrations.pipeline.PipelineCheck` and the canaries' own record), and
the correct pipeline they are measured against.

Every run: 105 synthetic records (4 features, 2 classes), batch 10 (q = 1/11: int(N q) = 9 for N - 1, N,
N + 1), a two-layer model (``fc`` 4x4, ``head`` 4x2), sigma 1.0, clipping norm 1.0, 2 epochs; 8 canaries in
``fc.weight`` and a PipelineCheck attached right after ``make_private`` (as ``dpaudit audit opacus`` does).
A replica changes one thing, the way the upstream report did. The replicas live with the tests, not in the
library: dpaudit has no switch that weakens a pipeline.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn

from dpaudit.integrations.opacus import OpacusCanaries
from dpaudit.integrations.pipeline import PipelineCheck

N, BATCH, SIGMA, EPOCHS = 105, 10, 1.0, 2


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)))


@dataclass
class Run:
    """One tiny Opacus run with the canaries and the check attached."""

    model: nn.Module
    optimizer: object
    loader: object
    engine: PrivacyEngine
    canaries: OpacusCanaries
    check: PipelineCheck
    data: torch.utils.data.TensorDataset

    def train(self, epochs: int = EPOCHS, *, each=None) -> None:
        """``epochs`` passes over the loader; ``each(i)`` after every step (a replica's extra update)."""
        i = 0
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # torch's note on full backward hooks without input gradients
            for _ in range(epochs):
                for x, y in self.loader:
                    self.plain_backward(x, y)
                    self.optimizer.step()
                    if each is not None:
                        each(i, x, y)
                    i += 1

    def plain_backward(self, x, y) -> None:
        """A backward pass, every parameter's (per-sample) gradients cleared first: Opacus refuses to
        accumulate them under Poisson sampling."""
        self.optimizer.zero_grad()
        self.model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(self.model(x), y).backward()

    def codes(self) -> set[str]:
        """The finding codes of the audited record (the canaries' and the check's)."""
        bounds = self.canaries.audit(self.model, delta=1e-5, pipeline=self.check).bounds
        return {f["code"] for f in bounds.get("findings", [])}


def dataset(seed: int, n: int = N) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1000 + seed)
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def setup(
    seed: int,
    *,
    n: int = N,
    loader=None,
    poisson: bool = True,
    sigma: float = SIGMA,
    dp_params=None,
    before_attach=None,
) -> Run:
    """make_private over ``n`` records (``loader``: the user's own; ``dp_params(model)``: what the DP
    optimizer gets, default all), then ``before_attach(run)`` (a bug inside the library), then the canaries
    and the check."""
    torch.manual_seed(seed)
    data = dataset(seed, n)
    model = TwoLayer()
    canaries = OpacusCanaries(model, canaries=8, seed=1, tensors=["fc.weight"], noise_seed=seed)
    engine = PrivacyEngine(accountant="rdp")
    params = model.parameters() if dp_params is None else dp_params(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus's notes on secure RNG and non-Poisson loaders
        wrapped, opt, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(params, lr=0.1),
            data_loader=loader or torch.utils.data.DataLoader(data, batch_size=BATCH),
            noise_multiplier=sigma,
            max_grad_norm=1.0,
            poisson_sampling=poisson,
        )
    run = Run(wrapped, opt, loader, engine, canaries, None, data)
    if before_attach is not None:
        before_attach(run)
    canaries.attach(opt, data_loader=loader)
    run.check = PipelineCheck().attach(
        opt, data_loader=loader, accountant=engine.accountant, module=model
    )
    return run


# ---------------------------------------------------------------------------------------------- the replicas
def correct(seed: int) -> set[str]:
    run = setup(seed)
    run.train()
    return run.codes()


def size_derived_normaliser(seed: int) -> set[str]:
    run = setup(
        seed, n=110
    )  # int(110 / 11) = 10 but int(109 / 11) = 9: the mean's divisor depends on N
    run.train()
    return run.codes()


def weighted_sampler(seed: int) -> set[str]:
    data = dataset(seed)
    weights = torch.where(
        data.tensors[1] == 1, 4.0, 1.0
    )  # class rebalancing: one class drawn 4x as often
    sampler = torch.utils.data.WeightedRandomSampler(
        weights, num_samples=N, replacement=True, generator=torch.Generator().manual_seed(seed)
    )
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler)
    run = setup(seed, loader=loader, poisson=False)  # the rate is 1 / len(loader), the sampler kept
    run.train()
    return run.codes()


def accountant_given_other_sigma(seed: int) -> set[str]:
    """The noise is drawn at sigma 0.5 (the optimizer's), the accountant is told the configured 1.0."""

    def configured_sigma_to_accountant(run):
        q = run.loader.sample_rate
        accountant = run.engine.accountant
        run.optimizer.attach_step_hook(
            lambda opt: accountant.step(noise_multiplier=SIGMA, sample_rate=q)
        )

    run = setup(seed, sigma=0.5, before_attach=configured_sigma_to_accountant)
    run.train()
    return run.codes()


def noise_drawn_at_other_sigma(seed: int) -> set[str]:
    """The optimizer (and so the accountant) reports sigma 1.0, its noise is drawn at 0.8 (no single update
    shows it: the pooled test over all updates does)."""

    def lower_inside_add_noise(run):
        opt, original = run.optimizer, run.optimizer.add_noise

        def add_noise():
            reported, opt.noise_multiplier = opt.noise_multiplier, 0.8
            try:
                original()
            finally:
                opt.noise_multiplier = reported

        opt.add_noise = add_noise

    run = setup(seed, before_attach=lower_inside_add_noise)
    run.train()
    return run.codes()


def shuffled_reported_as_poisson(seed: int) -> set[str]:
    loader = torch.utils.data.DataLoader(dataset(seed), batch_size=BATCH, shuffle=True)
    run = setup(seed, loader=loader, poisson=False)
    run.train()
    return run.codes()


class BinomialShuffledSampler(UniformWithReplacementSampler):
    """Opacus's Poisson sampler's interface (rate, binomial batch sizes) over a shuffled permutation: every
    record exactly once per epoch."""

    def __iter__(self):
        rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,))))
        order = rng.permutation(self.num_samples)
        sizes = rng.binomial(self.num_samples, self.sample_rate, len(self))
        cuts = np.minimum(np.cumsum(np.maximum(sizes, 1)), self.num_samples)
        for start, stop in zip(np.concatenate([[0], cuts[:-1]]), cuts):
            yield order[start:stop].tolist() if stop > start else order[:1].tolist()


# it reports itself as Opacus's Poisson sampler
BinomialShuffledSampler.__name__ = "UniformWithReplacementSampler"


def binomial_sizes_over_shuffled_epochs(seed: int) -> set[str]:
    sampler = BinomialShuffledSampler(
        num_samples=N, sample_rate=1 / 11
    )  # 11 batches, the accounted rate
    run = setup(
        seed,
        loader=torch.utils.data.DataLoader(dataset(seed), batch_sampler=sampler),
        poisson=False,
    )
    run.train(4)
    return run.codes()


def unclipped_step(seed: int) -> set[str]:
    run = setup(seed)
    inner = run.optimizer.original_optimizer

    def raw_step(i, x, y):
        if i == 5:  # one update from the raw (unclipped, noiseless) gradient of the same batch
            run.plain_backward(x, y)
            inner.step()

    run.train(each=raw_step)
    return run.codes()


def noise_changed_after_make_private(seed: int) -> set[str]:
    run = setup(seed)
    run.optimizer.noise_multiplier = 0.3
    run.train()
    return run.codes()


def extra_non_private_steps(seed: int) -> set[str]:
    run = setup(seed)
    run.train()
    plain = torch.optim.SGD(run.model.parameters(), lr=0.1)
    x, y = run.data.tensors
    for _ in range(3):  # "a few more epochs without DP to recover accuracy"
        run.plain_backward(x, y)
        plain.step()
    return run.codes()


def layer_left_unclipped(seed: int) -> set[str]:
    """The DP optimizer gets ``fc`` only; the head is trained by a plain optimizer on the same batches."""
    run = setup(seed, dp_params=lambda m: m.fc.parameters())
    head = torch.optim.SGD(run.model._module.head.parameters(), lr=0.1)

    def head_step(i, x, y):
        run.plain_backward(x, y)
        head.step()

    run.train(each=head_step)
    return run.codes()


@dataclass(frozen=True)
class Bug:
    """One catalogue entry: ``run(seed)`` plants the bug and returns the audited record's finding codes;
    it is caught when every code of ``expected`` is among them."""

    name: str
    reference: str
    description: str
    run: Callable[[int], set[str]]
    expected: frozenset

    def caught(self, seed: int) -> bool:
        return self.expected <= self.run(seed)


CATALOGUE = (
    Bug(
        "size-derived normaliser",
        "Opacus #571, #819",
        "loss_reduction='mean' divides by int(N q), which one record more or less changes "
        "(N = 110, q = 1/11)",
        size_derived_normaliser,
        frozenset({"size-derived-normaliser"}),
    ),
    Bug(
        "rate from a weighted sampler",
        "Opacus #813",
        "a WeightedRandomSampler kept (poisson_sampling=False), the rate taken as 1 / len(loader); one class "
        "drawn 4x as often",
        weighted_sampler,
        frozenset({"non-uniform-sampler"}),
    ),
    Bug(
        "accountant told another sigma",
        "Opacus PR #807",
        "noise drawn at sigma 0.5, the accountant's step hook fed the configured sigma 1.0",
        accountant_given_other_sigma,
        frozenset({"accountant-history"}),
    ),
    Bug(
        "noise drawn at another sigma",
        "Opacus PR #807",
        "the optimizer (and the accountant) report sigma 1.0, add_noise draws at 0.8",
        noise_drawn_at_other_sigma,
        frozenset({"too-little-noise"}),
    ),
    Bug(
        "shuffling reported as Poisson",
        "Opacus #80",
        "shuffled fixed-size batches (poisson_sampling=False) accounted as Poisson at q = 1/11",
        shuffled_reported_as_poisson,
        frozenset({"not-poisson", "fixed-batch-size"}),
    ),
    Bug(
        "binomial sizes over shuffled epochs",
        "-",
        "a sampler named and sized like Opacus's Poisson one that cuts a shuffled permutation "
        "(each record once per epoch)",
        binomial_sizes_over_shuffled_epochs,
        frozenset({"not-poisson-records"}),
    ),
    Bug(
        "unclipped step",
        "-",
        "one update from original_optimizer.step on the raw gradient of a batch",
        unclipped_step,
        frozenset({"non-private-update"}),
    ),
    Bug(
        "noise changed after make_private",
        "-",
        "optimizer.noise_multiplier lowered to 0.3 after make_private (declared 1.0)",
        noise_changed_after_make_private,
        frozenset({"changed-noise"}),
    ),
    Bug(
        "extra non-private steps",
        "-",
        "3 full-batch plain SGD steps after the DP loop, before the audit",
        extra_non_private_steps,
        frozenset({"changed-after-training"}),
    ),
    Bug(
        "one layer left unclipped",
        "-",
        "the DP optimizer gets fc only; the head is trained by a plain optimizer on the same batches",
        layer_left_unclipped,
        frozenset({"unclipped-parameters"}),
    ),
)


def measure(seeds, correct_seeds) -> dict:
    """Per bug: caught over ``seeds`` and seconds per run; the correct pipeline's runs with any finding over
    ``correct_seeds``."""
    rows = []
    for bug in CATALOGUE:
        t0 = time.perf_counter()
        hits = sum(bug.caught(s) for s in seeds)
        rows.append(
            {
                "bug": bug,
                "caught": hits,
                "runs": len(seeds),
                "seconds": (time.perf_counter() - t0) / len(seeds),
            }
        )
    t0 = time.perf_counter()
    flagged = [s for s in correct_seeds if correct(s)]
    return {
        "rows": rows,
        "flagged": flagged,
        "correct_runs": len(correct_seeds),
        "correct_seconds": (time.perf_counter() - t0) / max(1, len(correct_seeds)),
    }


def table(result: dict) -> str:
    """The measured catalogue as a Markdown table, with the totals."""
    lines = [
        "| bug | upstream | replica | expected finding | caught | s / run |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        b = r["bug"]
        lines.append(
            f"| {b.name} | {b.reference} | {b.description} | {', '.join(sorted(b.expected))} | "
            f"{r['caught']}/{r['runs']} | {_seconds(r['seconds'])} |"
        )
    caught = sum(r["caught"] for r in result["rows"])
    total = sum(r["runs"] for r in result["rows"])
    flagged = len(result["flagged"])
    lines.append(
        f"| correct pipeline | - | Poisson at q = 1/11 of N = 105 (int(N q) = 9 for N - 1, N, "
        f"N + 1), settings as declared | none | {flagged}/{result['correct_runs']} flagged | "
        f"{_seconds(result['correct_seconds'])} |"
    )
    lines.append(
        f"\ncaught {100 * caught / total:.0f} % ({caught}/{total}); correct pipelines flagged "
        f"{100 * flagged / max(1, result['correct_runs']):.0f} % "
        f"({flagged}/{result['correct_runs']})"
    )
    return "\n".join(lines)


def _seconds(s: float) -> str:
    return "-" if s != s else f"{s:.2f}"  # NaN: not timed
