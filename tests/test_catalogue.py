"""The catalogue (one table of mechanism names) and the Request types (to_dict / from_dict / to_argv)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.catalogue import ALIASES, CATALOGUE, HEAD_CANARIES, lookup, names
from dpaudit.errors import DataError, UsageError
from dpaudit.requests import (
    ALWAYS_RECORDED,
    REQUEST_TYPES,
    DPELMRequest,
    DPSGDRequest,
    MixMinRequest,
    Request,
    flag_of,
    option,
)

REQUESTS = (DPSGDRequest, DPELMRequest, MixMinRequest)


def test_catalogue_and_requests_import_no_numerical_library():
    # The CLI and the catalogue read these at start-up: torch (seconds to import) must stay out.
    code = (
        "import sys, dpaudit.catalogue, dpaudit.requests; "
        "print([m for m in ('torch', 'numpy', 'scipy', 'sklearn') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_existing_mechanism_name_is_catalogued():
    assert set(CATALOGUE) >= {
        "dp-rvfl",
        "dp-elm-sgd",
        "frozen-dense-matched",
        "logistic-raw",
        "logistic-projected",
        "dp-dense",
        "dp-cnn",
        "dp-attention",
        "dp-elm",
        "dp-mixmin",
        "gaussian",
    }
    assert lookup("mixmin") is CATALOGUE["dp-mixmin"] and ALIASES["mixmin"] == "dp-mixmin"
    assert CATALOGUE["gaussian"].audit_only and "gaussian" not in names(trainable=True)
    assert all(not e.audit_only for n, e in CATALOGUE.items() if n != "gaussian")


def test_the_registry_and_the_catalogue_agree():
    """Every name's implementation is a mechanism object of the registry (and every object is named), and the head canary
    kinds the catalogue names are the choosers there, in the same order."""
    from dpaudit.mechanisms import registry
    from dpaudit.mechanisms.dpsgd import head_canaries

    assert {e.implementation for e in CATALOGUE.values()} == set(registry.IMPLEMENTATIONS)
    for name, e in CATALOGUE.items():
        assert registry.mechanism(name).name == e.implementation and issubclass(
            e.request_type(), registry.mechanism(name).request_type
        )
    assert registry.mechanism("mixmin") is registry.mechanism("dp-mixmin")
    assert tuple(head_canaries.CHOOSERS) == HEAD_CANARIES


def test_lookup_refuses_unknown_name_naming_the_allowed_ones():
    with pytest.raises(
        UsageError, match=r"mechanism must be one of dp-rvfl, .*mixmin.*, got 'dp-nope'\."
    ):
        lookup("dp-nope")


def test_request_types_of_the_builtin_families():
    for e in CATALOGUE.values():
        if e.family in REQUEST_TYPES:
            assert e.request_type() is REQUEST_TYPES[e.family]
    assert (
        CATALOGUE["dp-rvfl"].request_type() is DPSGDRequest
        and CATALOGUE["dp-dense"].request_type() is DPSGDRequest
    )
    assert (
        CATALOGUE["dp-elm"].request_type() is DPELMRequest
        and CATALOGUE["dp-mixmin"].request_type() is MixMinRequest
    )


def test_default_request_argv_is_the_command_with_its_privacy_target():
    assert DPSGDRequest("dp-cnn").to_argv() == [
        "dpaudit",
        "train",
        "dp-cnn",
        "--eps",
        "2.0",
        "--delta",
        "1e-05",
    ]
    assert DPELMRequest().to_argv() == [
        "dpaudit",
        "train",
        "dp-elm",
        "--width",
        "10",
        "--eps",
        "2.0",
    ]  # pure: no delta field
    assert MixMinRequest().to_argv() == [
        "dpaudit",
        "train",
        "mixmin",
        "--eps",
        "1.0",
        "--delta",
        "1e-05",
    ]
    assert (
        "--data-dir" not in DPSGDRequest("dp-cnn", data_dir="/home/me/data").to_argv()
    )  # this machine's, never recorded
    assert "--data-dir data" in DPSGDRequest("dp-cnn", data_dir="data").command()


def test_argv_spells_each_non_default_field_once():
    r = DPSGDRequest(
        "dp-rvfl",
        dataset="mnist",
        epsilon=3.0,
        non_private=True,
        privacy_unit="user",
        records_per_user=2,
        user_ids="/tmp/a b.npy",
        split_seed=7,
    )
    assert r.to_argv(out="runs/x") == [
        "dpaudit",
        "train",
        "dp-rvfl",
        "--dataset",
        "mnist",
        "--eps",
        "3.0",
        "--delta",
        "1e-05",
        "--non-private",
        "--split-seed",
        "7",
        "--privacy-unit",
        "user",
        "--records-per-user",
        "2",
        "--user-ids",
        "/tmp/a b.npy",
        "--out",
        "runs/x",
    ]
    assert r.command(out="runs/x").endswith("--user-ids '/tmp/a b.npy' --out runs/x")
    # floats are written exactly (repr round-trips every double)
    assert DPELMRequest(epsilon=0.1 + 0.2).to_argv() == [
        "dpaudit",
        "train",
        "dp-elm",
        "--width",
        "10",
        "--eps",
        repr(0.1 + 0.2),
    ]


def test_bool_with_true_default_is_written_as_no_flag():
    @dataclasses.dataclass(frozen=True)
    class R(Request):
        COMMAND = "thing"
        controls: bool = option(True)

    assert R().to_argv() == ["dpaudit", "train", "thing"]
    assert R(controls=False).to_argv() == ["dpaudit", "train", "thing", "--no-controls"]


def _strategy(tp, f):
    choices = f.metadata.get("choices")
    base = {
        str: st.sampled_from(choices)
        if choices
        else st.text(alphabet="abcXYZ019 _/.", min_size=1, max_size=8),
        int: st.integers(-(10**6), 10**6),
        float: st.floats(allow_nan=False, allow_infinity=False),
        bool: st.booleans(),
    }[tp]
    if f.default is None:
        return st.one_of(st.none(), base)
    return base


def _requests(cls):
    types = cls.field_types()
    return st.fixed_dictionaries(
        {f.name: _strategy(types[f.name], f) for f in cls.option_fields()}
    ).map(lambda kw: cls(**kw))


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(REQUESTS).flatmap(_requests))
def test_dict_round_trip_through_json(r):
    d = json.loads(json.dumps(r.to_dict()))  # what release.json stores and gives back
    assert type(r).from_dict(d) == r


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(REQUESTS).flatmap(_requests))
def test_argv_names_exactly_the_non_default_fields_and_the_privacy_target(r):
    argv = r.to_argv()
    assert argv[:3] == ["dpaudit", "train", r.command_name()]
    flags = {flag_of(f): f for f in r.option_fields() if not f.metadata.get("positional")}
    values = r.to_dict()
    seen = [a for a in argv[3:] if a in flags or (a.startswith("--no-") and "--" + a[5:] in flags)]
    local = (
        r.data_dir is not None and os.path.isabs(r.data_dir) if hasattr(r, "data_dir") else False
    )  # never recorded
    non_default = {
        flag_of(f)
        for f in flags.values()
        if (values[f.name] != f.default or f.name in ALWAYS_RECORDED and values[f.name] is not None)
        and not (f.name == "data_dir" and local)
    }
    assert {a if a in flags else "--" + a[5:] for a in seen} == non_default


def test_from_dict_refuses_unknown_keys_and_wrong_types():
    d = DPSGDRequest("dp-rvfl").to_dict()
    with pytest.raises(DataError, match="request keys must be among .* got clip_everything"):
        DPSGDRequest.from_dict({**d, "clip_everything": True})
    with pytest.raises(DataError, match="request epsilon must be a number, got 'two'"):
        DPSGDRequest.from_dict({**d, "epsilon": "two"})
    with pytest.raises(DataError, match="request is missing required keys: model"):
        DPSGDRequest.from_dict({k: v for k, v in d.items() if k != "model"})
    # JSON writes 2.0 as 2 in some writers; the float field reads it back as a float
    assert DPSGDRequest.from_dict({**d, "epsilon": 2}).epsilon == 2.0


def test_derived_tables_follow_the_catalogue():
    from dpaudit.audits import canaries
    from dpaudit.mechanisms.dpsgd import head_audit as heads
    from dpaudit.mechanisms.dpsgd import schedule as rvfl
    from dpaudit.sweeps import spec

    dpsgd = names(family=("dp-sgd-head", "dp-sgd-module"))
    assert rvfl.MODEL_NAMES == dpsgd and tuple(rvfl.MODELS) == dpsgd
    assert all(rvfl.MODELS[n].description == CATALOGUE[n].description for n in dpsgd)
    assert heads.HEAD_MODELS == names(family="dp-sgd-head")
    assert set(dpsgd) <= set(
        spec.train_models()
    )  # sweeps take every catalogue entry whose Request names a dataset
    for n in names(auditable=True):
        assert canaries.supported(canaries.audit_family(CATALOGUE[n])) == CATALOGUE[n].canaries
