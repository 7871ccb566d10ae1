"""Refusals of bad inputs and records, and the guards of written and loaded data, that no other
test runs: each message is the one a user reads, so it is pinned here."""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import numpy as np
import pytest
import torch

from dpaudit import claims
from dpaudit.accounting import PureEpsilon
from dpaudit.errors import DataError, UsageError
from dpaudit.noise import NoiseSource, noise_tail_delta
from dpaudit.paths import write_atomically
from dpaudit.records import Release, public_noise_reason, read_json, write_json_atomic
from dpaudit.release_compat import release_request
from dpaudit.releasing import read_noise_seed, release_session, reserve
from dpaudit.requests import DPELMRequest, Request, option

#: A pure-epsilon release of dp-rvfl (the fields every release needs).
CLAIM = dict(
    mechanism="dp-rvfl",
    dataset={"name": "mnist"},
    adjacency="add-remove-record",
    accountant="pure",
    epsilon=1.0,
    delta=0.0,
    guarantee=PureEpsilon(1.0).to_dict(),
    seed=0,
    noise_source={},
)


def test_the_torch_generator_comes_from_the_source_and_is_kept():
    a, b = NoiseSource("reproducible", seed=7), NoiseSource("reproducible", seed=7)
    assert a.torch is a.torch
    assert torch.equal(torch.rand(4, generator=a.torch), torch.rand(4, generator=b.torch))


def test_noise_buffers_and_counts_are_refused_when_unusable():
    noise = NoiseSource("reproducible", seed=1)
    with pytest.raises(UsageError, match="out must be a C-contiguous array, got a strided view"):
        noise.gaussian_into(np.zeros((4, 4), dtype=np.float32)[:, ::2], 1.0)
    with pytest.raises(UsageError, match="out must be a float32 or float64 array, got int64"):
        noise.gaussian_into(np.zeros(4, dtype=np.int64), 1.0)
    with pytest.raises(ValueError, match=r"n_values must be >= 0, got -1\."):
        noise_tail_delta(-1, 1.0, 1e-5)


def test_a_json_file_that_is_no_object_and_a_noise_source_that_is_no_dict(tmp_path):
    (tmp_path / "r.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"release .*r\.json must hold a JSON object, got list\."):
        read_json(tmp_path / "r.json", "release")
    assert public_noise_reason(None) is None
    written = write_json_atomic(tmp_path / "n.json", {"rate": np.float32(0.5), "n": np.int64(3)})
    assert json.loads(written.read_text()) == {"rate": 0.5, "n": 3}
    (tmp_path / "taken").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomically(tmp_path / "taken", "text")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.json", "r.json", "taken"]


def test_a_malformed_or_failing_guarantee_gets_no_number(monkeypatch):
    monkeypatch.setattr(claims, "_RECOMPUTED", {})
    half = {"type": "subsampled-gaussian", "noise_multiplier": 2.0}
    got = claims.recompute_epsilon(half, 1e-5, "rdp", "add-remove-record")
    assert got.epsilon is None and got.error == "malformed guarantee (KeyError: 'sample_rate')"

    def fails(*args, **kwargs):
        raise RuntimeError("discretisation too coarse")

    no_number = Release(**{**CLAIM, "epsilon": None})
    assert claims.verify_claim(no_number).reason == "the release states no numeric epsilon"
    monkeypatch.setattr(claims.accounting, "compute_epsilon", fails)
    got = claims.recompute_epsilon(PureEpsilon(1.0).to_dict(), 1e-5, "prv", "add-remove-record")
    assert got.epsilon is None
    assert got.error == "prv accountant failed (RuntimeError: discretisation too coarse)"


def test_request_types_spell_nan_defaults_and_need_a_command_name():
    @dataclasses.dataclass(frozen=True)
    class Tuned(Request):
        COMMAND: ClassVar[str] = "tuned"
        scale: float = option(float("nan"), help="A NaN default.")

    assert Tuned().to_argv() == ["dpaudit", "train", "tuned"]  # NaN at its NaN default
    assert Tuned(scale=2.0).to_argv() == ["dpaudit", "train", "tuned", "--scale", "2.0"]
    with pytest.raises(TypeError, match="Request must set COMMAND or declare a positional field"):
        Request().command_name()
    with pytest.raises(DataError, match=r"request must be a JSON object, got list\."):
        DPELMRequest.from_dict([])
    with pytest.raises(ValueError, match="width must not be None in a request whose default is 10"):
        DPELMRequest(width=None).to_argv()


def test_a_recorded_request_of_another_mechanism_is_refused():
    rel = Release(**CLAIM, request={"model": "dp-dense"})
    with pytest.raises(DataError, match="mechanism 'dp-rvfl', got 'dp-dense'"):
        release_request(rel)


def test_a_seed_file_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "noise.seed"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(UsageError, match=r"noise seed file must be .*\(unreadable: not text\)\."):
        read_noise_seed(path)


def test_a_run_reserves_its_budget_once(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    args = dict(dataset="toy", partition="train", event=PureEpsilon(1.0))
    with release_session():
        first = reserve(ledger_path=ledger, adjacency="add-remove-record", **args)
        with pytest.raises(UsageError, match=f"got a second reservation after {first}"):
            reserve(ledger_path=ledger, adjacency="add-remove-record", **args)
