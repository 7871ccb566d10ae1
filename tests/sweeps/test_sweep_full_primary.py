"""The paper's full primary suite as a builtin (`dp-rvfl-primary-full`), incl. closed-form DP-ELM tasks.

Runs on the embedded ``digits`` data (no files needed), two epochs to stay fast.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.accounting import Composed, PureEpsilon, SubsampledGaussian, compute_epsilon
from dpaudit.ledger.book import open_ledger
from dpaudit.cli import app
from dpaudit.data import DATASETS
from dpaudit.errors import BudgetExceededError, UsageError
from dpaudit.sweeps import TaskFilter, builtin_spec, open_store, parse_spec, plan, run_sweep
from dpaudit.sweeps.published import TABLE5_DP_ELM
from dpaudit.sweeps.runner import _close_reservations, budget_reserve
from dpaudit.sweeps.tables import render_html, render_markdown, sweep_tables
from dpaudit.sweeps.spec import LEGACY_MODELS, task_request, train_models, validate_block
from dpaudit.sweeps.tasks import planned_event

DP_ELM_MODELS = tuple(LEGACY_MODELS)

# Secret (default) noise: noise derived from the published seed is not private, unbounded in
# the ledger and refused against a cap; these tests compose budgets.
SPEC = """
name = "digits-elm"
[settings]
epochs = 2
[[grid]]
models = ["dp-rvfl", "dp-elm-L3"]
datasets = ["digits"]
epsilons = [2.0]
seeds = [42]
settings = { delta = 1e-5 }
[[grid]]
models = ["dp-rvfl", "dp-elm-L3"]
datasets = ["digits"]
seeds = [42]
settings = { non_private = true }
"""

# dp-rvfl-primary exactly as it was written before the full suite existed (a finished store
# exists for it: its task keys must never change).
OLD_PRIMARY = """
name = "dp-rvfl-primary"
runner = "train"
[settings]
delta = 1e-5
[[grid]]
models = ["dp-rvfl", "dp-elm-sgd", "frozen-dense-matched", "logistic-raw", "logistic-projected"]
datasets = ["mnist", "cifar10", "cardio", "heart"]
epsilons = [0.1, 0.5, 1.0, 2.0, 4.0, 8.0]
seeds = [42, 43, 44, 45, 46]
[[grid]]
models = ["dp-dense", "dp-cnn"]
datasets = ["mnist", "cifar10", "cardio", "heart"]
epsilons = [2.0]
seeds = [42, 43, 44, 45, 46]
[[grid]]
models = ["dp-attention"]
datasets = ["mnist", "cifar10"]
epsilons = [2.0]
seeds = [42, 43, 44, 45, 46]
"""
# SHA-256 of the concatenated sorted task keys of dp-rvfl-primary, computed before this change.
OLD_PRIMARY_KEYS_SHA256 = "7ba1cc94652b4680b4e5b503647d7ad8954535542fffe1b4dc54c451c68476fc"
GRADIENT = (
    "dp-rvfl",
    "dp-elm-sgd",
    "frozen-dense-matched",
    "logistic-raw",
    "logistic-projected",
    "dp-dense",
    "dp-cnn",
)


def _runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 always separates stderr
        return CliRunner()


def _fake_data_dir(root: Path, without=("cifar10",)) -> Path:
    """Empty files where the registry looks for each dataset (only presence is checked by plan)."""
    for name, info in DATASETS.items():
        if name in without:
            continue
        for f in info.files:
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text("")
    return root


# -------------------------------------------------------------------------------- spec level


def test_dp_elm_names_are_train_models_and_unknown_names_are_refused():
    from dpaudit.mechanisms.elm.mechanism import ELM_WIDTHS
    from dpaudit.requests import DPELMRequest

    assert tuple(fixed["width"] for _, fixed in LEGACY_MODELS.values()) == ELM_WIDTHS
    assert DP_ELM_MODELS == ("dp-elm-L1", "dp-elm-L3", "dp-elm-L5", "dp-elm-L10")
    validate_block(
        "train",
        list(DP_ELM_MODELS) + ["dp-elm"],
        ["digits"],
        {"delta": 1e-5, "epochs": 2},
        "grid block 1",
    )
    # a legacy name is the catalogue's dp-elm at that width (delta and epochs do not apply to it)
    config = {
        "runner": "train",
        "model": "dp-elm-L3",
        "dataset": "digits",
        "epsilon": 2.0,
        "seed": 42,
        "settings": {"delta": 1e-5, "epochs": 2},
    }
    assert task_request(config) == (
        "dp-elm",
        DPELMRequest(dataset="digits", width=3, epsilon=2.0, seed=42),
    )
    assert set(train_models()) >= set(GRADIENT) | set(DP_ELM_MODELS) | {"dp-elm"}
    for bad in (
        "dp-elm-L2",
        "dp-elm-l3",
        "dp-mixmin",
        "gaussian",
    ):  # unknown, no dataset in the request, audit-only
        with pytest.raises(UsageError) as e:
            parse_spec(
                f'name = "x"\nmodels = ["{bad}"]\ndatasets = ["digits"]\nepsilons = [2.0]\nseeds = [42]\n'
            )
        msg = str(e.value)
        assert "\n" not in msg and msg.endswith(f"got {bad!r}.")
        assert all(m in msg for m in train_models())  # the allowed names are listed


def test_full_builtin_expands_to_the_papers_1540_primary_tasks():
    spec = builtin_spec("dp-rvfl-primary-full")
    tasks = spec.tasks()
    assert len(tasks) == (7 + 4) * 4 * (6 + 1) * 5 == 1540
    assert len({t.key for t in tasks}) == 1540
    assert {t.model for t in tasks} == set(GRADIENT) | set(DP_ELM_MODELS)  # no attention control
    assert {t.dataset for t in tasks} == {"mnist", "cifar10", "cardio", "heart"}
    assert {t.seed for t in tasks} == {42, 43, 44, 45, 46}
    for m in GRADIENT + DP_ELM_MODELS:
        assert {t.epsilon for t in tasks if t.model == m} == {None, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0}, m
    for t in tasks:
        s = dict(t.settings)
        assert (t.epsilon is None) == bool(s.get("non_private"))
        # Gaussian private runs at delta = 1e-5; DP-ELM is pure (delta = 0) and carries none.
        assert ("delta" in s) == (t.model in GRADIENT and t.epsilon is not None)
        if "delta" in s:
            assert s["delta"] == 1e-5
    # a private gradient task is the same task (same key) as in dp-rvfl-primary
    old = {t.key for t in builtin_spec("dp-rvfl-primary").tasks()}
    shared = {t.key for t in tasks} & old
    assert len(shared) == 5 * 4 * 6 * 5 + 2 * 4 * 5
    assert (
        "cluster" in spec.description
        and "--executor dask" in spec.description
        and "CIFAR-10" in spec.description
    )


def test_dp_rvfl_primary_is_unchanged():
    spec = builtin_spec("dp-rvfl-primary")
    keys = sorted(t.key for t in spec.tasks())
    assert len(keys) == 650
    assert keys == sorted(t.key for t in parse_spec(OLD_PRIMARY).tasks())
    assert hashlib.sha256("".join(keys).encode()).hexdigest() == OLD_PRIMARY_KEYS_SHA256
    assert not any(t.model.startswith("dp-elm-L") for t in spec.tasks())


def test_plan_without_cifar10_counts_1155_tasks(tmp_path):
    dd = _fake_data_dir(tmp_path / "data")
    tasks, skipped = plan(builtin_spec("dp-rvfl-primary-full"), data_dir=dd)
    assert set(skipped) == {"cifar10"} and len(tasks) == 1540 - 385 == 1155
    assert len(plan(builtin_spec("dp-rvfl-primary"), data_dir=dd)[0]) == 485
    r = _runner().invoke(
        app,
        [
            "sweep",
            "--builtin",
            "dp-rvfl-primary-full",
            "--plan",
            "--data-dir",
            str(dd),
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["tasks"], out["pending"], out["done"], list(out["skipped_datasets"])) == (
        1155,
        1155,
        0,
        ["cifar10"],
    )
    assert not (tmp_path / "out").exists()  # --plan runs (and creates) nothing
    r = _runner().invoke(
        app,
        [
            "sweep",
            "--builtin",
            "dp-rvfl-primary-full",
            "--plan",
            "--data-dir",
            str(dd),
            "--dataset",
            "heart",
            "--out",
            str(tmp_path / "out"),
            "--json",
        ],
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["tasks"] == 385


# -------------------------------------------------------------------------------- accounting


def test_planned_event_of_a_dp_elm_task_is_pure_epsilon():
    tasks = {(t.model, t.epsilon): t for t in parse_spec(SPEC).tasks()}
    assert planned_event(tasks[("dp-elm-L3", 2.0)].config()) == (
        "digits",
        "train",
        "add-remove-record",
        PureEpsilon(2.0),
    )
    assert planned_event(tasks[("dp-elm-L3", None)].config()) == (
        "digits",
        "train",
        "add-remove-record",
        None,
    )
    ds, part, adj, ev = planned_event(tasks[("dp-rvfl", 2.0)].config())
    assert (ds, part, adj) == ("digits", "train", "add-remove-record") and isinstance(
        ev, SubsampledGaussian
    )


def test_cap_preflight_composes_pure_dp_elm_with_gaussian_tasks(tmp_path):
    private = [t for t in parse_spec(SPEC).tasks() if t.epsilon is not None]
    gauss = next(t for t in private if t.model == "dp-rvfl")
    elm = next(t for t in private if t.model == "dp-elm-L3")
    ev = planned_event(gauss.config())[3]
    both = compute_epsilon(Composed((ev, PureEpsilon(2.0))), delta=1e-5, accountant="rdp").epsilon
    alone = compute_epsilon(ev, delta=1e-5, accountant="rdp").epsilon
    cap = (max(alone, 2.0) + both) / 2.0  # each task fits alone, the two together do not
    assert max(alone, 2.0) < cap < both
    ledger = tmp_path / "ledger.sqlite"
    with open_ledger(ledger) as led:
        led.cap("digits", cap, 1e-5)
    held = budget_reserve([gauss], ledger, "s")
    assert len(held) == 1
    with pytest.raises(BudgetExceededError, match="exceeded"):  # the held sweep budget counts
        budget_reserve([elm], ledger, "t")
    _close_reservations(held, ledger, "s")
    _close_reservations(budget_reserve([elm], ledger, "t"), ledger, "t")
    with pytest.raises(BudgetExceededError, match="exceeded"):
        budget_reserve([gauss, elm], ledger, "u")
    with open_ledger(ledger) as led:  # a refused sweep holds nothing
        assert led.open_reservations() == []
    # three pure eps = 2 DP-ELM tasks alone are far over a cap of 4
    elms = [
        t
        for t in parse_spec(SPEC.replace("seeds = [42]", "seeds = [42, 43, 44]")).tasks()
        if t.model == "dp-elm-L3" and t.epsilon
    ]
    with open_ledger(tmp_path / "l2.sqlite") as led:
        led.cap("digits", 4.0, 1e-5)
    with pytest.raises(BudgetExceededError, match="exceeded"):
        budget_reserve(elms, tmp_path / "l2.sqlite", "s")


def test_a_sweep_with_dp_elm_over_the_cap_is_refused_before_anything_runs(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    with open_ledger(ledger) as led:
        led.cap("digits", 3.0, 1e-5)
    spec = parse_spec(
        SPEC.replace('"dp-rvfl", "dp-elm-L3"', '"dp-elm-L3"').replace(
            "seeds = [42]", "seeds = [42, 43]"
        )
    )
    with pytest.raises(BudgetExceededError, match="exceeded"):
        run_sweep(
            spec, out=tmp_path, ledger_path=ledger, task_filter=TaskFilter(epsilons=(2.0,))
        )  # 2 x pure 2 > 3
    with open_ledger(ledger) as led:
        assert led.entries(dataset="digits", kind="release") == []


# -------------------------------------------------------------------------------- end to end


def test_tiny_mixed_sweep_runs_records_and_tabulates(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    spec = parse_spec(SPEC)
    s = run_sweep(spec, out=tmp_path, ledger_path=ledger, task_filter=TaskFilter(epsilons=(2.0,)))
    assert (s.ran_ok, s.failed) == (2, 0), s.failures
    with open_store(tmp_path / "digits-elm", create=False) as st:
        rows = {r.config["model"]: r for r in st.rows(status="done")}
    elm = rows["dp-elm-L3"].result
    assert (
        elm["mechanism"],
        elm["epsilon"],
        elm["delta"],
        elm["accountant"],
        elm["adjacency"],
    ) == ("dp-elm", 2.0, 0.0, "pure", "add-remove-record")
    assert elm["width"] == 3 and elm["noise_scale"] == pytest.approx(3 * 5 / 2.0)
    assert 0.0 <= elm["metrics"]["accuracy"] <= 1.0 and "f1_macro" in elm["metrics"]
    rel = json.loads((Path(elm["release_dir"]) / "release.json").read_text())
    assert rel["config"]["sweep"]["name"] == "digits-elm" and rel["config"]["width"] == 3
    assert Path(elm["release_dir"]).parts[-4:-1] == ("dp-elm-L3", "digits", "eps2")
    with open_ledger(ledger) as led:
        entries = led.entries(dataset="digits", kind="release")
        total = next(x for x in led.summary("digits") if x["partition"] == "*")
    assert sorted(e.id for e in entries) == sorted(r.result["release_id"] for r in rows.values())
    # the ledger composes the pure DP-ELM event with the Gaussian one: finite, more than either
    gauss_eps = rows["dp-rvfl"].result["epsilon"]
    assert math.isfinite(total["epsilon"]) and total["epsilon"] > max(gauss_eps, 2.0)
    assert total["epsilon_pure"] is None  # a mixed tree is not pure-only

    s2 = run_sweep(spec, out=tmp_path, ledger_path=ledger)  # now the non-private block too
    assert (s2.ran_ok, s2.skipped_finished, s2.done, s2.failed) == (2, 2, 4, 0), s2.failures
    with open_ledger(ledger) as led:
        total = next(x for x in led.summary("digits") if x["partition"] == "*")
    assert total["epsilon"] == math.inf  # a non-private release spends without bound

    from dpaudit.sweeps import load_records

    _, records = load_records(tmp_path / "digits-elm")
    tables = sweep_tables(records, name="digits-elm")
    json.dumps(tables)
    acc = {(c["model"], c["epsilon"]) for c in tables["cells"] if c["metric"] == "accuracy"}
    assert acc == {(m, e) for m in ("dp-rvfl", "dp-elm-L3") for e in (2.0, None)}
    labels = {
        (r["model"], r["published_source"])
        for r in tables["table3"]["rows"]
        if r["dataset"] == "digits"
    }
    assert (
        "dp-elm-L3",
        None,
    ) in labels  # no published digits value; the row is there with our result
    md = render_markdown(tables)
    assert "| digits | dp-elm-L3 |" in md and "eps=non-private" in md


# -------------------------------------------------------------------------------- tables


def _rec(model, dataset, seed, acc, eps=2.0):
    return {
        "model": model,
        "dataset": dataset,
        "epsilon": eps,
        "seed": seed,
        "metrics": {"accuracy": acc},
    }


def test_eps2_slice_shows_dp_elm_widths_next_to_table5():
    recs = [
        _rec("dp-elm-L10", "heart", s, a)
        for s, a in zip(range(42, 47), (0.4, 0.45, 0.5, 0.35, 0.3))
    ]
    recs += [_rec("dp-rvfl", "heart", s, 0.6) for s in range(42, 47)]
    t3 = sweep_tables(recs)["table3"]
    by = {r["model"]: r for r in t3["rows"]}
    assert [m for m in by if m.startswith("dp-elm-L")] == list(
        DP_ELM_MODELS
    )  # all widths, in order
    r10 = by["dp-elm-L10"]
    assert (r10["label"], r10["published_mean"], r10["published_sd"], r10["published_source"]) == (
        "DP-ELM L=10",
        41.30,
        13.40,
        "Table 5, DP-ELM, pure DP",
    )
    assert r10["mean"] == pytest.approx(40.0) and r10["difference"] == pytest.approx(40.0 - 41.30)
    assert by["dp-elm-L3"]["mean"] is None and by["dp-elm-L3"]["published_mean"] == 59.57
    assert by["dp-rvfl"]["published_source"] == "Table 3" and "Table 5" in t3["citation"]
    md = render_markdown(sweep_tables(recs))
    assert (
        "| DP-ELM L=10 | Heart | 40.00 ± 7.91 | 5 | 41.30 ± 13.40 (Table 5, DP-ELM, pure DP) | -1.30 |"
        in md
    )
    assert "Table 5, DP-ELM, pure DP" in render_html(sweep_tables(recs))
    # no DP-ELM result: no Table 5 rows and the citation is Table 3's alone
    plain = sweep_tables([r for r in recs if r["model"] == "dp-rvfl"])["table3"]
    assert (
        not any(r["model"].startswith("dp-elm-L") for r in plain["rows"])
        and "Table 5" not in plain["citation"]
    )


def test_non_private_results_are_a_separate_contrast_family():
    models = ("dp-rvfl",) + DP_ELM_MODELS
    recs = [
        _rec(m, "heart", s, 0.5 + 0.01 * s + (0.05 if m == "dp-rvfl" else 0.0), eps=e)
        for m in models
        for s in range(42, 47)
        for e in (0.5, 2.0, None)
    ]
    t = sweep_tables(recs)
    assert t["reference"] == "dp-rvfl"
    # private family: 2 budgets x 4 comparators (accuracy only), as in the paper's 960 = 4 x 6 x 10 x 4
    assert t["contrast_family_size"] == 2 * 4 and all(
        c["epsilon"] is not None for c in t["contrasts"]
    )
    assert t["non_private_family_size"] == 4 and all(
        c["epsilon"] is None for c in t["non_private_contrasts"]
    )
    # Holm over 8 p-values of 0.0625 vs over 4: the families are adjusted separately
    assert {c["p_holm"] for c in t["contrasts"]} == {min(1.0, 8 * 0.0625)}
    assert {c["p_holm"] for c in t["non_private_contrasts"]} == {min(1.0, 4 * 0.0625)}
    assert all(w["conditions"] == 2 for w in t["win_tie_loss"])  # private conditions only
    # the eps = 2 slice ignores non-private results
    assert all(r["n"] in (0, 5) for r in t["table3"]["rows"])
    md = render_markdown(t)
    assert (
        "## Non-private paired contrasts (4 in their own Holm family)" in md
        and "| heart | non-private | accuracy |" in md
    )


def test_table5_transcription_matches_the_paper_text():
    paper = Path(__file__).resolve().parents[3] / "shared" / "papers" / "001_5ae1aa25002ee196.txt"
    if not paper.exists():
        pytest.skip(f"paper text not found at {paper}")
    import re

    block = paper.read_text().split("Table 5. Numerical DP-ELM test accuracy", 1)[1]
    lines = block.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("Width L\t"))
    assert lines[head].split("\t")[1:] == ["MNIST", "CIFAR-10", "Cardio", "Heart"]
    found = {}
    for line in lines[head + 1 : head + 5]:
        width, *cols = line.split("\t")
        found[int(width)] = dict(
            zip(
                ("mnist", "cifar10", "cardio", "heart"),
                (
                    tuple(
                        float(v) for v in re.fullmatch(r"([\d.]+) ± ([\d.]+)", c.strip()).groups()
                    )
                    for c in cols
                ),
            )
        )
    assert found == TABLE5_DP_ELM


def test_sweep_reservation_holds_the_tasks_noise_tails(tmp_path, monkeypatch):
    """Each task's up-front reservation holds its planned sampler tail delta with its event
    (planned_release; as a single run's reservation does). The DP-SGD heads plan their tail from
    public dimensions; the plumbing is tested with planned tails put in."""
    import dpaudit.sweeps.runner as runner_mod
    import dpaudit.sweeps.tasks as tasks_mod

    private = [t for t in parse_spec(SPEC).tasks() if t.epsilon is not None]
    gauss = next(t for t in private if t.model == "dp-rvfl")
    elm = next(t for t in private if t.model == "dp-elm-L3")
    assert tasks_mod.planned_release(elm.config())[4] == 0.0
    assert (
        tasks_mod.planned_release(gauss.config())[4] > 0.0
    )  # steps x noised head weights, known before training
    real = tasks_mod.planned_release
    monkeypatch.setattr(
        runner_mod,
        "planned_release",
        lambda config: real(config)[:4] + (3e-12 if config["model"] == "dp-rvfl" else 0.0,),
    )
    ledger = tmp_path / "ledger.sqlite"
    with open_ledger(ledger) as led:
        led.cap("digits", 100.0, 1e-5)
    held = budget_reserve([gauss, gauss, elm], ledger, "s")  # a task is reserved once
    assert set(held) == {gauss.key, elm.key}
    with open_ledger(ledger) as led:
        tails = {
            e.id: e.payload.get("noise_tail_delta", 0.0) for e in led.open_reservations("digits")
        }
    assert tails == {held[gauss.key]: pytest.approx(3e-12, rel=1e-12), held[elm.key]: 0.0}
    _close_reservations(held, ledger, "s")
    with open_ledger(ledger) as led:
        assert led.open_reservations() == []
