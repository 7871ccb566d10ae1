"""Requests keep their flat outside while grouping options inside: the same ``to_dict`` (release.json,
ledger, audit.json), ``to_argv`` and ``command`` strings, and the same options in every ``train`` and
``audit`` command's ``--help`` as the code before the grouping (golden values in golden_requests.json;
``python tests/test_requests.py > tests/golden_requests.json`` rewrites them from the code on
PYTHONPATH)."""

import dataclasses
import hashlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpaudit.errors import DataError
from dpaudit.requests import (
    REQUEST_TYPES,
    AuditRequest,
    DPELMRequest,
    DPSGDRequest,
    GaussianRequest,
    MixMinRequest,
    NoisySumRequest,
)

GOLDEN = Path(__file__).with_name("golden_requests.json")


def _requests() -> dict:
    """Representative requests: defaults, and every option a group holds away from its default."""
    return {
        "dpsgd-default": DPSGDRequest(model="dp-rvfl"),
        "dpsgd-sgd-cuda-user": DPSGDRequest(
            model="dp-dense",
            dataset="heart",
            data_dir="/abs/data",
            epsilon=1.5,
            optimizer="sgd",
            momentum=0.9,
            device="cuda",
            privacy_unit="user",
            records_per_user=3,
            user_ids="ids.npy",
            reference_size=120,
            epochs=3,
            batch_size=32,
            profile="authors",
        ),
        "mixmin-default": MixMinRequest(),
        "mixmin-tuned": MixMinRequest(
            task="heart-mix",
            target="cleveland",
            rho=0.2,
            stage="pipeline",
            loss="nll",
            steps=50,
            batch_size=100,
            clipping_norm=2.0,
            step_size=0.25,
            proxy_mode="per-source",
            composition="sequential",
            reproducible_noise=True,
            data_dir="rel/data",
        ),
        "elm": DPELMRequest(width=3, sampler="textbook", non_private=True),
        "gaussian": GaussianRequest(broken_noise_factor=2.0),
        "noisy-sum": NoisySumRequest(accountant="rdp", clipping_norm=0.5),
        "audit-default": AuditRequest(mechanism="dp-rvfl"),
        "audit-everything": AuditRequest(
            mechanism="dp-dense",
            canary="natural",
            runs=200,
            epsilon=1.0,
            task="mnist-mix",
            target="digit-3",
            dataset="mnist",
            data_dir="d",
            profile="centered",
            no_noise=True,
            confidence=0.9,
            release="r/release.json",
            out="o",
            seed=7,
            reproducible_noise=True,
            controls=False,
            control_runs=50,
            workers=3,
            executor="dask",
            scheduler="tcp://h:1",
            chunk_size=10,
            width=5,
            epochs=2,
            rho=0.3,
            privacy_unit="user",
            records_per_user=2,
            user_ids="u.npy",
            reference_size=99,
            broken_noise_factor=3.0,
            one_run=True,
            canaries=100,
            one_run_kind="input-mislabeled",
            threat_model="white-box",
            ledger="l",
            json_out=True,
            fail_on_violation=True,
            device="auto",
            sequential=True,
        ),
    }


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _options(command) -> dict:
    """Each option of a click command: its spellings, default, hidden flag and help (digested)."""
    return {
        " ".join([*p.opts, *p.secondary_opts]): [
            str(getattr(p.default, "value", p.default)),
            bool(getattr(p, "hidden", False)),
            _digest(getattr(p, "help", None) or ""),
        ]
        for p in command.params
    }


def _commands() -> dict:
    """Every ``train NAME`` command and every ``audit`` command (the generic routes included)."""
    from dpaudit.cli import app
    from dpaudit.cli.common import ROUTES

    root = app.lazy_command()
    train = root.commands["train"]
    found = {f"train {n}": train.commands[n] for n in train.commands}
    found["audit"] = root.commands["audit"]
    found.update({" ".join(key): make() for key, make in ROUTES.items()})
    return {name: _options(command) for name, command in found.items()}


def snapshot() -> dict:
    """What the outside of the requests looks like: flat dicts, argv, commands and CLI options."""
    return {
        "requests": {
            name: {"dict": r.to_dict(), "argv": r.to_argv(out="runs/x"), "command": r.command()}
            for name, r in _requests().items()
        },
        "options": _commands(),
    }


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(_requests()))
def test_flat_dict_argv_and_command_are_unchanged(golden, name):
    request = _requests()[name]
    want = golden["requests"][name]
    assert json.loads(json.dumps(request.to_dict())) == want["dict"]
    assert list(request.to_dict()) == list(want["dict"])  # the key order too
    assert request.to_argv(out="runs/x") == want["argv"]
    assert request.command() == want["command"]
    assert type(request).from_dict(want["dict"]) == request


def test_every_train_and_audit_command_keeps_its_options(golden):
    # in a fresh interpreter: building every command loads every family (and reorders them)
    run = subprocess.run([sys.executable, __file__, "options"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == golden["options"]


@pytest.mark.parametrize(
    "rtype", sorted({AuditRequest, *REQUEST_TYPES.values()}, key=lambda t: t.__name__)
)
def test_request_records_hold_at_most_20_fields(rtype):
    assert len(inspect.get_annotations(rtype)) <= 20  # its own, class variables included


def test_a_grouped_option_is_given_replaced_and_recorded_by_its_own_name():
    r = DPSGDRequest(model="dp-dense", optimizer="sgd", momentum=0.5)
    assert (r.training.optimizer, r.training.momentum, r.training.device) == ("sgd", 0.5, "cpu")
    moved = dataclasses.replace(r, device="cuda")  # the other grouped options are kept
    assert moved.training == dataclasses.replace(r.training, device="cuda")
    assert DPSGDRequest.from_dict(moved.to_dict()) == moved
    assert "training" not in moved.to_dict() and moved.to_dict()["device"] == "cuda"
    # the group is no key of a recorded request
    with pytest.raises(DataError, match="got training"):
        DPSGDRequest.from_dict({**r.to_dict(), "training": {"device": "cuda"}})


def test_a_recorded_request_without_the_newer_grouped_options_takes_their_defaults():
    recorded = {"model": "dp-rvfl", "dataset": "digits", "epsilon": 2, "delta": 1e-5}
    r = DPSGDRequest.from_dict(recorded)
    assert r.training == DPSGDRequest(model="dp-rvfl").training and r.epsilon == 2.0
    with pytest.raises(DataError, match="request momentum must be a number, got 'x'"):
        DPSGDRequest.from_dict({**recorded, "momentum": "x"})


if __name__ == "__main__":
    json.dump(_commands() if sys.argv[1:] == ["options"] else snapshot(), sys.stdout, indent=1)
