"""Audits rebuilt from a release check the release's *public* dataset identity
(new releases publish no hash of the data) and still check the sha256 of old releases."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dpaudit.auditing import target_from_release
from dpaudit.audits.targets import check_release_identity
from dpaudit.data import load_dataset
from dpaudit.errors import DataError
from dpaudit.releasing import release
from dpaudit.requests import DPELMRequest


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _elm_release(out, prepared):
    return release(
        "dp-elm",
        DPELMRequest(dataset=prepared.name, epsilon=2.0, width=3, seed=1),
        out_dir=out,
        record=False,
        prepared=prepared,
    )


def test_audit_of_a_new_release_accepts_its_data_and_refuses_other_public_identity(
    tmp_path, digits
):
    _elm_release(tmp_path / "ok", digits)
    assert "sha256" not in json.loads((tmp_path / "ok" / "release.json").read_text())["dataset"]
    t = target_from_release(tmp_path / "ok")  # the same public identity: accepted
    assert t.describe()["dataset"] == "digits"
    # a release made on digits minus one training record publishes the same identity (the training
    # count is private): nothing public tells the neighbours apart, so the audit accepts digits
    smaller = dataclasses.replace(digits, x_train=digits.x_train[1:], y_train=digits.y_train[1:])
    _elm_release(tmp_path / "smaller", smaller)
    assert (
        json.loads((tmp_path / "smaller" / "release.json").read_text())["dataset"]
        == json.loads((tmp_path / "ok" / "release.json").read_text())["dataset"]
    )
    assert target_from_release(tmp_path / "smaller").describe()["dataset"] == "digits"
    # another evaluation partition (published: outside the claim) is still refused
    d = json.loads((tmp_path / "smaller" / "release.json").read_text())
    d["dataset"]["split_sizes"]["test"] = 270
    (tmp_path / "smaller" / "release.json").write_text(json.dumps(d))
    with pytest.raises(
        DataError, match=r"dataset split_sizes must equal the release's \{'val': 269, 'test': 270\}"
    ):
        target_from_release(tmp_path / "smaller")
    # data of another schema than the release's (same name, sizes and seeds) is refused too
    d = json.loads((tmp_path / "ok" / "release.json").read_text())
    d["dataset"]["n_features"] = 16
    (tmp_path / "ok" / "release.json").write_text(json.dumps(d))
    with pytest.raises(DataError, match="dataset n_features must equal the release's 16, got 64"):
        target_from_release(tmp_path / "ok")


def test_old_release_with_sha256_is_still_checked_exactly(tmp_path, digits):
    _elm_release(tmp_path / "r", digits)
    path = tmp_path / "r" / "release.json"
    d = json.loads(path.read_text())
    d["dataset"]["sha256"] = digits.sha256  # what dpaudit published before this change
    d["dataset"]["source_files"] = {}
    path.write_text(json.dumps(d))
    assert target_from_release(tmp_path / "r").describe()["dataset"] == "digits"
    d["dataset"]["sha256"] = (
        "00" * 32
    )  # same public identity, other content: only the old digest can tell
    path.write_text(json.dumps(d))
    with pytest.raises(DataError, match="dataset sha256 must equal the release's 000000000000"):
        target_from_release(tmp_path / "r")


def test_check_release_identity_compares_only_recorded_public_fields(digits):
    ident = digits.identity()
    check_release_identity(digits, ident)
    check_release_identity(
        digits, {"name": "digits"}
    )  # fields an older release did not record are not required
    # an older release also published the training count: only the published partitions are compared
    check_release_identity(
        digits, {**ident, "split_sizes": {"train": 1256, **ident["split_sizes"]}}
    )
    check_release_identity(digits, None)
    for key, other in (
        ("n_features", 32),
        ("n_classes", 2),
        ("split_seed", 7),
        ("kind", "tabular"),
        ("name", "mnist"),
    ):
        with pytest.raises(DataError, match=f"dataset {key} must equal the release's"):
            check_release_identity(digits, {**ident, key: other})
