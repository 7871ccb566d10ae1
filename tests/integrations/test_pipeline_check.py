"""PipelineCheck: planted pipeline mismatches each produce their finding; correct pipelines produce none."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from scipy import stats
from torch import nn

from dpaudit.accounting.accountants import compute_epsilon
from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.integrations.opacus import OpacusCanaries
from dpaudit.integrations.pipeline import NOT_CERTIFIED, PipelineCheck, fixed_size_chance
from dpaudit.reports.model import build_report

BATCH = 10


def _codes(check: PipelineCheck) -> set[str]:
    return {f.code for f in check.findings()}


def _opacus(
    n: int, *, poisson: bool = True, passes: int = 1, epochs: int = 3, canaries: int | None = None
):
    """A real Opacus run on n records; ``passes`` backward passes per optimizer step (accumulation)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)
    )
    model = nn.Linear(4, 2)
    c = OpacusCanaries(model, canaries=canaries, seed=1, noise_seed=3) if canaries else None
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=poisson,
    )
    check = PipelineCheck().attach(opt, data_loader=loader, accountant=engine.accountant)
    if c is not None:
        c.attach(opt, data_loader=loader)
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            nn.functional.cross_entropy(model(x), y).backward()
            if (i + 1) % passes == 0:
                opt.step()
                opt.zero_grad()
    return check, c, model


def test_correct_opacus_pipeline_has_no_findings():
    # N = 105, batch 10: q = 1/11 and int(N q) = 9 for N - 1, N, N + 1 alike
    check, _, _ = _opacus(105)
    assert check.findings() == ()
    # the accountant's own epsilon is recorded: Opacus's RDP figure for the executed 33 steps (the pipeline test's 4.62)
    assert len(check.noised) == 33 and check.record(1e-5) == {
        "findings": [],
        "accountant_epsilon": check._accountant.get_epsilon(1e-5),
    }
    assert check.record(1e-5)["accountant_epsilon"] == pytest.approx(4.619, abs=1e-3)


def test_fixed_size_shuffled_batches_behind_poisson_accounting():
    check, _, _ = _opacus(105, poisson=False)
    assert {"not-poisson", "fixed-batch-size"} <= _codes(check)
    rec = check.record(1e-5)
    assert rec["certified"] == NOT_CERTIFIED
    want = compute_epsilon(
        SubsampledGaussian(1.0, 1.0, 3), delta=1e-5
    ).epsilon  # 3 epochs, no amplification
    assert (
        rec["no_amplification"]["epsilon"] == pytest.approx(want)
        and rec["no_amplification"]["event"]["steps"] == 3
    )
    assert want > compute_epsilon(SubsampledGaussian(1.0, 1 / 11, 33), delta=1e-5).epsilon


def test_size_derived_normaliser():
    check, _, _ = _opacus(110)  # int(110 / 11) = 10, int(109 / 11) = 9
    assert _codes(check) == {"size-derived-normaliser"}


def test_opacus_accumulation_over_batches():
    check, _, _ = _opacus(105, poisson=False, passes=2, epochs=2)
    assert "accumulation" in _codes(check)


def test_findings_go_into_the_one_run_record(tmp_path):
    check, c, model = _opacus(105, poisson=False, canaries=8)
    c.audit(model, out=tmp_path, delta=1e-5, pipeline=check)
    rec = json.loads((tmp_path / "one_run.json").read_text())
    assert rec["certified"] == NOT_CERTIFIED and "not-poisson" in {
        f["code"] for f in rec["findings"]
    }
    notes = [n["message"] for n in build_report([tmp_path])["notes"]]
    assert any("not certified: pipeline findings (not-poisson" in m for m in notes)


def _plain(
    n: int,
    steps: int,
    *,
    fixed: bool = False,
    skip_every: int = 0,
    sigma: float = 1.0,
    q: float = 0.1,
    seed: int = 0,
):
    """A plain loop reporting to the check: Poisson or fixed-size batches; every ``skip_every``-th update skips noise."""
    rng = np.random.default_rng(seed)
    check = PipelineCheck(
        noise_multiplier=sigma, sample_rate=q, steps=steps, max_grad_norm=1.0, dataset_size=n
    )
    for t in range(steps):
        size = int(n * q) if fixed else int((rng.random(n) < q).sum())
        check.clip(size, 1.0)
        if not (skip_every and (t + 1) % skip_every == 0):
            check.noise(sigma, 1.0)
        check.step()
    return check


def test_plain_loop_correct_and_planted():
    assert _plain(200, 50).findings() == ()
    assert _codes(_plain(200, 50, fixed=True)) == {"fixed-batch-size"}
    assert _codes(_plain(200, 50, skip_every=4)) == {"noise-steps"}
    assert (
        len(_plain(200, 50, skip_every=4).findings()) == 2
    )  # 38 noised vs 50 accounted; 12 updates without noise


def test_changed_noise_multiplier():
    check = _plain(200, 10)
    check.clip(20, 1.0)
    check.noise(0.5, 1.0)
    check.step()
    assert {"changed-noise", "noise-steps"} <= _codes(check)


def test_fixed_size_chance_exact():
    # k = T: the chance is sum_b P[Bin(n, q) = b]^T
    assert fixed_size_chance([3, 3, 3], n=5, q=0.5) == pytest.approx(
        sum(stats.binom.pmf(b, 5, 0.5) ** 3 for b in range(6))
    )
    assert fixed_size_chance([1, 2, 3], n=5, q=0.5) == 1.0
