"""Error paths and small features of DP-MixMin, DP-ELM, noisy-sum and the Opacus / white-box
integrations that the rest of the suite never ran: each refuses bad input with its one-line
message, or computes what it documents."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit.errors import DataError, UsageError
from dpaudit.integrations.opacus import OpacusCanaries, canary_sample_rate, summed_grad
from dpaudit.integrations.white_box import LoopWhiteBox
from dpaudit.mechanisms.elm import mechanism as elm
from dpaudit.mechanisms.mixmin.mechanism import MECHANISM as MIXMIN
from dpaudit.mechanisms.mixmin.solver import (
    MixMinCanary,
    check_inputs,
    loss_coefficient,
    objective,
)
from dpaudit.mechanisms.mixmin.tasks import (
    FORMER_DIVISION_KEY,
    declared_rows,
    load_task,
    mixture_split,
)
from dpaudit.mechanisms.simple.noisy_sum import MECHANISM as NOISY_SUM


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "record"}, "canary probs must be given for a record canary, got None."),
        ({"kind": "gradient"}, "canary direction must be given for a gradient canary, got None."),
        ({"kind": "gradient", "direction": np.zeros(3)}, "canary direction must be a finite"),
    ],
)
def test_mixmin_canary_refuses_a_missing_part(kwargs, message):
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        MixMinCanary(**kwargs)


@pytest.mark.parametrize(
    "probs, labels, loss, message",
    [
        ([[0.5, 0.5]], ["a"], "bce", "labels must be numeric, got dtype <U1."),
        ([[0.5, 0.5]], [np.nan], "mse", "labels must be finite, got non-finite values."),
        ([[np.nan, 0.5]], [1.0], "bce", "probs must hold finite numbers"),
        ([[-0.5, 0.5]], [1.0], "bce", "probs must be >= 0, got minimum -0.5."),
        ([[0.0, 0.0]], [0], "nll", "probs must have a positive density for at least one source"),
    ],
)
def test_mixmin_inputs_refused_with_one_line(probs, labels, loss, message):
    with pytest.raises(DataError, match="^" + message.replace(".", r"\.")):
        check_inputs(np.asarray(probs), np.asarray(labels), loss)


def test_mixmin_loss_coefficient_refuses_an_unknown_loss():
    with pytest.raises(UsageError, match=r"^loss must be one of bce, nll, mse, got 'hinge'\.$"):
        loss_coefficient(np.full(2, 0.5), np.ones(2), "hinge")


def test_mixmin_bce_objective_is_the_mean_cross_entropy():
    probs, labels, weights = np.array([[0.2, 0.6], [0.9, 0.5]]), np.array([1.0, 0.0]), [0.5, 0.5]
    p = probs @ weights
    want = np.mean(-(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
    assert objective(probs, labels, weights, "bce") == pytest.approx(want, rel=1e-12)


def test_mixmin_validate_refuses_another_request_type():
    with pytest.raises(UsageError, match=r"^request must be a MixMinRequest, got object\.$"):
        MIXMIN.validate(object())
    with pytest.raises(UsageError, match=r"^request must be a NoisySumRequest, got object\.$"):
        NOISY_SUM.validate(object())


def test_task_division_is_the_current_or_the_former_one():
    with pytest.raises(UsageError, match=r"^division of task digits-mix must be .*, got 7\.$"):
        load_task("digits-mix", division=7)
    # the former digits division (no test file): a seeded private half split 60/20/20
    former = load_task("digits-mix", division=FORMER_DIVISION_KEY)
    parts = [former.record_ids[i] for i in (former.train_idx, former.val_idx, former.test_idx)]
    assert [len(p) for p in parts] == [539, 180, 180] and len(
        np.unique(np.concatenate(parts))
    ) == 899


def test_declared_rows_of_a_task_are_the_task_rows():
    assert declared_rows("digits-mix") == tuple(load_task("digits-mix").rows)


def test_split_keys_string_ids_and_refuses_other_types():
    mix, ft = mixture_split(np.array([f"record-{i}" for i in range(40)]), 0.5, 3)
    assert len(mix) + len(ft) == 40 and len(mix) and len(ft)
    with pytest.raises(
        UsageError, match=r"^record and user identifiers must be integers or strings"
    ):
        mixture_split(np.array([0.5, 1.5]), 0.5, 3)


def test_elm_statistics_refuse_mismatched_features_and_shapes():
    x, y = np.zeros((4, 3)), np.zeros(4, dtype=np.int64)
    with pytest.raises(UsageError, match=r"^features must have width 4, got 3\.$"):
        elm.elm_sufficient_statistics(x, y, 4, 0, n_classes=2, features=elm.elm_features(3, 3, 0))
    with pytest.raises(UsageError, match=r"^x must have shape \(n, 3\), got \(4, 2\)\.$"):
        elm.elm_sufficient_statistics(
            x[:, :2], y, 2, 0, n_classes=2, features=elm.elm_features(3, 2, 0)
        )
    with pytest.raises(UsageError, match=r"^y must have shape \(4,\), got \(3,\)\.$"):
        elm.elm_sufficient_statistics(x, y[:3], 2, 0, n_classes=2)


def test_elm_fit_refuses_flat_x_and_a_private_fit_without_noise():
    y = np.zeros(4, dtype=np.int64)
    with pytest.raises(UsageError, match=r"^x must be a 2-D array, got shape \(4,\)\.$"):
        elm.fit_dp_elm(np.zeros(4), y, 2, 2, None, seed=0, noise=None)
    with pytest.raises(UsageError, match=r"^noise must be a NoiseSource for a private fit"):
        elm.fit_dp_elm(np.zeros((4, 3)), y, 2, 2, 1.0, seed=0, noise=None)


def test_opacus_helpers_refuse_missing_inputs():
    with pytest.raises(
        UsageError, match=r"^sample_rate or data_loader must be given, got neither\.$"
    ):
        canary_sample_rate(None, None)
    with pytest.raises(UsageError, match=r"^parameter 'weight' must have a clipped gradient sum"):
        summed_grad(nn.Linear(2, 1).weight, "weight")


def test_opacus_detach_restores_the_optimizer():
    from opacus.optimizers import DPOptimizer

    model = nn.Linear(3, 2)
    optimizer = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=4,
    )
    canaries = OpacusCanaries(model, canaries=2, tensors=["weight"])
    canaries.attach(optimizer, sample_rate=0.1)
    assert "add_noise" in vars(optimizer) and optimizer.dpaudit_canaries is canaries
    canaries.detach()
    assert "add_noise" not in vars(optimizer) and not hasattr(optimizer, "dpaudit_canaries")
    canaries.attach(optimizer, sample_rate=0.1)  # detached canaries attach again
    assert optimizer.dpaudit_canaries is canaries


def test_white_box_steps_out_of_order_are_refused():
    canaries = LoopWhiteBox(nn.Linear(3, 2), canaries=2)
    with pytest.raises(UsageError, match=r"^the claim must be declared before the first step"):
        canaries.before_noise({})
    with pytest.raises(UsageError, match=r"^a noisy sum must follow its clipped sum"):
        canaries.after_noise({})
    with pytest.raises(UsageError, match=r"^canaries must be attached and trained with before the"):
        canaries.observations()
