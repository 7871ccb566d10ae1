"""The release path of DP-MixMin: calibration, ledger pre-check, partitions, composition (Figure 1, A.7)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpaudit.accounting import compute_epsilon, event_from_dict
from dpaudit.ledger.book import open_ledger
from dpaudit.errors import BudgetExceededError, UsageError
from dpaudit.records import read_release
from dpaudit.releasing import release
from dpaudit.requests import MixMinRequest


def mixmin_release(*, out_dir, record=True, ledger_path=None, **request):
    """One DP-MixMin release through the generic path (``release("mixmin", request)``)."""
    return release(
        "mixmin", MixMinRequest(**request), out_dir=out_dir, record=record, ledger_path=ledger_path
    )


FAST_MIX = dict(steps=30)


def test_mixture_release_records_lambda_and_guarantee(tmp_path):
    r = mixmin_release(
        task="digits-mix",
        target="loops-0689",
        epsilon=1.0,
        rho=0.3,
        out_dir=tmp_path / "m",
        **FAST_MIX,
        reproducible_noise=True,
    )
    assert r.mechanism == "dp-mixmin" and r.adjacency == "add-remove-record"
    assert set(r.metrics["weights"]) == {f"digit-{i}" for i in range(10)}
    assert abs(sum(r.metrics["weights"].values()) - 1) < 1e-9
    assert r.epsilon <= 1.0 and r.steps_executed == r.steps == 30
    ev = event_from_dict(r.guarantee)
    assert compute_epsilon(ev, delta=r.delta).epsilon == pytest.approx(r.epsilon)
    assert r.sample_rate == pytest.approx(
        r.normalizer / round(0.3 * 1257)
    )  # q = B / round(rho N0), N0 the task's declared size
    assert r.config["reference_size"] == 1257 and "n_mix_units" not in r.config
    assert (
        r.config["step_size"] == 0.5 and r.clipping_norm == 1.0
    )  # the embedded task's public default C
    back = read_release(tmp_path / "m")
    assert back.id == r.id
    with open_ledger() as L:
        rel = L.entries(dataset="digits-mix", kind="release")
        parts = L.entries(dataset="digits-mix", kind="partition")
    assert len(rel) == 1 and rel[0].payload["partition"] == r.partition
    assert parts[0].payload["children"] == [r.partition, r.partition[:-4] + "/ft"]


def test_reproducible_noise_reproduces_lambda(tmp_path):
    a = mixmin_release(
        task="digits-mix",
        rho=0.3,
        out_dir=tmp_path / "a",
        **FAST_MIX,
        reproducible_noise=True,
        record=False,
    )
    b = mixmin_release(
        task="digits-mix",
        rho=0.3,
        out_dir=tmp_path / "b",
        **FAST_MIX,
        reproducible_noise=True,
        record=False,
    )
    c = mixmin_release(task="digits-mix", rho=0.3, out_dir=tmp_path / "c", **FAST_MIX, record=False)
    assert a.metrics["weights"] == b.metrics["weights"] != c.metrics["weights"]
    assert a.noise_source["source"] == "reproducible" and c.noise_source["secret"]


def test_pipeline_parallel_two_releases_on_disjoint_children(tmp_path):
    r = mixmin_release(
        task="digits-mix",
        stage="pipeline",
        epsilon=2.0,
        rho=0.3,
        out_dir=tmp_path / "p",
        **FAST_MIX,
    )
    assert r.mechanism == "dp-mixmin-finetune" and r.partition.endswith("/ft")
    assert (
        0.0 <= r.metrics["auc"]["finetuned"] <= 1.0 and 0.0 <= r.metrics["auc"]["pretrained"] <= 1.0
    )
    mix = read_release(tmp_path / "p" / "mixture")
    assert mix.partition.endswith("/mix") and mix.target_epsilon == 2.0 and r.target_epsilon == 2.0
    e2e = r.metrics["end_to_end"]
    assert e2e["composition"] == "parallel"
    assert e2e["epsilon"]["rdp"] == pytest.approx(max(mix.epsilon, r.epsilon), rel=1e-9)
    with open_ledger() as L:
        rels = L.entries(dataset="digits-mix", kind="release")
        summary = {row["partition"]: row for row in L.summary("digits-mix")}
    assert {e.payload["partition"] for e in rels} == {mix.partition, r.partition}
    total = summary["*"]["epsilon"]
    assert total <= 2.0 + 1e-9  # parallel: the max, not the sum
    pipeline = json.loads((tmp_path / "p" / "pipeline.json").read_text())
    assert pipeline["mixture"]["id"] == mix.id


def test_pipeline_sequential_splits_epsilon(tmp_path):
    r = mixmin_release(
        task="digits-mix",
        stage="pipeline",
        composition="sequential",
        epsilon=2.0,
        rho=0.25,
        out_dir=tmp_path / "s",
        **FAST_MIX,
    )
    mix = read_release(tmp_path / "s" / "mixture")
    assert mix.target_epsilon == pytest.approx(0.5) and r.target_epsilon == pytest.approx(1.5)
    assert mix.partition == r.partition == "train"
    assert (
        mix.normalizer == 1000 and mix.sample_rate == 1000 / 1257
    )  # all N0 private training records
    assert r.sample_rate == pytest.approx(
        1 / math.ceil(1257 / 64)
    )  # digits-mix fine-tunes in batches of 64
    with open_ledger() as L:
        summary = {row["partition"]: row for row in L.summary("digits-mix")}
    assert summary["*"]["epsilon"] <= 2.0 + 1e-9
    assert summary["*"]["naive_epsilon"] == pytest.approx(mix.epsilon + r.epsilon)


def test_budget_cap_refuses_before_training(tmp_path):
    with open_ledger() as L:
        L.cap("digits-mix", 0.5, 1e-5)
    with pytest.raises(BudgetExceededError, match="refused before training"):
        mixmin_release(task="digits-mix", epsilon=1.0, out_dir=tmp_path / "x", **FAST_MIX)
    assert not (tmp_path / "x").exists()
    with open_ledger() as L:
        assert L.entries(dataset="digits-mix", kind="release") == []


def test_user_level_mixture(tmp_path):
    r = mixmin_release(
        task="digits-mix",
        privacy_unit="user",
        records_per_user=3,
        rho=0.5,
        out_dir=tmp_path / "u",
        **FAST_MIX,
    )
    assert r.adjacency == "add-remove-user" and r.config["records_per_user"] == 3
    assert r.normalizer == round(
        0.5 * math.ceil(1257 / 3)
    )  # round(rho U0) of U0 = ceil(N0 / G) users
    with pytest.raises(UsageError, match="privacy_unit must be record for stage pipeline"):
        mixmin_release(
            task="digits-mix", privacy_unit="user", stage="pipeline", out_dir=tmp_path / "v"
        )


def test_proxy_predictions_file(tmp_path):
    rng = np.random.default_rng(0)
    probs = rng.uniform(0.05, 0.95, size=(400, 3))
    labels = (rng.random(400) < probs[:, 2]).astype(float)
    f = tmp_path / "pp.npz"
    np.savez(f, probs=probs, labels=labels, source_names=np.array(["web", "code", "math"]))
    r = mixmin_release(
        proxy_predictions=str(f),
        epsilon=4.0,
        out_dir=tmp_path / "pp",
        steps=50,
        batch_size=1000,
        clipping_norm=5.0,
        reference_size=400,
    )
    assert list(r.metrics["weights"]) == ["web", "code", "math"]
    # Named by content (the keyed fingerprint of the arrays), not by the file name.
    from dpaudit.ledger.book import open_ledger

    with open_ledger() as led:
        assert (
            r.dataset["name"]
            == "proxy-predictions-" + led.get(r.id).payload["dataset_fingerprint"][:12]
            and r.partition == "train"
        )
    assert (
        r.config["reference_size"] == 400
        and r.sample_rate == 1.0
        and r.normalizer == 400
        and "n" not in r.dataset
    )
    with pytest.raises(UsageError, match="stage must be mixture"):
        mixmin_release(
            proxy_predictions=str(f), stage="pipeline", out_dir=tmp_path / "q", reference_size=400
        )
