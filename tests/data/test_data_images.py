"""Image profiles against torchvision, synthetic CIFAR-10 pickles, corrupt / altered files."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle

import numpy as np
import pytest
from PIL import Image
from torchvision import transforms

from dpaudit.data import load_dataset
from dpaudit.data import images
from dpaudit.data.images import CIFAR_TRAIN_FILES, MNIST_FILES, apply_profile, load_cifar10_raw
from dpaudit.data.splits import train_val_indices
from dpaudit.errors import DataError


def _reference(images: np.ndarray, tf) -> np.ndarray:
    out = []
    for img in images:
        pil = Image.fromarray(img, mode="L") if img.ndim == 2 else Image.fromarray(img)
        out.append(tf(pil).numpy().reshape(-1))
    return np.stack(out)


@pytest.mark.parametrize("shape", [(7, 28, 28), (5, 32, 32, 3)])
def test_profiles_equal_torchvision_transforms(shape):
    imgs = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    imgs[0] = 0
    imgs[1] = 255
    raw, s = apply_profile(imgs, "raw01")
    np.testing.assert_array_equal(raw, _reference(imgs, transforms.ToTensor()))
    cen, _ = apply_profile(imgs, "centered")
    ref = _reference(
        imgs,
        transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize((0.5,) * s[0], (0.5,) * s[0])]
        ),
    )
    np.testing.assert_array_equal(cen, ref)
    assert cen.min() == -1.0 and cen.max() == 1.0 and raw.min() == 0.0 and raw.max() == 1.0
    half, hs = apply_profile(imgs, "half-resolution")
    h, w = shape[1] // 2, shape[2] // 2
    assert hs == (s[0], h, w)
    np.testing.assert_array_equal(
        half,
        _reference(imgs, transforms.Compose([transforms.Resize((h, w)), transforms.ToTensor()])),
    )
    assert half.dtype == np.float32 and 0.0 <= half.min() and half.max() <= 1.0


# ----------------------------------------------------------------------------- synthetic CIFAR-10


def _write_cifar(root, n_per_batch=12, n_test=10, protocol=2, seed=0):
    """Small files in the cifar-10-batches-py format (dicts of uint8 (n, 3072) + label lists)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {}
    for name, n in [(f, n_per_batch) for f in CIFAR_TRAIN_FILES] + [("test_batch", n_test)]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        with open(folder / name, "wb") as f:
            pickle.dump(
                {
                    "batch_label": name,
                    "data": data,
                    "labels": labels,
                    "filenames": [f"img{i}.png" for i in range(n)],
                },
                f,
                protocol=protocol,
            )
        batches[name] = (data, labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump(
            {
                "label_names": [f"class{i}" for i in range(10)],
                "num_cases_per_batch": n_per_batch,
                "num_vis": 3072,
            },
            f,
            protocol=protocol,
        )
    return folder, batches


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_synthetic_cifar_round_trip(tmp_path, protocol):
    folder, batches = _write_cifar(tmp_path, protocol=protocol)
    x_tr, y_tr, x_te, y_te, src, official = load_cifar10_raw(tmp_path, with_sources=True)
    train_data = np.concatenate([batches[f][0] for f in CIFAR_TRAIN_FILES])
    # Independent decoding of the documented layout: 1024 R, then G, then B values, row-major.
    np.testing.assert_array_equal(x_tr, train_data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(y_tr, sum((batches[f][1] for f in CIFAR_TRAIN_FILES), []))
    assert official is False
    for name, digest in src.items():
        assert digest == hashlib.sha256((folder / name).read_bytes()).hexdigest()

    d = load_dataset("cifar10", data_dir=tmp_path, split_seed=5)
    tr, va = train_val_indices(60, 5, 85)
    assert d.split_sizes == {"train": 51, "val": 9, "test": 10} and d.image_shape == (3, 32, 32)
    np.testing.assert_array_equal(d.x_train, (train_data[tr] / np.float32(255)).astype(np.float32))
    np.testing.assert_array_equal(
        d.x_test, (batches["test_batch"][0] / np.float32(255)).astype(np.float32)
    )
    np.testing.assert_array_equal(d.y_val, np.asarray(y_tr)[va])
    assert "NOT the official" in d.notes and len(d.source_files) == 7
    half = load_dataset("cifar10", data_dir=tmp_path, profile="half-resolution")
    assert half.image_shape == (3, 16, 16) and half.n_features == 768
    cen = load_dataset("cifar10", data_dir=tmp_path, profile="centered")
    assert cen.x_train.min() >= -1 and cen.x_train.max() <= 1


def test_cifar_pickle_with_code_is_refused_before_it_runs(tmp_path):
    folder, _ = _write_cifar(tmp_path)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({"data": Evil(), "labels": [0]}, f)
    with pytest.raises(DataError) as e:
        load_dataset("cifar10", data_dir=tmp_path)
    assert "data_batch_3" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "labels", "shape"])
def test_corrupt_cifar_is_a_data_error(tmp_path, damage):
    folder, batches = _write_cifar(tmp_path)
    path = folder / "test_batch"
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    else:
        data, labels = batches["test_batch"]
        obj = (
            {"data": data, "labels": labels[:-1]}
            if damage == "labels"
            else {"data": data[:, :100], "labels": labels}
        )
        with open(path, "wb") as f:
            pickle.dump(obj, f)
    with pytest.raises(DataError) as e:
        load_dataset("cifar10", data_dir=tmp_path)
    assert "test_batch" in str(e.value) and str(folder) in str(e.value)


# ----------------------------------------------------------------------------- MNIST file errors


def _fake_mnist_dir(root):
    folder = root / "mnist"
    folder.mkdir(parents=True)
    for name in MNIST_FILES:
        with gzip.open(folder / name, "wb") as f:
            f.write(b"\x00" * 16)
    return folder


def test_corrupt_mnist_gz(tmp_path):
    folder = _fake_mnist_dir(tmp_path)
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(b"this is not gzip")
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir=tmp_path)
    msg = str(e.value)
    assert (
        "t10k-labels-idx1-ubyte.gz" in msg
        and "corrupt" in msg
        and str(folder) in msg
        and "\n" not in msg
    )


def test_malformed_mnist_idx(tmp_path):
    _fake_mnist_dir(tmp_path)  # valid gzip, but not IDX content
    with pytest.raises(DataError, match="malformed|must have"):
        load_dataset("mnist", data_dir=tmp_path)


def test_sha256sums_mismatch_is_refused(tmp_path):
    _fake_mnist_dir(tmp_path)
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  mnist/train-labels-idx1-ubyte.gz\n")
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir=tmp_path)
    assert "train-labels-idx1-ubyte.gz" in str(e.value) and "sha256" in str(e.value)


def test_missing_one_mnist_file(tmp_path):
    folder = _fake_mnist_dir(tmp_path)
    (folder / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DataError) as e:
        load_dataset("mnist", data_dir=tmp_path)
    assert "missing: train-images-idx3-ubyte.gz" in str(e.value) and str(folder) in str(e.value)


def test_stale_mnist_cache_without_marker_is_replaced(tmp_path, monkeypatch):
    """A cache folder lacking COMPLETE (e.g. a crash mid-write by an older version) is rebuilt."""
    import dpaudit.data.images as images

    folder = _fake_mnist_dir(tmp_path / "data")
    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    root, _ = images._mnist_torchvision_root(tmp_path / "data")
    (root / "MNIST" / "raw" / "COMPLETE").unlink()
    (root / "MNIST" / "raw" / "junk").write_text("x")
    root2, _ = images._mnist_torchvision_root(tmp_path / "data")
    assert root2 == root and (root / "MNIST" / "raw" / "COMPLETE").is_file()
    assert not (root / "MNIST" / "raw" / "junk").exists()
    assert folder.is_dir()


def _idx_bytes(arr: np.ndarray) -> bytes:
    head = bytes([0, 0, 0x08, arr.ndim]) + np.asarray(arr.shape, dtype=">i4").tobytes()
    return head + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()


def test_read_idx_round_trip_and_refusals(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    p = tmp_path / "x-idx3-ubyte"
    p.write_bytes(_idx_bytes(arr))
    out = images.read_idx(p, 3)
    np.testing.assert_array_equal(out, arr)
    assert out.flags.writeable  # a copy, not a view of the file's bytes
    with pytest.raises(DataError, match="magic 0x00000801"):
        images.read_idx(p, 1)  # wrong number of dimensions
    p.write_bytes(_idx_bytes(arr)[:-1])
    with pytest.raises(DataError, match="must hold"):
        images.read_idx(p, 3)  # truncated data
    p.write_bytes(b"\x00\x00\x08\x03\x00")
    with pytest.raises(DataError, match="truncated"):
        images.read_idx(p, 3)
    p.write_bytes(b"")
    with pytest.raises(DataError, match="empty file"):
        images.read_idx(p, 3)


def test_mnist_load_does_not_import_torchvision(tmp_path):
    """Reading MNIST no longer costs torchvision's import (seconds: it pulls in torch._dynamo)."""
    import subprocess
    import sys

    folder = tmp_path / "mnist"
    folder.mkdir()
    rng = np.random.default_rng(1)
    import gzip

    for prefix, n in (("train", 60_000), ("t10k", 10_000)):
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, size=n, dtype=np.uint8)
        with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz", "wb", compresslevel=1) as f:
            f.write(_idx_bytes(x))
        with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz", "wb", compresslevel=1) as f:
            f.write(_idx_bytes(y))
    code = (
        "import sys; from dpaudit.data.images import load_mnist_raw; "
        f"x = load_mnist_raw({str(tmp_path)!r}); assert x[0].shape == (60000, 28, 28); "
        "print('torchvision' in sys.modules)"
    )
    env = {**__import__("os").environ, "DPAUDIT_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("profile", ["raw01", "centered"])
def test_every_pixel_value_gets_torchvisions_float(profile):
    """The profiles are NumPy float32 operations (no torch import): for each of the 256 values the
    float ToTensor (and Normalize) give, bit for bit, whatever the image layout."""
    values = np.arange(256, dtype=np.uint8)
    tf = (
        transforms.ToTensor()
        if profile == "raw01"
        else transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,), (0.5,))])
    )
    got, _ = apply_profile(values.reshape(1, 16, 16), profile)
    want = _reference(values.reshape(1, 16, 16), tf)
    assert got.dtype == np.float32 and np.array_equal(
        got.view(np.uint32), want.astype(np.float32).view(np.uint32)
    )
    rgb, _ = apply_profile(
        np.stack([values.reshape(16, 16)] * 3, axis=-1)[None], profile
    )  # (1, 16, 16, 3): channels first after
    assert np.array_equal(rgb.reshape(3, -1), np.repeat(got, 3, axis=0))


@pytest.mark.parametrize(
    "profile, note",
    [
        (
            None,
            "official CIFAR-10 test batch; training batches split 85/15; files are NOT the official "
            "CIFAR-10 batches (md5 differs); structure verified only. no SHA256SUMS entries for the "
            "source files; their sha256 are recorded only.",
        ),
        (
            "authors",
            "authors' pipeline: official CIFAR-10 test batch, ToTensor pixels in [0, 1]; files are NOT "
            "the official CIFAR-10 batches (md5 differs); no SHA256SUMS entries for the source files; "
            "their sha256 are recorded only; split numpy default_rng(2026)",
        ),
    ],
)
def test_cifar_notes_of_both_profiles_are_unchanged(tmp_path, profile, note):
    # Both profiles read the files through one loader; each keeps its own wording (as before).
    _write_cifar(tmp_path)
    assert load_dataset("cifar10", data_dir=tmp_path, profile=profile).notes.startswith(note)
