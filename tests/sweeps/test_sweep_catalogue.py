"""Sweeps are generic over the catalogue: a train task is a catalogue name + its Request, planned by
the mechanism's own ``plan`` and released by the one release skeleton."""

from __future__ import annotations

from dpaudit.records import read_release
from dpaudit.requests import DPELMRequest
from dpaudit.sweeps import open_store, parse_spec, run_sweep
from dpaudit.sweeps.spec import task_request
from dpaudit.sweeps.tasks import planned_event

SPEC = """
name = "cat"
models = ["noisy-sum", "dp-elm"]
datasets = ["digits"]
epsilons = [1.0]
seeds = [42]
[settings]
delta = 1e-5
"""


def test_any_catalogue_entry_whose_request_takes_a_dataset_is_a_sweep_model(tmp_path):
    spec = parse_spec(SPEC)
    summary = run_sweep(spec, out=tmp_path, ledger_path=tmp_path / "ledger.sqlite")
    assert (summary.done, summary.failed) == (2, 0)
    with open_store(tmp_path / "cat", create=False) as st:
        done = {r.config["model"]: r.result for r in st.rows(status="done")}
    for task in spec.tasks():
        name, request = task_request(task.config())
        rel = read_release(done[task.model]["release_dir"])
        # the release is the catalogue mechanism's, made for the task's Request ...
        assert (
            rel.mechanism == name == task.model
            and rel.request["epsilon"] == 1.0
            and rel.request["seed"] == 42
        )
        # ... and the sweep reserved exactly the event it spent, from the same plan
        assert planned_event(task.config())[3].to_dict() == rel.guarantee
        assert rel.config["sweep"] == {"name": "cat", "task": task.key}
    # a setting reaches a Request only where it has the field: DP-ELM (pure DP) takes no delta
    assert task_request(spec.tasks()[1].config())[1] == DPELMRequest(
        dataset="digits", epsilon=1.0, seed=42
    )
    assert (
        done["dp-elm"]["width"] == 10
        and done["dp-elm"]["delta"] == 0.0
        and done["noisy-sum"]["delta"] == 1e-5
    )
