"""The grouped :class:`~dpaudit.records.Release` publishes exactly what the flat one did.

``release_golden.json`` was written by the flat record's code (before the fields were grouped)
from the same fixed public inputs: the published and the local forms must stay key for key, in
order, value for value the same.
"""

import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from dpaudit.mechanisms.contract import DataInfo, ReleasePlan, RunOutput
from dpaudit.mechanisms.dpsgd.mechanism import MECHANISM
from dpaudit.records import Release, read_release
from dpaudit.releasing import build_release, make_noise_source
from dpaudit.requests import DPSGDRequest

GOLDEN = Path(__file__).parent / "data" / "release_golden.json"
STAMP = dict(id="0" * 32, created_at="2026-12-03T00:00:00+00:00", git_commit="abc")


def fixed_release() -> Release:
    """A DP-SGD release built by the release skeleton from fixed public inputs."""
    request = DPSGDRequest(model="dp-rvfl", dataset="digits", epsilon=2.0, epochs=2, seed=3)
    info = DataInfo(
        name="digits",
        kind="tabular",
        n_train=1000,
        n_features=64,
        n_classes=10,
        split_seed=0,
        identity={"name": "digits", "split_seed": 0},
        reference_size=1000,
    )
    plan = MECHANISM.plan(request, info)
    output = RunOutput(
        steps_executed=plan.steps,
        metrics={"accuracy": 0.5},
        timings={"train_seconds": 1.234, "torch_threads": 1},
        config={"trainable_parameters": 10},
    )
    noise = make_noise_source(seed=3, reproducible_noise=False, noise_source="os-entropy")
    release = build_release(
        MECHANISM, plan, output, noise=noise, out_dir=Path("/out"), timings={"setup_seconds": 0.5}
    )
    return dataclasses.replace(release, dpaudit_version="0.0", data_digest="d" * 64, **STAMP)


def both_forms(release: Release) -> str:
    return json.dumps([release.to_dict(), release.to_dict(local=True)], indent=2)


def test_release_dict_is_the_flat_records_key_for_key():
    assert both_forms(fixed_release()) == GOLDEN.read_text()


def test_release_round_trips_through_its_file(tmp_path):
    published = fixed_release().to_dict()
    (tmp_path / "release.json").write_text(json.dumps(published))
    again = read_release(tmp_path)
    assert again.to_dict() == published
    assert again.steps == published["steps"] and again.calibration.steps == published["steps"]
    assert again.data_digest is None  # local facts never come back from a published file


def test_grouped_fields_are_given_read_and_replaced_by_their_own_names():
    base = dict(mechanism="m", dataset={}, adjacency="a", accountant="rdp", epsilon=1.0)
    base.update(delta=1e-5, guarantee={}, seed=0, noise_source={})
    rel = Release(**base, steps=3, data_digest="x")
    assert rel.calibration.steps == rel.steps == 3 and rel.local.data_digest == "x"
    changed = dataclasses.replace(rel, steps=4, noise_seed_file="f")
    assert (changed.steps, changed.data_digest, changed.noise_seed_file) == (4, "x", "f")
    assert changed.id == rel.id and pickle.loads(pickle.dumps(changed)) == changed
    with pytest.raises(TypeError, match="no field bogus"):
        Release(**base, bogus=1)
    with pytest.raises(AttributeError):
        rel.bogus
    plan = ReleasePlan(
        mechanism="m",
        request=None,
        dataset={},
        partition="train",
        adjacency="a",
        accountant="rdp",
        event=None,
        target_epsilon=None,
        delta=1e-5,
        noise_values=5,
        out_subdir="part",
    )
    assert (plan.noise.noise_values, plan.publishing.out_subdir) == (5, "part")
    assert (plan.noise_what, plan.time_run, plan.declarations) == ("release", True, ())
