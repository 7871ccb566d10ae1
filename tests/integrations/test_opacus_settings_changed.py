"""The settings an Opacus run executes are read at every optimizer step: a noise multiplier (or clipping norm,
sample rate, expected batch size) changed after make_private is a finding, the record is not certified, the
script accountant's epsilon above the claim is a finding, and `verify` fails a planned run that did this."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.integrations.opacus import OpacusCanaries
from dpaudit.integrations.pipeline import NOT_CERTIFIED, PipelineCheck
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger

runner = CliRunner()


def _run(n: int = 105, *, change=None, epochs: int = 2, pipeline: bool = True):
    """Opacus on n records, canaries (and the check) attached right after make_private, as
    `audit opacus` does;
    ``change(opt, loader)`` runs after attach, before training."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(n, 4, generator=g), torch.randint(0, 2, (n,), generator=g)
    )
    model = nn.Linear(4, 2)
    c = OpacusCanaries(model, canaries=8, seed=1, noise_seed=3)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=torch.utils.data.DataLoader(data, batch_size=10),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    c.attach(opt, data_loader=loader)
    check = (
        PipelineCheck().attach(opt, data_loader=loader, accountant=engine.accountant)
        if pipeline
        else None
    )
    if change is not None:
        change(opt, loader)
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return c.audit(model, delta=1e-5, pipeline=check).bounds


def _set(attr, value):
    return lambda opt, loader: setattr(opt, attr, value)


def test_noise_multiplier_lowered_after_make_private_is_a_finding():
    b = _run(change=_set("noise_multiplier", 0.05))
    codes = {f["code"] for f in b["findings"]}
    assert {"changed-noise", "accountant-epsilon"} <= codes and b["certified"] == NOT_CERTIFIED
    assert (
        b["accountant_epsilon"] > 1000 > b["claimed_epsilon"]
    )  # the script's own accountant saw sigma 0.05
    assert b["executed"]["epsilon"] > 1000 and b["executed"]["event"]["noise_multiplier"] == 0.05


@pytest.mark.parametrize(
    "attr,value,code",
    [
        ("noise_multiplier", 0.05, "changed-noise"),
        ("max_grad_norm", 5.0, "changed-clipping"),
        ("expected_batch_size", 3, "changed-batch-size"),
    ],
)
def test_each_setting_is_checked_by_the_canaries_alone(attr, value, code):
    b = _run(change=_set(attr, value), pipeline=False)
    assert code in {f["code"] for f in b["findings"]} and b["certified"] == NOT_CERTIFIED


def test_sampler_rate_raised_after_make_private_is_a_finding():
    b = _run(change=lambda opt, loader: setattr(loader.batch_sampler, "sample_rate", 0.5))
    assert {"changed-sample-rate", "sample-rate"} <= {f["code"] for f in b["findings"]}


def test_noise_changed_midway_is_a_finding():
    def later(opt, loader):
        original = opt.add_noise
        steps = []

        def add_noise():
            steps.append(1)
            if len(steps) == 5:
                opt.noise_multiplier = 0.3
            original()

        opt.add_noise = add_noise

    b = _run(change=later)
    assert "changed-noise" in {f["code"] for f in b["findings"]}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_unchanged_run_has_no_findings(seed):
    torch.manual_seed(seed)
    b = _run(n=105 + 11 * seed)  # int(N q) unchanged by one record more or fewer
    assert b["findings"] == [] and "certified" not in b
    assert b["accountant_epsilon"] == pytest.approx(b["claimed_epsilon"], rel=1e-9)


SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.zeros(105, 204)
    x[:, :4] = torch.randn(105, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, torch.randint(0, 2, (105,), generator=g))
    model = nn.Linear(204, 2)
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=torch.utils.data.DataLoader(data, batch_size=10), noise_multiplier=0.8, max_grad_norm=1.0)
    if "--cheat" in sys.argv:
        opt.noise_multiplier = 0.05
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
""")


@pytest.mark.parametrize("cheat", [False, True])
def test_planned_script_run_with_lowered_noise_fails_verify(tmp_path, monkeypatch, cheat):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.setenv("DPAUDIT_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv(sg.SIGNING_KEY_ENV, str(sg.keygen("auditor").path))
    with open_ledger(None) as led:
        led.register_key()
    r = runner.invoke(
        app,
        [
            "audit",
            "plan",
            "opacus",
            "--noise-multiplier",
            "0.8",
            "--sample-rate",
            str(1 / 11),
            "--epochs",
            "1",
            "--delta",
            "1e-5",
            "--canaries",
            "50",
            "--tensors",
            "weight",
            "--out",
            "p",
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(
        app,
        [
            "audit",
            "opacus",
            "train.py",
            "--plan",
            "p/plan.json",
            "--",
            *(["--cheat"] if cheat else []),
        ],
    )
    assert r.exit_code == 0, r.output
    rec = json.loads((tmp_path / "p" / "one_run.json").read_text())
    assert ("changed-noise" in {f["code"] for f in rec["findings"]}) is cheat
    assert ("pipeline: not certified" in r.output) is cheat
    assert runner.invoke(app, ["bundle", "p", "--out", "b"]).exit_code == 0
    v = runner.invoke(app, ["verify", "b", "--json"])
    assert (v.exit_code == 0) is not cheat, v.output
    if cheat:
        checks = json.loads(v.stdout)["checks"]
        assert any(c["name"] == "pipeline" and c["status"] == "FAIL" for c in checks), v.stdout


def test_noise_removed_behind_the_hooks_is_measured():
    """The settings stay as declared but the update carries no noise (p.grad reset to the clipped sum)."""

    def strip(opt, loader):
        original = opt.add_noise

        def add_noise():
            original()
            for p in opt.params:
                p.grad = p.summed_grad.view_as(p).clone()

        opt.add_noise = add_noise

    b = _run(change=strip)
    assert (
        "too-little-noise" in {f["code"] for f in b["findings"]} and b["certified"] == NOT_CERTIFIED
    )


def test_the_cli_shows_the_executed_epsilon(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    r = runner.invoke(
        app,
        [
            "audit",
            "opacus",
            "train.py",
            "--canaries",
            "20",
            "--tensors",
            "weight",
            "--out",
            "o",
            "--",
            "--cheat",
        ],
    )
    assert r.exit_code == 0, r.output
    rec = json.loads((tmp_path / "o" / "one_run.json").read_text())
    assert rec["executed"]["epsilon"] > 1000
    assert f"the executed steps: eps {rec['executed']['epsilon']}" in r.output
    assert (
        "pipeline finding changed-noise" in r.output
        and "pipeline finding accountant-epsilon" in r.output
    )
