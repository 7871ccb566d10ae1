"""Section 4.2 statistics: cells, exact sign-flip tests, Holm, paired contrasts, win/tie/loss."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.errors import UsageError
from dpaudit.sweeps.stats import (
    cells,
    holm_adjust,
    min_attainable_pvalue,
    paired_contrasts,
    sign_flip_pvalue,
    summarize,
    win_tie_loss,
)


def brute_force_sign_flip(d):
    """Reference: enumerate the 2^n sign vectors with itertools, exact rational counting."""
    obs = abs(sum(d))
    hits = 0
    for signs in itertools.product((1, -1), repeat=len(d)):
        if abs(sum(s * x for s, x in zip(signs, d))) >= obs - 1e-12 * max(
            sum(abs(x) for x in d), 1e-300
        ):
            hits += 1
    return hits / 2 ** len(d)


def holm_by_definition(p):
    """Reference: Holm step-down, p_(i) -> max_{j<=i} min(1, (m - j + 1) p_(j)), back in input order."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adj = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return adj


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-50, 50), min_size=1, max_size=9))
def test_sign_flip_matches_brute_force_on_integer_differences(ints):
    d = [x / 7.0 for x in ints]  # non-trivial floats with exact ties
    assert sign_flip_pvalue(d) == pytest.approx(brute_force_sign_flip(d), abs=0.0)


def test_sign_flip_known_values_and_the_five_seed_floor():
    assert sign_flip_pvalue([1, 2, 3, 4, 5]) == 2 / 32  # only the all-plus and all-minus vectors
    assert min_attainable_pvalue(5) == 0.0625
    assert sign_flip_pvalue([0, 0, 0]) == 1.0
    assert sign_flip_pvalue([1, -1, 1, -1]) == 1.0
    # differences 0.1, 0.2, 0.3 (floating point: 0.1 + 0.2 != 0.3) — the tie must still count
    assert (
        sign_flip_pvalue([0.1, 0.2, -0.3]) == 1.0
    )  # observed sum ~5.6e-17: every assignment is as extreme
    assert sign_flip_pvalue([0.1, 0.2, 0.3]) == 2 / 8
    # |0.1 + 0.2 - 0.3| and |-0.1 - 0.2 + 0.3| differ from 0 by rounding only; the tie is counted
    assert sign_flip_pvalue([0.3, -0.1, -0.2]) == brute_force_sign_flip([0.3, -0.1, -0.2]) == 1.0
    with pytest.raises(UsageError):
        sign_flip_pvalue([])
    with pytest.raises(UsageError):
        sign_flip_pvalue([1.0, math.nan])


def test_sign_flip_large_n_uses_the_blocked_enumeration():
    rng = np.random.default_rng(0)
    d = rng.integers(-20, 20, size=18).tolist()
    # exact count by a vectorised independent enumeration
    signs = 1 - 2 * ((np.arange(2**18)[:, None] >> np.arange(18)[None, :]) & 1)
    ref = np.mean(np.abs(signs @ np.array(d)) >= abs(sum(d)))
    assert sign_flip_pvalue(d) == ref


@settings(max_examples=6, deadline=None)  # multipletests runs gc.collect() on every call
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=30))
def test_holm_matches_the_definition(p):
    assert holm_adjust(p) == pytest.approx(holm_by_definition(p), abs=1e-12)


def test_holm_fixed_cases():
    p = [0.01, 0.04, 0.03, 0.2, 0.0625, 1.0, 0.0625]
    assert holm_adjust(p) == pytest.approx(holm_by_definition(p), abs=1e-12)
    assert holm_adjust([0.0625] * 960) == [1.0] * 960  # the paper's 960 five-seed contrasts


def test_holm_refuses_invalid_p():
    with pytest.raises(UsageError):
        holm_adjust([0.5, 1.5])
    assert holm_adjust([]) == []


def test_summarize_uses_sample_sd_and_student_t():
    x = [90.1, 90.5, 90.2, 90.4, 90.3]
    s = summarize(x)
    mean = sum(x) / 5
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / 4)
    t975_4 = 2.7764451051977987  # Student t quantile, 4 degrees of freedom
    assert s.n == 5 and s.mean == pytest.approx(mean) and s.sd == pytest.approx(sd)
    assert s.ci_low == pytest.approx(mean - t975_4 * sd / math.sqrt(5))
    assert s.ci_high == pytest.approx(mean + t975_4 * sd / math.sqrt(5))
    one = summarize([3.0])
    assert one.n == 1 and math.isnan(one.sd) and math.isnan(one.ci_low)


def _rec(model, seed, acc, dataset="heart", eps=2.0, **more):
    return {
        "model": model,
        "dataset": dataset,
        "epsilon": eps,
        "seed": seed,
        "metrics": {"accuracy": acc, **more},
    }


def test_paired_contrasts_align_by_seed_and_holm_over_the_family():
    recs = [_rec("dp-rvfl", s, 0.80 + 0.01 * s) for s in range(5)]
    recs += [_rec("logistic-raw", s, 0.70 + 0.01 * s) for s in range(1, 5)]  # seed 0 missing
    recs += [_rec("dp-cnn", s, 0.90) for s in range(5)]
    recs += [_rec("dp-rvfl", s, 0.5, eps=1.0) for s in range(5)] + [
        _rec("dp-cnn", s, 0.5, eps=1.0) for s in range(5)
    ]
    cs = paired_contrasts(recs, metrics=("accuracy",))
    assert [(c.epsilon, c.comparator) for c in cs] == [
        (1.0, "dp-cnn"),
        (2.0, "dp-cnn"),
        (2.0, "logistic-raw"),
    ]
    by = {(c.epsilon, c.comparator): c for c in cs}
    lr = by[(2.0, "logistic-raw")]
    assert lr.seeds == (1, 2, 3, 4) and lr.n == 4
    assert lr.differences == pytest.approx((0.1,) * 4)
    assert lr.p_value == 2 / 16 and (lr.wins, lr.ties, lr.losses) == (4, 0, 0)
    cnn = by[(2.0, "dp-cnn")]
    assert cnn.p_value == 2 / 32 and (cnn.wins, cnn.ties, cnn.losses) == (0, 0, 5)
    tie = by[(1.0, "dp-cnn")]
    assert tie.p_value == 1.0 and (tie.wins, tie.ties, tie.losses) == (0, 5, 0)
    assert [c.p_holm for c in cs] == pytest.approx(holm_by_definition([c.p_value for c in cs]))
    wtl = {w.comparator: w for w in win_tie_loss(cs)}
    assert (wtl["dp-cnn"].wins, wtl["dp-cnn"].ties, wtl["dp-cnn"].losses) == (0, 1, 1)
    assert (wtl["logistic-raw"].wins, wtl["logistic-raw"].conditions) == (1, 1)


def test_cells_group_and_skip_missing_metrics():
    recs = [_rec("dp-rvfl", s, 0.8 + 0.01 * s, auroc=0.9) for s in range(3)] + [
        _rec("dp-cnn", 0, 0.7)
    ]
    acc = cells(recs, "accuracy")
    assert [(c.model, c.summary.n) for c in acc] == [("dp-cnn", 1), ("dp-rvfl", 3)]
    au = cells(recs, "auroc")
    assert [(c.model, c.seeds) for c in au] == [("dp-rvfl", (0, 1, 2))]
