"""The DP-RVFL authors' pipeline (profile ``authors``): split indices, encoding, registry.

The expected partitions are computed here independently from the stated rule
(``numpy.random.default_rng(2026).permutation(n)`` of the cleaned rows, ``int()`` cut points),
with the cleaned row count n taken from the raw files by this test's own parsing, and compared
with what the loader used as SHA-256 of the sorted int64 indices. Tests needing real data skip,
visibly, when the files are absent.
"""

from __future__ import annotations

import csv
import hashlib
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.data import (
    AUTHORS_PROFILE,
    dataset_info,
    load_dataset,
    profile_files,
    profile_split_sizes,
)
from dpaudit.data import authors
from dpaudit.data.splits import split_indices, train_val_indices
from dpaudit.errors import DataError, UsageError


def _sha(idx) -> str:
    return hashlib.sha256(
        np.sort(np.asarray(idx, dtype=np.int64)).astype("<i8").tobytes()
    ).hexdigest()


def _rule_tabular(n: int, seed: int = 2026):
    perm = np.random.default_rng(seed).permutation(n)
    a, b = int(0.70 * n), int(0.85 * n)
    return perm[:a], perm[a:b], perm[b:]


def _rule_images(n_train: int, n_test: int, seed: int = 2026):
    rng = np.random.default_rng(seed)
    perm = rng.permutation(n_train)
    test = rng.permutation(n_test)
    a = int(0.85 * n_train)
    return perm[:a], perm[a:], test


def require_file(data_dir, rel):
    p = data_dir / rel
    if not p.exists():
        pytest.skip(f"real data file {rel} not found under {data_dir}")
    return p


def _check_partitions(data, idx, expected, rows_x, rows_y, test_x=None, test_y=None):
    """The loader's indices are the rule's, and its partitions are exactly those rows."""
    got = idx.sha256()
    for part, exp in zip(("train", "val", "test"), expected):
        assert got[part] == _sha(exp), part
        assert f"{part} {_sha(exp)}" in data.notes  # the loader publishes the index sets it used
    np.testing.assert_array_equal(data.x_train, rows_x[expected[0]])
    np.testing.assert_array_equal(data.y_train, rows_y[expected[0]])
    np.testing.assert_array_equal(data.x_val, rows_x[expected[1]])
    np.testing.assert_array_equal(data.y_val, rows_y[expected[1]])
    np.testing.assert_array_equal(data.x_test, (rows_x if test_x is None else test_x)[expected[2]])
    np.testing.assert_array_equal(data.y_test, (rows_y if test_y is None else test_y)[expected[2]])
    assert data.profile == AUTHORS_PROFILE and data.split_seed == 2026
    ident = data.identity()
    assert ident["profile"] == "authors" and ident["split_seed"] == 2026


# ----------------------------------------------------------------------------- real data: index sets


def _count_cardio_rows(path) -> int:
    """Rows kept by the stated Cardio rule, by this test's own parsing of the CSV."""
    kept = 0
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter=";"):
            try:
                h, w, hi, lo = (float(row[k]) for k in ("height", "weight", "ap_hi", "ap_lo"))
            except ValueError:
                continue
            if row["cardio"].strip() == "":
                continue
            if (
                120 <= h <= 220
                and 30 <= w <= 200
                and 80 <= hi <= 250
                and 40 <= lo <= 150
                and hi >= lo
            ):
                kept += 1
    return kept


def _count_heart_rows(path) -> int:
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = [tuple(float(v) for v in r) for r in list(csv.reader(f))[1:] if r]
    return len(set(rows))


def test_cardio_index_sets_follow_the_rule(data_dir):
    path = require_file(data_dir, "cardio/cardio_train.csv")
    n = _count_cardio_rows(path)
    assert n == 68_608  # the published count
    expected = _rule_tabular(n)
    data, idx = authors.load(dataset_info("cardio"), data_dir)
    rows = authors.load_rows("cardio", data_dir)
    assert rows.x.shape == (68_608, 32) and data.n_features == 32
    _check_partitions(data, idx, expected, rows.x, rows.y)
    assert (
        data.split_sizes
        == {"train": 48_025, "val": 10_291, "test": 10_292}
        == profile_split_sizes("cardio", "authors")
    )
    # dpaudit's own profile draws another permutation: without the profile the sets differ.
    ours = split_indices(n, 2026, 70, 15)
    assert _sha(ours[0]) != _sha(expected[0]) and _sha(ours[2]) != _sha(expected[2])
    # load_dataset gives exactly the same arrays
    again = load_dataset("cardio", data_dir=data_dir, profile="authors")
    assert again.sha256 == data.sha256


def test_heart_index_sets_follow_the_rule(data_dir):
    path = require_file(data_dir, "heart/heart_kaggle.csv")
    n = _count_heart_rows(path)
    assert n == 302
    expected = _rule_tabular(n)
    data = load_dataset("heart", data_dir=data_dir, profile="authors")
    _, idx = authors.load(dataset_info("heart"), data_dir)
    rows = authors.load_rows("heart", data_dir)
    assert rows.x.shape == (302, 47) and data.n_features == 47
    _check_partitions(data, idx, expected, rows.x, rows.y)
    assert (
        data.split_sizes
        == {"train": 211, "val": 45, "test": 46}
        == profile_split_sizes("heart", "authors")
    )
    assert data.source_files.keys() == {"heart_kaggle.csv"}
    ours = split_indices(n, 2026, 70, 15)
    assert _sha(ours[2]) != _sha(expected[2])


def test_mnist_index_sets_follow_the_rule(data_dir):
    for name in (
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ):
        require_file(data_dir, f"mnist/{name}")
    data, idx = authors.load(dataset_info("mnist"), data_dir)
    rows = authors.load_rows("mnist", data_dir)
    expected = _rule_images(60_000, 10_000)
    assert len(rows.y) == 60_000 and len(rows.y_test) == 10_000
    flat = lambda x: x.reshape(len(x), -1).astype(np.float32) / np.float32(255)  # noqa: E731  ToTensor
    got = idx.sha256()
    for part, exp in zip(("train", "val", "test"), expected):
        assert got[part] == _sha(exp) and f"{part} {_sha(exp)}" in data.notes
    np.testing.assert_array_equal(data.y_train, rows.y[expected[0]])
    np.testing.assert_array_equal(data.y_val, rows.y[expected[1]])
    np.testing.assert_array_equal(data.y_test, rows.y_test[expected[2]])
    np.testing.assert_array_equal(data.x_train[:500], flat(rows.x[expected[0][:500]]))
    np.testing.assert_array_equal(data.x_test[-500:], flat(rows.x_test[expected[2][-500:]]))
    assert (
        data.split_sizes
        == {"train": 51_000, "val": 9_000, "test": 10_000}
        == profile_split_sizes("mnist", "authors")
    )
    assert data.image_shape == (1, 28, 28) and 0.0 <= data.x_val.min() and data.x_val.max() <= 1.0
    ours_train, _ = train_val_indices(60_000, 2026, 85)
    assert _sha(ours_train) != _sha(expected[0])


# ----------------------------------------------------------------------------- synthetic CIFAR-10


def _write_cifar(root, n_per_batch=12, n_test=10, seed=0):
    rng = np.random.default_rng(seed)
    folder = root / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    train, test = [], None
    for name in (
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "test_batch",
    ):
        n = n_test if name == "test_batch" else n_per_batch
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        with open(folder / name, "wb") as f:
            pickle.dump({"batch_label": name, "data": data, "labels": labels}, f, protocol=2)
        if name == "test_batch":
            test = (data, np.asarray(labels))
        else:
            train.append((data, np.asarray(labels)))
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f, protocol=2)
    x = np.concatenate([d for d, _ in train])
    y = np.concatenate([lab for _, lab in train])
    return x, y, test[0], test[1]


def test_cifar10_index_sets_follow_the_rule_on_synthetic_batches(tmp_path):
    x, y, xt, yt = _write_cifar(tmp_path)  # 60 training images, 10 test images, official layout
    data, idx = authors.load(dataset_info("cifar10"), tmp_path)
    expected = _rule_images(60, 10)
    # The pickles store each image as 1024 R, 1024 G, 1024 B values: exactly the (C, H, W) flattening.
    to01 = lambda a: a.astype(np.float32) / np.float32(255)  # noqa: E731
    _check_partitions(data, idx, expected, to01(x), y, to01(xt), yt)
    assert data.split_sizes == {"train": 51, "val": 9, "test": 10}
    assert data.image_shape == (3, 32, 32)
    assert "NOT the official CIFAR-10" in data.notes
    assert profile_split_sizes("cifar10", "authors") == {
        "train": 42_500,
        "val": 7_500,
        "test": 10_000,
    }


# ----------------------------------------------------------------------------- split rule


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1))
def test_tabular_split_is_the_rule_and_a_partition(n, seed):
    s = authors.tabular_split(n, seed)
    exp = _rule_tabular(n, seed)
    for got, e in zip((s.train, s.val, s.test), exp):
        np.testing.assert_array_equal(got, e)  # same order too
    allidx = np.concatenate([s.train, s.val, s.test])
    assert allidx.dtype == np.int64 and np.array_equal(np.sort(allidx), np.arange(n))
    assert s.sizes()["train"] == math.floor(0.7 * n) and s.sizes()["train"] + s.sizes()[
        "val"
    ] == math.floor(0.85 * n)


def test_cut_points_use_the_float_product():
    # 0.7 * 90 = 62.99999999999999 in binary floating point: the rule's int() gives 62, where exact
    # integer arithmetic ((70 * 90) // 100, dpaudit's own rule) gives 63.
    assert authors.cut_point(90, 0.7) == 62 and (70 * 90) // 100 == 63
    assert authors.cut_point(68_608, 0.85) == 58_316 and authors.cut_point(302, 0.7) == 211
    assert authors.tabular_split(90).sizes() == {"train": 62, "val": 14, "test": 14}


def test_split_seed_override_keeps_the_rule(tmp_path):
    _write_heart(tmp_path, [f"{30 + i},1,3,145,233,1,0,150,0,2.3,0,0,1,{i % 2}" for i in range(40)])
    d = load_dataset("heart", data_dir=tmp_path, profile="authors", split_seed=7)
    rows = authors.load_rows("heart", tmp_path)
    assert len(rows.y) == 40
    exp = _rule_tabular(40, 7)
    np.testing.assert_array_equal(d.x_train, rows.x[exp[0]])
    np.testing.assert_array_equal(d.x_test, rows.x[exp[2]])
    assert d.split_seed == 7 and d.identity()["split_seed"] == 7


# ----------------------------------------------------------------------------- encoding, hand-made rows

CARDIO_HEADER = "id;age;gender;height;weight;ap_hi;ap_lo;cholesterol;gluc;smoke;alco;active;cardio"
CARDIO_ROWS = [
    "0;18262.5;1;170;70;120;80;1;1;0;0;1;0",  # ordinary row
    "1;;2;120;200;250;40;3;5;1;1;0;1",  # age missing; BMI 138.9 clipped; gluc 5 unknown
    "2;60000;3;220;30;80;80;;1;0;0;0;1",  # age 164 y clipped; gender 3 unknown; cholesterol missing
    "3;18000;1;119;70;120;80;1;1;0;0;1;0",  # height below 120: dropped
    "4;18000;1;170;70;100;110;1;1;0;0;1;0",  # ap_hi < ap_lo: dropped
    "5;18000;1;170;70;120;80;1;1;0;0;1;",  # target missing: dropped
    "6;18000;1;170;;120;80;1;1;0;0;1;1",  # weight missing: fails the filter, dropped
]


def _num(x, lo, hi):
    """The rule for one numerical field: (value, missing indicator)."""
    if x is None:
        x, miss = (lo + hi) / 2, 1.0
    else:
        miss = 0.0
    return [2 * (min(max(x, lo), hi) - lo) / (hi - lo) - 1, miss]


def _cat(v, levels):
    return [1.0 if v == lev else 0.0 for lev in levels] + [0.0 if v in levels else 1.0]


def _cardio_row(age_days, gender, height, weight, ap_hi, ap_lo, chol, gluc, smoke, alco, active):
    age = None if age_days is None else age_days / 365.25
    bmi = weight / (height / 100) ** 2
    return (
        _num(age, 0, 120)
        + _num(height, 100, 250)
        + _num(weight, 20, 300)
        + _num(ap_hi, 40, 300)
        + _num(ap_lo, 20, 200)
        + _num(bmi, 5, 100)
        + _cat(gender, (1, 2))
        + _cat(chol, (1, 2, 3))
        + _cat(gluc, (1, 2, 3))
        + _cat(smoke, (0, 1))
        + _cat(alco, (0, 1))
        + _cat(active, (0, 1))
    )


def test_cardio_encoding_on_hand_made_rows(tmp_path):
    path = tmp_path / "cardio_train.csv"
    path.write_text("\n".join([CARDIO_HEADER] + CARDIO_ROWS) + "\n")
    x, y = authors.prepare_cardio(path)
    expected = np.array(
        [
            _cardio_row(18262.5, 1, 170, 70, 120, 80, 1, 1, 0, 0, 1),
            _cardio_row(None, 2, 120, 200, 250, 40, 3, 5, 1, 1, 0),
            _cardio_row(60000, 3, 220, 30, 80, 80, None, 1, 0, 0, 0),
        ]
    )
    assert x.shape == (3, 32) and x.dtype == np.float32
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(y, [0, 1, 1])
    names = authors.CARDIO_FEATURES
    assert names[:2] == ("age_years", "age_years__missing") and names[10:12] == (
        "bmi",
        "bmi__missing",
    )
    assert (
        names[12:15] == ("gender=1", "gender=2", "gender=unknown") and names[-1] == "active=unknown"
    )
    assert x[1, names.index("bmi")] == 1.0 and x[1, names.index("age_years")] == 0.0
    assert x[2, names.index("age_years")] == 1.0 and x[2, names.index("cholesterol=unknown")] == 1.0


HEART_HEADER = "age,sex,cp,trestbps,chol,fbs,restecg,thalach,exang,oldpeak,slope,ca,thal,target"
HEART_ROWS = [
    "63,1,3,145,233,1,0,150,0,2.3,0,0,1,1",
    "63,1,3,145,233,1,0,150,0,2.3,0,0,1,1",  # exact duplicate of the first: dropped
    "40,0,4,500,?,0,2,20,1,-1,3,4,7,0",  # trestbps / thalach / oldpeak clipped, chol missing
    "40,0,5,500,,0,2,20,1,-1,3,4,5,2",  # cp 5 and thal 5 unknown, target 2 -> 1
    "63,1,3,145,233,1,0,150,0,2.3,0,0,1,0",  # differs in the target only: kept
]


def _heart_row(
    age, sex, cp, trestbps, chol, fbs, restecg, thalach, exang, oldpeak, slope, ca, thal
):
    return (
        _num(age, 0, 120)
        + _num(trestbps, 40, 300)
        + _num(chol, 0, 700)
        + _num(thalach, 30, 250)
        + _num(oldpeak, 0, 10)
        + _cat(cp, (0, 1, 2, 3, 4))
        + _cat(restecg, (0, 1, 2))
        + _cat(slope, (0, 1, 2, 3))
        + _cat(ca, (0, 1, 2, 3, 4))
        + _cat(thal, (0, 1, 2, 3, 6, 7))
        + _cat(sex, (0, 1))
        + _cat(fbs, (0, 1))
        + _cat(exang, (0, 1))
    )


def _write_heart(root, rows):
    folder = root / "heart"
    folder.mkdir(parents=True, exist_ok=True)
    # a UTF-8 byte-order mark like the Kaggle file
    (folder / "heart_kaggle.csv").write_text(
        "\ufeff" + "\n".join([HEART_HEADER] + rows) + "\n", encoding="utf-8"
    )
    return folder / "heart_kaggle.csv"


def test_heart_encoding_on_hand_made_rows(tmp_path):
    x, y = authors.prepare_heart(_write_heart(tmp_path, HEART_ROWS))
    expected = np.array(
        [
            _heart_row(63, 1, 3, 145, 233, 1, 0, 150, 0, 2.3, 0, 0, 1),
            _heart_row(40, 0, 4, 500, None, 0, 2, 20, 1, -1, 3, 4, 7),
            _heart_row(40, 0, 5, 500, None, 0, 2, 20, 1, -1, 3, 4, 5),
            _heart_row(63, 1, 3, 145, 233, 1, 0, 150, 0, 2.3, 0, 0, 1),
        ]
    )
    assert x.shape == (4, 47)
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(y, [1, 0, 1, 0])
    names = authors.HEART_FEATURES
    assert names[:10:2] == ("age", "trestbps", "chol", "thalach", "oldpeak")
    assert names[-3:] == ("exang=0", "exang=1", "exang=unknown")
    assert x[1, names.index("chol__missing")] == 1.0 and x[1, names.index("oldpeak")] == -1.0


def test_heart_through_load_dataset_on_a_small_file(tmp_path):
    _write_heart(tmp_path, HEART_ROWS)
    d = load_dataset("heart", data_dir=tmp_path, profile="authors")
    rows = authors.load_rows("heart", tmp_path)
    assert len(rows.y) == 4 and "the original file gives 302" in rows.notes
    exp = _rule_tabular(4)
    np.testing.assert_array_equal(d.x_train, rows.x[exp[0]])
    np.testing.assert_array_equal(d.y_test, rows.y[exp[2]])
    assert d.feature_names == authors.HEART_FEATURES and d.identity()["profile"] == "authors"


def test_a_missing_heart_target_is_a_data_error(tmp_path):
    _write_heart(tmp_path, ["63,1,3,145,233,1,0,150,0,2.3,0,0,1,"])
    with pytest.raises(DataError, match="target must be present"):
        load_dataset("heart", data_dir=tmp_path, profile="authors")


def test_a_bad_cardio_target_is_a_data_error(tmp_path):
    (tmp_path / "cardio").mkdir()
    (tmp_path / "cardio" / "cardio_train.csv").write_text(
        CARDIO_HEADER + "\n0;18000;1;170;70;120;80;1;1;0;0;1;3\n"
    )
    with pytest.raises(DataError, match="cardio must be 0 or 1"):
        load_dataset("cardio", data_dir=tmp_path, profile="authors")


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", ["digits", "breast-cancer"])
def test_authors_profile_only_for_the_papers_datasets(name):
    with pytest.raises(UsageError) as e:
        load_dataset(name, profile="authors")
    assert "'authors'" in str(e.value) and "\n" not in str(e.value)


def test_registry_lists_the_profile_and_its_files():
    for name in authors.AUTHORS_DATASETS:
        assert AUTHORS_PROFILE in dataset_info(name).profiles
    assert profile_files("heart", "authors") == ("heart/heart_kaggle.csv",)
    assert profile_files("heart") == ("heart/processed.cleveland.data",)
    assert profile_files("cardio", "authors") == ("cardio/cardio_train.csv",)
    assert profile_split_sizes("heart") == {
        "train": 212,
        "val": 45,
        "test": 46,
    }  # the default profile is unchanged


def test_missing_authors_heart_file_names_it(tmp_path):
    with pytest.raises(DataError, match="heart_kaggle.csv"):
        load_dataset("heart", data_dir=tmp_path, profile="authors")
