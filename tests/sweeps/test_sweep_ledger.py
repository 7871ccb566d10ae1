"""A sweep's releases go into the ledger (tagged with the sweep) and caps are enforced up front.

Uses the embedded ``digits`` data (no files needed), two epochs to stay fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpaudit.accounting.ledger import open_ledger
from dpaudit.errors import BudgetExceededError
from dpaudit.sweeps import open_store, parse_spec, run_sweep

SPEC = """
name = "digits-tiny"
models = ["dp-rvfl", "logistic-raw"]
datasets = ["digits"]
epsilons = [2.0]
seeds = [42]
[settings]
delta = 1e-5
reproducible_noise = true
epochs = 2
"""


def test_sweep_releases_are_recorded_and_composed(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    s = run_sweep(parse_spec(SPEC), out=tmp_path, ledger_path=ledger_path)
    assert (s.done, s.failed) == (2, 0), s.failures
    with open_store(tmp_path / "digits-tiny", create=False) as st:
        rows = st.rows(status="done")
    with open_ledger(ledger_path) as led:
        entries = led.entries(dataset="digits", kind="release")
        summary = led.summary("digits")
    assert sorted(e.id for e in entries) == sorted(r.result["release_id"] for r in rows)
    for r in rows:
        rel = json.loads((Path(r.result["release_dir"]) / "release.json").read_text())
        assert rel["config"]["sweep"] == {"name": "digits-tiny", "task": r.key}
        assert rel["epsilon"] <= 2.0 and rel["noise_source"]["source"] == "reproducible"
        assert Path(r.result["release_dir"]).is_relative_to((tmp_path / "digits-tiny").resolve())
    assert {e.payload["artefact_path"] for e in entries} == {r.result["release_dir"] for r in rows}
    total = next(x for x in summary if x["partition"] == "*")
    assert total["epsilon"] > 2.0  # two runs on the same records cost more than either alone
    # resuming records nothing twice
    again = run_sweep(parse_spec(SPEC), out=tmp_path, ledger_path=ledger_path)
    assert again.ran == 0
    with open_ledger(ledger_path) as led:
        assert len(led.entries(dataset="digits", kind="release")) == 2


def test_a_sweep_over_the_cap_is_refused_before_any_task_runs(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with open_ledger(ledger_path) as led:
        led.cap("digits", 3.0, 1e-5)
    bigger = parse_spec(SPEC.replace("seeds = [42]", "seeds = [42, 43]"))  # 4 runs at eps 2 > cap 3
    with pytest.raises(BudgetExceededError, match="exceeded"):
        run_sweep(bigger, out=tmp_path, ledger_path=ledger_path)
    with open_store(tmp_path / "digits-tiny", create=False) as st:
        assert st.counts() == {"pending": 4, "done": 0, "failed": 0}
    with open_ledger(ledger_path) as led:
        assert led.entries(dataset="digits", kind="release") == []
