"""Malformed records: every corruption gives a report or one DataError line, never a traceback,
and a corrupted bound or claim never reads as "no evidence of a violation"."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from report_fixtures import make_release, synthetic_audit, write_audit_record

from dpaudit.errors import DPAuditError
from dpaudit.reports import build_report, render_html

JUNK = st.sampled_from(
    [None, "x", "inf", "nan", -1, 0, 1e308, [], {}, [1, "a"], {"a": 1}, True, 2.5]
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("malformed")
    rel = make_release(root / "r", noise_multiplier=6.0, sample_rate=1.0, steps=5)
    res, s_in, s_out = synthetic_audit(claimed_epsilon=rel.epsilon, shift=0.3)
    write_audit_record(root / "a", res, s_in, s_out)
    return json.loads((root / "r" / "release.json").read_text()), json.loads(
        (root / "a" / "audit.json").read_text()
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corrupted_fields_never_raise_a_traceback(base, tmp_path_factory, data):
    rel, aud = json.loads(json.dumps(base[0])), json.loads(json.dumps(base[1]))
    for obj in (rel, aud):
        for key in data.draw(
            st.lists(st.sampled_from(sorted(obj)), min_size=1, max_size=3, unique=True)
        ):
            if data.draw(st.booleans()):
                obj[key] = data.draw(JUNK)
            else:
                del obj[key]
    d = tmp_path_factory.mktemp("case")
    (d / "r").mkdir()
    (d / "a").mkdir()
    (d / "r" / "release.json").write_text(json.dumps(rel))
    (d / "a" / "audit.json").write_text(json.dumps(aud))
    try:
        rep = build_report([d])
    except DPAuditError as e:
        assert "\n" not in str(e)
        return
    render_html(rep, figures=[])
    lb_ok = isinstance(aud.get("epsilon_lower_bound"), (int, float)) and not isinstance(
        aud.get("epsilon_lower_bound"), bool
    )
    if not lb_ok:
        assert all(e["status"] != "no-evidence" for e in rep["sections"]["audit"]["audits"])
