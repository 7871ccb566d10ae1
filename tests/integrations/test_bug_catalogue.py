"""The bug catalogue (tests/integrations/bug_catalogue.py): every planted replica of a real DP-SGD pipeline
bug is caught by its expected finding, the correct pipeline gets no finding over 20 seeds, and the summary
table (100 % caught, 0 % flagged) is printed for CI; then the detections the catalogue needed."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bug_catalogue as cat  # noqa: E402 -- the catalogue sits beside this file

from dpaudit.integrations.pipeline import PipelineCheck, weight_findings  # noqa: E402

CORRECT_SEEDS = range(20)


@functools.lru_cache(maxsize=None)
def _codes(name: str, seed: int) -> frozenset:
    """One run's finding codes, kept so the summary reuses the parametrised runs."""
    run = cat.correct if name == "correct" else next(b.run for b in cat.CATALOGUE if b.name == name)
    return frozenset(run(seed))


@pytest.mark.parametrize("bug", cat.CATALOGUE, ids=[b.name for b in cat.CATALOGUE])
def test_each_bug_is_caught(bug):
    found = _codes(bug.name, 0)
    assert bug.expected <= found, (
        f"{bug.name}: expected {sorted(bug.expected)}, found {sorted(found)}"
    )


@pytest.mark.parametrize("seed", CORRECT_SEEDS)
def test_the_correct_pipeline_has_no_finding(seed):
    assert _codes("correct", seed) == frozenset()


def test_summary_all_caught_none_flagged(capsys):
    rows = [
        {
            "bug": b,
            "caught": int(b.expected <= _codes(b.name, 0)),
            "runs": 1,
            "seconds": float("nan"),
        }
        for b in cat.CATALOGUE
    ]
    flagged = [s for s in CORRECT_SEEDS if _codes("correct", s)]
    result = {
        "rows": rows,
        "flagged": flagged,
        "correct_runs": len(CORRECT_SEEDS),
        "correct_seconds": float("nan"),
    }
    with capsys.disabled():
        print("\n" + cat.table(result))
    assert sum(r["caught"] for r in rows) == len(rows) and flagged == []


def test_the_catalogue_covers_the_issue_list():
    refs = " ".join(b.reference for b in cat.CATALOGUE)
    assert all(r in refs for r in ("#571", "#819", "#813", "PR #807"))
    assert len({b.name for b in cat.CATALOGUE}) == len(cat.CATALOGUE) == 10


# ------------------------------------------------------------------ the detections added for the catalogue
def _loader(weights, *, replacement=True, batch=cat.BATCH):
    data = cat.dataset(0)
    sampler = torch.utils.data.WeightedRandomSampler(
        weights, num_samples=cat.N, replacement=replacement
    )
    return torch.utils.data.DataLoader(data, batch_size=batch, sampler=sampler)


def test_weighted_sampler_finding_states_the_top_rate():
    w = torch.ones(cat.N)
    w[0] = 21.0  # record 0 has weight 21 of a total 125: 1 - (1 - 21/125)^10 per batch of 10
    (f,) = weight_findings(_loader(w), 1 / 11)
    assert f.code == "non-uniform-sampler" and f"{1 - (1 - 21 / 125) ** 10:.4g}" in f.message
    assert (
        weight_findings(_loader(torch.full((cat.N,), 3.0)), 1 / 11) == []
    )  # equal weights: one rate
    assert weight_findings(torch.utils.data.DataLoader(cat.dataset(0), batch_size=10), 1 / 11) == []


def _noise_codes(draws, dims: int, sigma: float = 1.0) -> set[str]:
    """The check's findings for updates whose squared noise sums are ``draws`` (clipping norm 1)."""
    check = PipelineCheck(noise_multiplier=sigma, sample_rate=0.1, max_grad_norm=1.0)
    check.noise_sums = [(float(sq), dims, 1.0) for sq in draws]
    return {f.code: f.message for f in check.findings()}


def test_pooled_noise_catches_a_10_percent_understatement_no_single_update_does():
    """300 coordinates x 22 updates of noise drawn at 0.9 sigma: each update alone is within its
    Bonferroni level, the pooled chi^2 (6,600 degrees) is far outside it."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        found = _noise_codes(0.81 * rng.chisquare(300, 22), 300)
        assert (
            "too-little-noise" in found
            and "together carried noise of std" in found["too-little-noise"]
        )


def test_pooled_noise_false_positive_simulation():
    """1,000 runs of exactly the declared noise (chi^2 sums): none flagged (level 1e-6 per run)."""
    rng = np.random.default_rng(1)
    flagged = sum(bool(_noise_codes(rng.chisquare(30, 22), 30)) for _ in range(1000))
    assert flagged / 1000 <= 0.05 and flagged == 0


def test_parameters_outside_the_dp_optimizer_left_untouched_are_no_finding():
    """fc alone is DP-trained and the head never changes (frozen before make_private): no finding."""
    run = cat.setup(0, dp_params=lambda m: (m.head.requires_grad_(False), m.fc.parameters())[1])
    run.train()
    assert run.codes() == set()


def test_unclipped_parameters_seen_by_the_check_alone():
    run = cat.setup(0, dp_params=lambda m: m.fc.parameters())
    head = torch.optim.SGD(run.model._module.head.parameters(), lr=0.1)
    run.train(each=lambda i, x, y: (run.plain_backward(x, y), head.step()))
    codes = {f.code for f in run.check.findings()}
    assert "unclipped-parameters" in codes
    assert "head.weight" in next(
        f.message for f in run.check.findings() if f.code == "unclipped-parameters"
    )
