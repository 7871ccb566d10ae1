"""The reviewer's picture: the trade-off figure of an audit, the report's
statistic/comparison sections and the one-run results.

Audit records here are hand-made audit.json dicts following the claimed-curve record contract (the
``claimed_curve`` and ``comparison`` blocks), so the report is tested independently of the
engine that writes them. The claimed curves are Gaussian trade-off functions computed here
with scipy (f(a) = Phi(Phi^-1(1 - a) - mu)), and each hand-made box is checked against that
independent curve so the "violated" flag of the fixture is itself true.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from scipy.stats import norm

from dpaudit.errors import UsageError
from dpaudit.records import write_json_atomic
from dpaudit.reports import build_report, write_report
from dpaudit.reports import stats as rstats
from dpaudit.reports.plots import all_figures
from dpaudit.reports.tradeoff import (
    CONSISTENT_COLOR,
    TRADEOFF_FILE,
    VIOLATION_COLOR,
    one_run_figure,
    tradeoff_figure,
    write_tradeoff_png,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DELTA = 1e-5
COUNTS = {
    "tp": 280,
    "fp": 170,
    "tn": 330,
    "fn": 220,
}  # 1,000 EVAL trials: Clopper-Pearson eps_LB about 0.30
CP_EPS = rstats.epsilon_lower_bound(**COUNTS, delta=DELTA, confidence=0.95)


def gauss_curve(mu: float, n: int = 200) -> dict:
    a = np.logspace(-6, 0, n)
    return {"fpr": a.tolist(), "fnr": norm.cdf(norm.ppf(1 - a) - mu).tolist()}


def claimed_curve_block(
    *,
    violated: bool,
    mu_claim: float,
    corner: tuple[float, float],
    eps_lb: float,
    lb_mu: float | None,
) -> dict:
    # the fixture must be true to itself: the box is below the claimed curve iff "violated"
    assert (corner[1] < norm.cdf(norm.ppf(1 - corner[0]) - mu_claim)) == violated
    rng = np.random.default_rng(0)
    s_out, s_in = rng.normal(0, 1, 500), rng.normal(2.0 if violated else 0.4, 1, 500)
    th = np.quantile(np.concatenate([s_in, s_out]), np.linspace(0, 1, 64))
    return {
        "statistic": "claimed-curve",
        "method": "threshold on SELECT; one-sided CP on EVAL; family search",
        "event": {
            "type": "subsampled-gaussian",
            "noise_multiplier": 1 / mu_claim,
            "sample_rate": 1.0,
            "steps": 1,
        },
        "accountant": "rdp",
        "adjacency": "add-remove-record",
        "delta": DELTA,
        "confidence": 0.95,
        "family": {
            "parameter": "noise_multiplier",
            "claimed": 1 / mu_claim,
            "lower_bound": None if lb_mu is None else 1 / lb_mu,
        },
        "scale_lower_bound": None if lb_mu is None else mu_claim / lb_mu,
        "epsilon_lower_bound": eps_lb,
        "violated": violated,
        "threshold": 1.0,
        "direction": "greater",
        "point": {
            "fpr": corner[0] * 0.6,
            "fnr": corner[1] * 0.9,
            "fpr_upper": corner[0],
            "fnr_upper": corner[1],
        },
        "points": {
            "fpr": [float((s_out >= t).mean()) for t in th],
            "fnr": [float((s_in < t).mean()) for t in th],
        },
        "curve": gauss_curve(mu_claim),
        "curve_at_lower_bound": None if lb_mu is None else gauss_curve(lb_mu),
        "select_size": 1000,
        "eval_size": 1000,
    }


def comparison_block() -> dict:
    return {
        "cp_bonferroni": {
            "epsilon_lower_bound": 0.41,
            "thresholds_tested": 999,
            "threshold": 1.0,
            "direction": "greater",
            "method": "all thresholds, Bonferroni",
        },
        "tpr_at_fpr": [
            {"fpr": 0.001, "tpr": 0.123, "tpr_interval": [0.1, 0.15]},
            {"fpr": 0.01, "tpr": 0.3, "tpr_interval": [0.26, 0.34]},
        ],
        "auroc": {"auc": 0.871, "interval": [0.85, 0.89], "bootstrap": 1000, "confidence": 0.95},
        "gdp_estimate": {
            "kind": "estimate (not a bound)",
            "epsilon": 3.4,
            "epsilon_interval": [3.1, 3.7],
            "mu": 1.6,
        },
    }


def audit_record(
    *,
    claimed: float = 1.0,
    violated: bool = True,
    eps_lb: float | None = None,
    new: bool = True,
    mechanism: str = "gaussian",
    **curve,
) -> dict:
    """An audit.json dict: with claimed_curve/comparison blocks (``new``) or the older shape."""
    rec = {
        "schema": "dpaudit.audit/1",
        "mechanism": mechanism,
        "canary": "unclipped",
        "role": "main",
        "noise": True,
        "canary_inserted": True,
        "runs": 2000,
        "claimed_epsilon": claimed,
        "delta": DELTA,
        "adjacency": "add-remove-record",
        "confidence": 0.95,
        "method": "Jagielski et al. 2020",
        "threshold": 1.0,
        "direction": "greater",
        "counts": dict(COUNTS),
        "ceiling": 6.0,
        "controls": {},
        "epsilon_lower_bound": CP_EPS,
    }
    if not new:
        return rec
    if violated:
        block = claimed_curve_block(
            violated=True,
            mu_claim=0.3,
            corner=(0.02, 0.30),
            eps_lb=3.1 if eps_lb is None else eps_lb,
            lb_mu=1.9,
            **curve,
        )
    else:
        block = claimed_curve_block(
            violated=False,
            mu_claim=1.0,
            corner=(0.05, 0.85),
            eps_lb=0.3 if eps_lb is None else eps_lb,
            lb_mu=0.4,
            **curve,
        )
    rec.update(
        statistic="claimed-curve",
        epsilon_lower_bound=block["epsilon_lower_bound"],
        clopper_pearson_epsilon=CP_EPS,
        claimed_curve=block,
        comparison=comparison_block(),
        threat_model="final-model",
    )
    return rec


def _artists(fig, gid: str) -> list:
    return [a for ax in fig.axes for a in ax.findobj(lambda x: x.get_gid() == gid)]


# ------------------------------------------------------------------ the figure


def test_write_tradeoff_png_writes_a_png_file_and_into_a_folder(tmp_path):
    rec = audit_record(violated=True)
    out = write_tradeoff_png(rec, tmp_path / "fig.png")
    assert out == tmp_path / "fig.png" and out.read_bytes()[:8] == PNG_MAGIC
    out2 = write_tradeoff_png(rec, tmp_path)
    assert out2 == tmp_path / TRADEOFF_FILE and out2.read_bytes()[:8] == PNG_MAGIC
    assert not list(tmp_path.glob("*.tmp"))


def test_violated_audit_gets_the_violation_colour_and_label():
    fig = tradeoff_figure(audit_record(violated=True))
    boxes = _artists(fig, "confidence-box")
    assert len(boxes) == 2  # linear and log-log panel
    for b in boxes:
        assert to_rgb(b.get_facecolor()) == to_rgb(VIOLATION_COLOR)
        assert to_rgb(b.get_edgecolor()) == to_rgb(VIOLATION_COLOR)
    lin = boxes[0]  # the linear panel's box is exactly [0, FPR_hi] x [0, FNR_hi]
    assert (lin.get_x(), lin.get_y()) == (0.0, 0.0)
    assert lin.get_x() + lin.get_width() == pytest.approx(
        0.02
    ) and lin.get_y() + lin.get_height() == pytest.approx(0.30)
    labels = _artists(fig, "violation-label")
    assert labels and all(
        t.get_text() == "VIOLATION" and to_rgb(t.get_color()) == to_rgb(VIOLATION_COLOR)
        for t in labels
    )
    # a record of the older layout: its published 3.1 was the claim family's epsilon, not a bound for any
    # mechanism; the title shows the Clopper-Pearson bound of its EVAL counts instead
    assert (
        "VIOLATION" in fig._suptitle.get_text()
        and f"eps_LB {CP_EPS:.3f} vs claimed eps 1.000" in fig._suptitle.get_text()
    )
    assert (
        "gaussian" in fig._suptitle.get_text()
        and "unclipped" in fig._suptitle.get_text()
        and "claimed-curve" in fig._suptitle.get_text()
    )
    assert len(_artists(fig, "claimed-curve")) == 2 and len(_artists(fig, "lower-bound-curve")) == 2
    assert len(_artists(fig, "eval-points")) == 2


def test_consistent_audit_is_not_violation_coloured():
    fig = tradeoff_figure(audit_record(violated=False, claimed=4.0))
    boxes = _artists(fig, "confidence-box")
    assert boxes and all(to_rgb(b.get_facecolor()) == to_rgb(CONSISTENT_COLOR) for b in boxes)
    assert not _artists(fig, "violation-label")
    assert "VIOLATION" not in fig._suptitle.get_text()


def test_no_claimed_curve_draws_nothing_and_says_why(tmp_path):
    old = audit_record(new=False)
    assert write_tradeoff_png(old, tmp_path / "x.png") is None and not (tmp_path / "x.png").exists()
    with pytest.raises(UsageError, match="claimed_curve block"):
        tradeoff_figure(old)
    bad = audit_record()
    bad["claimed_curve"]["point"]["fpr_upper"] = 1.5  # not a rate
    with pytest.raises(UsageError, match="malformed"):
        tradeoff_figure(bad)


# ------------------------------------------------------------------ the report


def _report(
    tmp_path: Path, records: dict[str, dict], one_runs: dict[str, dict] | None = None
) -> dict:
    for name, rec in records.items():
        write_json_atomic(tmp_path / name / "audit.json", rec)
    for name, rec in (one_runs or {}).items():
        write_json_atomic(tmp_path / name / "one_run.json", rec)
    return build_report([tmp_path], ledger_path=None)


def test_report_states_the_deciding_statistic_and_the_comparison_statistics(tmp_path):
    rep = _report(tmp_path, {"a": audit_record(violated=True)})
    (v,) = rep["sections"]["verdict"]
    assert v["status"] == "violation" and v["decided_by"] == ["claimed-curve"]
    assert (
        "VIOLATION: the claimed event is ruled out (noise_multiplier >= 0.5263 ruled out (claimed 3.333)"
        in v["line"]
    )
    assert (
        f"eps_LB {CP_EPS:.3f}, claimed 1.000" in v["line"]
        and "decided by the claimed-curve statistic" in v["line"]
    )
    (e,) = rep["sections"]["audit"]["audits"]
    assert e["statistic"] == "claimed-curve" and e["clopper_pearson_epsilon"] == pytest.approx(
        CP_EPS
    )
    assert e["claimed_curve"]["violated"] is True and e["comparison"]["auroc"]["auc"] == 0.871
    # the counts are the Clopper-Pearson test's: checked against clopper_pearson_epsilon, not the curve's eps_LB
    assert not [
        n
        for n in rep["notes"]
        if "Clopper-Pearson eps_LB" in n["message"] and "differs" in n["message"]
    ]
    # the constructed block's family result does not follow from its counts: the recomputation says so
    assert any("stored claimed-curve result" in n["message"] for n in rep["notes"])
    figs = all_figures(rep)
    trade = [f for f in figs if f.name.startswith("tradeoff")]
    assert len(trade) == 1 and trade[0].png[:8] == PNG_MAGIC

    md = write_report(rep, tmp_path / "r.md", fmt="md", figures=figs)
    text = md.read_text()
    assert "decided by the claimed-curve statistic" in text
    for s in (
        "statistic (decides)",
        "claimed-curve",
        "CP eps_LB (Bonferroni)",
        "0.410 (999 thresholds)",
        "TPR at FPR 0.1 % [CI]",
        "0.123 [0.100, 0.150]",
        "0.871 [0.850, 0.890]",
        "3.400 [3.100, 3.700] (estimate)",
        "VIOLATED",
    ):
        assert s in text, s
    assert (tmp_path / "r_files" / f"{trade[0].name}.png").read_bytes()[:8] == PNG_MAGIC
    assert f"r_files/{trade[0].name}.png" in text
    html = write_report(rep, tmp_path / "r.html", fmt="html", figures=figs).read_text()
    assert (
        "decided by the claimed-curve statistic" in html
        and "TPR at FPR 1 % [CI]" in html
        and "Trade-off (" in html
    )


def test_report_no_evidence_line_names_the_statistic(tmp_path):
    rep = _report(tmp_path, {"a": audit_record(violated=False, claimed=4.0)})
    (v,) = rep["sections"]["verdict"]
    assert v["status"] == "no-evidence" and "statistic: claimed-curve" in v["line"]


def test_old_audit_renders_as_before_and_says_clopper_pearson(tmp_path):
    rep = _report(tmp_path, {"old": audit_record(new=False, claimed=1.0)})
    (v,) = rep["sections"]["verdict"]
    assert v["status"] == "no-evidence" and "statistic: clopper-pearson" in v["line"]
    (e,) = rep["sections"]["audit"]["audits"]
    assert (
        e["statistic"] == "clopper-pearson"
        and e["claimed_curve"] is None
        and e["comparison"] is None
    )
    assert e["clopper_pearson_epsilon"] == pytest.approx(CP_EPS)
    assert not [f for f in all_figures(rep) if f.name.startswith("tradeoff")]
    text = write_report(rep, tmp_path / "r.md", fmt="md", figures=[]).read_text()
    assert (
        "statistic (decides)" not in text
    )  # no statistic table for records that have none of its blocks
    assert "no evidence of a violation" in text


def test_curve_violated_decides_even_when_eps_lb_is_below_the_claim(tmp_path):
    # one rule: the claimed-curve test decides; eps_LB (a bound for any mechanism)
    # below the claimed epsilon is no contradiction, and neither is a family epsilon equal to the claim
    rec = audit_record(violated=True, eps_lb=1.0, claimed=1.0)
    rec["claimed_curve"]["scale_lower_bound"] = (
        1.0  # the boundary: the claimed event itself ruled out
    )
    rep = _report(tmp_path, {"a": rec})
    (v,) = rep["sections"]["verdict"]
    assert v["status"] == "violation" and "the claimed event is ruled out" in v["line"]


def test_malformed_claimed_curve_is_a_note_not_a_figure(tmp_path):
    rec = audit_record(violated=False, claimed=4.0)
    rec["claimed_curve"]["curve"]["fnr"] = rec["claimed_curve"]["curve"]["fnr"][
        :-1
    ]  # lengths differ
    rep = _report(tmp_path, {"a": rec})
    assert rep["sections"]["audit"]["audits"][0]["claimed_curve"] is None
    assert any("claimed_curve block is malformed" in n["message"] for n in rep["notes"])
    assert not [f for f in all_figures(rep) if f.name.startswith("tradeoff")]


# ------------------------------------------------------------------ one-run results


def one_run_record(
    *, steinke_lb: float, fdp_lb: float | None, claimed: float = 2.0, violated: bool = False
) -> dict:
    return {
        "schema": "dpaudit.one-run/1",
        "canaries": 1000,
        "kind": "gradient",
        "included": 497,
        "grid": [[10, 10], [50, 50]],
        "steinke": {
            "epsilon_lower_bound": steinke_lb,
            "k_pos": 50,
            "k_neg": 50,
            "guesses": 100,
            "correct": 97,
            "ceiling": 2.9,
            "method": "Steinke, Nasr & Jagielski 2023",
        },
        "fdp": None
        if fdp_lb is None
        else {"epsilon_lower_bound": fdp_lb, "violated": violated, "method": "f-DP"},
        "claimed_epsilon": claimed,
        "delta": DELTA,
        "confidence": 0.95,
        "info": {"model": "dp-cnn", "steps": 100},
    }


def test_one_run_records_get_a_table_a_figure_and_a_verdict_line(tmp_path):
    rep = _report(
        tmp_path,
        {},
        {
            "ok": one_run_record(steinke_lb=0.8, fdp_lb=1.1),
            "bad": one_run_record(steinke_lb=2.6, fdp_lb=None, claimed=1.0),
        },
    )
    lines = {v["key"].split("/")[-2]: v for v in rep["sections"]["verdict"]}
    assert (
        lines["bad"]["status"] == "violation"
        and "decided by the one-run (eps, delta) statistic" in lines["bad"]["line"]
    )
    assert (
        lines["ok"]["status"] == "no-evidence" and "statistic: one-run f-DP" in lines["ok"]["line"]
    )
    assert "dp-cnn (one-run audit, 1000 canaries)" in lines["ok"]["line"]
    figs = [f for f in all_figures(rep) if f.name.startswith("onerun")]
    assert len(figs) == 2 and all(f.png[:8] == PNG_MAGIC for f in figs)
    text = write_report(rep, tmp_path / "r.md", fmt="md", figures=figs).read_text()
    assert "One-run audits" in text and "97 / 100" in text and "not computed" in text


def test_one_run_figure_colours_a_bound_above_the_claim():
    fig = one_run_figure(one_run_record(steinke_lb=2.6, fdp_lb=1.1, claimed=1.0))
    (st,), (fd,) = _artists(fig, "bar-steinke"), _artists(fig, "bar-fdp")
    assert to_rgb(st.get_facecolor()) == to_rgb(
        VIOLATION_COLOR
    ) and st.get_width() == pytest.approx(2.6)
    assert to_rgb(fd.get_facecolor()) == to_rgb(VIOLATION_COLOR)  # 1.1 > claim 1.0
    (b,) = _artists(
        one_run_figure(one_run_record(steinke_lb=0.5, fdp_lb=0.7, claimed=1.0)), "bar-steinke"
    )
    assert to_rgb(b.get_facecolor()) == to_rgb(CONSISTENT_COLOR)
    with pytest.raises(UsageError, match="steinke or fdp"):
        one_run_figure({"canaries": 3})


def test_one_run_json_alone_is_a_valid_report_input(tmp_path):
    write_json_atomic(
        tmp_path / "run" / "one_run.json", one_run_record(steinke_lb=0.8, fdp_lb=None)
    )
    rep = build_report([tmp_path / "run" / "one_run.json"], ledger_path=None)
    assert [e["label"] for e in rep["sections"]["audit"]["one_run"]] == ["run"]
    assert rep["inputs"]["releases"] == [] and json.dumps(rep)


def test_one_run_verdict_uses_the_deciding_analysis_only(tmp_path):
    # f-DP was tested (a claimed event), so it decides; the Steinke bound above the claim is a
    # warning, not a violation (using the larger of two tests would break the stated confidence)
    rep = _report(
        tmp_path,
        {},
        {"r": dict(one_run_record(steinke_lb=1.5, fdp_lb=0.5, claimed=1.0), statistic="f-dp")},
    )
    (v,) = rep["sections"]["verdict"]
    assert (
        v["status"] == "no-evidence"
        and "statistic: one-run f-DP" in v["line"]
        and v["max_epsilon_lower_bound"] == 0.5
    )
    assert any("does not decide" in n["message"] and n["level"] == "warning" for n in rep["notes"])
    rep = _report(
        tmp_path / "x",
        {},
        {"r": one_run_record(steinke_lb=0.2, fdp_lb=0.9, claimed=1.0, violated=True)},
    )
    assert (
        rep["sections"]["verdict"][0]["status"] == "inconclusive"
    )  # flag not backed by its eps_LB: fail closed


def test_figure_of_a_real_engine_audit_follows_its_violated_flag(tmp_path):
    # the blocks as the audit engine writes them (not hand-made): an unclipped canary (mean shift
    # 3 sigma) against a claimed Gaussian with noise multiplier 3 is falsified, a clipped one is not
    from dpaudit.accounting import SubsampledGaussian
    from dpaudit.audits.engine import audit_scores

    rng = np.random.default_rng(3)
    for shift, expect in ((3.0, True), (1 / 3, False)):
        res = audit_scores(
            rng.normal(shift, 1, 500),
            rng.normal(0, 1, 500),
            delta=DELTA,
            claim=SubsampledGaussian(3.0, 1.0, 1),
            mechanism="gaussian",
            canary="c",
        )
        d = json.loads(json.dumps(res.to_dict()))
        assert d["claimed_curve"]["violated"] is expect
        fig = tradeoff_figure(d)
        want = VIOLATION_COLOR if expect else CONSISTENT_COLOR
        assert all(
            to_rgb(b.get_facecolor()) == to_rgb(want) for b in _artists(fig, "confidence-box")
        )
    assert write_tradeoff_png(d, tmp_path).read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(
    "claim", [(3.0, 1.0, 1), (1.2, 0.05, 40)]
)  # closed-form Gaussian; subsampled (PLD profile)
def test_report_recomputes_the_deciding_claimed_curve_statistic(tmp_path, claim):
    """The cross-check the report shows is the statistic that decided (the claimed-curve family search on the
    stored box counts), equal to the engine's own result; an edited box count changes it and is noted."""
    from dpaudit.accounting import SubsampledGaussian
    from dpaudit.audits.engine import audit_scores
    from dpaudit.audits.curves import family_statement

    rng = np.random.default_rng(5)
    res = audit_scores(
        rng.normal(2.5, 1, 500),
        rng.normal(0, 1, 500),
        delta=DELTA,
        claim=SubsampledGaussian(*claim),
        mechanism="gaussian",
        canary="c",
    )
    rec = json.loads(json.dumps(res.to_dict()))
    rep = _report(tmp_path / "a", {"a": rec})
    (e,) = rep["sections"]["audit"]["audits"]
    cc = rec["claimed_curve"]
    assert e["recomputed"] == {
        "statistic": "claimed-curve",
        "statement": family_statement(cc["family"]),
        "violated": cc["violated"],
    }
    assert not [n for n in rep["notes"] if "stored claimed-curve result" in n["message"]]
    rec["claimed_curve"]["counts"]["fn"] += 40  # the box edited after the fact
    rep = _report(tmp_path / "b", {"a": rec})
    assert rep["sections"]["audit"]["audits"][0]["recomputed"]["statement"] != family_statement(
        cc["family"]
    )
    assert any("stored claimed-curve result" in n["message"] for n in rep["notes"])
