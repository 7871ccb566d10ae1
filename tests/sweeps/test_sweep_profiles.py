"""Preprocessing profiles as a sweep grid axis (``profiles = [...]``, ``--profile authors``).

The default profile adds nothing to a task, so every grid written before the axis keeps its
task keys (the dp-rvfl-primary keys are also pinned in test_sweep_full_primary.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.errors import UsageError
from dpaudit.sweeps import builtin_spec, load_records, parse_spec, run_sweep
from dpaudit.sweeps.runner import plan
from dpaudit.sweeps.spec import with_profile
from dpaudit.sweeps.tables import render_markdown, sweep_tables
from dpaudit.sweeps.tasks import planned_event, task_dir

BASE = """
name = "p"
models = ["dp-rvfl", "logistic-raw"]
datasets = ["heart", "cardio"]
epsilons = [2.0]
seeds = [42, 43]
[settings]
delta = 1e-5
"""


def test_default_profile_keeps_task_keys():
    plain = parse_spec(BASE)
    explicit = parse_spec(
        BASE.replace("seeds = [42, 43]", 'seeds = [42, 43]\nprofiles = ["default"]')
    )
    assert [t.key for t in plain.tasks()] == [t.key for t in explicit.tasks()]
    assert all("profile" not in dict(t.settings) for t in explicit.tasks())
    assert with_profile(plain, None) is plain and with_profile(plain, "default") is plain
    # a profile equal to the dataset's own default is the default too
    digits = parse_spec(BASE.replace('["heart", "cardio"]', '["digits"]'))
    raw = parse_spec(
        BASE.replace('["heart", "cardio"]', '["digits"]').replace(
            "seeds = [42, 43]", 'seeds = [42, 43]\nprofile = "raw01"'
        )
    )
    assert [t.key for t in digits.tasks()] == [t.key for t in raw.tasks()]


def test_profiles_axis_expands_and_gives_new_keys():
    both = parse_spec(
        BASE.replace("seeds = [42, 43]", 'seeds = [42, 43]\nprofiles = ["default", "authors"]')
    )
    tasks = both.tasks()
    assert len(tasks) == 2 * len(parse_spec(BASE).tasks())
    default_keys = {t.key for t in parse_spec(BASE).tasks()}
    authors = [t for t in tasks if dict(t.settings).get("profile") == "authors"]
    assert len(authors) == len(tasks) // 2 and not {t.key for t in authors} & default_keys
    assert {t.key for t in tasks} - {t.key for t in authors} == default_keys
    grid = both.to_dict()["grid"][0]
    assert (
        grid["profiles"] == ["default", "authors"]
        and "profiles" not in parse_spec(BASE).to_dict()["grid"][0]
    )


def test_builtin_with_profile_authors():
    spec = builtin_spec("dp-rvfl-primary")
    moved = with_profile(spec, "authors")
    assert moved.name == "dp-rvfl-primary-authors" and moved.source.endswith("--profile authors")
    tasks = moved.tasks()
    assert len(tasks) == len(spec.tasks()) == 650
    assert all(dict(t.settings)["profile"] == "authors" for t in tasks)
    assert not {t.key for t in tasks} & {t.key for t in spec.tasks()}
    # the settings other than the profile are those of the builtin
    assert {tuple((k, v) for k, v in t.settings if k != "profile") for t in tasks} == {
        t.settings for t in spec.tasks()
    }


@pytest.mark.parametrize(
    "text,match",
    [
        ('profiles = ["authors"]', "profile for dataset digits must be one of default"),
        ("profiles = []", "profiles must be a non-empty list"),
        ('profiles = ["centered"]', "profile for dataset heart"),
        ("profiles = [3]", "profiles must be a non-empty list"),
    ],
)
def test_bad_profiles_are_refused_when_the_spec_is_read(text, match):
    src = BASE.replace("seeds = [42, 43]", f"seeds = [42, 43]\n{text}")
    if "digits" in match:
        src = src.replace('["heart", "cardio"]', '["heart", "digits"]')
    with pytest.raises(UsageError, match=match) as e:
        parse_spec(src)
    assert "\n" not in str(e.value)


def test_profile_is_not_a_setting_and_selftest_takes_none():
    with pytest.raises(UsageError, match="settings must be among"):
        parse_spec(BASE.replace("delta = 1e-5", 'delta = 1e-5\nprofile = "authors"'))
    with pytest.raises(UsageError, match="for the selftest runner"):
        with_profile(builtin_spec("selftest"), "authors")
    with pytest.raises(UsageError, match="profile for dataset digits"):
        with_profile(parse_spec(BASE.replace('["heart", "cardio"]', '["digits"]')), "authors")


def test_planned_event_uses_the_profiles_training_size():
    # Heart: 212 training records under dpaudit's profile, 211 under the authors' (302 rows after
    # de-duplication). With batch 211 the schedule differs: 2 batches per epoch vs 1.
    spec = parse_spec(
        BASE.replace('["heart", "cardio"]', '["heart"]')
        .replace("delta = 1e-5", "delta = 1e-5\nbatch_size = 211")
        .replace("seeds = [42, 43]", 'seeds = [42]\nprofiles = ["default", "authors"]')
    )
    ev = {
        dict(t.settings).get("profile"): planned_event(t.config())[3]
        for t in spec.tasks()
        if t.model == "dp-rvfl"
    }
    assert ev[None].sample_rate == 0.5 and ev["authors"].sample_rate == 1.0


def test_task_dir_names_the_profile(tmp_path):
    t = with_profile(parse_spec(BASE), "authors").tasks()[0]
    assert task_dir(tmp_path, t.config(), t.key).parts[-3] == "heart-authors"
    d = parse_spec(BASE).tasks()[0]
    assert task_dir(tmp_path, d.config(), d.key).parts[-3] == "heart"


def test_plan_skips_a_profile_whose_files_are_missing(tmp_path):
    (tmp_path / "heart").mkdir()
    (tmp_path / "heart" / "processed.cleveland.data").write_text("")
    spec = parse_spec(
        BASE.replace('["heart", "cardio"]', '["heart"]').replace(
            "seeds = [42, 43]", 'seeds = [42]\nprofiles = ["default", "authors"]'
        )
    )
    tasks, skipped = plan(spec, data_dir=tmp_path)
    assert set(skipped) == {"heart (profile authors)"}
    assert tasks and all("profile" not in dict(t.settings) for t in tasks)


def _records(profile_values):
    recs = []
    for profile, acc in profile_values:
        for seed in (42, 43):
            r = {
                "model": "dp-rvfl",
                "dataset": "heart",
                "epsilon": 2.0,
                "seed": seed,
                "metrics": {"accuracy": acc},
            }
            if profile:
                r["profile"] = profile
            recs.append(r)
    return recs


def test_tables_keep_profiles_apart():
    tables = sweep_tables(_records([(None, 0.7), ("authors", 0.6)]))
    cells = {
        c["dataset"]: c["summary"]["mean"] for c in tables["cells"] if c["metric"] == "accuracy"
    }
    assert cells == {"heart": pytest.approx(0.7), "heart (authors)": pytest.approx(0.6)}
    rows = [r for r in tables["table3"]["rows"] if r["model"] == "dp-rvfl"]
    assert [(r.get("profile"), round(r["mean"], 6), r["published_mean"]) for r in rows] == [
        (None, 70.0, 63.48),
        ("authors", 60.0, 63.48),
    ]
    md = render_markdown(tables)
    assert (
        "| RVFL | Heart (authors) | 60.00 ± 0.00 | 2 |" in md
        and "| RVFL | Heart | 70.00 ± 0.00 | 2 |" in md
    )
    # without any profile the tables are those of before (no profile key anywhere)
    plain = sweep_tables(_records([(None, 0.7)]))
    assert all("profile" not in r for r in plain["table3"]["rows"])


HEART_HEADER = "age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,oldpeak,slope,ca,thal,target"


def _tiny_heart(root: Path) -> None:
    (root / "heart").mkdir(parents=True)
    rows = [
        f"{30 + i},{i % 2},{i % 4},{120 + i},{200 + 3 * i},0,{i % 3},{140 + i},{i % 2},{(i % 5) / 2},{i % 3},{i % 4},{1 + i % 3},{(i * 7) % 2}"
        for i in range(60)
    ]
    (root / "heart" / "heart_kaggle.csv").write_text("\n".join([HEART_HEADER] + rows) + "\n")


def test_a_sweep_with_the_authors_profile_records_it(tmp_path):
    _tiny_heart(tmp_path / "data")
    spec = parse_spec(
        BASE.replace('["heart", "cardio"]', '["heart"]')
        .replace('["dp-rvfl", "logistic-raw"]', '["dp-rvfl"]')
        .replace("seeds = [42, 43]", 'seeds = [42]\nprofiles = ["authors"]')
        .replace("delta = 1e-5", "delta = 1e-5\nepochs = 1")
    )
    s = run_sweep(
        spec,
        out=tmp_path / "out",
        data_dir=tmp_path / "data",
        ledger_path=tmp_path / "ledger.sqlite",
    )
    assert (s.done, s.failed) == (1, 0), s.failures
    _, records = load_records(s.store)
    assert [r.get("profile") for r in records] == ["authors"]
    rel_dir = next(
        (tmp_path / "out" / "p" / "releases" / "dp-rvfl" / "heart-authors").rglob("release.json")
    )
    rel = json.loads(rel_dir.read_text())
    assert rel["dataset"]["profile"] == "authors" and rel["dataset"]["split_seed"] == 2026
    # 42 training rows here (int(0.7 * 60)) are never published; the schedule is the one the sweep planned from the
    # profile's declared size (authors' Heart: 211)
    assert (
        rel["dataset"]["split_sizes"] == {"val": 9, "test": 9}
        and rel["config"]["reference_size"] == 211
    )
    assert "--profile authors" in rel["command"]


def test_cli_sweep_profile_plan(tmp_path):
    _tiny_heart(tmp_path / "data")
    r = CliRunner().invoke(
        app,
        [
            "sweep",
            "--builtin",
            "dp-rvfl-primary",
            "--profile",
            "authors",
            "--plan",
            "--json",
            "--data-dir",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["name"] == "dp-rvfl-primary-authors"
    assert (
        out["tasks"] == 5 * 6 * 5 + 2 * 5
    )  # Heart only: five models x six budgets + Dense, CNN at eps 2; five seeds
    assert set(out["skipped_datasets"]) == {
        "mnist (profile authors)",
        "cifar10 (profile authors)",
        "cardio (profile authors)",
    }
    bad = CliRunner().invoke(
        app, ["sweep", "--builtin", "selftest", "--profile", "authors", "--plan"]
    )
    assert bad.exit_code == 2 and "selftest runner" in bad.output
