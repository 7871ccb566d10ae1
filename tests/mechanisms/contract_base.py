"""The behavioural contract every mechanism's tests inherit, checked from outside the mechanism.

A case names one catalogue mechanism (``name``) and gives a tiny request (:meth:`tiny_request`);
it may override how one record (or user) is removed from the loaded data (:meth:`without_one`)
and must give a plan that changes one training setting (:meth:`training_variant`). The class
fixtures load, plan and release that request once; each ``test_`` method then checks one property
through the public seams only (``registry.mechanism``, the contract's hooks, ``releasing.release``,
``plan_of_release``, ``audit_target`` and the trial engine):

1. the plan is public: removing one record (or user) from the data leaves it unchanged;
2. the run executes ``plan.steps``: the steps it reports, and the Gaussian values it draws are the
   ones it declares for the sampler's tail check (a run that does one step more draws more);
3. ``plan_of_release`` rebuilds the plan of a release, and refuses a record that says otherwise;
4. the no-noise control refutes the claim, and the real audit stays at or below it;
5. the audit trains with the plan: a change of a training setting that changes the release
   changes the audit's trials too (under the same noise), and the same plan gives the same trials.

A property that does not hold for a mechanism is marked with :func:`expected_failures` (strict
xfail, the reason stated), never weakened. Each test takes its fixtures as arguments, so a planted
fault (tests/mechanisms/test_contract_faults.py) calls it with a broken mechanism and shows that
it fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import tempfile
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from dpaudit.accounting import compute_epsilon
from dpaudit.audits.engine import run_audit
from dpaudit.catalogue import lookup
from dpaudit.errors import DataError
from dpaudit.mechanisms import registry
from dpaudit.mechanisms.contract import MechanismBase, ReleasePlan
from dpaudit.noise import NoiseSource
from dpaudit.records import read_release
from dpaudit.release_compat import release_request
from dpaudit.releasing import release

#: Trials (canary in / out alternating) the audit-training check scores.
SCORED_TRIALS = 16


class CountingNoise(NoiseSource):
    """Reproducible noise that counts the Gaussian values it hands out (nested calls once)."""

    def __init__(self, seed: int) -> None:
        super().__init__("reproducible", seed)
        self.drawn = 0
        self._depth = 0

    def _counted(self, draw, size: int, *args):
        self._depth += 1
        try:
            return draw(*args)
        finally:
            self._depth -= 1
            self.drawn += size if self._depth == 0 else 0

    def gaussian_into(self, out, std):
        return self._counted(super().gaussian_into, out.size, out, std)

    def gaussian_numpy(self, shape, std):
        return self._counted(super().gaussian_numpy, int(np.prod(shape)), shape, std)

    def gaussian_torch(self, shape, std, dtype=None):
        return self._counted(super().gaussian_torch, int(np.prod(shape)), shape, std, dtype)


@contextlib.contextmanager
def cold_cache(folder: Path):
    """Plans made inside start from an empty calibration cache (a plan must not depend on it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DPAUDIT_CACHE_DIR", tempfile.mkdtemp(dir=folder))
        yield


class Wrapped:
    """A mechanism delegating every hook to ``inner``, except those a subclass overrides."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def without_first_record(data):
    """A prepared dataset without its first training record (the add/remove neighbour)."""
    users = data.user_ids and {**data.user_ids, "train": data.user_ids["train"][1:]}
    return dataclasses.replace(
        data, x_train=data.x_train[1:], y_train=data.y_train[1:], user_ids=users
    )


def without_first_user(data):
    """A user-split prepared dataset without every training record of its first user."""
    ids = np.asarray(data.user_ids["train"])
    keep = ids != ids[0]
    return dataclasses.replace(
        data,
        x_train=data.x_train[keep],
        y_train=data.y_train[keep],
        user_ids={**data.user_ids, "train": ids[keep]},
    )


def public_view(plan: ReleasePlan) -> dict:
    """The plan's fields, events and requests as dicts, parts recursively (to compare two plans)."""

    def plain(value):
        if isinstance(value, ReleasePlan):
            return public_view(value)
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value.to_dict() if hasattr(value, "to_dict") else value

    return {f.name: plain(getattr(plan, f.name)) for f in dataclasses.fields(plan)}


def plan_differences(got: ReleasePlan, want: ReleasePlan) -> dict:
    """path -> (got, wanted) of every value where two plans differ (``parts.0.config.seed``)."""
    return _differences(public_view(got), public_view(want), "")


def _differences(got, want, path: str) -> dict:
    if isinstance(got, dict) and isinstance(want, dict):
        keys = list(got) + [k for k in want if k not in got]
        return {
            k: v
            for key in keys
            for k, v in _differences(
                got.get(key), want.get(key), f"{path}.{key}".lstrip(".")
            ).items()
        }
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return {
            k: v
            for i, (a, b) in enumerate(zip(got, want))
            for k, v in _differences(a, b, f"{path}.{i}").items()
        }
    return {} if got == want else {path: (got, want)}


def released_values(mechanism, plan: ReleasePlan, data, folder: Path) -> list:
    """What a run of ``plan`` publishes under fixed noise: each part's metrics (e.g. mixture
    weights) and arrays, or the files its ``save`` writes."""
    output = mechanism.run(plan, data, NoiseSource("reproducible", 7), progress=None)
    values = []
    for i, part in enumerate(output.parts or (output,)):
        values.append(json.dumps(part.metrics, sort_keys=True, default=str))
        if part.arrays is not None:
            values += [np.asarray(part.arrays[k]).tobytes() for k in sorted(part.arrays)]
        elif part.save is not None:
            where = folder / f"saved{i}"
            where.mkdir(parents=True, exist_ok=True)
            part.save(where)
            values += [p.read_bytes() for p in sorted(where.iterdir())]
    return values


def trial_scores(target) -> np.ndarray:
    """The target's scores of alternating canary-in / canary-out trials under fixed noise."""
    inserted = np.arange(SCORED_TRIALS) % 2 == 0
    return np.asarray(target.scores(inserted, NoiseSource("reproducible", 11)), dtype=float)


def expected_failures(**reasons: str):
    """Class decorator: the named inherited tests are strict xfails with ``reason`` (a finding:
    the property does not hold for this mechanism; an unexpected pass fails the run)."""

    def decorate(cls):
        for test_name, reason in reasons.items():
            inherited = getattr(cls, test_name)

            @functools.wraps(inherited)
            def wrapper(self, *args, _inherited=inherited, **kwargs):
                return _inherited(self, *args, **kwargs)

            setattr(cls, test_name, pytest.mark.xfail(strict=True, reason=reason)(wrapper))
        return cls

    return decorate


class MechanismContract:
    """Base of every mechanism's contract case (module docstring); not collected by itself."""

    #: the catalogue name of the mechanism under test
    name: ClassVar[str]
    #: the canary the audits use (None: the catalogue's default for the mechanism)
    canary: ClassVar[str | None] = None
    #: False for an audit-only mechanism: it has no private data, run or release to check
    releases: ClassVar[bool] = True
    audit_runs: ClassVar[int] = 100

    # ------------------------------ hooks of a case
    def tiny_request(self, folder: Path):
        """The mechanism's request, small enough for a few seconds (``folder``: for its files)."""
        raise NotImplementedError

    def without_one(self, data):
        """``data`` less one record (or user: the privacy unit of the request)."""
        return without_first_record(data)

    def training_variant(self, plan: ReleasePlan) -> ReleasePlan:
        """``plan`` with one setting the run trains with changed (the release must change)."""
        raise NotImplementedError

    def audit_canary(self) -> str:
        canaries = lookup(self.name).canaries
        assert self.canary or canaries, (
            f"{self.name} has no standard audit: the catalogue lists no canary for it"
        )
        return self.canary or canaries[0]

    def make_plan(self, mechanism, job, data) -> ReleasePlan:
        return mechanism.plan(job, mechanism.data_info(job, data))

    def make_release(self, mechanism, job, folder: Path):
        return release(
            mechanism,
            job,
            out_dir=folder / "release",
            ledger_path=folder / "ledger.sqlite",
            progress=False,
        )

    def _needs_release(self) -> None:
        if not self.releases:
            pytest.skip(f"{self.name} is audit-only: it has no private data, run or release")

    # ------------------------------ fixtures (one load, plan, release per case)
    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _quiet_home(cls, tmp_path_factory):
        """Class-scoped work runs before the per-test isolation: its ledger and cache stay here."""
        home = tmp_path_factory.mktemp("contract-home")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DPAUDIT_LEDGER", str(home / "ledger.sqlite"))
            patch.setenv(
                "DPAUDIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "contract-cache")
            )
            yield

    @pytest.fixture(scope="class")
    @classmethod
    def folder(cls, tmp_path_factory) -> Path:
        return tmp_path_factory.mktemp(cls.name)

    @pytest.fixture(scope="class")
    @classmethod
    def mechanism(cls) -> MechanismBase:
        return registry.mechanism(cls.name)

    @pytest.fixture(scope="class")
    @classmethod
    def job(cls, mechanism, folder):
        return mechanism.validate(cls().tiny_request(folder))

    @pytest.fixture(scope="class")
    @classmethod
    def data(cls, mechanism, job):
        return mechanism.load(job)

    @pytest.fixture(scope="class")
    @classmethod
    def plan(cls, mechanism, job, data, folder) -> ReleasePlan:
        with cold_cache(folder):
            return cls().make_plan(mechanism, job, data)

    @pytest.fixture(scope="class")
    @classmethod
    def released(cls, mechanism, job, folder):
        case = cls()
        case._needs_release()
        return case.make_release(mechanism, job, folder)

    # ------------------------------ the properties
    def test_plan_is_the_same_without_one_record(self, mechanism, job, data, folder):
        self._needs_release()
        info, smaller = mechanism.data_info(job, data), self.without_one(data)
        fewer = mechanism.data_info(job, smaller)
        assert (fewer.n_users, fewer.n_train) < (info.n_users, info.n_train), (
            "the neighbour must hold one unit fewer"
        )
        with cold_cache(folder):
            first = self.make_plan(mechanism, job, data)
            for name, other in (("removing one record", smaller), ("planning again", data)):
                changed = plan_differences(self.make_plan(mechanism, job, other), first)
                assert not changed, (
                    f"plan is not a function of the request and public facts: {name} "
                    f"changes {changed}"
                )

    def test_run_executes_the_plan_steps(self, mechanism, plan, data):
        self._needs_release()
        noise = CountingNoise(5)
        output = mechanism.run(plan, data, noise, progress=None)
        parts, outputs = plan.parts or (plan,), output.parts or (output,)
        assert [o.steps_executed for o in outputs] == [p.steps for p in parts], (
            "run steps differ from plan.steps"
        )
        declared = [
            o.noise_values if o.noise_values is not None else p.noise_values
            for p, o in zip(parts, outputs)
        ]
        if None not in declared:  # Gaussian mechanisms: every step's values are declared
            assert noise.drawn == sum(declared), (
                f"run drew {noise.drawn} Gaussian values, declared {sum(declared)} for plan.steps"
            )

    def test_plan_of_release_reproduces_the_plan(self, mechanism, plan, released, folder):
        records = [read_release(folder / "release" / p.out_subdir) for p in plan.parts or (plan,)]
        assert records[-1].id == released.id
        for record, part in zip(records, plan.parts or (plan,)):
            assert record.steps_executed == record.steps == part.steps
        record = records[0]  # a multi-release plan is rebuilt from its first release
        with cold_cache(folder):  # as the plan fixture's (the cache's effect is property 1's)
            rebuilt = mechanism.plan_of_release(release_request(record), record)
        changed = plan_differences(rebuilt, plan)
        assert not changed, f"plan_of_release does not reproduce the plan: {changed}"
        other = dataclasses.replace(record, steps=record.steps + 1)
        with pytest.raises(DataError):
            mechanism.plan_of_release(release_request(other), other)
            pytest.fail(
                "plan_of_release accepted a release whose recorded steps are not its plan's"
            )

    def test_audit_within_claim_and_no_noise_control_refutes_it(self, mechanism, plan):
        claim_plan = (plan.parts or (plan,))[0]
        target = mechanism.audit_target(plan, self.audit_canary())
        claimed = compute_epsilon(
            claim_plan.event, delta=plan.delta, accountant=plan.accountant, adjacency=plan.adjacency
        ).epsilon
        assert target.claimed_epsilon <= claimed + 1e-9, (
            "the audit tests a weaker claim than the plan's"
        )
        result = run_audit(
            target,
            runs=self.audit_runs,
            controls=("no-noise",),
            record=False,
            reproducible_noise=True,
            seed=0,
        )
        control = result.controls["no-noise"]
        assert (control.claimed_curve or {}).get("violated"), (
            f"the no-noise control finds no leakage (eps_LB {control.epsilon_lower_bound})"
        )
        assert not result.violated and result.epsilon_lower_bound <= result.claimed_epsilon, (
            f"the real audit exceeds the claim: eps_LB {result.epsilon_lower_bound} "
            f"> {result.claimed_epsilon}"
        )

    def test_audit_trains_with_the_plan(self, mechanism, plan, data, folder):
        self._needs_release()
        variant = self.training_variant(plan)
        assert released_values(mechanism, variant, data, folder / "a") != released_values(
            mechanism, plan, data, folder / "b"
        ), "the variant must change a setting the run trains with"
        canary = self.audit_canary()
        first, again, changed = (
            trial_scores(mechanism.audit_target(p, canary)) for p in (plan, plan, variant)
        )
        np.testing.assert_array_equal(
            first, again, err_msg="the audit's trials are not a function of the plan and the noise"
        )
        assert not np.array_equal(first, changed), (
            "the audit ignores a training setting of the plan that the run trains with"
        )
