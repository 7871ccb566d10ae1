"""Old releases (recorded before requests existed) rebuild the same request: the requests below
were produced by the readers of dpaudit.release_compat before they shared one table of fields
(tests/golden_old_release_requests.json)."""

import json
from pathlib import Path

import pytest

from dpaudit.records import Release
from dpaudit.release_compat import release_request

GOLDEN = json.loads((Path(__file__).parent / "golden_old_release_requests.json").read_text())
BASE = dict(accountant="rdp", guarantee={}, noise_source={}, request=None)
HEART = {"task": "heart-mix", "target": "cleveland", "rho": 0.2, "stage": "pipeline"}
CASES = {
    "dp-rvfl-user": dict(
        mechanism="dp-rvfl",
        dataset={"name": "mnist", "profile": "centered", "split_seed": 7},
        adjacency="add-remove-user",
        epsilon=1.4,
        target_epsilon=1.5,
        delta=1e-5,
        seed=3,
        privacy_unit="user",
        config={"epochs": 5, "batch_size": 64, "records_per_user": 3},
    ),
    "dp-dense-non-private": dict(
        mechanism="dp-dense",
        dataset={},
        adjacency="add-remove-record",
        epsilon=float("inf"),
        delta=1e-5,
        seed=0,
        non_private=True,
    ),
    "dp-elm-replace": dict(
        mechanism="dp-elm",
        dataset={"name": "heart", "split_seed": 1},
        adjacency="replace-record",
        epsilon=2.0,
        delta=0.0,
        seed=9,
        config={"width": 5, "sampler": "textbook"},
    ),
    "dp-elm-defaults": dict(
        mechanism="dp-elm",
        dataset=None,
        adjacency="add-remove-record",
        epsilon=0.5,
        target_epsilon=0.75,
        delta=0.0,
        seed=1,
        config=None,
    ),
    "mixmin-user": dict(
        mechanism="dp-mixmin",
        dataset={},
        adjacency="add-remove-user",
        epsilon=0.9,
        target_epsilon=1.0,
        delta=1e-6,
        seed=5,
        privacy_unit="user",
        config={
            **HEART,
            "records_per_user": 4,
            "proxy_mode": "per-source",
            "composition": "sequential",
            "mixmin_config": {"loss": "nll"},
        },
    ),
    "mixmin-record": dict(
        mechanism="mixmin",
        dataset={},
        adjacency="add-remove-record",
        epsilon=0.9,
        delta=1e-5,
        seed=5,
        config={"records_per_user": 4, "loss": "mse"},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_old_release_rebuilds_the_recorded_golden_request(name):
    assert release_request(Release(**BASE, **CASES[name])).to_dict() == GOLDEN[name]


@pytest.mark.parametrize("mechanism", ["gaussian", "noisy-sum"])
def test_old_release_without_reader_is_refused_as_before(mechanism):
    fields = dict(dataset={}, adjacency="add-remove-record", epsilon=1.0, delta=1e-5, seed=0)
    with pytest.raises(Exception) as caught:
        release_request(Release(**BASE, mechanism=mechanism, **fields))
    assert f"{type(caught.value).__name__}: {caught.value}" == GOLDEN[mechanism]
