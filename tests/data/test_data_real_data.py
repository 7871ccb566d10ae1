"""Real files from the data directory (skipped, visibly, when absent): Table 1 counts exactly."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from dpaudit.data import HEART_CENTRES, load_dataset, load_heart_centre, load_mnist_raw
from dpaudit.data import images
from dpaudit.data.files import file_digest, read_sha256sums

_LOADED: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _free_mnist():
    yield
    _LOADED.clear()  # do not keep 230 MB of MNIST alive for the rest of the suite


def require_file(data_dir, rel):
    p = data_dir / rel
    if not p.exists():
        pytest.skip(f"real data file {rel} not found under {data_dir}")
    return p


@pytest.fixture
def mnist(data_dir):
    """Real MNIST, loaded once per module (the decompressed cache makes reloads fast anyway)."""
    for name in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        require_file(data_dir, f"mnist/{name}")
    key = str(data_dir)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = load_dataset("mnist", data_dir=data_dir)
    return data_dir, _LOADED[key]


def test_mnist_table_1(mnist):
    d, ds = mnist
    assert ds.split_sizes == {"train": 51_000, "val": 9_000, "test": 10_000}
    assert ds.image_shape == (1, 28, 28) and ds.n_features == 784 and ds.n_classes == 10
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0
    sums = read_sha256sums(d)
    for name, digest in ds.source_files.items():
        assert digest == file_digest(d / "mnist" / name)
        if f"mnist/{name}" in sums:
            assert sums[f"mnist/{name}"] == digest


def test_mnist_test_set_is_the_official_one_in_order(mnist):
    d, ds = mnist
    # Independent IDX decoding with gzip + numpy (offset 16 / 8 bytes of header).
    with gzip.open(d / "mnist" / "t10k-images-idx3-ubyte.gz") as f:
        imgs = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(d / "mnist" / "t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8)
    np.testing.assert_array_equal(ds.y_test, labels)
    np.testing.assert_array_equal(ds.x_test, (imgs / np.float32(255)).astype(np.float32))
    x_tr, y_tr, x_te, y_te = load_mnist_raw(d)
    assert x_tr.shape == (60_000, 28, 28) and x_tr.dtype == np.uint8 and y_tr.dtype == np.int64
    np.testing.assert_array_equal(x_te.reshape(-1, 784), imgs)
    # Train + val are a partition of the official training set.
    rows = np.concatenate([ds.y_train, ds.y_val])
    np.testing.assert_array_equal(np.bincount(rows, minlength=10), np.bincount(y_tr, minlength=10))


def test_cardio_table_1(data_dir):
    require_file(data_dir, "cardio/cardio_train.csv")
    ds = load_dataset("cardio", data_dir=data_dir)
    assert ds.split_sizes == {"train": 48_025, "val": 10_291, "test": 10_292}
    assert ds.n_features == 32 and ds.n_classes == 2
    assert sum(ds.split_sizes.values()) == 68_608
    for x in (ds.x_train, ds.x_val, ds.x_test):
        assert x.dtype == np.float32 and x.min() >= -1.0 and x.max() <= 1.0
    assert set(np.unique(ds.y_train)) == {0, 1}
    assert ds.source_files["cardio_train.csv"] == file_digest(
        data_dir / "cardio" / "cardio_train.csv"
    )
    again = load_dataset("cardio", data_dir=data_dir)
    assert again.sha256 == ds.sha256
    other = load_dataset("cardio", data_dir=data_dir, split_seed=2027)
    assert other.sha256 != ds.sha256 and other.split_sizes == ds.split_sizes


def test_heart_table_1(data_dir):
    require_file(data_dir, "heart/processed.cleveland.data")
    ds = load_dataset("heart", data_dir=data_dir)
    assert ds.split_sizes == {"train": 212, "val": 45, "test": 46}
    assert ds.n_features == 47
    y = np.concatenate([ds.y_train, ds.y_val, ds.y_test])
    assert int(y.sum()) == 139 and len(y) == 303  # num > 0 count of the UCI Cleveland file
    for seed in (2026, 2027, 2028, 2029):  # the paper's Heart partition seeds
        assert (
            load_dataset("heart", data_dir=data_dir, split_seed=seed).split_sizes == ds.split_sizes
        )


@pytest.mark.parametrize(
    "centre, n, positives",
    [("cleveland", 303, 139), ("hungarian", 294, 106), ("switzerland", 123, 115), ("va", 200, 149)],
)
def test_heart_centres_share_one_feature_space(data_dir, centre, n, positives):
    require_file(data_dir, f"heart/processed.{centre}.data")
    x, y = load_heart_centre(centre, data_dir=data_dir)
    assert x.shape == (n, 47) and x.dtype == np.float32 and y.dtype == np.int64
    assert int(y.sum()) == positives
    assert x.min() >= -1.0 and x.max() <= 1.0
    assert centre in HEART_CENTRES


def test_mnist_cache_is_built_once_and_reused(mnist, monkeypatch):
    from dpaudit.accounting.calibration import cache_dir

    d, ds = mnist
    assert "verified against SHA256SUMS" in ds.notes or "recorded only" in ds.notes
    import dpaudit.data.images as images

    root, _ = images._mnist_torchvision_root(d)
    assert root.parent == cache_dir() / "data"
    marker = root / "MNIST" / "raw" / "COMPLETE"
    stamp = marker.stat().st_mtime_ns
    # A second load must not decompress again: forbid gzip and reload.

    monkeypatch.setattr(
        images.gzip,
        "open",
        lambda *a, **k: (_ for _ in ()).throw(AssertionError("re-decompressed")),
    )
    x_tr, _, _, _ = load_mnist_raw(d)
    assert x_tr.shape == (60_000, 28, 28) and marker.stat().st_mtime_ns == stamp
    assert not list((cache_dir() / "data").glob(".mnist-tmp-*"))


def test_numpy_idx_reader_equals_torchvision_mnist(mnist):
    """load_mnist_raw reads the IDX files with numpy; torchvision's MNIST class gives the same arrays."""
    from torchvision.datasets import MNIST

    d, _ = mnist
    root, _ = images._mnist_torchvision_root(d)
    x_tr, y_tr, x_te, y_te = load_mnist_raw(d)
    for train, x, y in ((True, x_tr, y_tr), (False, x_te, y_te)):
        ds = MNIST(str(root), train=train, download=False)
        np.testing.assert_array_equal(x, ds.data.numpy())
        np.testing.assert_array_equal(y, ds.targets.numpy())
        assert y.dtype == np.int64 and x.dtype == np.uint8
