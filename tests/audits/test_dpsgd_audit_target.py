"""DPSGDMechanism.audit_target(plan, canary, release=, user_ids=, no_noise=) builds the target the
hand-built path of audits/build.py builds (fresh and from a release), with the same scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit.auditing import build_target, target_from_release
from dpaudit.release_compat import release_request
from dpaudit.mechanisms.contract import DataInfo
from dpaudit.mechanisms.dpsgd.mechanism import MECHANISM
from dpaudit.noise import NoiseSource
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest

WORLDS = np.array([True, False, True, False, True, False])


def _scores(t) -> np.ndarray:
    return t.scores(WORLDS, NoiseSource("reproducible", seed=2))


def _plan(req: DPSGDRequest, user_ids=None):
    mech = MECHANISM if user_ids is None else type(MECHANISM)(user_ids=user_ids)
    return MECHANISM.plan(req, DataInfo.from_prepared(mech.load(req)))


@pytest.mark.parametrize("canary", ["max-clip", "mislabeled"])
@pytest.mark.parametrize("no_noise", [False, True])
def test_fresh_audit_target_equals_the_hand_built_one(canary, no_noise):
    torch.set_num_threads(1)
    want = build_target("dp-rvfl", canary=canary, epochs=1, no_noise=no_noise)
    got = MECHANISM.audit_target(
        _plan(DPSGDRequest(model="dp-rvfl", epochs=1)), canary, no_noise=no_noise
    )
    assert (
        type(got) is type(want)
        and got._config == want._config
        and got.claimed_epsilon == want.claimed_epsilon
    )
    assert np.array_equal(_scores(got), _scores(want))


def test_release_audit_target_equals_the_hand_built_one(tmp_path):
    torch.set_num_threads(1)
    rel = release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", epochs=1, reproducible_noise=True),
        out_dir=tmp_path / "r",
        record=False,
    )
    want = target_from_release(tmp_path / "r", canary="max-clip")
    req = release_request(rel)
    got = MECHANISM.audit_target(MECHANISM.plan_of_release(req, rel), "max-clip", release=rel)
    assert (
        got._config == want._config
        and got.claimed_event == want.claimed_event
        and got.accountant == want.accountant
    )
    assert got.claimed_epsilon == want.claimed_epsilon
    assert np.array_equal(_scores(got), _scores(want))


def test_user_release_audit_target_equals_the_hand_built_one(tmp_path):
    torch.set_num_threads(1)
    np.save(tmp_path / "ids.npy", np.arange(1797) // 4)
    ids = str(tmp_path / "ids.npy")
    req = DPSGDRequest(
        model="dp-rvfl",
        epochs=1,
        reproducible_noise=True,
        privacy_unit="user",
        records_per_user=4,
        user_ids=ids,
        reference_size=315,
    )
    rel = release("dp-rvfl", req, out_dir=tmp_path / "r", record=False)
    want = target_from_release(tmp_path / "r", canary="max-clip", user_ids=ids)
    got = MECHANISM.audit_target(_plan(release_request(rel)), "max-clip", release=rel, user_ids=ids)
    assert (
        got._config == want._config
        and got.claimed_event == want.claimed_event
        and got.claimed_epsilon == want.claimed_epsilon
    )
    assert np.array_equal(_scores(got), _scores(want))
