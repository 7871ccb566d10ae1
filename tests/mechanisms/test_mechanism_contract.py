"""The mechanism contract: every catalogue entry's MECHANISM, the skeleton's multi-release path
(several releases under one reservation) and DP-MixMin on it."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest

from dpaudit.accounting import SubsampledGaussian, compute_epsilon
from dpaudit.accounting.events import Composed, Parallel
from dpaudit.ledger.book import open_ledger
from dpaudit.catalogue import CATALOGUE, names
from dpaudit.errors import AccountingMismatchError
from dpaudit.mechanisms import registry
from dpaudit.mechanisms.mixmin.tasks import SPLIT_RULE
from dpaudit.mechanisms.contract import (
    DataInfo,
    MechanismBase,
    PartitionDeclaration,
    ReleasePlan,
    RunOutput,
)
from dpaudit.records import read_release
from dpaudit.releasing import release
from dpaudit.requests import MixMinRequest, Request


@pytest.mark.parametrize("name", names(trainable=True))
def test_every_trainable_catalogue_entry_exposes_a_contract_mechanism(name):
    # The release skeleton, the audits and the sweeps call these on whatever the catalogue names:
    # a module whose MECHANISM is a string (or lacks a method) breaks them at run time only.
    m = registry.mechanism(name)
    assert isinstance(m, MechanismBase), (
        f"{name}: MECHANISM is {type(m).__name__}, not a contract mechanism"
    )
    for method in ("load", "plan", "run", "audit_target"):
        assert callable(getattr(m, method)), f"{name}: MECHANISM.{method} is not callable"
    assert inspect.isclass(m.request_type) and issubclass(m.request_type, Request)
    assert (
        issubclass(CATALOGUE[name].request_type(), m.request_type)
        or m.request_type is CATALOGUE[name].request_type()
    )


# ------------------------------------------------------------- the multi-release skeleton path

SIGMA = (1.5, 3.0)


@dataclass(frozen=True)
class ToyRequest(Request):
    COMMAND: ClassVar[str] = "toy-two"


class TwoReleases(MechanismBase):
    """A toy two-part mechanism: each part releases a noisy constant (one Gaussian step)."""

    name = "toy-two"
    request_type = ToyRequest
    cheat = False  # part 2's run reports one step more than planned

    def load(self, request):
        return SimpleNamespace(sha256=None)

    def data_info(self, request, data):
        return DataInfo(name="toy-data", kind="synthetic", n_train=10, n_features=1, n_classes=2)

    def plan(self, request, info):
        events = [SubsampledGaussian(s, 1.0, 1) for s in SIGMA]
        eps = [
            compute_epsilon(e, delta=1e-5, accountant="rdp", adjacency="add-remove-record").epsilon
            for e in events
        ]
        common = dict(
            mechanism=self.name,
            request=request,
            dataset={"name": info.name},
            adjacency="add-remove-record",
            accountant="rdp",
            delta=1e-5,
            data_name=info.name,
            time_run=False,
        )
        parts = tuple(
            ReleasePlan(
                partition=f"train/split/{i}",
                event=e,
                target_epsilon=x,
                out_subdir=f"part{i}",
                **common,
            )
            for i, (e, x) in enumerate(zip(events, eps))
        )
        return ReleasePlan(
            partition="train/split",
            event=Parallel(tuple(events)),
            target_epsilon=max(eps),
            parts=parts,
            declarations=(
                PartitionDeclaration(
                    info.name, "train/split", ("train/split/0", "train/split/1"), "toy"
                ),
            ),
            **common,
        )

    def run(self, plan, data, noise, *, progress=None):
        outs = tuple(
            RunOutput(
                steps_executed=1 + (self.cheat and i == 1),
                arrays={"x": np.zeros(1)},
                timings={"part_s": float(i)},
            )
            for i in range(2)
        )
        return RunOutput(steps_executed=1, parts=outs)


def test_multi_release_plan_settles_every_part_under_one_reservation(tmp_path):
    ledger = tmp_path / "l.sqlite"
    last = release(TwoReleases(), ToyRequest(), out_dir=tmp_path / "r", ledger_path=ledger)
    parts = [read_release(tmp_path / "r" / f"part{i}") for i in range(2)]
    assert last.id == parts[1].id and [p.partition for p in parts] == [
        "train/split/0",
        "train/split/1",
    ]
    for p, s in zip(parts, SIGMA):
        assert p.epsilon == pytest.approx(
            compute_epsilon(SubsampledGaussian(s, 1.0, 1), delta=1e-5).epsilon
        )
        assert "setup_seconds" not in p.timings  # time_run=False: the run's own timings only
    with open_ledger(ledger) as led:
        (res,) = led.entries(kind="reservation")
        (settle,) = led.entries(kind="settle")
        assert res.payload["partition"] == "train/split"
        assert sorted(settle.payload["releases"]) == sorted(p.id for p in parts)
        assert len(led.entries(kind="release")) == 2 and led.open_reservations() == []
        (decl,) = led.entries(kind="partition")
        assert decl.payload["children"] == ["train/split/0", "train/split/1"]


def test_multi_release_plan_publishes_nothing_when_one_part_fails_its_check(tmp_path):
    ledger = tmp_path / "l.sqlite"
    mech = TwoReleases()
    mech.cheat = True
    with pytest.raises(AccountingMismatchError):
        release(mech, ToyRequest(), out_dir=tmp_path / "r", ledger_path=ledger)
    assert not (
        tmp_path / "r" / "part0" / "release.json"
    ).exists()  # the verified first part is not published either
    with open_ledger(ledger) as led:
        assert led.entries(kind="release") == [] and led.entries(kind="partition") == []
        assert len(led.entries(kind="cancel")) == 1 and led.open_reservations() == []


# ------------------------------------------------------------- DP-MixMin on the contract

FAST = dict(steps=30, rho=0.3)


def _plan(request: MixMinRequest):
    from dpaudit.mechanisms.mixmin.mechanism import MECHANISM

    job = MECHANISM.validate(request)
    data = MECHANISM.load(job)
    return MECHANISM.plan(job, MECHANISM.data_info(job, data))


def test_mixmin_plan_reserves_the_combined_event_of_its_two_releases():
    par = _plan(MixMinRequest(stage="pipeline", epsilon=2.0, **FAST))
    mix, ft = par.parts
    assert par.event == Parallel((mix.event, ft.event)) and par.partition + "/mix" == mix.partition
    assert ft.partition == par.partition + "/ft" and mix.target_epsilon == ft.target_epsilon == 2.0
    assert par.declarations == (
        PartitionDeclaration(
            "digits-mix",
            par.partition,
            (mix.partition, ft.partition),
            f"dp-mixmin (split rule {SPLIT_RULE})",
        ),
    )
    seq = _plan(MixMinRequest(stage="pipeline", composition="sequential", epsilon=2.0, **FAST))
    mix_s, ft_s = seq.parts
    assert (
        seq.event == Composed((mix_s.event, ft_s.event))
        and seq.partition == "train"
        and seq.declarations == ()
    )
    assert mix_s.target_epsilon == pytest.approx(0.6) and ft_s.target_epsilon == pytest.approx(1.4)
    # Each part's event meets its own target (what the skeleton verifies after the run).
    for p in (mix, ft, mix_s, ft_s):
        assert (
            compute_epsilon(
                p.event, delta=p.delta, accountant=p.accountant, adjacency=p.adjacency
            ).epsilon
            <= p.target_epsilon + 1e-9
        )


def test_mixmin_releases_through_the_generic_skeleton_from_its_request(tmp_path):
    req = MixMinRequest(reproducible_noise=True, **FAST)
    ledger = tmp_path / "l.sqlite"
    rel = release("dp-mixmin", req, out_dir=tmp_path / "m", ledger_path=ledger)
    back = read_release(tmp_path / "m")
    assert (
        back.id == rel.id
        and back.request == req.to_dict()
        and back.command == req.command(out=tmp_path / "m")
    )
    assert rel.steps_executed == rel.steps == 30 and (tmp_path / "m" / "weights.json").exists()
    with open_ledger(ledger) as led:
        assert (
            len(led.entries(kind="release")) == 1
            and len(led.entries(kind="settle")) == 1
            and led.open_reservations() == []
        )


def test_mixmin_audit_target_is_built_from_the_plan():
    plan = _plan(MixMinRequest(**FAST))
    (mix,) = plan.parts
    from dpaudit.mechanisms.mixmin.mechanism import MECHANISM

    t = MECHANISM.audit_target(plan, "max-clip")
    assert (
        t.config.noise_multiplier == mix.release_fields["noise_multiplier"]
        and t.config.steps == mix.steps
    )
    assert t.config.sample_rate == pytest.approx(mix.release_fields["sample_rate"], abs=1e-12)
    assert t.claimed_epsilon == pytest.approx(compute_epsilon(mix.event, delta=plan.delta).epsilon)
    assert t.canary == "max-clip" and t.mechanism == "dp-mixmin"
