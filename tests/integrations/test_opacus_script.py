"""`dpaudit audit opacus SCRIPT.py -- ARGS`: a user's own Opacus script, unchanged, audited in one run.

The script below knows nothing of dpaudit: N = 105 synthetic records, batch 10 (Poisson, 11 steps per epoch), a
linear model whose ``side`` weights read inputs that are zero in every record (quiet coordinates for the canaries),
sigma 0.8. It writes what it saw (Opacus's epsilon, its optimizer steps) to the file named by ``--report``."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
from typer.testing import CliRunner

from dpaudit.accounting.accountants import compute_epsilon
from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.cli import app
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger

runner = CliRunner()
SIGMA, EPOCHS, N, BATCH = 0.8, 3, 105, 10

SCRIPT = textwrap.dedent("""
    import argparse, json
    import torch
    from opacus import PrivacyEngine
    from torch import nn

    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int)
    p.add_argument("--sigma", type=float)
    p.add_argument("--report")
    p.add_argument("--fixed", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.zeros(105, 204)
    x[:, :4] = torch.randn(105, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, torch.randint(0, 2, (105,), generator=g))


    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.side = nn.Linear(4, 2), nn.Linear(200, 2)

        def forward(self, x):
            return self.fc(x[:, :4]) + self.side(x[:, 4:])


    model = Tiny()
    engine = PrivacyEngine(accountant="rdp")
    model, opt, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                             data_loader=torch.utils.data.DataLoader(data, batch_size=10, shuffle=a.fixed),
                                             noise_multiplier=a.sigma, max_grad_norm=1.0, poisson_sampling=not a.fixed)
    steps = 0
    for _ in range(a.epochs):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            steps += 1
    json.dump({"epsilon": engine.get_epsilon(1e-5), "steps": steps}, open(a.report, "w"))
""")


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path / "train.py"


def _audit(
    *options, script_args=("--epochs", str(EPOCHS), "--sigma", str(SIGMA), "--report", "seen.json")
):
    return runner.invoke(app, ["audit", "opacus", "train.py", *options, "--", *script_args])


def test_correct_pipeline_is_audited_without_findings(script):
    script.write_text(SCRIPT + "print('the script prints')\n")
    r = _audit("--canaries", "200", "--tensors", "side.weight", "--out", "o", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["audit_dir"] == "o"  # --json: the script's own prints go to stderr
    seen, rec = (
        json.loads((script.parent / "seen.json").read_text()),
        json.loads((script.parent / "o" / "one_run.json").read_text()),
    )
    assert seen["steps"] == rec["info"]["steps"] > 0  # every optimizer step went through the hook
    assert rec["findings"] == [] and "certified" not in rec
    assert rec["accountant_epsilon"] == pytest.approx(
        seen["epsilon"], rel=1e-12
    )  # the script's own accountant
    # the claim is the executed run's: Opacus's sample rate 1/11, the executed steps; its epsilon recomputed independently
    ev = SubsampledGaussian(SIGMA, 1 / 11, seen["steps"])
    assert rec["claimed_epsilon"] == pytest.approx(
        compute_epsilon(ev, delta=1e-5, accountant="rdp").epsilon, rel=1e-9
    )
    assert (
        rec["canaries"] == 200 and rec["info"]["tensors"] == ["side.weight"] and not rec["violated"]
    )


def test_planted_fixed_batches_are_found_and_not_certified(script):
    r = _audit(
        "--canaries",
        "200",
        "--tensors",
        "side.weight",
        "--out",
        "o",
        script_args=(
            "--epochs",
            str(EPOCHS),
            "--sigma",
            str(SIGMA),
            "--report",
            "seen.json",
            "--fixed",
        ),
    )
    assert r.exit_code == 0, r.output
    rec = json.loads((script.parent / "o" / "one_run.json").read_text())
    assert {f["code"] for f in rec["findings"]} == {
        "not-poisson",
        "fixed-batch-size",
        "not-poisson-records",
    }
    assert (
        rec["certified"] == "not certified: pipeline findings"
        and "pipeline finding not-poisson" in r.output
    )
    # without amplification: each record in one batch per epoch, the Gaussian mechanism composed over the epochs
    want = compute_epsilon(
        SubsampledGaussian(SIGMA, 1.0, EPOCHS), delta=1e-5, accountant="rdp"
    ).epsilon
    assert (
        rec["no_amplification"]["epsilon"] == pytest.approx(want, rel=1e-12)
        and want > rec["claimed_epsilon"]
    )


def test_under_a_plan_the_run_and_result_are_recorded_and_verify(script, monkeypatch):
    monkeypatch.setenv("DPAUDIT_LEDGER", str(script.parent / "ledger.sqlite"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(script.parent / "cfg"))
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
            str(SIGMA),
            "--sample-rate",
            str(1 / 11),
            "--epochs",
            str(EPOCHS),
            "--delta",
            "1e-5",
            "--canaries",
            "100",
            "--tensors",
            "side.weight",
            "--out",
            "p",
        ],
    )
    assert r.exit_code == 0, r.output
    assert _audit("--plan", "p/plan.json", "--delta", "1e-3").exit_code == 2  # the plan fixes delta
    assert _audit("--plan", "p/plan.json", "--canaries", "99").exit_code == 2  # and the canaries
    r = _audit("--plan", "p/plan.json")
    assert r.exit_code == 0, r.output
    plan, rec = (
        json.loads((script.parent / "p" / "plan.json").read_text()),
        json.loads((script.parent / "p" / "one_run.json").read_text()),
    )
    assert rec["plan"]["id"] == plan["id"] and rec["findings"] == [] and rec["canaries"] == 100
    with open_ledger(None, create=False) as led:
        stages = [e.payload["stage"] for e in led.entries(kind="plan")]
    assert stages == ["registered", "run", "result"]
    assert runner.invoke(app, ["bundle", "p", "--out", "b"]).exit_code == 0
    v = runner.invoke(app, ["verify", "b", "--json"])
    assert v.exit_code == 0 and json.loads(v.stdout)["ok"], v.output
    # a second run of the plan is refused before the script runs: the first run's files stay as they are
    first = (script.parent / "p" / "one_run.json").read_bytes()
    r = _audit("--plan", "p/plan.json", script_args=("--epochs", "1", "--report", "again.json"))
    assert (
        r.exit_code == 2
        and "plan must be run once" in r.output
        and not (script.parent / "again.json").exists()
    )
    assert (script.parent / "p" / "one_run.json").read_bytes() == first
    # a less private run than planned is refused when make_private returns, before any training step (the plan copied
    # to a folder without results, so that the rule of make_private is what refuses it)
    (script.parent / "p2").mkdir()
    for f in ("plan.json", "plan.local.json"):
        shutil.copy(script.parent / "p" / f, script.parent / "p2" / f)
    r = _audit(
        "--plan",
        "p2/plan.json",
        script_args=("--epochs", "1", "--sigma", "0.5", "--report", "x.json"),
    )
    assert (
        r.exit_code == 2
        and "noise_multiplier must be at least the planned 0.8" in r.output
        and not (script.parent / "x.json").exists()
    )


@pytest.mark.parametrize(
    "argv,says",
    [
        (["missing.py"], "SCRIPT must be an existing .py file"),
        (["seen.txt"], "SCRIPT must be an existing .py file"),
        (
            ["train.py", "--out", "seen.txt"],
            "--out must be a directory dpaudit can create and write",
        ),
        (["train.py", "--plan", "nope/plan.json"], "audit plan not found: nope/plan.json."),
        (["train.py", "--canaries", "1"], "--canaries must be an integer >= 2, got 1."),
        (["train.py", "--delta", "2"], "--delta must be in the open interval (0, 1), got 2.0."),
        (["train.py", "--canaries", "100000"], "--canaries must be at most"),
        (["train.py", "--tensors", "nope.weight"], "--tensors must name trainable parameters"),
    ],
)
def test_bad_inputs_exit_2(script, argv, says):
    (script.parent / "seen.txt").write_text("x")
    r = runner.invoke(
        app, ["audit", "opacus", *argv, "--", "--epochs", "1", "--sigma", "1", "--report", "r.json"]
    )
    assert r.exit_code == 2 and says in r.output, r.output
    assert not (
        script.parent / "r.json"
    ).exists()  # refused before (or at make_private, before) any training


def test_a_script_without_make_private_or_failing_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "none.py").write_text("print('no training')\n")
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(3)\n")
    r = runner.invoke(app, ["audit", "opacus", "none.py"])
    assert (
        r.exit_code == 2
        and "SCRIPT must train through opacus.PrivacyEngine.make_private" in r.output
    )
    r = runner.invoke(app, ["audit", "opacus", "fail.py"])
    assert r.exit_code == 2 and "SCRIPT must exit with status 0, got 3." in r.output


def test_a_script_without_a_noise_multiplier_is_refused_in_one_line(script):
    """Opacus accepts noise_multiplier=None; the hook refuses it at make_private, before any training."""
    r = _audit("--canaries", "10", script_args=("--epochs", "1", "--report", "r.json"))
    assert (
        r.exit_code == 2
        and "optimizer.noise_multiplier must be one number >= 0, got None." in r.output
    ), r.output
    assert not (script.parent / "r.json").exists()


def test_a_script_that_attaches_its_own_canaries_is_refused(script):
    """Two canary sets may share coordinates (twice the sensitivity): the second attach is refused."""
    own = SCRIPT.replace(
        "steps = 0\n",
        "from dpaudit.integrations.opacus import OpacusCanaries\n"
        "OpacusCanaries(model, canaries=10, tensors=['side.weight']).attach(opt, data_loader=loader)\n"
        "steps = 0\n",
    )
    script.write_text(own)
    r = _audit("--canaries", "10", "--tensors", "side.weight")
    assert r.exit_code == 2 and "optimizer must carry one set of canaries" in r.output


def test_the_scripts_warnings_are_one_line_each_and_never_hidden(script):
    """Opacus's secure-RNG warning becomes one dpaudit line; torch's expected backward-hook note is dropped."""
    r = _audit("--canaries", "50", "--tensors", "side.weight", "--out", "o")
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert (
        flat.count("secure_mode off") == 1
        and "Full backward hook" not in flat
        and "UserWarning" not in flat
    )
    assert "warning from train.py:" in flat


def test_warning_lines_keep_every_unexpected_warning():
    import warnings

    from dpaudit.integrations.opacus_script import warning_lines

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn(
            "Full backward hook is firing when gradients are computed with respect to module outputs since ..."
        )
        warnings.warn("Secure RNG turned off. This is perfectly fine for experimentation ...")
        warnings.warn("overflow encountered in exp\nsecond line", RuntimeWarning)
        warnings.warn("overflow encountered in exp\nsecond line", RuntimeWarning)
    lines = warning_lines(caught)
    assert lines[1] == "RuntimeWarning: overflow encountered in exp" and len(lines) == 2
    assert "secure_mode off" in lines[0]
