"""audit.json keeps its layout while AuditResult groups its fields into small records.

The fixed-input audits of :func:`cases` are compared, as digests per key, with
data/audit_record_golden.json, which this file run as a script printed under the flat AuditResult
of before the grouping (``PYTHONPATH=OLD/src python tests/audits/test_audit_record_layout.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import sys
import tempfile
from pathlib import Path

import numpy as np

import numpy as np

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits.engine import AuditResult, audit_scores, read_audit, run_audit
from dpaudit.audits.gaussian import GaussianTarget

GOLDEN = Path(__file__).parent / "data" / "audit_record_golden.json"

#: Keys that differ between two runs of the same audit (fresh ids, clocks, the checkout).
VOLATILE = ("id", "created_at", "git_commit", "dpaudit_version", "timings")
OLD_AUDIT = Path(__file__).parent / "old_audits" / "gaussian-broken.json"


def stable(record):
    """``record`` with every volatile value (controls' too) replaced by a marker."""
    if isinstance(record, dict):
        return {k: "<volatile>" if k in VOLATILE else stable(v) for k, v in record.items()}
    return record


def cases() -> dict:
    rng = np.random.default_rng(0)
    s_in, s_out = rng.normal(1.0, 1.0, 40), rng.normal(0.0, 1.0, 40)
    out = {
        "claim": audit_scores(s_in, s_out, delta=1e-5, claim=SubsampledGaussian(1.0, 1.0, 1)),
        "plain": audit_scores(s_in, s_out, delta=1e-5, claimed_epsilon=1.0, seed=2),
    }
    with tempfile.TemporaryDirectory() as tmp:
        kw = dict(record=False, reproducible_noise=True, seed=1)
        out["run"] = run_audit(GaussianTarget(noise_multiplier=1.0), runs=40, out_dir=tmp, **kw)
        out["shared"] = read_audit(tmp, local=False)
    broken = GaussianTarget(noise_multiplier=0.5, broken_noise_factor=2.0)
    out["sequential"] = run_audit(broken, runs=100, sequential=True, controls=(), **kw)
    old = json.loads(OLD_AUDIT.read_text())
    out["old"] = AuditResult.from_dict(old)
    # before the deciding statistic was recorded: Clopper-Pearson, with an infinite eps_LB
    bare = {k: v for k, v in old.items() if k not in ("statistic", "comparison", "controls")}
    out["bare"] = AuditResult.from_dict(bare | {"epsilon_lower_bound": "inf", "threshold": "-inf"})
    return {name: digests(stable(r.to_dict())) for name, r in out.items()}


def digests(record: dict) -> dict:
    """Key -> a digest of its value as JSON, in the record's key order (small to store, and a
    mismatch still names the key)."""
    return {k: hashlib.sha256(json.dumps(v).encode()).hexdigest()[:16] for k, v in record.items()}


def test_records_keep_the_flat_layout_of_before_the_grouping():
    """Digests per key of the same fixed-input audits written by the flat AuditResult (integ)."""
    golden, now = json.loads(GOLDEN.read_text()), cases()
    for name, keys in golden.items():
        assert list(now[name]) == list(keys), name
        assert now[name] == keys, (name, [k for k in keys if now[name].get(k) != keys[k]])


def test_grouped_record_reads_and_replaces_by_its_audit_json_keys():
    res = audit_scores([3.0, 2.5, 2.0, 4.0], [0.0, 0.5, -1.0, 0.2], delta=1e-5, claimed_epsilon=1.0)
    assert len(dataclasses.fields(AuditResult)) <= 20
    assert res.counts == res.test.counts and res.seeds == res.split.seeds
    edited = res.replace(scores_file="scores.npz", ceiling=0.5)
    assert (edited.provenance.scores_file, edited.ceiling, edited.underpowered) == (
        "scores.npz",
        0.5,
        True,
    )
    assert AuditResult.from_dict(edited.to_dict()).to_dict() == edited.to_dict()
    assert pickle.loads(pickle.dumps(res)).to_dict() == res.to_dict()


if __name__ == "__main__":
    json.dump(cases(), sys.stdout, indent=0)
