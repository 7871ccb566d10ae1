"""The generic `dpaudit train NAME` / `dpaudit audit NAME` commands built from a Request's fields.

A test-only catalogue entry (``fake-sum``: a Gaussian sum with a request that has every kind of
field) exercises the factory; ``noisy-sum`` (a real catalogue entry without bespoke commands)
exercises it end to end through the installed command line.
"""

from __future__ import annotations

import dataclasses
import json
from typing import ClassVar

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dpaudit.catalogue import ALIASES, CATALOGUE, CatalogueEntry
from dpaudit.cli import app
from dpaudit.cli.common import ROUTES, new_app
from dpaudit.mechanisms import registry
from dpaudit.mechanisms.contract import MechanismBase
from dpaudit.requests import REQUEST_TYPES, Request, option

runner = CliRunner()


@dataclasses.dataclass(frozen=True)
class FakeSumRequest(Request):
    COMMAND: ClassVar[str] = "fake-sum"

    epsilon: float = option(1.0, flag="--eps", help="Target epsilon.")
    delta: float = option(1e-5, help="Target delta.")
    dimension: int = option(4, help="Dimension d.")
    label: str | None = option(None, help="A free string.")
    scale: float | None = option(None, help="An optional float.")
    flavour: str = option("plain", choices=("plain", "salted"), help="A choice.")
    seed: int = option(42, help="Public seed.")
    clip: bool = option(True, help="A switch that defaults to on.")
    verbose: bool = option(False, help="A switch that defaults to off.")


class FakeSum(MechanismBase):
    """A contract mechanism on no data: the plain Gaussian mechanism calibrated exactly."""

    name = "fake-sum"
    request_type = FakeSumRequest

    def load(self, request):
        return None

    def data_info(self, request, data):
        from dpaudit.mechanisms.contract import DataInfo

        return DataInfo(
            name="synthetic", kind="tabular", n_train=50, n_features=request.dimension, n_classes=2
        )

    def plan(self, request, info):
        from dpaudit.accounting import SubsampledGaussian
        from dpaudit.audits.gaussian import calibrate_exact
        from dpaudit.mechanisms.contract import ReleasePlan

        sigma = calibrate_exact(request.epsilon, request.delta)
        return ReleasePlan(
            mechanism="fake-sum",
            request=request,
            dataset={"name": "synthetic"},
            partition="train",
            adjacency="add-remove-record",
            accountant="pld",
            event=SubsampledGaussian(sigma, 1.0, 1),
            target_epsilon=request.epsilon,
            delta=request.delta,
            seed=request.seed,
            config={"dimension": info.n_features},
        )

    def audit_target(self, plan, canary, *, release=None, user_ids=None, no_noise=False):
        from dpaudit.audits.gaussian import GaussianTarget
        from dpaudit.audits.targets import prepared

        return prepared(
            GaussianTarget(
                noise_multiplier=plan.event.noise_multiplier,
                delta=plan.delta,
                canary=canary,
                dimension=plan.config["dimension"],
                n_records=50,
                seed=plan.seed,
                mechanism="fake-sum",
            ),
            no_noise,
        )


ENTRY = CatalogueEntry(
    "fake-sum",
    "fake-sum",
    "other",
    ("max-clip", "natural"),
    1.0,
    description="test-only Gaussian sum",
)


def _register(monkeypatch) -> None:
    """The test-only mechanism where a new one goes: its request type, its catalogue line, its registry entry."""
    monkeypatch.setitem(REQUEST_TYPES, "fake-sum", FakeSumRequest)
    monkeypatch.setitem(CATALOGUE, "fake-sum", ENTRY)
    monkeypatch.setitem(ALIASES, "fake-sum", "fake-sum")
    monkeypatch.setitem(registry.IMPLEMENTATIONS, "fake-sum", FakeSum())


@pytest.fixture
def fake_catalogue(monkeypatch):
    from dpaudit.cli.generic import audit_click_command

    _register(monkeypatch)
    monkeypatch.setitem(ROUTES, ("audit", "fake-sum"), lambda: audit_click_command("fake-sum"))


def _train_app(captured: list):
    from dpaudit.cli.generic import make_train_command

    sub = new_app("test")
    sub.command("fake-sum")(make_train_command(ENTRY))
    sub.command("unused", hidden=True)(lambda: None)  # two commands: typer keeps the NAME argument
    return sub


class _Stop(Exception):
    pass


def _capture_release(monkeypatch, captured):
    import dpaudit.releasing

    def fake_release(name, request, **kw):
        captured.append((name, request, kw))
        raise _Stop

    monkeypatch.setattr(dpaudit.releasing, "release", fake_release)
    _register(monkeypatch)


def _fake_requests():
    return st.builds(
        FakeSumRequest,
        epsilon=st.floats(0.01, 50),
        delta=st.floats(1e-9, 0.5),
        dimension=st.integers(1, 10**6),
        label=st.none() | st.text(alphabet="abc xyz/_.", min_size=1, max_size=6),
        scale=st.none() | st.floats(-1e6, 1e6),
        flavour=st.sampled_from(("plain", "salted")),
        seed=st.integers(0, 2**31),
        clip=st.booleans(),
        verbose=st.booleans(),
    )


@settings(max_examples=40, deadline=None)
@given(_fake_requests())
def test_to_argv_parses_back_to_the_same_request(req):
    # The generic command parses exactly what to_argv writes: argv -> Request -> argv is the identity.
    captured = []
    with pytest.MonkeyPatch.context() as mp:
        _capture_release(mp, captured)
        result = runner.invoke(_train_app(captured), req.to_argv()[2:])
    assert isinstance(result.exception, _Stop), result.output
    name, parsed, kw = captured[0]
    assert name == "fake-sum" and parsed == req and parsed.to_argv() == req.to_argv()


def test_generic_train_options_come_from_the_request_fields(monkeypatch):
    captured = []
    _capture_release(monkeypatch, captured)
    r = runner.invoke(_train_app(captured), ["fake-sum", "--help"])
    assert r.exit_code == 0
    for flag in (
        "--eps",
        "--delta",
        "--dimension",
        "--label",
        "--scale",
        "--flavour",
        "--seed",
        "--clip",
        "--no-clip",
        "--verbose",
        "--out",
        "--ledger",
        "--json",
    ):
        assert flag in r.output, flag
    r = runner.invoke(_train_app(captured), ["fake-sum", "--flavour", "peppered"])
    assert (
        r.exit_code == 2 and "peppered" in r.output
    )  # a choice outside the allowed ones is refused by the parser
    r = runner.invoke(_train_app(captured), ["fake-sum", "--no-clip", "--out", "somewhere"])
    assert isinstance(r.exception, _Stop)
    assert (
        captured[-1][1] == FakeSumRequest(clip=False)
        and str(captured[-1][2]["out_dir"]) == "somewhere"
    )


def test_generic_audit_of_a_test_only_catalogue_entry(fake_catalogue, tmp_path):
    out = tmp_path / "audit"
    r = runner.invoke(
        app,
        [
            "audit",
            "fake-sum",
            "--eps",
            "1.5",
            "--dimension",
            "3",
            "--runs",
            "200",
            "--no-controls",
            "--reproducible-noise",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (
        d["mechanism"] == "fake-sum"
        and d["canary"] == "max-clip"
        and d["claimed_epsilon"] == pytest.approx(1.5)
    )
    assert d["epsilon_lower_bound"] <= 1.5
    assert d["command"] == (
        "dpaudit audit fake-sum --eps 1.5 --dimension 3 --canary max-clip --runs 200 --confidence 0.95 "
        f"--no-controls --reproducible-noise --out {out}"
    )
    r = runner.invoke(app, ["audit", "fake-sum", "--canary", "worst-case"])
    assert r.exit_code == 2


def test_noisy_sum_train_then_audit_its_release(tmp_path, monkeypatch):
    # A catalogue entry with no bespoke command: train and audit come from its Request.
    assert "noisy-sum" in CATALOGUE
    rel_dir, aud = tmp_path / "rel", tmp_path / "aud"
    r = runner.invoke(
        app,
        [
            "train",
            "noisy-sum",
            "--eps",
            "1.5",
            "--reproducible-noise",
            "--out",
            str(rel_dir),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    rel = json.loads((rel_dir / "release.json").read_text())
    assert (
        rel["request"]["epsilon"] == 1.5
        and rel["command"]
        == f"dpaudit train noisy-sum --eps 1.5 --delta 1e-05 --reproducible-noise --out {rel_dir}"
    )
    r = runner.invoke(
        app,
        [
            "audit",
            "noisy-sum",
            "--release",
            str(rel_dir),
            "--runs",
            "200",
            "--no-controls",
            "--out",
            str(aud),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["release_id"] == rel["id"] and d["epsilon_lower_bound"] <= rel["epsilon"]
    # options of the request next to --release would be ignored: refused instead
    r = runner.invoke(app, ["audit", "noisy-sum", "--release", str(rel_dir), "--eps", "3"])
    assert r.exit_code == 2 and "--eps must not be given with --release" in r.output
    # a release whose recorded request no longer gives its guarantee is refused
    bad = {**rel, "request": {**rel["request"], "epsilon": 3.0}}
    (rel_dir / "release.json").write_text(json.dumps(bad))
    r = runner.invoke(app, ["audit", "noisy-sum", "--release", str(rel_dir), "--runs", "200"])
    assert r.exit_code == 2 and "rebuilt guarantee must equal the release's" in r.output
