"""Registry, argument errors and the bundled datasets (digits, breast-cancer)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer, load_digits
from torchvision import transforms

from dpaudit.data import DATASETS, dataset_info, load_dataset
from dpaudit.data.splits import split_indices
from dpaudit.data.tabular import BREAST_CANCER_UPPER
from dpaudit.errors import DataError, UsageError


def test_registry_lists_every_required_dataset():
    assert set(DATASETS) == {"mnist", "cifar10", "cardio", "heart", "digits", "breast-cancer"}
    for name, info in DATASETS.items():
        d = info.to_dict()
        assert d["name"] == name
        assert d["needs_files"] == (name not in ("digits", "breast-cancer"))
        assert bool(d["files"]) == d["needs_files"]
        assert d["default_profile"] in d["profiles"]


def test_unknown_dataset_lists_allowed_names():
    with pytest.raises(UsageError) as e:
        dataset_info("imagenet")
    msg = str(e.value)
    assert "\n" not in msg and "'imagenet'" in msg
    for name in DATASETS:
        assert name in msg
    with pytest.raises(UsageError):
        load_dataset("imagenet")
    # a value that is no name at all (a list from a parsed file) is the same one-line refusal
    with pytest.raises(UsageError, match=r"dataset must be one of .*, got \['mnist'\]\.$"):
        dataset_info(["mnist"])


@pytest.mark.parametrize("name", ["breast-cancer", "cardio", "heart"])
@pytest.mark.parametrize("profile", ["raw01", "centered", "half-resolution"])
def test_tabular_rejects_image_profiles(name, profile, tmp_path):
    with pytest.raises(UsageError) as e:
        load_dataset(name, profile=profile, data_dir=tmp_path)
    assert "must be one of default" in str(e.value) and "\n" not in str(e.value)


def test_image_rejects_unknown_profile():
    with pytest.raises(UsageError, match="raw01, centered, half-resolution"):
        load_dataset("digits", profile="default")


def test_bad_split_seed():
    with pytest.raises(UsageError, match="split_seed must be an integer >= 0"):
        load_dataset("digits", split_seed=-3)


def test_missing_data_dir_is_a_one_line_data_error(monkeypatch):
    monkeypatch.delenv("DPAUDIT_DATA_DIR", raising=False)
    with pytest.raises(DataError) as e:
        load_dataset("cardio")
    assert "DPAUDIT_DATA_DIR" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "name, files",
    [
        ("cardio", "cardio_train.csv"),
        ("heart", "processed.cleveland.data"),
        ("mnist", "train-images-idx3-ubyte.gz"),
        ("cifar10", "data_batch_1"),
    ],
)
def test_missing_files_name_expected_files_and_folder(name, files, tmp_path):
    with pytest.raises(DataError) as e:
        load_dataset(name, data_dir=tmp_path)
    msg = str(e.value)
    assert files in msg and str(tmp_path) in msg and "\n" not in msg


def test_data_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DPAUDIT_DATA_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(DataError, match="elsewhere"):
        load_dataset("heart")


# ----------------------------------------------------------------------------- digits


def test_digits_default_split_and_pixels():
    d = load_dataset("digits")
    assert (
        d.split_sizes
        == dataset_info("digits").split_sizes
        == {"train": 1257, "val": 269, "test": 271}
    )
    assert (
        d.kind == "image"
        and d.image_shape == (1, 8, 8)
        and d.n_classes == 10
        and d.split_seed == 2026
    )
    assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int64
    ref = load_digits()
    tr, va, te = split_indices(1797, 2026, 70, 15)
    np.testing.assert_array_equal(d.x_test, (ref.data[te] / 16.0).astype(np.float32))
    np.testing.assert_array_equal(d.y_val, ref.target[va])
    assert d.x_train.min() >= 0.0 and d.x_train.max() <= 1.0


def test_digits_split_depends_only_on_seed():
    a, b, c = (
        load_dataset("digits", split_seed=1),
        load_dataset("digits", split_seed=1),
        load_dataset("digits", split_seed=2),
    )
    assert a.sha256 == b.sha256 and a.sha256 != c.sha256
    # Disjoint partitions: the three parts together are the whole dataset, each row once.
    rows = np.concatenate([a.x_train, a.x_val, a.x_test])
    ref = (load_digits().data / 16.0).astype(np.float32)
    assert sorted(map(bytes, rows)) == sorted(map(bytes, ref))


def test_digits_profiles():
    raw = load_dataset("digits")
    cen = load_dataset("digits", profile="centered")
    half = load_dataset("digits", profile="half-resolution")
    np.testing.assert_allclose(cen.x_train, (raw.x_train - 0.5) / 0.5, atol=0)
    assert cen.x_train.min() >= -1.0 and cen.x_train.max() <= 1.0 and cen.x_train.min() < 0
    assert half.image_shape == (1, 4, 4) and half.n_features == 16
    ref = transforms.Resize((4, 4), antialias=True)(
        torch.from_numpy(raw.x_test.reshape(-1, 1, 8, 8))
    )
    np.testing.assert_allclose(half.x_test, ref.reshape(len(ref), -1).numpy(), atol=1e-7)
    assert half.x_train.min() >= 0.0 and half.x_train.max() <= 1.0


# ----------------------------------------------------------------------------- breast-cancer


def test_breast_cancer_fixed_bounds():
    d = load_dataset("breast-cancer")
    assert (
        d.split_sizes == {"train": 398, "val": 85, "test": 86}
        and d.n_features == 30
        and d.kind == "tabular"
    )
    assert set(np.unique(np.concatenate([d.y_train, d.y_val, d.y_test]))) == {0, 1}
    for x in (d.x_train, d.x_val, d.x_test):
        assert x.dtype == np.float32 and x.min() >= -1.0 and x.max() <= 1.0
    # Independent reference: clip(x, 0, U) mapped to [-1, 1] with the documented constants.
    ref = load_breast_cancer()
    upper = np.array(
        [
            BREAST_CANCER_UPPER[n.replace("mean ", "").replace(" error", "").replace("worst ", "")][
                0 if n.startswith("mean") else (1 if n.endswith("error") else 2)
            ]
            for n in ref.feature_names
        ]
    )
    want = (2 * np.clip(ref.data, 0, upper) / upper - 1).astype(np.float32)
    tr, va, te = split_indices(569, 2026, 70, 15)
    np.testing.assert_allclose(d.x_train, want[tr], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(d.y_test, 1 - ref.target[te])  # 1 = malignant
    assert d.feature_names == tuple(ref.feature_names)
