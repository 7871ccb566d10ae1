"""Accountants against independent references, plus the contract every accountant obeys."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpaudit.accounting import (
    RDP_ORDERS,
    Composed,
    Parallel,
    PureEpsilon,
    SubsampledGaussian,
    compute_epsilon,
)
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


@pytest.mark.parametrize(
    "sigma,q,steps,delta", [c for c in CONFIGS if c[1] < 1.0][:6] + [CONFIGS[8]]
)
def test_prv_matches_prv_accountant(sigma, q, steps, delta):
    import prv_accountant as pa

    ours = compute_epsilon(SubsampledGaussian(sigma, q, steps), delta=delta, accountant="prv")
    prv = (
        pa.GaussianMechanism(noise_multiplier=sigma)
        if q >= 1.0
        else pa.PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)
    )
    acc = pa.PRVAccountant(
        prvs=[prv], max_self_compositions=[steps], eps_error=0.01, delta_error=delta * 1e-3
    )
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
        mpmath.binomial(alpha, k)
        * (1 - q) ** (alpha - k)
        * q**k
        * mpmath.e ** ((k * k - k) / (2 * s * s))
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
    expected = (
        {round(1 + x / 10, 1) for x in range(1, 100)}
        | set(range(12, 256))
        | {2**k for k in range(8, 15)}
    )
    assert set(RDP_ORDERS) == {float(a) for a in expected}
    assert len(RDP_ORDERS) == 99 + 244 + 7
    assert 11.0 not in RDP_ORDERS and 16384.0 in RDP_ORDERS


# ------------------------------------------------------------------ contract


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_noop_gives_zero(accountant):
    assert (
        compute_epsilon(SubsampledGaussian(1.0, 0.1, 0), delta=1e-5, accountant=accountant).epsilon
        == 0.0
    )


def test_pure_noop_and_sum():
    assert compute_epsilon(PureEpsilon(1.0, count=0), delta=1e-5, accountant="pure").epsilon == 0.0
    r = compute_epsilon(
        Composed((PureEpsilon(0.5), PureEpsilon(0.25, count=2))), delta=1e-5, accountant="pure"
    )
    assert r.epsilon == pytest.approx(1.0) and r.delta == 0.0


def test_rdp_sequential_composition_equals_more_steps():
    a = SubsampledGaussian(1.0, 0.01, 300)
    two = compute_epsilon(Composed((a, a)), delta=1e-5, accountant="rdp").epsilon
    doubled = compute_epsilon(
        SubsampledGaussian(1.0, 0.01, 600), delta=1e-5, accountant="rdp"
    ).epsilon
    single = compute_epsilon(a, delta=1e-5, accountant="rdp").epsilon
    assert two == pytest.approx(doubled, rel=1e-12)
    assert two < 2 * single  # tight composition beats the naive sum


def test_prv_sequential_composition_equals_more_steps():
    a = SubsampledGaussian(1.0, 0.01, 300)
    two = compute_epsilon(Composed((a, a)), delta=1e-5, accountant="prv").epsilon
    doubled = compute_epsilon(
        SubsampledGaussian(1.0, 0.01, 600), delta=1e-5, accountant="prv"
    ).epsilon
    assert two == pytest.approx(doubled, abs=0.02)  # both within the discretisation error


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_parallel_is_the_worst_branch(accountant):
    a, b = SubsampledGaussian(1.0, 0.01, 100), SubsampledGaussian(0.8, 0.01, 400)
    par = compute_epsilon(Parallel((a, b)), delta=1e-5, accountant=accountant).epsilon
    eb = compute_epsilon(b, delta=1e-5, accountant=accountant).epsilon
    ea = compute_epsilon(a, delta=1e-5, accountant=accountant).epsilon
    assert par == pytest.approx(max(ea, eb), rel=1e-9)


def test_parallel_inside_sequential_composes_each_branch():
    a, b, c = (
        SubsampledGaussian(1.0, 0.01, 100),
        SubsampledGaussian(0.8, 0.01, 400),
        SubsampledGaussian(1.2, 0.02, 200),
    )
    tree = Composed((Parallel((a, b)), c))
    got = compute_epsilon(tree, delta=1e-5).epsilon
    worst = max(
        compute_epsilon(Composed((a, c)), delta=1e-5).epsilon,
        compute_epsilon(Composed((b, c)), delta=1e-5).epsilon,
    )
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
    tree = Composed(
        (
            Parallel((SubsampledGaussian(1.0, 0.01, 100), PureEpsilon(0.3, 2))),
            SubsampledGaussian(2.0, 1.0, 5),
        )
    )
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
    many = Composed(
        tuple(
            [a, b, SubsampledGaussian(2.0, 0.005, 2000), SubsampledGaussian(3.0, 0.005, 2000)] * 100
        )
    )
    merged4 = Composed(
        (
            SubsampledGaussian(1.0, 0.01, 10000),
            SubsampledGaussian(0.8, 0.02, 5000),
            SubsampledGaussian(2.0, 0.005, 200000),
            SubsampledGaussian(3.0, 0.005, 200000),
        )
    )
    assert compute_epsilon(many, delta=1e-5).epsilon == compute_epsilon(merged4, delta=1e-5).epsilon
    small = Composed(
        tuple([SubsampledGaussian(1.0, 0.01, 10), SubsampledGaussian(0.8, 0.02, 5)] * 100)
    )
    merged2 = Composed((SubsampledGaussian(1.0, 0.01, 1000), SubsampledGaussian(0.8, 0.02, 500)))
    assert (
        compute_epsilon(small, delta=1e-5, accountant="prv").epsilon
        == compute_epsilon(merged2, delta=1e-5, accountant="prv").epsilon
    )


def test_prv_declines_huge_compositions_instead_of_hanging():
    with pytest.raises(UnsupportedEventError, match="use rdp"):
        compute_epsilon(SubsampledGaussian(1.0, 0.005, 1_000_000), delta=1e-5, accountant="prv")


@pytest.mark.parametrize(
    "sigma,q,steps", [(1.1, 0.01, 1), (0.9, 0.25, 120), (13.625, 1 / 188, 5640)]
)
def test_cached_one_step_rdp_equals_opacus_with_steps(sigma, q, steps):
    """rdp_curve scales a cached one-step curve: exactly compute_rdp(steps=T) of the numpy-only
    analysis (rdp_sgm.py), and Opacus's compute_rdp(steps=T) to rounding (tests/accounting/test_rdp_sgm.py)."""
    from opacus.accountants.analysis.rdp import compute_rdp

    from dpaudit.accounting import rdp_sgm

    want = np.asarray(
        rdp_sgm.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(RDP_ORDERS)),
        dtype=float,
    )
    opacus = np.asarray(
        compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(RDP_ORDERS)), dtype=float
    )
    np.testing.assert_allclose(
        want, opacus, rtol=1e-11, atol=0, equal_nan=True
    )  # Opacus gives NaN at a few huge orders; its conversion skips them
    for _ in range(2):  # the second call is served from the cache
        got = rdp_curve([SubsampledGaussian(sigma, q, steps)])
        assert np.array_equal(got, want, equal_nan=True)
    # the cache hands out a read-only curve: a caller cannot corrupt it
    from dpaudit.accounting.rdp import _one_step_rdp

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
    from dpaudit.ledger import compose as lc

    far = SubsampledGaussian(0.5, 0.25, 3000)  # rdp eps in the hundreds
    b = lc.bounds(far, delta=1e-5, adjacency="add-remove-record")
    assert b["epsilon_rdp"] > lc.PRV_SKIP_ABOVE_RDP_EPSILON and b["epsilon"] == b["epsilon_rdp"]
    assert b["epsilon_prv"] is None and "not attempted" in b["accountant_errors"]["prv"]
    near = lc.bounds(SubsampledGaussian(1.0, 0.01, 1000), delta=1e-5, adjacency="add-remove-record")
    assert near["epsilon_prv"] is not None and near["epsilon"] <= near["epsilon_rdp"]


# ------------------------------------------------------------------ adjacency is an input

from pathlib import Path  # noqa: E402

_PROFILE = None


def _profile():
    global _PROFILE
    if _PROFILE is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "privacy_profile", Path(__file__).with_name("privacy_profile.py")
        )
        _PROFILE = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_PROFILE)
    return _PROFILE


ADJ = ("add-remove-record", "replace-record")
# (sigma, q, T): sigma in {0.8794, 1, 2}, q in {0.005, 0.01}, T in {1, 100, 2000}
SUBSAMPLED = [
    (0.8794, 0.005, 2000),
    (1.0, 0.005, 2000),
    (2.0, 0.005, 2000),
    (1.0, 0.01, 1),
    (2.0, 0.005, 1),
    (0.8794, 0.01, 100),
    (2.0, 0.01, 100),
    (1.0, 0.01, 2000),
]


@pytest.mark.parametrize("sigma,q,steps", SUBSAMPLED)
@pytest.mark.parametrize("adjacency", ADJ)
def test_pld_matches_an_independent_privacy_profile(sigma, q, steps, adjacency):
    ref = _profile().subsampled_gaussian_epsilon(
        sigma, q, steps, 1e-5, replace=adjacency == "replace-record"
    )
    r = compute_epsilon(
        SubsampledGaussian(sigma, q, steps), delta=1e-5, accountant="pld", adjacency=adjacency
    )
    assert r.adjacency == adjacency and r.accountant == "pld"
    # pld is pessimistic (an upper bound); the reference is a rounded-to-nearest estimate
    assert ref - 0.003 <= r.epsilon <= ref * 1.01 + 0.003


@pytest.mark.parametrize("sigma,q,steps", SUBSAMPLED[:4])
def test_rdp_and_prv_add_remove_bound_the_independent_profile(sigma, q, steps):
    ref = _profile().subsampled_gaussian_epsilon(sigma, q, steps, 1e-5, replace=False)
    ev = SubsampledGaussian(sigma, q, steps)
    assert (
        compute_epsilon(ev, delta=1e-5, accountant="rdp").epsilon >= ref - 0.003
    )  # RDP is loose, never below
    prv = compute_epsilon(ev, delta=1e-5, accountant="prv")
    assert prv.epsilon_lower - 0.003 <= ref <= prv.epsilon + 0.003


@pytest.mark.parametrize("sigma,steps", [(0.8794, 1), (1.0, 10), (2.0, 100), (20.0, 2000)])
@pytest.mark.parametrize("adjacency", ADJ)
def test_no_subsampling_matches_the_gaussian_closed_form(sigma, steps, adjacency):
    """q = 1: T Gaussian steps are N(0,1) vs N(mu,1) with mu = sqrt(T) Delta / sigma, Delta = 1
    (add/remove) or 2 (replace-one: the clipped sum moves by up to 2C). Every accountant supports
    it under both adjacencies (rdp / prv by the exact conversion to sigma / 2)."""
    delta_sens = 2.0 if adjacency == "replace-record" else 1.0
    exact = _profile().gaussian_closed_form_epsilon(math.sqrt(steps) * delta_sens / sigma, 1e-5)
    ev = SubsampledGaussian(sigma, 1.0, steps)
    pld = compute_epsilon(ev, delta=1e-5, accountant="pld", adjacency=adjacency).epsilon
    assert exact * (1 - 1e-9) <= pld <= exact * 1.01 + 1e-3
    rdp = compute_epsilon(ev, delta=1e-5, accountant="rdp", adjacency=adjacency).epsilon
    assert rdp >= exact * (1 - 1e-9)
    try:
        prv = compute_epsilon(ev, delta=1e-5, accountant="prv", adjacency=adjacency)
    except UnsupportedEventError:
        assert (
            exact > 40
        )  # prv may decline only far in the tails (grid > 5e6 points, or its own check)
        return
    assert prv.epsilon >= exact - 1e-6 and prv.epsilon_lower <= exact + 1e-6


def test_the_reference_itself_matches_the_closed_form():
    p = _profile()
    for steps, replace in ((1, False), (10, True)):
        exact = p.gaussian_closed_form_epsilon(
            math.sqrt(steps) * (2.0 if replace else 1.0) / 2.0, 1e-5
        )
        assert p.subsampled_gaussian_epsilon(
            2.0, 1.0, steps, 1e-5, replace=replace
        ) == pytest.approx(exact, abs=2e-3)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_rdp_and_prv_refuse_subsampled_replace_one_and_name_pld(accountant):
    ev = SubsampledGaussian(1.0, 0.005, 2000)
    with pytest.raises(UnsupportedEventError, match=r"replace-record.*use the pld accountant") as e:
        compute_epsilon(ev, delta=1e-5, accountant=accountant, adjacency="replace-record")
    assert len(str(e.value).splitlines()) == 1
    # inside a composition or a parallel branch too: never the add/remove number relabelled
    tree = Composed((PureEpsilon(0.1), Parallel((SubsampledGaussian(2.0, 1.0, 3), ev))))
    with pytest.raises(UnsupportedEventError, match="use the pld accountant"):
        compute_epsilon(tree, delta=1e-5, accountant=accountant, adjacency="replace-record")


def test_replace_one_is_larger_than_add_remove_where_the_issue_measured_it():
    """(sigma 1, q 0.005, T 2000) was once shown as 1.458 (rdp) / 1.218 (prv) for replace-record."""
    for sigma, want in ((1.0, 1.93), (0.8794, 2.37)):
        ev = SubsampledGaussian(sigma, 0.005, 2000)
        rep = compute_epsilon(ev, delta=1e-5, accountant="pld", adjacency="replace-record").epsilon
        assert rep == pytest.approx(want, abs=0.01)
        assert rep > compute_epsilon(ev, delta=1e-5, accountant="rdp").epsilon


def test_support_table():
    from dpaudit.accounting.accountants import (
        ACCOUNTANTS,
        accountants_supporting,
        support_error,
        supports,
    )

    assert ACCOUNTANTS == ("rdp", "prv", "pld", "pure")
    sub, full, pure = (
        SubsampledGaussian(1.0, 0.01, 10),
        SubsampledGaussian(1.0, 1.0, 10),
        PureEpsilon(0.5, 2),
    )
    assert accountants_supporting(sub, "add-remove-record") == ("rdp", "prv", "pld")
    assert accountants_supporting(sub, "add-remove-user") == ("rdp", "prv", "pld")
    assert accountants_supporting(sub, "replace-record") == ("pld",)
    assert accountants_supporting(full, "replace-record") == ("rdp", "prv", "pld")
    for adj in ("add-remove-record", "replace-record", "add-remove-user"):
        assert accountants_supporting(pure, adj) == ACCOUNTANTS  # a claim made under that adjacency
        assert supports("pure", SubsampledGaussian(1.0, 0.01, 0), adj)  # nothing spent
    assert "pure-epsilon" in support_error("pure", sub, "add-remove-record")
    assert not supports("prv", SubsampledGaussian(1.0, 0.01, 200_000), "add-remove-record")
    with pytest.raises(UsageError, match="accountant must be one of rdp, prv, pld, pure"):
        support_error("moments", sub)


@pytest.mark.parametrize("accountant", ["rdp", "prv", "pld"])
def test_add_remove_user_is_add_remove_at_the_user_level(accountant):
    ev = SubsampledGaussian(1.0, 0.02, 300)
    user = compute_epsilon(ev, delta=1e-5, accountant=accountant, adjacency="add-remove-user")
    rec = compute_epsilon(ev, delta=1e-5, accountant=accountant, adjacency="add-remove-record")
    assert user.epsilon == rec.epsilon and user.adjacency == "add-remove-user"


def test_pld_composes_sequentially_and_in_parallel():
    a, b = SubsampledGaussian(1.0, 0.01, 300), SubsampledGaussian(0.8, 0.01, 400)
    for adj in ADJ:
        two = compute_epsilon(Composed((a, a)), delta=1e-5, accountant="pld", adjacency=adj).epsilon
        doubled = compute_epsilon(
            SubsampledGaussian(1.0, 0.01, 600), delta=1e-5, accountant="pld", adjacency=adj
        ).epsilon
        assert two == pytest.approx(doubled, abs=2e-3)
        par = compute_epsilon(Parallel((a, b)), delta=1e-5, accountant="pld", adjacency=adj).epsilon
        assert par == max(
            compute_epsilon(x, delta=1e-5, accountant="pld", adjacency=adj).epsilon for x in (a, b)
        )
    # pure epsilon: never above the sum; a mixed tree is above each part alone
    assert (
        1.9
        < compute_epsilon(
            PureEpsilon(0.5, 4), delta=1e-5, accountant="pld", adjacency="replace-record"
        ).epsilon
        <= 2.0 + 1e-9
    )
    mixed = compute_epsilon(
        Composed((a, PureEpsilon(0.5))), delta=1e-5, accountant="pld", adjacency="replace-record"
    ).epsilon
    assert (
        mixed > compute_epsilon(a, delta=1e-5, accountant="pld", adjacency="replace-record").epsilon
    )


def test_prv_declines_a_grid_that_would_exhaust_memory():
    """sigma 0.3, q 0.5, T 3000 made `dpaudit account` get killed for memory (a ~1e8-point grid)."""
    import time

    t = time.perf_counter()
    with _profile().memory_cap(), pytest.raises(UnsupportedEventError, match="grid points"):
        compute_epsilon(SubsampledGaussian(0.3, 0.5, 3000), delta=1e-5, accountant="prv")
    assert time.perf_counter() - t < 30.0  # declined before allocating


def test_ledger_bounds_use_pld_for_subsampled_replace_one():
    from dpaudit.ledger import compose as lc

    ev = SubsampledGaussian(1.0, 0.005, 2000)
    b = lc.bounds(ev, delta=1e-5, adjacency="replace-record")
    want = compute_epsilon(ev, delta=1e-5, accountant="pld", adjacency="replace-record").epsilon
    assert b["epsilon"] == want and b["bound_by"] == "pld"
    assert b["epsilon_rdp"] is None and "pld" in b["accountant_errors"]["rdp"]
    # pure-only replace-record trees (DP-ELM) keep their pure / rdp bounds
    p = lc.bounds(PureEpsilon(0.5, 2), delta=1e-5, adjacency="replace-record")
    assert p["epsilon"] <= 1.0 and p["epsilon_rdp"] is not None
