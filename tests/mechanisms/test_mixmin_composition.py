"""Which split rule a DP-MixMin release used, and when its two stages may compose in parallel.

Only the keyed per-record / per-user split (rule ``keyed-bernoulli-v1``) keeps D_mix and D_ft
disjoint under add/remove adjacency, so only it is declared to the ledger as a disjoint partition;
the sequential pipeline (both stages on every record, rule ``all-records``) is recorded on
``train`` and composes sequentially. A request cannot name any other split.
"""

from __future__ import annotations

import pytest

from dpaudit.accounting import event_from_dict
from dpaudit.accounting.events import Composed, Parallel
from dpaudit.ledger.book import open_ledger
from dpaudit.ledger.compose import DEFAULT_DELTA, bounds
from dpaudit.records import read_release
from dpaudit.releasing import release
from dpaudit.requests import MixMinRequest

SPLIT_RULE = (
    "keyed-bernoulli-v1"  # the public rule name (literal, so a renamed rule fails this test)
)


def test_keyed_split_is_declared_with_its_rule(tmp_path):
    r = release(
        "mixmin", MixMinRequest(epsilon=1.0, rho=0.3, seed=42, steps=10), out_dir=tmp_path / "m"
    )
    split = r.config["split"]
    assert split["rule"] == SPLIT_RULE
    assert split["stable_under_add_remove"] and split["parallel_composition"]
    assert SPLIT_RULE in r.partition and r.partition.endswith("/mix")
    assert r.normalizer == round(
        0.3 * 1257
    )  # B = round(rho N0) <= 1000: from the declared size, not |D_mix|
    with open_ledger() as L:
        parts = L.entries(dataset="digits-mix", kind="partition")
    assert len(parts) == 1 and SPLIT_RULE in parts[0].payload["declared_by"]
    assert parts[0].payload["children"] == [r.partition, r.partition[:-4] + "/ft"]


def test_split_without_the_keyed_rule_composes_sequentially(tmp_path):
    r = release(
        "mixmin",
        MixMinRequest(stage="pipeline", composition="sequential", epsilon=2.0, rho=0.3, steps=10),
        out_dir=tmp_path / "s",
    )
    mix = read_release(tmp_path / "s" / "mixture")
    assert mix.partition == r.partition == "train"
    assert r.config["split"]["rule"] == mix.config["split"]["rule"] == "all-records"
    assert (
        not r.config["split"]["parallel_composition"]
        and not r.config["split"]["stable_under_add_remove"]
    )
    with open_ledger() as L:
        assert L.entries(dataset="digits-mix", kind="partition") == []  # nothing declared disjoint
        total = {row["partition"]: row for row in L.summary("digits-mix")}["*"]
    assert total["naive_epsilon"] == pytest.approx(mix.epsilon + r.epsilon)
    evs = (event_from_dict(mix.guarantee), event_from_dict(r.guarantee))
    seq = bounds(Composed(evs), delta=DEFAULT_DELTA, adjacency=r.adjacency)["epsilon"]
    par = bounds(Parallel(evs), delta=DEFAULT_DELTA, adjacency=r.adjacency)["epsilon"]
    assert (
        total["epsilon"] == pytest.approx(seq) and seq > par
    )  # composed, not the worst of the two
