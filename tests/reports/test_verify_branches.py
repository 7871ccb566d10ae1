"""The verdicts of `dpaudit verify`'s plan checks that a whole bundle rarely reaches: a plan the
ledger never registered, an older plan naming no target, and the runs of a plan (a hidden run
fails, an unrecorded audit fails, a second run is noted)."""

from __future__ import annotations

from dpaudit.reports.verify import Check, _registered_first_check, _runs_check

PID = "p" * 20


def test_an_unregistered_plan_fails_and_an_older_plan_without_target_is_noted():
    target = {"release": "r" * 20}
    unregistered = Check(
        "registered first", PID[:12], "FAIL", "the ledger holds no registration of it"
    )
    assert _registered_first_check(PID, target, None, []) == unregistered
    assert _registered_first_check(PID, None, None, []) == unregistered
    older = Check("registered first", PID[:12], "note", "it names no target (an older plan)")
    assert _registered_first_check(PID, None, (3, "key", {}), []) == older
    assert _registered_first_check(PID, target, (3, "key", {}), []).status == "pass"


def test_runs_of_a_plan_fail_when_hidden_or_unrecorded_and_are_noted_when_repeated():
    one, two = _runs_check(PID, ["a1"], ["a1"]), _runs_check(PID, ["a1", "a2"], ["a1", "a2"])
    assert (one.status, one.detail) == (
        "pass",
        f"1 run of plan {PID[:12]} in the ledger, all in the bundle",
    )
    assert (two.status, two.detail) == (
        "note",
        f"2 runs of plan {PID[:12]} in the ledger, all in the bundle",
    )
    hidden = _runs_check(PID, ["a1", "a2"], ["a1", "a3"])
    assert hidden.status == "FAIL" and hidden.detail == (
        f"2 runs of plan {PID[:12]} in the ledger, 2 in the bundle; not in the bundle: a2; "
        "not recorded under the plan: a3"
    )
