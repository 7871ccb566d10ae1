"""Error paths and rare branches of the DP-SGD family and the mechanism contract that no other test
runs: refusals of bad library input, plans made before loading, and the binary head's log-probs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dpaudit.data import load_dataset
from dpaudit.data.users import index_users
from dpaudit.errors import DataError, UsageError
from dpaudit.mechanisms.contract import DataInfo, MechanismBase, ReleasePlan, _check_dataset
from dpaudit.mechanisms.dpsgd import core as dpsgd_core
from dpaudit.mechanisms.dpsgd.core import DPSGDConfig, check_head_inputs, head_clipped_sum
from dpaudit.mechanisms.dpsgd.ghost_clip import ghost_clipped_sum
from dpaudit.mechanisms.dpsgd.head_audit import label_log_prob
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
from dpaudit.mechanisms.dpsgd.head_canaries import _test_records
from dpaudit.mechanisms.dpsgd.loop import UserSampling, _check_canary_rows, train_heads
from dpaudit.mechanisms.dpsgd.mechanism import MECHANISM, DPSGDMechanism, _ledger_fingerprint
from dpaudit.mechanisms.dpsgd.models import CompactAttention, build_module
from dpaudit.mechanisms.dpsgd.module_training import train_module_dp_sgd
from dpaudit.mechanisms.dpsgd.one_run_heads import _log_softmax_rows
from dpaudit.mechanisms.dpsgd.one_run_modules import choose_coordinates, trial_config
from dpaudit.mechanisms.dpsgd.user_head_audit import user_clipped_gradient
from dpaudit.mechanisms.dpsgd.white_box_target import (
    _plain_sgd,
    head_white_box_run,
    white_box_audit,
    white_box_run,
)
from dpaudit.mechanisms.simple.noisy_sum import MECHANISM as NOISY_SUM
from dpaudit.noise import NoiseSource
from dpaudit.requests import DPSGDRequest

CONFIG = DPSGDConfig(sample_rate=0.1, steps=3, normalizer=2, noise_multiplier=1.0)


def test_instance_user_ids_refuse_a_record_level_request():
    with pytest.raises(UsageError, match=r"^privacy_unit must be 'user' when user ids"):
        DPSGDMechanism(user_ids=np.arange(5)).validate(DPSGDRequest("dp-rvfl"))


def test_plans_made_before_loading():
    """A sweep plans from the registry: a user-level plan needs users, an image CNN's noise count
    waits for the loaded image shape, and a non-private head plan has no claim to audit."""
    user = DPSGDRequest("dp-rvfl", privacy_unit="user", records_per_user=2, reference_size=50)
    with pytest.raises(DataError, match=r"^dataset digits must be split by users"):
        MECHANISM.plan(user, DataInfo.from_registry("digits"))
    cnn = MECHANISM.plan(DPSGDRequest("dp-cnn", dataset="mnist"), DataInfo.from_registry("mnist"))
    assert cnn.noise_values is None and cnn.event is not None
    plan = MECHANISM.plan(
        DPSGDRequest("dp-rvfl", non_private=True), DataInfo.from_registry("digits")
    )
    with pytest.raises(UsageError, match=r"^release must be private to be audited"):
        MECHANISM.audit_target(plan, "max-clip")


def test_a_missing_ledger_gives_no_fingerprint(tmp_path):
    assert _ledger_fingerprint("r-1", tmp_path / "no-such-ledger.db") is None
    assert _ledger_fingerprint(None, tmp_path / "no-such-ledger.db") is None


def test_contract_defaults():
    with pytest.raises(DataError, match=r"^dataset toy has an empty training partition\.$"):
        MechanismBase().load(None, SimpleNamespace(name="toy", y_train=np.zeros(0)))
    with pytest.raises(DataError, match=r"^rebuilt dataset name must equal the release's 'heart'"):
        _check_dataset({"name": "digits"}, {"name": "heart"})
    plan = ReleasePlan("noisy-sum", None, {}, "train", "add-remove-record", "rdp", None, None, 1e-5)
    plan = plan.replace(seed=3, data_name="digits")
    assert NOISY_SUM.default_out_dir(plan) == Path("runs/noisy-sum-digits-seed3-nonprivate")


def test_kernels_refuse_bad_input():
    with pytest.raises(UsageError, match=r"^betas must be two numbers in \[0, 1\)"):
        DPSGDConfig(sample_rate=0.1, steps=3, normalizer=2, noise_multiplier=1.0, betas=(0.9, 1.0))
    with pytest.raises(UsageError, match=r"^labels must be in \[0, 3\), got range \[0, 3\]\.$"):
        check_head_inputs(np.zeros((2, 4)), np.array([0, 3]), 3, False)
    with pytest.raises(UsageError, match=r"^loss must be one of cross_entropy, bce"):
        dpsgd_core._loss_fn("hinge")
    with pytest.raises(UsageError, match=r"^record_grads must have shape \(k, \.\.\.\)"):
        user_clipped_gradient(np.zeros(3), 1.0)
    with pytest.raises(UsageError, match=r"^canary tensors must be trainable parameters"):
        choose_coordinates({"fc.weight": (3, 2)}, ("fc.bias",), 2, 0)
    with pytest.raises(UsageError, match=r"^config must be a DPSGDConfig, got dict\.$"):
        trial_config({}, noise_on=True)
    with pytest.raises(UsageError, match=r"^target must be a record-level DP-SGD head target"):
        head_white_box_run(None, canaries=2, noise=NoiseSource(), seed=0)
    target, no_test = (
        SimpleNamespace(seed=0, canary="natural"),
        SimpleNamespace(name="toy", y_test=[]),
    )
    with pytest.raises(DataError, match=r"^dataset toy has no held-out test records for a natural"):
        _test_records(target, no_test, None, None, wrong=False)
    user_canary = SimpleNamespace(z=np.zeros((2, 3)), y=np.array([0, 1]), many=True)
    with pytest.raises(UsageError, match=r"^a user-level canary with records must be one user"):
        _check_canary_rows(user_canary, np.zeros((1, 2)), 2, True, 1)


def test_module_paths_refuse_bad_input():
    with pytest.raises(UsageError, match=r"^image height and width must be multiples of 4"):
        CompactAttention((1, 10, 10))
    with pytest.raises(UsageError, match=r"^embedding dim must be a multiple of 4, got 6\.$"):
        CompactAttention((1, 8, 8), dim=6)
    gru = build_module("gru", kind="image", n_features=64, n_classes=10, image_shape=(1, 8, 8))
    x, y = torch.randn(3, 64), torch.randint(0, 10, (3,))
    assert ghost_clipped_sum(gru, x, y, 1.0) is None  # layers outside the ghost kernel
    with pytest.raises(
        UsageError, match=r"^x and y must have the same number of rows, got 3 and 2"
    ):
        train_module_dp_sgd(gru, x, y[:2], CONFIG, noise=NoiseSource())


def test_head_kernels_rare_branches():
    """An empty batch sums to zeros; a plain-SGD config keeps its own learning rate; a binary
    head (one logit s) gives the log-probs of a two-class softmax head with logits (0, s)."""
    assert not head_clipped_sum(np.ones((2, 4)), np.zeros((0, 4)), np.zeros(0), [], 1.0).any()
    sgd = DPSGDConfig(
        sample_rate=0.1, steps=3, normalizer=2, noise_multiplier=1.0, lr=0.3, optimizer="sgd"
    )
    assert _plain_sgd(sgd) is sgd and _plain_sgd(CONFIG).optimizer == "sgd"
    rng = np.random.default_rng(0)
    w1, z = rng.normal(size=(4, 1, 6)), rng.normal(size=5)
    w2 = np.concatenate([np.zeros_like(w1), w1], axis=1)
    for label in (0, 1):
        np.testing.assert_allclose(label_log_prob(w1, z, label), label_log_prob(w2, z, label))
    zc = rng.normal(size=(3, 5))
    np.testing.assert_allclose(_log_softmax_rows(w1[0], zc), _log_softmax_rows(w2[0], zc))


def test_white_box_refusals():
    digits, noise = load_dataset("digits"), NoiseSource()
    with pytest.raises(UsageError, match=r"^canaries for crafted-final must be at most the \d+ "):
        white_box_run(
            "dp-dense",
            digits,
            CONFIG,
            canaries=10**6,
            noise=noise,
            seed=0,
            threat_model="crafted-final",
        )
    with pytest.raises(UsageError, match=r"^model for a white-box audit must be one of dp-dense"):
        white_box_run("dp-gru", digits, CONFIG, canaries=2, noise=noise, seed=0)
    head = HeadTarget.__new__(HeadTarget)  # the refusal reads only its type
    with pytest.raises(UsageError, match=r"^threat model for a DP-SGD head must be white-box"):
        white_box_audit(
            head, None, None, {}, canaries=2, noise=noise, seed=0, threat_model="crafted-final"
        )


def test_a_step_sampling_no_user_adds_a_zero_sum():
    """Algorithm 1, step 6: at q ~ 0 no user is sampled, so a noiseless head never moves (a
    stale or uninitialised sum buffer would move it)."""
    rng = np.random.default_rng(1)
    z, y, init = (
        rng.normal(size=(12, 3)),
        rng.integers(0, 3, 12),
        rng.normal(size=(3, 4)).astype(np.float32),
    )
    config = DPSGDConfig(1e-12, 5, 2, 0.0, non_private=True)
    users = UserSampling(index_users(np.arange(12) // 3), 2)
    noise = NoiseSource("reproducible", seed=2)
    head = train_heads(z, y, 3, config, noise=noise, init=init, users=users)
    assert head.steps_executed == 5 and np.array_equal(head.weights[0], init)
