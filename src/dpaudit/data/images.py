"""MNIST (IDX files, read with numpy) and CIFAR-10 (torchvision's dataset class), and the fixed image profiles.

Paper 001, sections 3.6 and 4.1, Table 1 and Table 7.

Files (read-only; nothing is downloaded, ``download=False`` always):

- MNIST: ``<data_dir>/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``
- CIFAR-10: ``<data_dir>/cifar10/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}``

MNIST: each ``.gz`` is hashed (sha256, checked against ``<data_dir>/SHA256SUMS`` when listed there) and decompressed once
into ``cache_dir()/data/mnist-<hash>/MNIST/raw`` (built in a temporary folder and renamed into place; a folder without its
``COMPLETE`` marker is rebuilt), then read with :func:`read_idx`. CIFAR-10: torchvision's class, with its md5 check replaced by
a structural one behind a restricted unpickler (:func:`_verified_cifar10_class`); the notes say whether the md5s are the
official ones. Partitions: the official test set is the test partition; the training images are split 85/15 (MNIST
51,000 / 9,000; CIFAR-10 42,500 / 7,500).

Profiles (fixed, independent of any record; paper section 3.6, Table 7):

===================  ==================================================================  =======
profile              transform (torchvision)                                             range
===================  ==================================================================  =======
``raw01``            ``ToTensor()``: uint8 / 255                                          [0, 1]
``centered``         ``ToTensor()`` then ``Normalize(0.5, 0.5)``: (x - 0.5) / 0.5         [-1, 1]
``half-resolution``  ``Resize((H/2, W/2))`` (PIL bilinear, antialiased), ``ToTensor()``   [0, 1]
===================  ==================================================================  =======

All three are bit-equal to the torchvision pipelines applied image by image (tested; :func:`apply_profile`). Features are
flattened in (channel, height, width) order; ``image_shape`` keeps (C, H, W)."""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import os
import pickle
import shutil
import tempfile
import zlib
from pathlib import Path

from ..errors import DataError
from ..lazy import lazy_import
from ..paths import cache_dir
from ..validation import one_of
from .base import empty_small_pages, resolve_data_dir
from .files import file_digest, hash_and_verify, sums_note

np = lazy_import("numpy")

IMAGE_PROFILES = ("raw01", "centered", "half-resolution")

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
MNIST_TRAIN_SIZE = 60_000
MNIST_TEST_SIZE = 10_000

CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_TRAIN_FILES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5")
CIFAR_TEST_FILES = ("test_batch",)
CIFAR_META_FILE = "batches.meta"
CIFAR_FILES = CIFAR_TRAIN_FILES + CIFAR_TEST_FILES + (CIFAR_META_FILE,)
CIFAR_TRAIN_SIZE = 50_000
CIFAR_TEST_SIZE = 10_000


# --------------------------------------------------------------------------- profiles


def apply_profile(images: np.ndarray, profile: str) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Fixed profile of uint8 images (n, H, W) or (n, H, W, C) -> float32 (n, C*H'*W'), (C, H', W'). The profile is a per-record
    transform with fixed constants: it fits nothing to the data."""
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise DataError(
            f"images must be uint8 of shape (n, H, W[, C]), got {images.dtype} {images.shape}."
        )
    one_of("profile", profile, IMAGE_PROFILES)
    if profile == "half-resolution":
        return apply_profile(_half_resolution(images), "raw01")
    chw = images[:, None, :, :] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
    # Exactly ToTensor's arithmetic: float32 conversion (exact), then division by 255, and for
    # ``centered`` Normalize(0.5, 0.5)'s: subtract, then divide (IEEE float32 operations, so NumPy
    # gives torch's floats; all 256 pixel values are checked in the tests).
    t = empty_small_pages((chw.shape[0], int(np.prod(chw.shape[1:]))), np.float32)
    t.reshape(chw.shape)[...] = chw  # in (channel, height, width) order
    t /= np.float32(255)
    if profile == "centered":
        t -= np.float32(0.5)
        t /= np.float32(0.5)
    return t, chw.shape[1:]


def _half_resolution(images: np.ndarray) -> np.ndarray:
    """``transforms.Resize((H/2, W/2))`` (PIL bilinear, antialiased) on each image, the call Resize
    makes: uint8 in the input's layout (the ToTensor arithmetic follows, for the whole batch)."""
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    hwc = images if images.ndim == 4 else images[..., None]
    n, h, w, c = hwc.shape
    small = np.empty((n, h // 2, w // 2, c), dtype=np.uint8)
    for i in range(n):
        img = Image.fromarray(hwc[i, :, :, 0], mode="L") if c == 1 else Image.fromarray(hwc[i])
        small[i] = np.asarray(TF.resize(img, [h // 2, w // 2], InterpolationMode.BILINEAR)).reshape(
            h // 2, w // 2, c
        )
    return small if c > 1 else small[..., 0]


# --------------------------------------------------------------------------- MNIST


def _cache_root() -> Path:
    return cache_dir() / "data"


def _mnist_torchvision_root(data_dir: Path) -> tuple[Path, dict[str, str]]:
    """Verify the four ``.gz`` files and return a torchvision root holding ``MNIST/raw/*``."""
    folder = data_dir / "mnist"
    hashes = hash_and_verify(data_dir, folder, MNIST_FILES, "MNIST")
    tag = hashlib.sha256("".join(hashes[n] for n in MNIST_FILES).encode()).hexdigest()[:20]
    root = _cache_root() / f"mnist-{tag}"
    done = root / "MNIST" / "raw" / "COMPLETE"
    if done.is_file():
        return root, hashes
    base = _cache_root()
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".mnist-tmp-", dir=base))
    except OSError as exc:
        raise DataError(
            f"cannot create the MNIST cache under {base}: {exc.strerror or exc}."
        ) from None
    try:
        _gunzip_mnist(folder, tmp / "MNIST" / "raw", hashes)
        _move_into_place(tmp, root, done)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root, hashes


def _gunzip_mnist(folder: Path, raw: Path, hashes: dict[str, str]) -> None:
    """Decompress the four verified ``.gz`` files of ``folder`` into ``raw``; mark it COMPLETE."""
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        src = folder / name
        try:
            with gzip.open(src, "rb") as fin, open(raw / name[: -len(".gz")], "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(
                f"MNIST file {src} is corrupt (cannot gunzip: {exc}); expected {', '.join(MNIST_FILES)} "
                f"in {folder}."
            ) from None
    (raw / "COMPLETE").write_text("\n".join(f"{hashes[n]}  {n}" for n in MNIST_FILES) + "\n")


def _move_into_place(tmp: Path, root: Path, done: Path) -> None:
    """Rename the built folder ``tmp`` to ``root``. When that fails, either another process finished
    first (its copy is equivalent: ``done`` exists), or a stale folder without the COMPLETE marker
    is in the way: it is removed and ours put in place."""
    for attempt in range(2):
        try:
            os.rename(tmp, root)
            return
        except OSError as exc:
            if done.is_file():
                return
            if attempt:
                raise DataError(
                    f"cannot write the MNIST cache {root}: {exc.strerror or exc}."
                ) from None
            shutil.rmtree(root, ignore_errors=True)


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """One decompressed IDX file of unsigned bytes (type 0x08) with ``ndim`` dimensions. The same format check and the same array
    as torchvision's MNIST reader (magic 0x0000 08 nd, big-endian int32 sizes, then the bytes), without importing torchvision: its
    import pulls in torch._dynamo and costs seconds on every MNIST command. tests/data compare both readers."""
    with open(path, "rb") as f:
        # read straight into the array's own memory (no zeroed buffer first, no copy afterwards)
        raw = np.empty(os.fstat(f.fileno()).st_size, dtype=np.uint8)
        # shorter when the file changed size while read (checked below)
        raw = raw[: f.readinto(raw)]
    head = 4 + 4 * ndim
    if raw[:4].tolist() != [0, 0, 0x08, ndim]:
        raise DataError(
            f"IDX file {path} must start with magic 0x000008{ndim:02x} (unsigned bytes, {ndim} dimensions), "
            f"got {raw[:4].tobytes().hex() or 'an empty file'}."
        )
    if raw.size < head:
        raise DataError(
            f"IDX file {path} is truncated: {raw.size} bytes, the header alone needs {head}."
        )
    shape = tuple(int(v) for v in raw[4:head].view(">i4"))
    if raw.size != head + math.prod(shape):
        want = head + math.prod(shape)
        raise DataError(
            f"IDX file {path} must hold {want} bytes for shape {shape}, got {raw.size}."
        )
    return raw[head:].reshape(shape)


def load_mnist_raw(data_dir=None, *, with_sources: bool = False):
    """The official MNIST split, unpermuted: ``(x_train, y_train, x_test, y_test)``. ``x_*`` uint8 (n, 28, 28), ``y_*`` int64.
    Read from the verified, decompressed cache with :func:`read_idx` (arrays equal to
    ``torchvision.datasets.MNIST(download=False)``'s; tested). With ``with_sources=True`` a fifth element maps each ``.gz`` file
    name to its sha256."""
    data_dir = resolve_data_dir(data_dir)
    root, hashes = _mnist_torchvision_root(data_dir)
    raw = root / "MNIST" / "raw"
    out = []
    for train, size in ((True, MNIST_TRAIN_SIZE), (False, MNIST_TEST_SIZE)):
        prefix = "train" if train else "t10k"
        try:
            x = read_idx(raw / f"{prefix}-images-idx3-ubyte", 3)
            y = read_idx(raw / f"{prefix}-labels-idx1-ubyte", 1).astype(np.int64)
        except (DataError, OSError) as exc:
            raise DataError(
                f"MNIST files in {data_dir / 'mnist'} are malformed ({exc}); "
                f"expected the IDX files {', '.join(MNIST_FILES)}."
            ) from None
        if x.shape != (size, 28, 28) or y.shape != (size,) or y.min() < 0 or y.max() > 9:
            raise DataError(
                f"MNIST {'training' if train else 'test'} set in {data_dir / 'mnist'} must have "
                f"{size} images of 28x28 with labels 0..9, got images {tuple(x.shape)}."
            )
        out += [x, y]
    return (*out, hashes) if with_sources else tuple(out)


# --------------------------------------------------------------------------- CIFAR-10

# md5 of the official python batches (the list torchvision pins); used only to say whether the files read are the official ones.
_CIFAR_OFFICIAL_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}

_SAFE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild NumPy arrays and plain containers, and nothing else."""

    def find_class(self, module, name):
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR-10 file")


def _safe_load(path: Path) -> object:
    with open(path, "rb") as f:
        return _SafeUnpickler(io.BytesIO(f.read()), encoding="latin1").load()


def _check_batch(path: Path) -> int:
    """Structure of one ``data_batch_*`` / ``test_batch`` pickle; returns its record count."""
    obj = _safe_load(path)
    if not isinstance(obj, dict) or "data" not in obj or "labels" not in obj:
        raise ValueError("not a dict with 'data' and 'labels'")
    data, labels = obj["data"], np.asarray(obj["labels"])
    if (
        not isinstance(data, np.ndarray)
        or (data.dtype, data.ndim) != (np.uint8, 2)
        or data.shape[1] != 3072
    ):
        raise ValueError(
            f"'data' must be uint8 (n, 3072), got {getattr(data, 'dtype', type(data))} {getattr(data, 'shape', '')}"
        )
    if (
        labels.shape != (data.shape[0],)
        or labels.dtype.kind not in "iu"
        or np.any((labels < 0) | (labels > 9))
    ):
        raise ValueError("'labels' must be one integer in 0..9 per row of 'data'")
    return int(data.shape[0])


def _label_names(path: Path) -> list:
    obj = _safe_load(path)
    names = obj.get("label_names") if isinstance(obj, dict) else None
    if not isinstance(names, list) or len(names) != 10:
        raise ValueError("'label_names' must be a list of 10 names")
    return names


def _corrupt(path: Path, exc: Exception) -> DataError:
    return DataError(
        f"CIFAR-10 file {path} is corrupt or not in the cifar-10-batches-py format ({exc}); "
        f"expected {', '.join(CIFAR_FILES)} in {path.parent}."
    )


def _verified_cifar10_class():
    from torchvision.datasets import CIFAR10

    class _VerifiedCIFAR10(CIFAR10):
        """CIFAR10 whose md5 check (which synthetic test batches fail) is replaced by a structural one: every file is parsed
        with a restricted unpickler (NumPy array constructors only) before torchvision's unrestricted ``pickle.load``, and must
        hold ``data`` uint8 (n, 3072) and ``labels`` (n ints in 0..9); the meta file ten ``label_names``."""

        def _check_integrity(self) -> bool:
            folder = Path(self.root) / self.base_folder
            for name, _ in self.train_list + self.test_list:
                try:
                    _check_batch(folder / name)
                except Exception as exc:
                    raise _corrupt(folder / name, exc) from None
            return True

        def _load_meta(self) -> None:
            path = Path(self.root) / self.base_folder / self.meta["filename"]
            try:
                self.classes = _label_names(path)
            except Exception as exc:
                raise _corrupt(path, exc) from None
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    return _VerifiedCIFAR10


def load_cifar10_raw(data_dir=None, *, with_sources: bool = False):
    """The official CIFAR-10 split, unpermuted: ``(x_train, y_train, x_test, y_test)``. ``x_*`` uint8 (n, 32, 32, 3) (HWC, as
    torchvision holds it), ``y_*`` int64. With ``with_sources=True`` two more elements: ``file name -> sha256`` and whether every
    file's md5 equals the official one."""
    data_dir = resolve_data_dir(data_dir)
    root = data_dir / "cifar10"
    folder = root / CIFAR_FOLDER
    hashes = hash_and_verify(data_dir, folder, CIFAR_FILES, "CIFAR-10")
    official = all(file_digest(folder / n, "md5") == _CIFAR_OFFICIAL_MD5[n] for n in CIFAR_FILES)
    cls = _verified_cifar10_class()
    out = []
    for train in (True, False):
        try:
            ds = cls(str(root), train=train, download=False)
        except DataError:
            raise
        except Exception as exc:
            raise DataError(
                f"CIFAR-10 files in {folder} are malformed ({type(exc).__name__}: {exc}); "
                f"expected {', '.join(CIFAR_FILES)}."
            ) from None
        out += [
            np.ascontiguousarray(ds.data, dtype=np.uint8),
            np.asarray(ds.targets, dtype=np.int64),
        ]
    if official and (len(out[1]) != CIFAR_TRAIN_SIZE or len(out[3]) != CIFAR_TEST_SIZE):
        raise DataError(
            f"CIFAR-10 in {folder} must have 50000 + 10000 images, got {len(out[1])} + {len(out[3])}."
        )
    return (*out, hashes, official) if with_sources else tuple(out)


#: What a CIFAR-10 note says about the files' md5 (official or not).
CIFAR_MD5_NOTE = {
    True: "files match the official md5 list",
    False: "files are NOT the official CIFAR-10 batches (md5 differs)",
}


def load_official(data_dir: Path, name: str) -> tuple:
    """``(x_train, y_train, x_test, y_test, sources, official, sums)`` of ``name`` (mnist or
    cifar10): the official split unpermuted, ``file name -> sha256``, whether every CIFAR-10 file's
    md5 is the official one (None for MNIST), and the :func:`~dpaudit.data.files.sums_note` phrase."""
    if name == "mnist":
        *arrays, sources = load_mnist_raw(data_dir, with_sources=True)
        official, folder = None, data_dir / "mnist"
    else:
        *arrays, sources, official = load_cifar10_raw(data_dir, with_sources=True)
        folder = data_dir / "cifar10" / CIFAR_FOLDER
    return (*arrays, sources, official, sums_note(data_dir, folder, tuple(sources)))
