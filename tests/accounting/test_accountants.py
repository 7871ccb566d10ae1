"""Accountants against independent references, plus the contract every accountant obeys."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpaudit.accounting import RDP_ORDERS, Composed, Parallel, PureEpsilon, SubsampledGaussian, compute_epsilon
from dpaudit.accounting.accountants import rdp_curve
from dpaudit.accounting.events import event_from_dict
from dpaudit.errors import AdjacencyMismatchError, UnsupportedEventError, UsageError

# (noise_multiplier, sample_rate, steps, delta): >= 10 configurations, incl. q=0.25/T=120 (Heart)
# and the noise levels that give epsilon near 0.1 and 8 there.
CONFIGS = [
    (0.8794, 0.005, 2000, 1e-5),  # MNIST eps~2
    (1.0, 0.005988023952095809, 1670, 1e-5),  # CIFAR-10 schedule
    (1.1, 0.005319148936170213, 5640, 1e-5),  # Cardio schedule
    (1.0, 0.25, 120, 1e-5),  # Heart schedule
    (93.25, 0.25, 120, 1e-5),  # Heart, eps ~ 0.1
    (1.85, 0.25, 120, 1e-5),  # Heart, eps ~ 8
    (4.0, 0.01, 1000, 1e-6),
    (0.6, 0.02, 500, 1e-5),
    (2.0, 1.0, 10, 1e-5),  # no subsampling
    (10.0, 0.1, 50, 1e-3),
    (0.7, 0.001, 10000, 1e-5),
    (1.3, 0.05, 300, 1e-7),
]


def _opacus_rdp_epsilon(sigma, q, steps, delta):
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(delta=delta, alphas=list(RDP_ORDERS))


@pytest.mark.parametrize("sigma,q,steps,delta", CONFIGS)
def test_rdp_matches_opacus_accountant(sigma, q, steps, delta):
    ours = compute_epsilon(SubsampledGaussian(sigma, q, steps), delta=delta, accountant="rdp")
    ref = _opacus_rdp_epsilon(sigma, q, steps, delta)
    assert ours.epsilon == pytest.approx(ref, rel=1e-6)
    assert ours.adjacency == "add-remove-record"


@pytest.mark.parametrize("sigma,q,steps,delta", [c for c in CONFIGS if c[1] < 1.0][:6] + [CONFIGS[8]])
def test_prv_matches_prv_accountant(sigma, q, steps, delta):
    import prv_accountant as pa

    ours = compute_epsilon(SubsampledGaussian(sigma, q, steps), delta=delta, accountant="prv")
    prv = (
        pa.GaussianMechanism(noise_multiplier=sigma)
        if q >= 1.0
        else pa.PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)
    )
    acc = pa.PRVAccountant(prvs=[prv], max_self_compositions=[steps], eps_error=0.01, delta_error=delta * 1e-3)
    lo, est, hi = acc.compute_epsilon(delta=delta, num_self_compositions=[steps])
    assert ours.epsilon == pytest.approx(hi, rel=1e-6)
    assert ours.epsilon_lower == pytest.approx(lo, rel=1e-6)
    assert ours.epsilon_estimate == pytest.approx(est, rel=1e-6)
    assert ours.epsilon_lower <= ours.epsilon_estimate <= ours.epsilon


def _rdp_integer_reference(q: float, sigma: float, alpha: int) -> float:
    """Independent reference: binomial expansion of the sampled Gaussian's RDP at integer order
    (Mironov, Talwar & Zhang 2019, Sec. 3.3), in arbitrary precision."""
    mpmath.mp.dps = 60
    q, s = mpmath.mpf(q), mpmath.mpf(sigma)
    a = mpmath.fsum(
        mpmath.binomial(alpha, k) * (1 - q) ** (alpha - k) * q**k * mpmath.e ** ((k * k - k) / (2 * s * s))
        for k in range(alpha + 1)
    )
    return float(mpmath.log(a) / (alpha - 1))


@pytest.mark.parametrize("sigma,q", [(0.8794, 0.005), (1.0, 0.25), (4.0, 0.01), (2.0, 1.0)])
def test_rdp_curve_matches_arbitrary_precision_reference(sigma, q):
    orders = (2.0, 3.0, 5.0, 12.0, 32.0, 64.0)
    ours = rdp_curve([SubsampledGaussian(sigma, q, 1)], orders=orders)
    ref = [_rdp_integer_reference(q, sigma, int(a)) for a in orders]
    np.testing.assert_allclose(ours, ref, rtol=1e-8)


def test_rdp_orders_are_the_documented_set():
    expected = {round(1 + x / 10, 1) for x in range(1, 100)} | set(range(12, 256)) | {2**k for k in range(8, 15)}
    assert set(RDP_ORDERS) == {float(a) for a in expected}
    assert len(RDP_ORDERS) == 99 + 244 + 7
    assert 11.0 not in RDP_ORDERS and 16384.0 in RDP_ORDERS


# ------------------------------------------------------------------ contract

@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_noop_gives_zero(accountant):
    assert compute_epsilon(SubsampledGaussian(1.0, 0.1, 0), delta=1e-5, accountant=accountant).epsilon == 0.0


def test_pure_noop_and_sum():
    assert compute_epsilon(PureEpsilon(1.0, count=0), delta=1e-5, accountant="pure").epsilon == 0.0
    r = compute_epsilon(Composed((PureEpsilon(0.5), PureEpsilon(0.25, count=2))), delta=1e-5, accountant="pure")
    assert r.epsilon == pytest.approx(1.0) and r.delta == 0.0


def test_rdp_sequential_composition_equals_more_steps():
    a = SubsampledGaussian(1.0, 0.01, 300)
    two = compute_epsilon(Composed((a, a)), delta=1e-5, accountant="rdp").epsilon
    doubled = compute_epsilon(SubsampledGaussian(1.0, 0.01, 600), delta=1e-5, accountant="rdp").epsilon
    single = compute_epsilon(a, delta=1e-5, accountant="rdp").epsilon
    assert two == pytest.approx(doubled, rel=1e-12)
    assert two < 2 * single  # tight composition beats the naive sum


def test_prv_sequential_composition_equals_more_steps():
    a = SubsampledGaussian(1.0, 0.01, 300)
    two = compute_epsilon(Composed((a, a)), delta=1e-5, accountant="prv").epsilon
    doubled = compute_epsilon(SubsampledGaussian(1.0, 0.01, 600), delta=1e-5, accountant="prv").epsilon
    assert two == pytest.approx(doubled, abs=0.02)  # both within the discretisation error


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_parallel_is_the_worst_branch(accountant):
    a, b = SubsampledGaussian(1.0, 0.01, 100), SubsampledGaussian(0.8, 0.01, 400)
    par = compute_epsilon(Parallel((a, b)), delta=1e-5, accountant=accountant).epsilon
    eb = compute_epsilon(b, delta=1e-5, accountant=accountant).epsilon
    ea = compute_epsilon(a, delta=1e-5, accountant=accountant).epsilon
    assert par == pytest.approx(max(ea, eb), rel=1e-9)


def test_parallel_inside_sequential_composes_each_branch():
    a, b, c = SubsampledGaussian(1.0, 0.01, 100), SubsampledGaussian(0.8, 0.01, 400), SubsampledGaussian(1.2, 0.02, 200)
    tree = Composed((Parallel((a, b)), c))
    got = compute_epsilon(tree, delta=1e-5).epsilon
    worst = max(compute_epsilon(Composed((a, c)), delta=1e-5).epsilon, compute_epsilon(Composed((b, c)), delta=1e-5).epsilon)
    assert got == pytest.approx(worst, rel=1e-12)


def test_pure_event_in_rdp_and_prv_is_bounded_by_its_epsilon():
    # A single eps-DP event is also (eps, delta)-DP: neither accountant may report more than eps
    # by more than its discretisation error, nor less than the exact (eps, delta) curve allows.
    for accountant in ("rdp", "prv"):
        r = compute_epsilon(PureEpsilon(1.0), delta=1e-5, accountant=accountant)
        assert 0.0 < r.epsilon <= 1.0 + 0.011


def test_pure_accountant_rejects_gaussian_events():
    with pytest.raises(UnsupportedEventError, match="pure"):
        compute_epsilon(SubsampledGaussian(1.0, 0.1, 10), delta=1e-5, accountant="pure")


def test_unknown_event_type_is_an_error_never_zero():
    with pytest.raises(UnsupportedEventError):
        event_from_dict({"type": "mystery", "epsilon": 0})


def test_event_round_trip():
    tree = Composed((Parallel((SubsampledGaussian(1.0, 0.01, 100), PureEpsilon(0.3, 2))), SubsampledGaussian(2.0, 1.0, 5)))
    assert event_from_dict(tree.to_dict()) == tree


def test_bad_delta_and_accountant():
    ev = SubsampledGaussian(1.0, 0.1, 10)
    for bad in (0.0, 1.0, -1e-5, math.nan):
        with pytest.raises(UsageError, match="delta must be in the open interval"):
            compute_epsilon(ev, delta=bad, accountant="rdp")
    with pytest.raises(UsageError, match="accountant must be one of"):
        compute_epsilon(ev, delta=1e-5, accountant="moments")


def test_adjacency_is_carried_and_mismatch_names_both():
    from dpaudit.accounting.adjacency import Adjacency, convert, require_same

    r = compute_epsilon(SubsampledGaussian(1.0, 0.1, 10), delta=1e-5, adjacency="add-remove-user")
    assert r.adjacency == "add-remove-user"
    with pytest.raises(AdjacencyMismatchError, match="add-remove-record vs replace-record"):
        require_same("add-remove-record", "replace-record")
    assert require_same(Adjacency.REPLACE_RECORD, "replace-record") is Adjacency.REPLACE_RECORD
    eps, delta = convert(1.0, 1e-5, "add-remove-record", "replace-record")
    assert eps == 2.0 and delta == pytest.approx((1 + math.e) * 1e-5)
    with pytest.raises(AdjacencyMismatchError):
        convert(1.0, 1e-5, "replace-record", "add-remove-user")
    with pytest.raises(UsageError, match="adjacency must be one of"):
        Adjacency.parse("neighbours")


def test_merging_identical_mechanisms_is_exact():
    from dpaudit.accounting.accountants import merge_leaves

    a, b = SubsampledGaussian(1.0, 0.01, 100), SubsampledGaussian(0.8, 0.02, 50)
    merged = merge_leaves([a, b, a, PureEpsilon(0.5), a, PureEpsilon(0.5, 2)])
    assert set(merged) == {SubsampledGaussian(1.0, 0.01, 300), b, PureEpsilon(0.5, 3)}
    # a ledger-sized composition: 400 releases of 4 distinct mechanisms equals 4 merged events
    many = Composed(tuple([a, b, SubsampledGaussian(2.0, 0.005, 2000), SubsampledGaussian(3.0, 0.005, 2000)] * 100))
    merged4 = Composed((SubsampledGaussian(1.0, 0.01, 10000), SubsampledGaussian(0.8, 0.02, 5000),
                        SubsampledGaussian(2.0, 0.005, 200000), SubsampledGaussian(3.0, 0.005, 200000)))
    assert compute_epsilon(many, delta=1e-5).epsilon == compute_epsilon(merged4, delta=1e-5).epsilon
    small = Composed(tuple([SubsampledGaussian(1.0, 0.01, 10), SubsampledGaussian(0.8, 0.02, 5)] * 100))
    merged2 = Composed((SubsampledGaussian(1.0, 0.01, 1000), SubsampledGaussian(0.8, 0.02, 500)))
    assert compute_epsilon(small, delta=1e-5, accountant="prv").epsilon == compute_epsilon(merged2, delta=1e-5, accountant="prv").epsilon


def test_prv_declines_huge_compositions_instead_of_hanging():
    with pytest.raises(UnsupportedEventError, match="use rdp"):
        compute_epsilon(SubsampledGaussian(1.0, 0.005, 1_000_000), delta=1e-5, accountant="prv")


@pytest.mark.parametrize("sigma,q,steps", [(1.1, 0.01, 1), (0.9, 0.25, 120), (13.625, 1 / 188, 5640)])
def test_cached_one_step_rdp_equals_opacus_with_steps(sigma, q, steps):
    """rdp_curve scales a cached one-step curve; Opacus's compute_rdp(steps=T) is the reference."""
    from opacus.accountants.analysis.rdp import compute_rdp

    want = np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(RDP_ORDERS)), dtype=float)
    for _ in range(2):  # the second call is served from the cache
        got = rdp_curve([SubsampledGaussian(sigma, q, steps)])
        assert np.array_equal(got, want, equal_nan=True)  # Opacus gives NaN at a few huge orders; its conversion skips them
    # the cache hands out a read-only curve: a caller cannot corrupt it
    from dpaudit.accounting.accountants import _one_step_rdp

    with pytest.raises(ValueError):
        _one_step_rdp(float(q), float(sigma), tuple(float(o) for o in RDP_ORDERS))[0] = 0.0


def test_prv_numerical_failure_is_an_unsupported_event(monkeypatch):
    """prv-accountant's own RuntimeError (e.g. its discretisation check) becomes a DPAudit error,
    so the ledger and reports fall back on rdp instead of crashing."""
    import prv_accountant as pa

    def broken(*a, **k):
        raise RuntimeError("Discrete mean differs from continuous mean significantly.")

    monkeypatch.setattr(pa, "PRVAccountant", broken)
    with pytest.raises(UnsupportedEventError, match="Discrete mean differs"):
        compute_epsilon(SubsampledGaussian(1.0, 0.01, 100), delta=1e-5, accountant="prv")


def test_ledger_bounds_skip_prv_far_in_the_tails():
    from dpaudit.accounting import ledger_compose as lc

    far = SubsampledGaussian(0.5, 0.25, 3000)  # rdp eps in the hundreds
    b = lc.bounds(far, delta=1e-5, adjacency="add-remove-record")
    assert b["epsilon_rdp"] > lc.PRV_SKIP_ABOVE_RDP_EPSILON and b["epsilon"] == b["epsilon_rdp"]
    assert b["epsilon_prv"] is None and "not attempted" in b["accountant_errors"]["prv"]
    near = lc.bounds(SubsampledGaussian(1.0, 0.01, 1000), delta=1e-5, adjacency="add-remove-record")
    assert near["epsilon_prv"] is not None and near["epsilon"] <= near["epsilon_rdp"]
