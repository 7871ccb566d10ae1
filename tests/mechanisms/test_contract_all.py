"""Every catalogue mechanism runs the behavioural contract (tests/mechanisms/contract_base.py).

One case per mechanism, a few lines each: a tiny request, how to remove one unit, and a plan with
one training setting changed. A new catalogue entry fails
:func:`test_every_catalogue_mechanism_has_a_contract_case` until it has a case here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dpaudit.catalogue import names
from dpaudit.requests import (
    DPELMRequest,
    DPSGDRequest,
    GaussianRequest,
    MixMinRequest,
    NoisySumRequest,
)

from .contract_base import MechanismContract, without_first_user


def with_optimizer_flipped(plan):
    """The plan training with the other update rule (adam <-> sgd) on the same schedule."""
    dp = plan.config["dp_sgd"]
    flipped = {**dp, "optimizer": "sgd" if dp["optimizer"] == "adam" else "adam"}
    return dataclasses.replace(plan, config={**plan.config, "dp_sgd": flipped})


class DPSGDCase(MechanismContract):
    """A DP-SGD model on breast-cancer in 14 steps (with fewer, too many no-noise trials
    never sample the canary)."""

    dataset = "breast-cancer"

    def tiny_request(self, folder):
        return DPSGDRequest(
            model=self.name,
            dataset=self.dataset,
            epochs=2,
            batch_size=64,
            seed=3,
            reproducible_noise=True,
        )

    def training_variant(self, plan):
        return with_optimizer_flipped(plan)


class TestDpRvfl(DPSGDCase):
    name = "dp-rvfl"


class TestDpElmSgd(DPSGDCase):
    name = "dp-elm-sgd"


class TestFrozenDenseMatched(DPSGDCase):
    name = "frozen-dense-matched"


class TestLogisticRaw(DPSGDCase):
    name = "logistic-raw"


class TestLogisticProjected(DPSGDCase):
    name = "logistic-projected"


class TestDpRvflUserLevel(DPSGDCase):
    """User level: pairs of rows are users; the neighbour lacks one whole user."""

    name = "dp-rvfl"

    def tiny_request(self, folder):
        ids = folder / "users.npy"
        np.save(ids, np.arange(569) // 2)  # breast-cancer's 569 rows, two per user
        return dataclasses.replace(
            super().tiny_request(folder),
            privacy_unit="user",
            records_per_user=2,
            user_ids=str(ids),
            reference_size=200,
        )

    def without_one(self, data):
        return without_first_user(data)


class TestDpDense(DPSGDCase):
    name = "dp-dense"


class TestDpCnn(DPSGDCase):
    name = "dp-cnn"


class TestDpAttention(DPSGDCase):
    name = "dp-attention"
    dataset = "digits"  # an image model


class TestDpGru(DPSGDCase):
    name = "dp-gru"
    dataset = "digits"  # an image model, read row by row


class TestDpElm(MechanismContract):
    name = "dp-elm"

    def tiny_request(self, folder):
        return DPELMRequest(dataset="breast-cancer", width=5, epsilon=2.0, reproducible_noise=True)

    def training_variant(self, plan):
        # the run and the audit read the width from the plan's request (its config mirrors it)
        width = plan.config["width"] + 2
        return dataclasses.replace(
            plan,
            request=dataclasses.replace(plan.request, width=width),
            config={**plan.config, "width": width},
        )


class TestDpMixMin(MechanismContract):
    name = "dp-mixmin"

    def tiny_request(self, folder):
        return MixMinRequest(steps=30, rho=0.3, reproducible_noise=True)

    def without_one(self, data):
        """D_train less its first record (the mixture and fine-tuning indices renumbered)."""

        def shifted(idx):
            return None if idx is None else idx[idx != 0] - 1

        return dataclasses.replace(
            data, labels=data.labels[1:], mix_idx=shifted(data.mix_idx), ft_idx=shifted(data.ft_idx)
        )

    def training_variant(self, plan):
        mix = plan.parts[0]
        settings = {
            **mix.config["mixmin_config"],
            "step_size": 2 * mix.config["mixmin_config"]["step_size"],
        }
        part = dataclasses.replace(mix, config={**mix.config, "mixmin_config": settings})
        return dataclasses.replace(plan, parts=(part, *plan.parts[1:]))


class TestDpMixMinPipeline(TestDpMixMin):
    """Both releases (mixture weights, then the fine-tuned head) under one reservation."""

    def tiny_request(self, folder):
        return dataclasses.replace(super().tiny_request(folder), stage="pipeline")


class TestNoisySum(MechanismContract):
    name = "noisy-sum"

    def tiny_request(self, folder):
        return NoisySumRequest(dataset="breast-cancer", epsilon=1.0, reproducible_noise=True)

    def training_variant(self, plan):
        return dataclasses.replace(
            plan, config={**plan.config, "clipping_norm": plan.config["clipping_norm"] / 2}
        )


class TestGaussian(MechanismContract):
    name = "gaussian"
    releases = False

    def tiny_request(self, folder):
        return GaussianRequest(epsilon=1.0)


def _cases(cls) -> list:
    return [c for sub in cls.__subclasses__() for c in (sub, *_cases(sub))]


def test_every_catalogue_mechanism_has_a_contract_case():
    covered = {case.name for case in _cases(MechanismContract) if case.__name__.startswith("Test")}
    assert set(names()) <= covered, (
        f"mechanisms without a contract case: {sorted(set(names()) - covered)}"
    )
