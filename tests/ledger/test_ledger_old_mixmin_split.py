"""Ledgers written before the keyed DP-MixMin split: their split declarations are not honoured.

Old dpaudit declared ``train/mixmin-rho<rho>-seed<seed> = .../mix + .../ft`` as disjoint, but that
split was a seeded permutation of n records: adding one record moved dozens of others between the
two sides, so the parallel claim was false under add/remove adjacency. Their
releases must compose sequentially. Expected values come from the accountant on hand-built trees.
"""

from __future__ import annotations

import pytest

from dpaudit.accounting import Composed, Parallel, SubsampledGaussian, compute_epsilon
from dpaudit.ledger.book import Ledger
from dpaudit.ledger.compose import unstable_declaration
from dpaudit.records import Release

MIX = SubsampledGaussian(noise_multiplier=4.0, sample_rate=1.0, steps=3)
FT = SubsampledGaussian(noise_multiplier=6.0, sample_rate=1.0, steps=10)


def _release(event, partition):
    return Release(
        mechanism="dp-mixmin",
        dataset={"name": "digits-mix", "sha256": "cd" * 32},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee=event.to_dict(),
        seed=0,
        noise_source={"kind": "os-entropy"},
        partition=partition,
        git_commit=None,
        noise_multiplier=event.noise_multiplier,
        sample_rate=event.sample_rate,
        steps=event.steps,
        clipping_norm=1.0,
    )


def _rdp(event):
    return compute_epsilon(event, delta=1e-5, accountant="rdp").epsilon


@pytest.mark.parametrize(
    "split, parallel",
    [
        ("train/mixmin-rho0.1-seed42", False),  # old permutation split: sequential
        ("train/mixmin-user-rho0.25-seed7", False),
        ("train/mixmin-keyed-bernoulli-v1-rho0.1-seed42", True),  # today's keyed split: parallel
    ],
)
def test_old_permutation_splits_compose_sequentially_and_keyed_splits_in_parallel(
    tmp_path, split, parallel
):
    with Ledger(tmp_path / "ledger.sqlite") as led:
        led.declare_partition("digits-mix", split, [split + "/mix", split + "/ft"], "dp-mixmin")
        led.record(_release(MIX, split + "/mix"))
        led.record(_release(FT, split + "/ft"))
        (total,) = [r for r in led.summary(accountants=("rdp",)) if r["partition"] == "*"]
    expected = _rdp(Parallel((MIX, FT))) if parallel else _rdp(Composed((MIX, FT)))
    assert total["epsilon_rdp"] == pytest.approx(expected, rel=1e-12)
    assert unstable_declaration(split, "dp-mixmin") is not parallel


def test_only_dpaudits_own_old_declaration_is_ignored():
    # A user's own declaration of a split they vouch for is theirs to make.
    assert not unstable_declaration("train/mixmin-rho0.1-seed42", "analyst: fixed split file v3")
    assert not unstable_declaration("train", "dp-mixmin")
