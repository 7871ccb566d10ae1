"""A proxy-predictions file's people are its rows, not its bytes: a shuffled copy, a copy minus one
row and a copy with a 1e-12 jitter all meet the original's cap (DP-MixMin, bring-your-own proxies).
"""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.errors import BudgetExceededError
from dpaudit.ledger import compose as lc
from dpaudit.ledger.book import open_ledger
from dpaudit.releasing import release
from dpaudit.requests import MixMinRequest

N = 120


def _write(path, probs, labels):
    np.savez(path, probs=probs, labels=labels)
    return path


@pytest.fixture
def original(tmp_path):
    rng = np.random.default_rng(5)
    probs = rng.uniform(0.05, 0.95, size=(N, 3))
    labels = (rng.random(N) < probs[:, 2]).astype(float)
    return probs, labels


def _copies(tmp_path, probs, labels):
    perm = np.random.default_rng(1).permutation(N)
    jitter = np.random.default_rng(2).choice([-1e-12, 1e-12], size=probs.shape)
    return {
        "shuffled": _write(tmp_path / "shuffled.npz", probs[perm], labels[perm]),
        "minus-one-row": _write(tmp_path / "minus-one.npz", probs[1:], labels[1:]),
        "jittered": _write(tmp_path / "jittered.npz", np.clip(probs + jitter, 0.0, 1.0), labels),
    }


def _mixmin(path, ledger_path, out_dir):
    request = MixMinRequest(
        proxy_predictions=str(path),
        epsilon=1.0,
        steps=10,
        batch_size=1000,
        clipping_norm=5.0,
        reference_size=N,
    )
    return release("mixmin", request, out_dir=out_dir, ledger_path=ledger_path)


@pytest.mark.parametrize("copy", ["shuffled", "minus-one-row", "jittered"])
def test_a_copy_of_a_proxy_file_meets_the_originals_cap(tmp_path, original, copy):
    probs, labels = original
    ledger_path = tmp_path / "l.sqlite"
    first = _mixmin(_write(tmp_path / "preds.npz", probs, labels), ledger_path, tmp_path / "a")
    name = first.dataset["name"]
    with open_ledger(ledger_path) as led:
        total = lc.dataset_total(led._states(name)[name])
        spent = lc.total_bounds(total, delta=1e-5, adjacency=first.adjacency)["epsilon"]
        led.cap(name, spent * 1.01, 1e-5)  # room for no second run on these people
    with pytest.raises(
        BudgetExceededError, match=f"dataset '{name}' exceeded through shared people"
    ):
        _mixmin(_copies(tmp_path, probs, labels)[copy], ledger_path, tmp_path / "b")
    with open_ledger(ledger_path) as led:
        assert len(led.entries(kind="release")) == 1 and led.open_reservations() == []


def test_row_identity_is_order_free_subset_stable_and_jitter_robust(original):
    from dpaudit.mechanisms.mixmin.tasks import PROXY_GRID_STEP, proxy_row_sets

    probs, labels = original

    def ids(p, y):
        return [set(rs.ids) for rs in proxy_row_sets(p, y)]

    base = ids(probs, labels)
    assert all(len(s) == N for s in base)  # distinct predictions, distinct rows
    perm = np.random.default_rng(3).permutation(N)
    assert ids(probs[perm], labels[perm]) == base
    assert all(a <= b for a, b in zip(ids(probs[:40], labels[:40]), base))
    # A row moved by less than a quarter step keeps its cell on at least one grid when one coordinate moves.
    moved = probs.copy()
    moved[:, 0] += 0.2 * PROXY_GRID_STEP
    kept = [a & b for a, b in zip(ids(moved, labels), base)]
    assert len(kept[0]) + len(kept[1]) >= N
    # Other predictions share no row.
    other = np.random.default_rng(9).uniform(0.05, 0.95, size=(N, 3))
    assert all(not (a & b) for a, b in zip(ids(other, labels), base))
