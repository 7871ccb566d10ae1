"""Head audits lay their training rows out once per audit, and the trials' scores do not change."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from dpaudit.audits.engine import run_audit
from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import loop as engine
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget, canary_scores
from dpaudit.mechanisms.dpsgd.user_head_audit import UserHeadTarget
from dpaudit.noise import NoiseSource


def _small(canary: str, user: bool = False):
    if user:
        return UserHeadTarget(
            model="dp-rvfl",
            records_per_user=4,
            epsilon=2.0,
            canary=canary,
            epochs=1,
            reference_size=300,
        )
    return HeadTarget(
        model="dp-rvfl", dataset="digits", epsilon=2.0, canary=canary, epochs=1, max_train=300
    )


def test_an_audit_with_its_controls_lays_its_training_rows_out_once(monkeypatch):
    target = _small("max-clip")
    target.prepare()
    calls = []
    real = engine._features
    monkeypatch.setattr(engine, "_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    r = run_audit(target, runs=12, chunk_size=4, workers=1, record=False, reproducible_noise=True)
    assert set(r.controls) == {"no-noise", "null"}
    assert calls == []  # 3 roles x 3 chunks re-laid the 300 rows out 9 times before


@pytest.mark.parametrize(
    "canary,user",
    [("max-clip", False), ("mislabeled", False), ("max-clip", True), ("natural", True)],
)
def test_scores_on_the_audit_layout_equal_those_of_a_fresh_layout_bit_for_bit(canary, user):
    target = _small(canary, user)
    target.prepare()
    c = np.arange(6) % 2 == 0
    got = target.scores(c, NoiseSource("reproducible", seed=5))
    users = engine.UserSampling(target._users, target.records_per_user) if user else None
    fresh = engine.train_heads(
        np.array(target._z),
        target._y,
        target._n_classes,
        target._config,
        noise=NoiseSource("reproducible", seed=5),
        runs=c.size,
        init=target._init,
        canary=dataclasses.replace(target._canary, included=c),
        users=users,
        binary_logit=target._binary,
    )
    np.testing.assert_array_equal(got, canary_scores(target, fresh.weights))


def test_a_layout_built_for_another_canary_is_refused():
    target = _small("mislabeled")
    target.prepare()
    with pytest.raises(UsageError, match="layout must hold the canary's rows"):
        gradient = np.zeros((target._k, target._z.shape[1] + 1))
        hook = engine.CanaryHook(included=np.ones(2, bool), gradient=gradient)
        engine.train_heads(
            None,
            None,
            target._n_classes,
            target._config,
            runs=2,
            canary=hook,
            noise=NoiseSource("reproducible", seed=1),
            layout=target._layout,
        )


def test_a_pickled_target_ships_one_copy_of_the_features():
    target = _small("max-clip")
    target.prepare()
    size = len(pickle.dumps(target))
    back = pickle.loads(pickle.dumps(target))
    assert size < 1.5 * target._layout.z1.nbytes  # the view is not pickled beside the layout
    assert np.shares_memory(back._z, back._layout.z1) and np.array_equal(back._z, target._z)
