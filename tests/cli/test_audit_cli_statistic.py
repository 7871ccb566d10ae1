"""`dpaudit audit` says which statistic decided and prints the comparison statistics."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()
OLD_AUDIT = Path(__file__).parents[1] / "audits" / "old_audits" / "gaussian-broken.json"


def test_gaussian_audit_names_the_claimed_curve_statistic(tmp_path):
    r = runner.invoke(
        app,
        [
            "audit",
            "gaussian",
            "--runs",
            "400",
            "--eps",
            "2",
            "--out",
            str(tmp_path),
            "--reproducible-noise",
            "--workers",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    out = r.stdout
    d = json.loads((tmp_path / "audit.json").read_text())
    cc = d["claimed_curve"]
    assert d["statistic"] == "claimed-curve" and cc["family"]["parameter"] == "noise_multiplier"
    assert "statistic: claimed-curve: " in out and f"claimed {cc['family']['claimed']:.4g}" in out
    assert f"family epsilon {cc['family_epsilon']:.3f}, pld accountant" in out
    assert f"eps_LB {d['epsilon_lower_bound']:.3f}" in out  # the bound for any mechanism
    flat = " ".join(out.split())  # the legend wraps at the terminal width
    for label in (
        "CP eps_LB",
        "TPR@FPR 0.1%",
        "TPR@FPR 1%",
        "AUROC [CI]",
        "GDP est. [CI]",
        "estimate of epsilon, not a bound",
    ):
        assert label in flat, label
    auroc = d["comparison"]["auroc"]
    assert f"{auroc['auc']:.2f} [{auroc['interval'][0]:.2f}, {auroc['interval'][1]:.2f}]" in out
    assert f"{d['clopper_pearson_epsilon']:.3f}" in out


def test_broken_gaussian_violation_names_the_statistic(tmp_path):
    # the planted bug (canary 3x the sensitivity at eps = 1, 2,000 trials): caught by the claimed curve
    r = runner.invoke(
        app,
        [
            "audit",
            "gaussian",
            "--runs",
            "2000",
            "--eps",
            "1",
            "--broken-noise-factor",
            "3",
            "--out",
            str(tmp_path),
            "--no-controls",
            "--reproducible-noise",
            "--workers",
            "1",
            "--seed",
            "0",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "VIOLATION: the claimed event is ruled out: noise_multiplier >= " in " ".join(
        r.stdout.split()
    )


def test_old_audit_renders_as_clopper_pearson(tmp_path):
    from dpaudit.audits.engine import read_audit
    from dpaudit.cli.audit_render import render as _render
    from dpaudit.console import console

    with console.capture() as cap:
        _render(read_audit(OLD_AUDIT), tmp_path)
    text = cap.get()
    assert "statistic: clopper-pearson (no claimed event)" in text and "VIOLATION" in text
    assert (
        "TPR@FPR 1%" in text
    )  # the row is there, empty (—) for a file without comparison statistics
