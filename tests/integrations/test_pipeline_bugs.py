"""Planted replicas of three DP-SGD pipeline bugs Opacus does not stop, each found by PipelineCheck (and the
canaries' record): shuffled epochs cut into binomial-sized batches behind a Poisson-named sampler,
an update that bypasses the DP optimizer, and non-private fine-tuning after the DP loop. Correct runs
get no finding."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn

from dpaudit.integrations.opacus import OpacusCanaries
from dpaudit.integrations.pipeline import (
    NOT_CERTIFIED,
    PipelineCheck,
    inclusion_count_test,
    trained_from_draws,
)

N, BATCH = 105, 10


class UniformWithReplacementSampler(UniformWithReplacementSampler):  # noqa: F811 -- hides behind the name
    """Looks like Opacus's Poisson sampler (its class name, its rate, binomial batch sizes) but shuffles a
    permutation each epoch and cuts it into Bin(N, q)-sized batches: every record exactly once per epoch."""

    def __iter__(self):
        rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,))))
        perm, at = rng.permutation(self.num_samples), 0
        for _ in range(len(self)):
            # no empty batch: the default collate refuses one
            size = max(1, int(rng.binomial(self.num_samples, self.sample_rate)))
            yield perm[at : at + size].tolist() if at < self.num_samples else perm[:size].tolist()
            at += size


def _data(n: int = N):
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)
    )


def _setup(seed: int, *, loader=None, poisson: bool = True):
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    c = OpacusCanaries(model, canaries=8, seed=1, noise_seed=seed)
    engine = PrivacyEngine(accountant="rdp")
    loader = loader or torch.utils.data.DataLoader(_data(), batch_size=BATCH)
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=poisson,
    )
    c.attach(opt, data_loader=loader)
    check = PipelineCheck().attach(opt, data_loader=loader, accountant=engine.accountant)
    return model, opt, loader, c, check


def _train(model, opt, batches, *, bypass_at: int = -1):
    for i, (x, y) in enumerate(batches):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        (opt.original_optimizer.step if i == bypass_at else opt.step)()


def _codes(c, check, model=None) -> set[str]:
    b = c.audit(model, delta=1e-5, pipeline=check).bounds
    b.setdefault("findings", [])
    assert ("certified" in b) is bool(b["findings"]) and b.get(
        "certified", NOT_CERTIFIED
    ) == NOT_CERTIFIED
    return {f["code"] for f in b["findings"]}


@pytest.mark.parametrize("seed", range(5))
def test_correct_pipeline_has_no_finding(seed):
    model, opt, loader, c, check = _setup(seed)
    for _ in range(3):
        _train(model, opt, loader)
    assert _codes(c, check, model) == set()


@pytest.mark.parametrize("seed", range(3))
def test_shuffled_epochs_with_binomial_sizes(seed):
    sampler = UniformWithReplacementSampler(num_samples=N, sample_rate=0.1)
    loader = torch.utils.data.DataLoader(_data(), batch_sampler=sampler)
    model, opt, loader, c, check = _setup(seed, loader=loader, poisson=False)
    for _ in range(3):
        _train(model, opt, loader)
    codes = _codes(c, check, model)
    # only the per-record check sees it
    assert "not-poisson-records" in codes and not {"not-poisson", "fixed-batch-size"} & codes


def test_batches_drawn_by_another_loader():
    model, opt, loader, c, check = _setup(0)
    sampler = UniformWithReplacementSampler(num_samples=N, sample_rate=0.1)
    own = torch.utils.data.DataLoader(_data(), batch_sampler=sampler)
    for _ in range(3):
        _train(model, opt, own)
    assert "not-from-loader" in _codes(c, check, model)


def test_unclipped_original_optimizer_step():
    model, opt, loader, c, check = _setup(0)
    _train(model, opt, loader, bypass_at=4)
    assert "non-private-update" in _codes(c, check, model)
    assert check.direct_steps == 1


def test_second_optimizer_inside_the_loop():
    model, opt, loader, c, check = _setup(0)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        (plain.step if i == 3 else opt.step)()
    assert "non-private-update" in _codes(c, check, model)


def test_non_private_fine_tuning_after_the_dp_loop():
    model, opt, loader, c, check = _setup(0)
    _train(model, opt, loader)
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data().tensors
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    plain.step()
    assert "changed-after-training" in _codes(c, check, model)


def test_fine_tuned_copy_scored_instead_of_the_dp_model():
    model, opt, loader, c, check = _setup(0)
    _train(model, opt, loader)
    tuned = copy.deepcopy(model._module)
    with torch.no_grad():
        tuned.weight.add_(0.01)
    assert "changed-after-training" in _codes(c, check, tuned)
    # an untouched copy scores the same values
    assert "changed-after-training" not in _codes(c, None, copy.deepcopy(model._module))


def test_inclusion_count_test_half_epoch_and_honest_draws():
    """Half an epoch of shuffled batches (no record twice) is far from Poisson; Poisson draws are not."""
    rng = np.random.default_rng(0)
    n, q, steps = 2000, 0.02, 25
    counts = np.zeros(n, dtype=np.int64)
    counts[rng.permutation(n)[: steps * 40]] = 1
    assert inclusion_count_test(counts, steps=steps, q=q)[0] < 1e-6
    draws = [(rng.random((steps, n)) < q).sum(0) for _ in range(50)]
    honest = [inclusion_count_test(c, steps=steps, q=q)[0] for c in draws]
    assert min(honest) > 1e-4


def test_a_peeked_batch_is_not_a_finding():
    """Drawing a batch to look at it (never trained) leaves the trained batches the loader's own."""
    model, opt, loader, c, check = _setup(0)
    next(iter(loader))
    for _ in range(2):
        _train(model, opt, loader)
    assert _codes(c, check, model) == set()


def test_trained_from_draws():
    assert trained_from_draws([3, 0, 5], [3, 0, 2, 3])  # 5 = two consecutive draws (accumulation)
    assert trained_from_draws([4], [7, 4])  # a draw never trained (a peek) lies before
    assert not trained_from_draws([3, 4], [3, 5, 2])
    assert not trained_from_draws([3], [])


def test_training_through_a_second_dp_optimizer_with_less_noise():
    """The hooked optimizer is never stepped: a new DPOptimizer over the same parameters trains instead."""
    from opacus.optimizers import DPOptimizer

    model, opt, loader, c, check = _setup(0)
    other = DPOptimizer(
        opt.original_optimizer, noise_multiplier=0.05, max_grad_norm=1.0, expected_batch_size=BATCH
    )
    _train(model, other, loader)
    assert "changed-after-training" in _codes(c, check, model)
