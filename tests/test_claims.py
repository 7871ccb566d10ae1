"""dpaudit.claims.verify_claim: the one claim check, used by the report, the ledger and the release paths.

Expected epsilons come from calling the accountants directly (compute_epsilon on hand-built
events), never from verify_claim's own recomputation. Events are unsubsampled (q = 1) so the
accountants are fast.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dpaudit.accounting import PureEpsilon, SubsampledGaussian, compute_epsilon
from dpaudit.claims import CLAIM_ATOL, CLAIM_RTOL, ClaimCheck, verify_claim
from dpaudit.cli import app
from dpaudit.errors import AccountingMismatchError
from dpaudit.records import Release, check_accounting, write_release

EVENT = SubsampledGaussian(noise_multiplier=2.0, sample_rate=1.0, steps=4)
DELTA = 1e-5
runner = CliRunner()


def eps(event=EVENT, accountant="rdp", adjacency="add-remove-record", delta=DELTA) -> float:
    return compute_epsilon(event, delta=delta, accountant=accountant, adjacency=adjacency).epsilon


def release(
    event=EVENT, *, accountant="rdp", adjacency="add-remove-record", epsilon=None, **kw
) -> Release:
    """A release whose claim is the accountant's own value unless ``epsilon`` overrides it."""
    claim = eps(event, accountant, adjacency) if epsilon is None else epsilon
    fields = dict(
        mechanism="dp-rvfl",
        dataset={"name": "mnist"},
        adjacency=adjacency,
        accountant=accountant,
        epsilon=claim,
        delta=DELTA,
        guarantee=event.to_dict(),
        seed=0,
        noise_source={"source": "os-entropy", "secret": True},
        target_epsilon=claim,
        noise_multiplier=getattr(event, "noise_multiplier", None),
        sample_rate=getattr(event, "sample_rate", None),
        steps=getattr(event, "steps", None),
        steps_executed=getattr(event, "steps", None),
        git_commit=None,
    )
    fields.update(kw)
    return Release(**fields)


@pytest.mark.parametrize("accountant", ["rdp", "prv", "pld"])
def test_a_correct_release_passes_with_its_own_accountant(accountant):
    r = release(accountant=accountant)
    c = verify_claim(r)
    assert isinstance(c, ClaimCheck) and dataclasses.is_dataclass(c)
    assert (c.status, c.ok, c.epsilon_status) == ("ok", True, "ok")
    assert c.recomputed_epsilon == pytest.approx(eps(accountant=accountant), rel=1e-12)
    assert c.recorded_epsilon == r.epsilon and c.target_epsilon == r.epsilon
    assert (c.steps_executed, c.steps_accounted) == (4, 4) and c.steps_reason is None
    assert (
        c.tolerance == CLAIM_RTOL
        and c.accountant == accountant
        and c.adjacency == "add-remove-record"
    )
    assert (
        c.reason
        == f"recomputed {accountant} epsilon {c.recomputed_epsilon:.4f} <= claimed {r.epsilon:.4f}"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.status = "mismatch"


def test_a_pure_release_is_recomputed_without_delta():
    c = verify_claim(release(PureEpsilon(0.5), accountant="pure", epsilon=0.5))
    assert c.status == "ok" and c.recomputed_epsilon == 0.5


def test_an_under_reported_epsilon_fails_with_a_reason():
    true = eps()
    r = release(epsilon=true * 0.9, target_epsilon=None)
    c = verify_claim(r)
    assert (c.status, c.ok, c.epsilon_status) == ("mismatch", False, "mismatch")
    assert c.recomputed_epsilon == pytest.approx(true, rel=1e-12)
    assert c.reason == f"recomputed rdp epsilon {true:.4f} > claimed {true * 0.9:.4f}"


def test_the_tolerance_is_the_documented_one_and_nothing_more():
    true = eps()
    edge = (true - CLAIM_ATOL) / (1 + CLAIM_RTOL)  # the smallest claim the rule accepts
    assert verify_claim(release(epsilon=edge * (1 + 1e-9), target_epsilon=None)).status == "ok"
    assert (
        verify_claim(release(epsilon=edge * (1 - 1e-6), target_epsilon=None)).status == "mismatch"
    )


def test_the_claim_is_recomputed_under_the_release_s_own_adjacency():
    # replace-record costs about twice as much: a claim made with the add-remove value is an under-report
    r = release(adjacency="replace-record", epsilon=eps(adjacency="add-remove-record"))
    c = verify_claim(r)
    assert c.status == "mismatch" and c.adjacency == "replace-record"
    assert c.recomputed_epsilon == pytest.approx(eps(adjacency="replace-record"), rel=1e-12)
    assert verify_claim(release(adjacency="replace-record")).status == "ok"


def test_a_steps_mismatch_fails_even_when_the_epsilon_checks_out():
    c = verify_claim(release(steps_executed=5))
    assert (c.status, c.ok) == ("mismatch", False)
    assert c.reason == c.steps_reason == "steps executed (5) differ from steps accounted (4)"
    assert c.epsilon_status == "ok"  # the two problems are told apart


def test_steps_accounted_come_from_the_guarantee_when_the_release_does_not_record_them():
    c = verify_claim(release(steps=None, steps_executed=3))
    assert c.steps_accounted == 4 and c.status == "mismatch"


def test_an_achieved_epsilon_above_the_target_fails_exactly():
    true = eps()
    c = verify_claim(release(target_epsilon=true * (1 - 1e-12)))
    assert c.status == "mismatch" and c.reason.startswith(
        f"achieved epsilon {true} exceeds the target"
    )


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(accountant="made-up", epsilon=5.0), "accountant 'made-up' cannot be recomputed"),
        (dict(delta=0.0), "delta must be in (0, 1), got 0.0"),
        (dict(guarantee={"type": "no-such-event"}), "cannot recompute the rdp epsilon"),
    ],
)
def test_a_claim_that_cannot_be_recomputed_is_unverified_never_ok(change, why):
    c = verify_claim(release(**change))
    assert (c.status, c.ok, c.recomputed_epsilon) == ("unverified", False, None) and why in c.reason


def test_a_non_private_release_makes_no_claim():
    c = verify_claim(
        release(
            non_private=True,
            guarantee={"type": "non-private"},
            epsilon=float("inf"),
            steps_executed=9,
        )
    )
    assert (c.status, c.ok, c.steps_reason) == ("no-claim", True, None)


@settings(max_examples=25, deadline=None)
@given(
    nm=st.floats(1.0, 20.0),
    steps=st.integers(1, 50),
    factor=st.floats(0.0, 0.95),
    over=st.floats(1.0, 3.0),
)
def test_property_under_reports_fail_and_over_reports_pass(nm, steps, factor, over):
    event = SubsampledGaussian(nm, 1.0, steps)
    true = eps(event)
    assert (
        verify_claim(release(event, epsilon=true * factor, target_epsilon=None)).status
        == "mismatch"
    )
    assert verify_claim(release(event, epsilon=true * over, target_epsilon=None)).status == "ok"


def test_check_accounting_is_the_same_rules_raised():
    check_accounting(steps_executed=4, steps_accounted=4, epsilon=1.0, target_epsilon=1.0)
    with pytest.raises(
        AccountingMismatchError,
        match=r"^steps executed \(3\) differ from steps accounted \(4\); the release is withheld\.$",
    ):
        check_accounting(steps_executed=3, steps_accounted=4, epsilon=1.0, target_epsilon=1.0)
    with pytest.raises(
        AccountingMismatchError,
        match=r"^achieved epsilon 1.5 exceeds the target 1.0; the release is withheld\.$",
    ):
        check_accounting(steps_executed=4, steps_accounted=4, epsilon=1.5, target_epsilon=1.0)
    with pytest.raises(
        AccountingMismatchError, match="steps executed"
    ):  # a run that cannot say is withheld
        check_accounting(steps_executed=None, steps_accounted=4, epsilon=1.0, target_epsilon=None)


# ------------------------------------------------------------------ report and ledger agree


def _tamper(folder, **fields) -> None:
    p = folder / "release.json"
    d = json.loads(p.read_text())
    d.update(fields)
    p.write_text(json.dumps(d))


def _report_check(folder) -> dict:
    r = runner.invoke(
        app, ["report", str(folder), "--format", "json"]
    )  # $DPAUDIT_LEDGER names no ledger
    assert r.exit_code == 0, r.output
    (card,) = json.loads(r.stdout)["sections"]["claim"]
    return card["accounting_check"]


def _ledger_record(folder, ledger):
    r = runner.invoke(app, ["ledger", "record", str(folder), "--ledger", str(ledger), "--json"])
    assert r.exit_code == 0, r.output
    return r


@pytest.mark.parametrize(
    "tamper, uncertified",
    [
        (lambda e: dict(epsilon=e * 0.5), False),  # under-reported claim
        (lambda e: dict(steps_executed=7), True),  # steps executed differ from the accounted ones
    ],
)
def test_report_and_ledger_give_the_same_verdict_on_a_tampered_release(
    tmp_path, monkeypatch, tamper, uncertified
):
    monkeypatch.setenv("DPAUDIT_LEDGER", str(tmp_path / "absent" / "ledger.sqlite"))
    rel = release()
    folder = tmp_path / "r"
    write_release(rel, folder)
    _tamper(folder, **tamper(rel.epsilon))
    expected = verify_claim(Release.from_dict(json.loads((folder / "release.json").read_text())))
    assert expected.status == "mismatch"

    report = _report_check(folder)
    assert report == {"status": "mismatch", "message": expected.reason}

    ledger = tmp_path / "ledger.sqlite"
    r = _ledger_record(folder, ledger)
    assert f"ACCOUNTING MISMATCH: {expected.reason}" in r.stderr
    assert json.loads(r.stdout)["id"] == rel.id  # recorded all the same: the release exists
    rows = json.loads(
        runner.invoke(app, ["ledger", "summary", "--ledger", str(ledger), "--json"]).stdout
    )["rows"]
    (row,) = [x for x in rows if x["partition"] == "train"]
    if uncertified:  # its events do not describe what ran: fail closed
        assert row["epsilon"] == float("inf") or row["epsilon"] == "inf"
    else:  # the ledger composes the stored events, not the claim
        assert row["epsilon"] == pytest.approx(
            min(eps(accountant="rdp"), eps(accountant="prv")), rel=1e-9
        )


def test_report_and_ledger_agree_that_an_untouched_release_checks_out(tmp_path, monkeypatch):
    monkeypatch.setenv("DPAUDIT_LEDGER", str(tmp_path / "absent" / "ledger.sqlite"))
    rel = release()
    write_release(rel, tmp_path / "r")
    assert _report_check(tmp_path / "r") == {"status": "ok", "message": verify_claim(rel).reason}
    r = _ledger_record(tmp_path / "r", tmp_path / "ledger.sqlite")
    assert "ACCOUNTING MISMATCH" not in r.stderr and "not verified" not in r.stderr
