"""The DP-SGD and DP-ELM releases on the mechanism contract: one plan for release, sweep budget and audit."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

import dpaudit
from dpaudit.accounting import compute_epsilon, event_from_dict
from dpaudit.errors import UsageError
from dpaudit.requests import DPELMRequest, DPSGDRequest

SRC = Path(dpaudit.__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    """Every module a source file imports (relative imports spelled with their dots)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_import_circle_between_schedule_and_user_level():
    schedule = _imports(SRC / "mechanisms" / "dpsgd" / "schedule.py")
    user = _imports(SRC / "mechanisms" / "dpsgd" / "user_level.py")
    assert not any(m.endswith("user_level") for m in schedule)
    assert not any(m.endswith("schedule") for m in user)


def test_release_sweep_budget_and_audit_share_one_plan(tmp_path):
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
    from dpaudit.releasing import release
    from dpaudit.requests import DPSGDRequest
    from dpaudit.sweeps.tasks import planned_event

    rel = release(
        "dp-rvfl",
        DPSGDRequest(
            model="dp-rvfl",
            dataset="digits",
            epsilon=2.0,
            epochs=1,
            seed=3,
            reproducible_noise=True,
        ),
        out_dir=tmp_path / "r",
        ledger_path=tmp_path / "l.sqlite",
        progress=False,
    )
    # The claim is the RDP epsilon of the recorded event, at most the target; steps match.
    ev = event_from_dict(rel.guarantee)
    assert (
        rel.epsilon
        == compute_epsilon(ev, delta=1e-5, accountant="rdp", adjacency="add-remove-record").epsilon
        <= 2.0
    )
    assert rel.steps == rel.steps_executed == ev.steps
    # release.json records the request; the command is derived from it.
    on_disk = json.loads((tmp_path / "r" / "release.json").read_text())
    req = DPSGDRequest.from_dict(on_disk["request"])
    assert req == DPSGDRequest(
        model="dp-rvfl", dataset="digits", epsilon=2.0, epochs=1, seed=3, reproducible_noise=True
    )
    assert on_disk["command"] == req.command(out=tmp_path / "r")
    # A sweep reserves exactly the event the release spends ...
    name, partition, adjacency, planned = planned_event(
        {
            "runner": "train",
            "dataset": "digits",
            "model": "dp-rvfl",
            "epsilon": 2.0,
            "settings": {"epochs": 1},
        }
    )
    assert (name, partition, adjacency, planned.to_dict()) == (
        "digits",
        "train",
        "add-remove-record",
        rel.guarantee,
    )
    # ... and a head audit of the same request trains with the release's noise and schedule.
    t = HeadTarget(model="dp-rvfl", dataset="digits", epsilon=2.0, epochs=1, seed=3)
    t.prepare()
    assert (
        t._config.noise_multiplier,
        t._config.sample_rate,
        t._config.steps,
        t._config.normalizer,
    ) == (rel.noise_multiplier, rel.sample_rate, rel.steps, rel.normalizer)


def test_user_level_release_records_the_user_ids_file(tmp_path):
    from dpaudit.releasing import release
    from dpaudit.requests import DPSGDRequest

    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(1797) // 3)
    rel = release(
        "logistic-raw",
        DPSGDRequest(
            model="logistic-raw",
            user_ids=str(ids),
            privacy_unit="user",
            records_per_user=2,
            epochs=1,
            reproducible_noise=True,
            reference_size=419,
        ),
        out_dir=tmp_path / "r",
        ledger_path=tmp_path / "l.sqlite",
        progress=False,
    )
    assert rel.adjacency == "add-remove-user" and rel.privacy_unit == "user" and rel.epsilon <= 2.0
    assert (
        rel.request["user_ids"] == str(ids)
        and rel.request["records_per_user"] == 2
        and rel.request["privacy_unit"] == "user"
    )
    assert (
        "--user-ids" in rel.command
        and rel.config["reference_size"] == rel.request["reference_size"] == 419
    )
    with pytest.raises(
        UsageError, match="privacy_unit must be 'user' when user ids or records_per_user are given"
    ):
        from dpaudit.releasing import release
        from dpaudit.requests import DPSGDRequest

        release(
            "logistic-raw",
            DPSGDRequest(model="logistic-raw", records_per_user=2),
            out_dir=tmp_path / "x",
            progress=False,
        )


def test_dp_elm_release_and_sweep_budget_share_one_plan(tmp_path):
    from dpaudit.releasing import release
    from dpaudit.requests import DPELMRequest
    from dpaudit.sweeps.tasks import planned_event

    rel = release(
        "dp-elm",
        DPELMRequest(width=3, epsilon=1.5, reproducible_noise=True),
        out_dir=tmp_path / "r",
        ledger_path=tmp_path / "l.sqlite",
    )
    assert (
        rel.epsilon == 1.5
        and rel.delta == 0.0
        and rel.guarantee == {"type": "pure-epsilon", "epsilon": 1.5, "count": 1}
    )
    assert DPELMRequest.from_dict(rel.request) == DPELMRequest(
        width=3, epsilon=1.5, reproducible_noise=True
    )
    assert (
        rel.artefacts["out_dir"] == str(tmp_path / "r")
        and (tmp_path / "r" / "weights.npz").exists()
    )
    _, _, adjacency, planned = planned_event(
        {
            "runner": "train",
            "dataset": "digits",
            "model": "dp-elm-L3",
            "epsilon": 1.5,
            "settings": {},
        }
    )
    assert adjacency == rel.adjacency and planned.to_dict() == rel.guarantee
