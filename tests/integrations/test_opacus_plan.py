"""A pre-registered one-run audit of an Opacus run: plan -> Opacus training with the
plan's canaries -> bundle -> verify, on a tiny synthetic model (one epoch, 50 canaries)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from typer.testing import CliRunner

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audit_plans import OPACUS, load_plan, opacus_plan
from dpaudit.audits.one_run import plan_coins
from dpaudit.cli import app
from dpaudit.errors import UsageError
from dpaudit.integrations.opacus import OpacusCanaries
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger

runner = CliRunner()
N, BATCH, M = 256, 32, 50


class Tiny(nn.Module):
    """``side`` reads features that are zero in every record (64 quiet coordinates for the canaries)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)
        self.side = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x[:, :16]) + self.side(x[:, 16:])


def _train(plan, sigma: float = 1.0, **given):
    """One Opacus epoch with the plan's canaries; returns (canaries, model)."""
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(N, 32)
    x[:, :16] = torch.randn(N, 16, generator=g)
    data = torch.utils.data.TensorDataset(x, torch.randint(0, 4, (N,), generator=g))
    model = Tiny()
    c = OpacusCanaries.from_plan(model, plan, **given)
    model, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=torch.utils.data.DataLoader(data, batch_size=BATCH),
        noise_multiplier=sigma,
        max_grad_norm=1.0,
    )
    c.attach(opt, data_loader=loader)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return c, model


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """A CLI-written plan run twice (bundles with the first run alone, and with both), a library-written plan."""
    root = tmp_path_factory.mktemp("opacus")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPAUDIT_LEDGER", str(root / "ledger.sqlite"))
        mp.setenv("XDG_CONFIG_HOME", str(root / "cfg"))
        mp.chdir(root)
        key = sg.keygen("auditor")
        mp.setenv(sg.SIGNING_KEY_ENV, str(key.path))
        with open_ledger(None) as led:
            led.register_key()
        r = runner.invoke(
            app,
            [
                "audit",
                "plan",
                "opacus",
                "--noise-multiplier",
                "1",
                "--sample-rate",
                str(BATCH / N),
                "--epochs",
                "1",
                "--delta",
                "1e-5",
                "--canaries",
                str(M),
                "--tensors",
                "side.weight",
                "--out",
                "p",
                "--json",
            ],
        )
        assert r.exit_code == 0, r.output
        first, model = _train("p/plan.json")
        first.audit(model)  # one_run.json into the plan's folder
        assert runner.invoke(app, ["bundle", "p", "--out", "honest"]).exit_code == 0
        shutil.copytree("p", "p-run1")
        with pytest.raises(
            UsageError, match="plan must be run once"
        ):  # while the first run's files are there
            _train("p/plan.json")
        for f in root.joinpath(
            "p"
        ).iterdir():  # the first run moved aside: the second run hidden by a bundle below
            if f.name not in ("plan.json", "plan.local.json"):
                f.unlink()
        second, model2 = _train("p/plan.json")
        second.audit(model2)
        for name, inputs in (("hidden", ["p"]), ("both", ["p-run1", "p"])):
            assert runner.invoke(app, ["bundle", *inputs, "--out", name]).exit_code == 0
        yield {
            "root": root,
            "first": first,
            "second": second,
            "model": model,
            "cli": json.loads(r.stdout),
            "key": str(key.path),
        }


def _failed(bundle) -> list[tuple[str, str]]:
    r = runner.invoke(app, ["verify", str(bundle), "--json"])
    d = json.loads(r.stdout)
    assert r.exit_code == (0 if d["ok"] else 1)
    return [(c["name"], c["detail"]) for c in d["checks"] if c["status"] == "FAIL"]


def test_honest_plan_run_bundle_verifies(flow):
    plan = json.loads((flow["root"] / "p" / "plan.json").read_text())
    assert plan["mechanism"] == OPACUS and plan["claim"]["event"] == {
        "type": "subsampled-gaussian",
        "noise_multiplier": 1.0,
        "sample_rate": BATCH / N,
        "steps": N // BATCH,
    }
    assert (
        plan["audit"]["canaries"] == M
        and plan["request"]["tensors"] == ["side.weight"]
        and flow["cli"]["statistic"] == "f-dp"
    )
    assert _failed(flow["root"] / "honest") == []
    one = json.loads(next((flow["root"] / "honest").glob("audits/*/one_run.json")).read_text())
    assert one["plan"]["id"] == plan["id"] and one["statistic"] == "f-dp" and one["canaries"] == M
    # the committed coins are the ones used, and the revealed seed fixes the coordinates
    first = flow["first"]
    assert np.array_equal(plan_coins(one["plan"]["seeds"]["coins"], M), first.included) and one[
        "included"
    ] == int(first.included.sum())
    again = OpacusCanaries(
        Tiny(), canaries=M, seed=one["plan"]["seeds"]["public"], tensors=["side.weight"]
    )
    assert (
        again.coords == first.coords
        and first.sampled[~first.included].sum() == 0
        and first.sampled[first.included].sum() > 0
    )


def test_second_run_is_visible(flow):
    assert flow["first"].id != flow["second"].id
    with open_ledger(flow["root"] / "ledger.sqlite", create=False) as led:
        runs = [e.payload for e in led.entries(kind="plan") if e.payload["stage"] == "run"]
    assert [r["audit_id"] for r in runs] == [flow["first"].id, flow["second"].id]
    (failed,) = _failed(flow["root"] / "hidden")  # the second run's audit alone
    assert failed[0] == "runs" and failed[1].startswith("2 runs of plan")
    assert _failed(flow["root"] / "both") == []


def _one_run(b):
    return next(b.glob("audits/*/one_run.json"))


def _edit(path, change):
    d = json.loads(path.read_text())
    change(d)
    path.write_text(json.dumps(d))


def _more_correct(d):
    """Counts edited: every guess of the widest grid point correct, and the stored eps_LB left (or made) as it was."""
    d["steinke"]["per_grid"][-1]["correct"] = d["steinke"]["per_grid"][-1]["guesses"]
    d["steinke"]["epsilon_lower_bound"] += 1.0


@pytest.mark.parametrize(
    "tamper,check,says",
    [
        (lambda b: _edit(_one_run(b), _more_correct), "result = ledger", "differs from the result"),
        (lambda b: _edit(_one_run(b), _more_correct), "bound", "recomputed from its counts"),
        (
            lambda b: _edit(_one_run(b), lambda d: d.update(included=d["included"] + 1)),
            "audit vs plan",
            "the committed coins include",
        ),
        (
            lambda b: _edit(_one_run(b), lambda d: d.update(statistic="steinke")),
            "audit vs plan",
            "statistic 'steinke', planned 'f-dp'",
        ),
        (
            lambda b: _edit(
                _one_run(b), lambda d: d.update(claimed_epsilon=d["claimed_epsilon"] / 2)
            ),
            "audit = claim",
            "claimed epsilon",
        ),
        (
            lambda b: _edit(
                next(b.glob("plans/*/plan.json")),
                lambda d: d["claim"]["event"].update(noise_multiplier=2.0),
            ),
            "plan",
            "signature",
        ),
    ],
)
def test_tampering_is_caught(flow, tmp_path, tamper, check, says):
    b = shutil.copytree(flow["root"] / "both", tmp_path / "b")
    tamper(b)
    assert any(name == check and says in detail for name, detail in _failed(b)), _failed(b)


def test_plan_swapped_is_caught(flow, tmp_path, monkeypatch):
    monkeypatch.setenv("DPAUDIT_LEDGER", str(flow["root"] / "ledger.sqlite"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(flow["root"] / "cfg"))
    # another claim (a plan of the runs' own claim cannot be registered after them: plan_rules)
    other = opacus_plan(
        SubsampledGaussian(2.0, BATCH / N, N // BATCH),
        delta=1e-5,
        canaries=M,
        tensors=["side.weight"],
        out=tmp_path / "other",
        key=flow["key"],
    )
    b = shutil.copytree(flow["root"] / "both", tmp_path / "b")
    for p in b.glob("plans/*"):
        shutil.rmtree(p)
    shutil.copytree(
        other.parent, b / "plans" / "x", ignore=shutil.ignore_patterns("plan.local.json")
    )
    assert any(
        name == "audit vs plan" and "not pre-registered" in detail for name, detail in _failed(b)
    )


def test_a_run_other_than_planned_is_refused(flow, monkeypatch):
    monkeypatch.chdir(flow["root"])
    monkeypatch.setenv("DPAUDIT_LEDGER", str(flow["root"] / "ledger.sqlite"))
    if not (
        flow["root"] / "q"
    ).exists():  # the plan without its runs' files: each rule below is what refuses
        (flow["root"] / "q").mkdir()
        for f in ("plan.json", "plan.local.json"):
            shutil.copy(flow["root"] / "p" / f, flow["root"] / "q" / f)
    with pytest.raises(UsageError, match=f"canaries must be the planned {M}"):
        OpacusCanaries.from_plan(Tiny(), "q/plan.json", canaries=M - 1)
    with pytest.raises(UsageError, match="noise_multiplier must be at least the planned 1.0"):
        _train("q/plan.json", sigma=0.5)
    with pytest.raises(UsageError, match="an Opacus plan runs in your training script"):
        load_plan("q/plan.json")
    short = opacus_plan(
        SubsampledGaussian(1.0, BATCH / N, 4),
        delta=1e-5,
        canaries=M,
        tensors=["side.weight"],
        out="short",
        key=flow["key"],
    )
    c, model = _train(short)  # 8 steps, 4 planned
    with pytest.raises(UsageError, match="steps must be at most the planned 4"):
        c.audit(model)
    with pytest.raises(UsageError, match="canaries must be attached to the optimizer"):
        OpacusCanaries.from_plan(Tiny(), "q/plan.json").audit()
    with pytest.raises(UsageError, match="delta and confidence must not be given under a plan"):
        flow["first"].audit(flow["model"], delta=1e-3)
    r = runner.invoke(
        app,
        [
            "audit",
            "plan",
            "opacus",
            "--noise-multiplier",
            "1",
            "--sample-rate",
            "0.1",
            "--steps",
            "5",
            "--runs",
            "9",
        ],
    )
    assert r.exit_code == 2 and "--runs must not be given with `audit plan opacus`" in r.output
    assert runner.invoke(app, ["audit", "dp-rvfl", "--noise-multiplier", "1"]).exit_code == 2
