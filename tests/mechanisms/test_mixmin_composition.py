"""Which split rule a DP-MixMin release used, and when its two stages may compose in parallel (issue 13, point 1).

Only the keyed per-record / per-user split (rule ``keyed-bernoulli-v1``) keeps D_mix and D_ft
disjoint under add/remove adjacency, so only it is declared to the ledger as a disjoint partition;
any other split (caller-supplied) is recorded on ``train`` and composes sequentially.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.accounting import event_from_dict
from dpaudit.accounting.events import Composed, Parallel
from dpaudit.ledger.book import open_ledger
from dpaudit.ledger.compose import DEFAULT_DELTA, bounds
from dpaudit.errors import UsageError
from dpaudit.mechanisms.mixmin_pipeline import DownstreamSettings, MixtureSettings, train_and_release_mixmin
from dpaudit.mechanisms.mixmin_tasks import load_task, mixture_split
from dpaudit.records import read_release

SPLIT_RULE = "keyed-bernoulli-v1"  # the public rule name (literal, so a renamed rule fails this test)

FAST_DOWN = DownstreamSettings(hidden=16, pretrain_checkpoints=(2,), finetune_epochs=1, finetune_batch_size=64)
FAST_MIX = MixtureSettings(steps=10)


def test_keyed_split_is_declared_with_its_rule(tmp_path):
    r = train_and_release_mixmin(task="digits-mix", epsilon=1.0, rho=0.3, seed=42, out_dir=tmp_path / "m", mixture=FAST_MIX)
    split = r.config["split"]
    assert split["rule"] == SPLIT_RULE
    assert split["stable_under_add_remove"] and split["parallel_composition"]
    assert SPLIT_RULE in r.partition and r.partition.endswith("/mix")
    t = load_task("digits-mix", seed=42)
    mix, _ = mixture_split(t.train_record_ids, 0.3, 42)  # the release used the keyed split of the stable ids
    assert r.config["n_mix_records"] == len(mix)
    with open_ledger() as L:
        parts = L.entries(dataset="digits-mix", kind="partition")
    assert len(parts) == 1 and SPLIT_RULE in parts[0].payload["declared_by"]
    assert parts[0].payload["children"] == [r.partition, r.partition[:-4] + "/ft"]


def test_caller_supplied_split_composes_sequentially(tmp_path):
    n = len(load_task("digits-mix").train_idx)
    split = (np.arange(0, n, 3), np.setdiff1d(np.arange(n), np.arange(0, n, 3)))
    with pytest.raises(UsageError, match="composition must be sequential for a caller-supplied split"):
        train_and_release_mixmin(task="digits-mix", stage="pipeline", composition="parallel", split=split,
                                 out_dir=tmp_path / "p", mixture=FAST_MIX, downstream=FAST_DOWN)
    r = train_and_release_mixmin(task="digits-mix", stage="pipeline", composition="sequential", split=split, epsilon=2.0, rho=0.3,
                                 out_dir=tmp_path / "s", mixture=FAST_MIX, downstream=FAST_DOWN)
    mix = read_release(tmp_path / "s" / "mixture")
    assert mix.partition == r.partition == "train"
    assert r.config["split"]["rule"] == mix.config["split"]["rule"] == "caller-supplied"
    assert not r.config["split"]["parallel_composition"] and not r.config["split"]["stable_under_add_remove"]
    assert mix.config["n_mix_records"] == len(split[0]) and r.config["n_finetune_records"] == len(split[1])
    with open_ledger() as L:
        assert L.entries(dataset="digits-mix", kind="partition") == []  # nothing declared disjoint
        total = {row["partition"]: row for row in L.summary("digits-mix")}["*"]
    assert total["naive_epsilon"] == pytest.approx(mix.epsilon + r.epsilon)
    evs = (event_from_dict(mix.guarantee), event_from_dict(r.guarantee))
    seq = bounds(Composed(evs), delta=DEFAULT_DELTA, adjacency=r.adjacency)["epsilon"]
    par = bounds(Parallel(evs), delta=DEFAULT_DELTA, adjacency=r.adjacency)["epsilon"]
    assert total["epsilon"] == pytest.approx(seq) and seq > par  # composed, not the worst of the two
    # a mixture-only release on a caller split: on ``train`` too, no declaration
    m = train_and_release_mixmin(task="digits-mix", split=split, out_dir=tmp_path / "m", mixture=FAST_MIX, record=False)
    assert m.partition == "train" and m.config["split"]["rule"] == "caller-supplied"


@pytest.mark.parametrize("bad, message", [
    ((np.array([0, 1]), np.array([1, 2])), "must be disjoint"),
    ((np.array([], dtype=int), np.array([1, 2])), "D_mix must be a non-empty"),
    ((np.array([0]), np.array([10**6])), "D_ft must hold distinct positions"),
])
def test_bad_caller_split_is_refused(tmp_path, bad, message):
    with pytest.raises(UsageError, match=message):
        train_and_release_mixmin(task="digits-mix", split=bad, out_dir=tmp_path / "x", mixture=FAST_MIX, record=False)
