"""Sweep specs: TOML grids, task keys, built-in grids, dataset availability."""

from __future__ import annotations

import pytest

from dpaudit.errors import DataError, UsageError
from dpaudit.sweeps import TaskFilter, builtin_spec, config_key, load_spec, parse_spec, plan
from dpaudit.sweeps.spec import FROZEN_AND_LOGISTIC, PRIMARY_EPSILONS, TRAINABLE, Task

SIMPLE = """
name = "s"
model = "dp-rvfl"
datasets = ["heart", "cardio"]
eps = [0.5, 2]
seeds = [42, 43]
[settings]
delta = 1e-5
"""


def test_single_grid_with_aliases_expands_to_the_product():
    spec = parse_spec(SIMPLE)
    tasks = spec.tasks()
    assert len(tasks) == 1 * 2 * 2 * 2
    assert {(t.model, t.dataset, t.epsilon, t.seed) for t in tasks} == {
        ("dp-rvfl", d, e, s) for d in ("heart", "cardio") for e in (0.5, 2.0) for s in (42, 43)
    }
    assert all(dict(t.settings) == {"delta": 1e-5} for t in tasks)


def test_grid_blocks_override_settings_and_duplicates_are_dropped():
    spec = parse_spec("""
name = "b"
[settings]
delta = 1e-5
[[grid]]
models = ["dp-rvfl"]
datasets = ["heart"]
epsilons = [2]
seeds = [42]
[[grid]]
models = ["dp-rvfl"]
datasets = ["heart"]
epsilons = [2]
seeds = [42]
[[grid]]
models = ["dp-cnn"]
datasets = ["heart"]
epsilons = [2]
seeds = [42]
settings = { epochs = 3 }
""")
    tasks = spec.tasks()
    assert len(tasks) == 2
    assert dict(tasks[1].settings) == {"delta": 1e-5, "epochs": 3}


def test_task_key_is_the_hash_of_the_full_public_configuration():
    t = Task("train", "dp-rvfl", "heart", 2.0, 42, (("delta", 1e-5),))
    assert t.key == config_key(t.config())
    assert len(t.key) == 64
    # every public field changes the key
    variants = [
        Task("train", "dp-cnn", "heart", 2.0, 42, (("delta", 1e-5),)),
        Task("train", "dp-rvfl", "cardio", 2.0, 42, (("delta", 1e-5),)),
        Task("train", "dp-rvfl", "heart", 1.0, 42, (("delta", 1e-5),)),
        Task("train", "dp-rvfl", "heart", 2.0, 43, (("delta", 1e-5),)),
        Task("train", "dp-rvfl", "heart", 2.0, 42, (("delta", 1e-6),)),
        Task("train", "dp-rvfl", "heart", 2.0, 42, (("delta", 1e-5), ("reproducible_noise", True))),
        Task("selftest", "dp-rvfl", "heart", 2.0, 42, (("delta", 1e-5),)),
    ]
    assert len({v.key for v in variants} | {t.key}) == len(variants) + 1
    # and the key does not depend on setting order, nor on the spec's name
    assert (
        config_key({**t.config(), "settings": dict(reversed(list(dict(t.settings).items())))})
        == t.key
    )
    a = parse_spec(SIMPLE.replace('name = "s"', 'name = "other"'))
    assert {x.key for x in a.tasks()} == {x.key for x in parse_spec(SIMPLE).tasks()}


@pytest.mark.parametrize(
    "text, fragment",
    [
        (SIMPLE.replace("delta = 1e-5", "detla = 1e-5"), "settings must be among"),
        (SIMPLE.replace('model = "dp-rvfl"', 'model = "dp-rvfll"'), "model must be one of"),
        (SIMPLE.replace("eps = [0.5, 2]", "eps = [0]"), "epsilon must be a finite number > 0"),
        (SIMPLE.replace('"cardio"', '"cardoi"'), "dataset must be one of"),
        (SIMPLE.replace("eps = [0.5, 2]", ""), "must list epsilons"),
        (SIMPLE.replace("delta = 1e-5", "delta = 2.0"), "delta must be in the open interval"),
        (SIMPLE.replace('name = "s"', 'name = "a b"'), "sweep name must be"),
        (SIMPLE + "\nfoo = 1\n", "settings must be among"),
        (SIMPLE.replace("seeds = [42, 43]", "seeds = [42, 43]\ncolour = 1"), "top-level keys"),
        (
            SIMPLE.replace('model = "dp-rvfl"', 'model = "dp-rvfl"\nmodels = ["dp-cnn"]'),
            "must give models once",
        ),
    ],
)
def test_bad_specs_are_refused_with_one_line(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse_spec(text)


def test_non_private_blocks_have_no_epsilon():
    spec = parse_spec(
        'name = "np"\nmodels = ["dp-rvfl"]\ndatasets = ["heart"]\nseeds = [1]\n[settings]\nnon_private = true\n'
    )
    (t,) = spec.tasks()
    assert t.epsilon is None
    with pytest.raises(UsageError, match="omitted for non_private"):
        parse_spec(
            'name = "np"\nmodels = ["dp-rvfl"]\ndatasets = ["heart"]\neps = [1]\nseeds = [1]\n[settings]\nnon_private = true\n'
        )


def test_load_spec_reads_files_and_reports_bad_toml(tmp_path):
    p = tmp_path / "my-grid.toml"
    p.write_text(SIMPLE.replace('name = "s"\n', ""))
    assert load_spec(p).name == "my-grid"  # defaults to the file stem
    p.write_text("name = [")
    with pytest.raises(DataError, match="not valid TOML"):
        load_spec(p)
    with pytest.raises(DataError, match="not found"):
        load_spec(tmp_path / "absent.toml")


def test_builtin_primary_grid_matches_the_paper_design():
    spec = builtin_spec("dp-rvfl-primary")
    tasks = spec.tasks()
    per_image_dataset = (
        len(FROZEN_AND_LOGISTIC) * len(PRIMARY_EPSILONS) * 5 + len(TRAINABLE) * 1 * 5
    )
    assert per_image_dataset == 165
    assert len(tasks) == 4 * per_image_dataset - 2 * 5  # no attention on the tabular datasets
    assert {t.dataset for t in tasks if t.model == "dp-attention"} == {"mnist", "cifar10"}
    assert {t.seed for t in tasks} == {42, 43, 44, 45, 46}
    assert {t.epsilon for t in tasks if t.model in TRAINABLE} == {2.0}
    assert {t.epsilon for t in tasks if t.model == "dp-rvfl"} == {0.1, 0.5, 1.0, 2.0, 4.0, 8.0}
    assert all(dict(t.settings)["delta"] == 1e-5 for t in tasks)
    with pytest.raises(UsageError, match="builtin must be one of"):
        builtin_spec("nope")


def test_missing_datasets_are_skipped_and_filters_select_a_slice(tmp_path):
    (tmp_path / "heart").mkdir()
    (tmp_path / "heart" / "processed.cleveland.data").write_text("")
    tasks, skipped = plan(builtin_spec("dp-rvfl-primary"), data_dir=tmp_path)
    assert set(skipped) == {"mnist", "cifar10", "cardio"}
    assert {t.dataset for t in tasks} == {"heart"} and len(tasks) == 160
    sl, _ = plan(
        builtin_spec("dp-rvfl-primary"), data_dir=tmp_path, task_filter=TaskFilter(epsilons=(2.0,))
    )
    assert len(sl) == 7 * 5 and {t.epsilon for t in sl} == {2.0}
    # a slice's keys are the full grid's keys, so slices fill the same store
    assert {t.key for t in sl} <= {t.key for t in tasks}
