"""Head audit targets score exactly as before they took the plan as it is.

``head_scores_golden.json`` holds the SHA-256 of the scores (and the claim) the targets gave
before the change, with their recorded set-up, under reproducible noise: built directly, from a fresh plan
(``audit_target``), from an old release (its recorded schedule and claim), at user level, and
the no-noise control.
"""

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from dpaudit.mechanisms.dpsgd.core import DPSGDConfig
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
from dpaudit.mechanisms.dpsgd.mechanism import MECHANISM
from dpaudit.records import read_release
from dpaudit.release_compat import release_request
from dpaudit.releasing import make_noise_source
from dpaudit.requests import DPSGDRequest

GOLDEN = Path(__file__).parent / "head_scores_golden.json"
OLD = Path(__file__).parent / "old_releases"


def targets() -> dict:
    """Small, prepared head targets of every construction path."""
    fresh = DPSGDRequest(model="dp-rvfl", dataset="digits", epsilon=4.0, epochs=1, seed=5)
    user = DPSGDRequest(
        model="logistic-raw",
        dataset="digits",
        epsilon=4.0,
        epochs=1,
        privacy_unit="user",
        records_per_user=4,
        reference_size=300,
    )
    old = read_release(OLD / "rvfl.json")
    old_plan = MECHANISM.plan_of_release(release_request(old), old)
    return {
        "direct": HeadTarget(model="dp-rvfl", epsilon=8.0, epochs=1, max_train=200),
        "plan": MECHANISM.audit_target(MECHANISM.plan_of_audit(fresh), "mislabeled"),
        "release": MECHANISM.audit_target(old_plan, "max-clip", release=old),
        "user": MECHANISM.audit_target(MECHANISM.plan_of_audit(user), "max-clip"),
        "no-noise": MECHANISM.audit_target(
            MECHANISM.plan_of_audit(fresh), "max-clip", no_noise=True
        ),
    }


def fingerprints() -> dict:
    out = {}
    for name, target in targets().items():
        noise = make_noise_source(seed=11, reproducible_noise=True)
        scores = target.scores(np.arange(6) % 2 == 0, noise)
        claim = [target.claimed_epsilon, target.claimed_event.to_dict(), target.accountant]
        claim.append(target.describe())
        blob = (
            np.ascontiguousarray(scores, dtype=np.float64).tobytes()
            + json.dumps(claim, default=str).encode()
        )
        out[name] = hashlib.sha256(blob).hexdigest()
    return out


def test_head_target_scores_and_claims_are_bit_identical():
    assert fingerprints() == json.loads(GOLDEN.read_text())


def test_head_target_takes_the_plan_as_it_is():
    request = DPSGDRequest(
        model="dp-rvfl", dataset="digits", epsilon=4.0, epochs=1, optimizer="sgd", momentum=0.5
    )
    plan = MECHANISM.plan_of_audit(request)
    target = MECHANISM.audit_target(plan, "max-clip")
    assert target.plan is plan and target.release is None
    assert target._config == DPSGDConfig.from_dict(plan.config["dp_sgd"])
    assert target.claimed_event == plan.event


def test_user_level_target_reads_the_old_release_checks_from_the_release(tmp_path):
    # Built from a plan and a release alone (no checksum passed in), the target still refuses
    # user ids other than the ones an old release's recorded checksum and user count name.
    from dpaudit.errors import DataError
    from dpaudit.mechanisms.dpsgd.user_head_audit import UserHeadTarget

    old = read_release(OLD / "rvfl-user.json")
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(1797) // 4)  # the file the release was made with
    request = dataclasses.replace(release_request(old), user_ids=str(ids))
    plan = MECHANISM.plan_of_release(request, old)
    fields = dict(release=old, records_per_user=2, user_ids=ids)
    target = UserHeadTarget.of_plan(plan, "max-clip", **fields)
    assert target.expected_n_users == 315 and target.reference_size == 315
    target.prepare()
    forged = old.replace(dataset={**old.dataset, "user_ids_sha256": "0" * 64})
    with pytest.raises(DataError, match="user ids sha256 must equal the release's 000000000000"):
        UserHeadTarget.of_plan(plan, "max-clip", **{**fields, "release": forged}).prepare()
