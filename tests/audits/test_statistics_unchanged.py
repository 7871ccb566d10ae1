"""Every audit statistic is bit-identical to the code before the audits package was trimmed.

``data/statistics_golden.json`` holds, per statistic, the SHA-256 of its exact JSON text (floats
in full ``repr`` precision) as the earlier code computed it on these inputs: eps lower bounds
(box, band, general, Bonferroni, sequential, one-run Steinke and f-DP, white-box), p-values,
band levels, claimed-curve blocks and power lines. Regenerate only for a deliberate change:
``python tests/audits/test_statistics_unchanged.py OUT.json`` with the old code on PYTHONPATH.
"""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from dpaudit.accounting.events import Composed, PureEpsilon, SubsampledGaussian
from dpaudit.audits import curves, one_run, power, power_runs, sequential, stats, white_box

GOLDEN = Path(__file__).parent / "data" / "statistics_golden.json"
GAUSSIAN, PURE = SubsampledGaussian(1.0, 1.0, 1), PureEpsilon(2.0, 1)


def _digest(value) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _trials(n: int, shift: float, rng, ties: bool = False):
    world = np.zeros(n, bool)
    world[: n // 2] = True
    rng.shuffle(world)
    scores = rng.normal(size=n) + shift * world
    select = np.zeros(n, bool)
    select[rng.permutation(n)[: int(0.3 * n)]] = True
    return (np.round(scores) if ties else scores), world, select


def _fixed_n(out: dict, rng) -> None:
    for i, (n, shift, ties) in enumerate([(40, 0.0, False), (200, 2.5, False), (31, 0.5, True)]):
        s, w, sel = _trials(n, shift, rng, ties)
        for delta in (0.0, 1e-5):
            band = stats.band_bound(s, w, delta=delta)
            counts = dict(zip(("tp", "fp", "tn", "fn"), stats.confusion(s, w, 0.3, "greater")))
            out[f"select {i} {delta}"] = stats.select_threshold(s[sel], w[sel], delta=delta)
            out[f"band {i} {delta}"] = band
            out[f"general {i} {delta}"] = stats.general_epsilon(
                counts, band, delta=delta, confidence=0.95
            )
            out[f"comparison {i} {delta}"] = stats.comparison_statistics(
                s, w, sel, "greater", delta=delta, seed=i
            )
            out[f"roc {i} {delta}"] = stats.roc(s, w, max_points=20)
        for event in (GAUSSIAN, PURE, Composed((SubsampledGaussian(2.0, 1.0, 3), PURE))):
            out[f"curve test {i} {event!r}"] = curves.curve_test(
                s, w, sel, event=event, delta=1e-5, accountant="pld"
            )
    for k in range(0, 11, 2):
        bound = stats.epsilon_lower_bound(tp=10 - k, fp=k, tn=10 - k, fn=k, delta=1e-5)
        out[f"box {k}"] = [bound, stats.cp_upper(k, 10, 0.9, split=3)]
    out["levels"] = [stats.band_level(n, 0.0125) for n in (5, 100)]
    out["gdp"] = [
        (stats.gdp_epsilon(mu, 1e-5), stats.gdp_mu_for_epsilon(mu, 1e-5)) for mu in (0.5, 3)
    ]


def _one_run(out: dict, rng) -> None:
    scores = rng.normal(size=300)
    included = rng.random(300) < 0.5
    for claim in (None, GAUSSIAN, PURE):
        bounds = one_run.audit_one_run(scores + 1.5 * included, included, delta=1e-5, claim=claim)
        out[f"one-run {claim!r}"] = [bounds, one_run.recompute_bounds(bounds, claim=claim)]
        out[f"one-run power {claim!r}"] = power_runs.one_run_power(
            200, delta=1e-5, claim=claim, claimed_epsilon=None if claim else 2.0
        ).to_dict()
    out["p-values"] = [one_run.steinke_p_value(100, 50, v, 1.0, 1e-5) for v in (20, 35, 50)]


def _sequential(out: dict, rng) -> None:
    for event, shift in ((GAUSSIAN, 3.0), (PureEpsilon(1.0, 1), 0.0)):
        curve = curves.claimed_curve(event)
        plan = sequential.plan_sequential(300, seed=3)
        scores = rng.normal(size=300) + shift * plan.world
        test = sequential.SequentialTest(
            curve, plan, confidence=0.95, criterion=sequential.criterion_for(curve)
        )
        _, look, reason = sequential.run_sequential(lambda a, b: scores[a:b], test)
        tested = dict(event=event, delta=1e-5, accountant="rdp", adjacency="add-remove-record")
        fields = sequential.audit_fields({}, plan, (test, look, reason), tested)
        out[f"sequential {event!r}"] = [fields, sequential.box_at(fields["sequential"], 0.99)]


def _power_and_white_box(out: dict) -> None:
    for curve in (None, curves.claimed_curve(GAUSSIAN), curves.claimed_curve(PURE)):
        for seq in (False, True):
            line = power.audit_power(
                trials=400, delta=1e-5, claimed_epsilon=2.0, curve=curve, sequential_mode=seq
            )
            out[f"power {curve!r} {seq}"] = line.to_dict()
    claim = SubsampledGaussian(1.0, 0.1, 50)
    steps = white_box.simulate_steps(
        np.random.default_rng(1), noise=0.9, rate=0.1, steps=50, canaries=20
    )
    final = white_box.simulate_final(
        np.random.default_rng(2), noise=0.9, rate=0.1, steps=50, canaries=200
    )
    out["white box"] = [
        white_box.step_bound(steps, claimed=claim, delta=1e-5).to_dict(),
        white_box.final_bound(final, claimed=claim, delta=1e-5).to_dict(),
        white_box.expected_step_bound(claim, 50, delta=1e-5),
        white_box.expected_final_bound(claim, 100, delta=1e-5),
    ]


def statistics() -> dict:
    """The statistics, each as the SHA-256 of its exact JSON text."""
    out: dict = {}
    rng = np.random.default_rng(7)
    _fixed_n(out, rng)
    _one_run(out, rng)
    _sequential(out, rng)
    _power_and_white_box(out)
    return {key: _digest(value) for key, value in out.items()}


def test_every_statistic_is_bit_identical_to_the_earlier_code():
    want = json.loads(GOLDEN.read_text())
    got = statistics()
    assert sorted(got) == sorted(want)
    assert [k for k in want if got[k] != want[k]] == []


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(statistics(), indent=1, sort_keys=True) + "\n")
