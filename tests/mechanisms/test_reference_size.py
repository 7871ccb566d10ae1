"""The DP-SGD schedule (q, T, m0) and the calibrated noise are functions of a
declared public reference size, never of the private training count, so neighbouring datasets
(one record, or one user, added or removed) run the identical mechanism."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpaudit.accounting import dp_sgd_schedule
from dpaudit.data import load_dataset
from dpaudit.errors import UsageError
from dpaudit.mechanisms.contract import DataInfo
from dpaudit.mechanisms.dpsgd.mechanism import MECHANISM
from dpaudit.requests import DPSGDRequest

# 1,257 digits training records in batches of 3: J = 419 exactly, so one record more gives J = 420
# (another q, T and sigma) and one record fewer another m0 (2, not 3) when the count decides the schedule.
BOUNDARY = dict(batch_size=3, epochs=1, epsilon=2.0)
#: The schedule alone (no noise calibration: fast); sigma is checked once, on a private plan.
SCHEDULE_ONLY = dict(BOUNDARY, non_private=True)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _with_train(data, keep=None, extra=0):
    """``data`` with its training rows restricted to ``keep`` and ``extra`` test rows appended."""
    keep = np.arange(len(data.y_train)) if keep is None else keep
    x = np.concatenate([data.x_train[keep], data.x_test[:extra]])
    y = np.concatenate([data.y_train[keep], data.y_test[:extra]])
    return dataclasses.replace(data, x_train=x, y_train=y)


def _schedule(plan) -> list:
    f = plan.release_fields
    return [
        f["sample_rate"],
        plan.steps,
        f["normalizer"],
        f["noise_multiplier"],
        plan.event,
        plan.config["schedule"],
        plan.config["dp_sgd"],
        plan.config["reference_size"],
    ]


def _all_equal(plans) -> bool:
    first = _schedule(plans[0])
    return all(_schedule(p) == first for p in plans[1:])


def test_record_neighbours_plan_the_identical_schedule(digits):
    n = len(digits.y_train)
    neighbours = [digits, _with_train(digits, keep=np.arange(1, n)), _with_train(digits, extra=1)]
    assert [len(d.y_train) for d in neighbours] == [n, n - 1, n + 1]
    plans = [
        MECHANISM.plan(DPSGDRequest("dp-rvfl", **SCHEDULE_ONLY), DataInfo.from_prepared(d))
        for d in neighbours
    ]
    assert _all_equal(plans)
    sched = dp_sgd_schedule(1257, 3, 1)  # the registry's declared train size of digits
    assert (
        (
            plans[0].release_fields["sample_rate"],
            plans[0].steps,
            plans[0].release_fields["normalizer"],
        )
        == (1 / 419, 419, 3)
        == (sched.sample_rate, sched.steps, sched.normalizer)
    )
    assert (
        plans[1].config["reference_size"] == 1257
        and plans[1].config["reference_size_from"] == "dataset definition"
    )
    # the calibrated noise and the event too (one record more used to give q 1/420, T 420: sigma 0.70375 instead of 0.70390)
    private = [
        MECHANISM.plan(DPSGDRequest("dp-rvfl", **BOUNDARY), DataInfo.from_prepared(d))
        for d in (neighbours[0], neighbours[2])
    ]
    assert _all_equal(private) and private[0].event.sample_rate == 1 / 419
    # the plan a sweep reserves before loading (registry) is the one the run uses
    assert _schedule(
        MECHANISM.plan(DPSGDRequest("dp-rvfl", **BOUNDARY), DataInfo.from_registry("digits"))
    ) == _schedule(private[0])


def test_reference_size_option_replaces_the_declared_size_and_is_recorded(digits):
    plan = MECHANISM.plan(
        DPSGDRequest("dp-rvfl", reference_size=1300, **SCHEDULE_ONLY),
        DataInfo.from_prepared(digits),
    )
    sched = dp_sgd_schedule(1300, 3, 1)
    assert (plan.release_fields["sample_rate"], plan.steps, plan.release_fields["normalizer"]) == (
        sched.sample_rate,
        sched.steps,
        sched.normalizer,
    )
    assert plan.config["reference_size"] == 1300 and plan.config["reference_size_from"] == "request"
    assert "--reference-size 1300" in DPSGDRequest("dp-rvfl", reference_size=1300).command()
    with pytest.raises(UsageError, match="reference_size must be an integer >= 1, got 0."):
        MECHANISM.validate(DPSGDRequest("dp-rvfl", reference_size=0))


def test_undeclared_data_needs_a_reference_size(digits):
    custom = dataclasses.replace(digits, name="custom", reference_size=None)
    with pytest.raises(UsageError, match="reference_size must be given"):
        MECHANISM.plan(DPSGDRequest("dp-rvfl", non_private=True), DataInfo.from_prepared(custom))


def _user_split(digits):
    from dpaudit.data.users import attach_user_ids

    return attach_user_ids(
        digits, np.arange(1797) // 3
    )  # 599 users of 3 records, 419 of them in training


def _drop_user(data, user):
    keep = np.flatnonzero(data.user_ids["train"] != user)
    return dataclasses.replace(
        _with_train(data, keep=keep),
        user_ids={**data.user_ids, "train": data.user_ids["train"][keep]},
    )


def _add_user(data, user, rows=2):
    ids = np.concatenate([data.user_ids["train"], np.full(rows, user)])
    return dataclasses.replace(
        _with_train(data, extra=rows), user_ids={**data.user_ids, "train": ids}
    )


def test_user_neighbours_plan_the_identical_schedule(digits):
    users = _user_split(digits)
    first = users.user_ids["train"][0]
    neighbours = [users, _drop_user(users, first), _add_user(users, 10**6)]
    infos = [DataInfo.from_prepared(d) for d in neighbours]
    assert [i.n_users for i in infos] == [419, 418, 420]
    # 419 users in batches of 419: one user more gives J = 2, one fewer m0 = 418 when the count decides
    request = DPSGDRequest(
        "dp-rvfl",
        privacy_unit="user",
        records_per_user=2,
        reference_size=419,
        batch_size=419,
        epochs=1,
        non_private=True,
    )
    plans = [MECHANISM.plan(request, i) for i in infos]
    assert (
        _all_equal(plans) and plans[0].steps == 1 and plans[0].release_fields["normalizer"] == 419
    )
    with pytest.raises(
        UsageError, match="reference_size must be given"
    ):  # no definition declares a number of users
        MECHANISM.validate(dataclasses.replace(request, reference_size=None))


def test_user_level_run_keeps_the_plan_schedule_when_the_count_differs(digits, tmp_path):
    from dpaudit.releasing import release
    from dpaudit.requests import DPSGDRequest

    users = _user_split(digits)
    rel = release(
        "logistic-raw",
        DPSGDRequest(
            model="logistic-raw",
            dataset=users.name,
            privacy_unit="user",
            records_per_user=2,
            reference_size=420,
            non_private=True,
            epochs=1,
        ),
        prepared=users,
        out_dir=tmp_path / "r",
        record=False,
        progress=False,
    )
    sched = dp_sgd_schedule(420, 64, 1)  # 419 actual training users: the declared 420 decides
    assert (rel.sample_rate, rel.steps, rel.steps_executed, rel.normalizer) == (
        sched.sample_rate,
        sched.steps,
        sched.steps,
        sched.normalizer,
    )
    assert (
        rel.config["reference_size"] == 420
        and "users" not in rel.config
        and "train" not in rel.dataset["n_users"]
    )


def test_head_audit_of_a_neighbour_replays_the_same_schedule(digits):
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget

    configs = []
    for data in (digits, _with_train(digits, extra=1)):
        t = HeadTarget(
            model="dp-rvfl",
            dataset="digits",
            epsilon=2.0,
            epochs=1,
            batch_size=3,
            seed=3,
            prepared=data,
        )
        t.prepare()
        configs.append(t._config)
    assert configs[0] == configs[1] and configs[0].steps == 419


def test_noisy_sum_normalises_by_the_declared_size(digits):
    from dpaudit.mechanisms.simple.noisy_sum import MECHANISM as NOISY_SUM
    from dpaudit.mechanisms.simple.noisy_sum import NoisySumRequest

    request = NoisySumRequest(epsilon=2.0)
    configs = [
        NOISY_SUM.plan(request, DataInfo.from_prepared(d)).config
        for d in (digits, _with_train(digits, extra=1))
    ]
    assert (
        configs[0] == configs[1]
        and configs[0]["reference_size"] == 1257
        and "n_train" not in configs[0]
    )
