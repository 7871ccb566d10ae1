"""The dataset registry (:data:`DATASETS`: kind, files, split sizes, features, profiles) and :func:`load_dataset`
(paper 001, section 4.1 and Table 1).

- Images: the official test set is the test partition; the official training set is split 85 / 15 (train / unused validation).
  Tabular and the bundled digits: 70 / 15 / 15. Always the seeded permutation with integer cut points of
  :mod:`dpaudit.data.splits`, no stratification, default split seed 2026 (:data:`~dpaudit.data.splits.DEFAULT_SPLIT_SEED`).
- ``digits`` is scikit-learn's bundled ``load_digits`` (1,797 images, 8 x 8, values 0..16): ``raw01`` divides by the fixed maximum
  16, ``centered`` applies ``Normalize(0.5, 0.5)`` after that, ``half-resolution`` applies ``torchvision.transforms.Resize((4,
  4))`` (bilinear, antialiased) to the [0, 1] float image (the pixels are not uint8, so no PIL round trip).
- Preprocessing of each source: :mod:`dpaudit.data.images` and :mod:`dpaudit.data.tabular` (every bound is documented there);
  profile ``authors``: :mod:`dpaudit.data.authors` and ``docs/data-profiles.md``.

Privacy contract: everything here is public, fixed preprocessing and a public split; no statistic is fitted on records. The DP
guarantee of a training run covers the training partition it receives; cohort cleaning and file audits are outside it (paper
section 3.1)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..lazy import lazy_import
from ..validation import non_negative_int, one_of
from . import authors

# the DP-RVFL authors' pipeline, offered for the paper's four datasets
from .authors import AUTHORS_PROFILE
from .images import (
    CIFAR_FILES,
    CIFAR_FOLDER,
    CIFAR_MD5_NOTE,
    IMAGE_PROFILES,
    MNIST_FILES,
    apply_profile,
    load_official,
)
from .tabular import (
    BREAST_CANCER_SCHEMA,
    CARDIO_N_ROWS,
    CARDIO_SCHEMA,
    HEART_SCHEMA,
    feature_names,
    load_breast_cancer_encoded,
    load_cardio_raw,
    load_heart_raw,
)
from .base import BackgroundDigest, PreparedDataset, partitions, resolve_data_dir
from .files import count_note, sums_note
from .rows import SOURCES, TEST_OFFSET, row_sets
from .splits import DEFAULT_SPLIT_SEED, split_indices, train_val_indices

np = lazy_import("numpy")

TABULAR_PROFILES = ("default",)


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset is, before loading it."""

    name: str
    kind: str  # "image" or "tabular"
    needs_files: bool
    split_sizes: dict  # {"train", "val", "test"} for the full, official data
    n_features: int
    n_classes: int
    description: str
    files: tuple[str, ...]  # relative to the data directory
    image_shape: tuple[int, int, int] | None
    profiles: tuple[str, ...]
    default_profile: str
    default_split_seed: int = DEFAULT_SPLIT_SEED

    def to_dict(self) -> dict:
        return {
            **dataclasses.asdict(self),
            "files": list(self.files),
            "image_shape": list(self.image_shape) if self.image_shape else None,
            "profiles": list(self.profiles),
        }

    def prepared(self, split_seed: int, **fields) -> PreparedDataset:
        """A :class:`PreparedDataset` of this dataset (its name, kind and classes) split with
        ``split_seed``; ``fields``: its partitions and the rest."""
        return PreparedDataset(
            name=self.name,
            kind=self.kind,
            n_classes=self.n_classes,
            split_seed=split_seed,
            **fields,
        )


def _info(name, kind, sizes, n_features, description, files=(), image_shape=None) -> DatasetInfo:
    """A registry entry; the rest follows from its kind (images: 10 classes, image profiles;
    tabular: 2 classes, one profile), its files and the authors' pipeline's datasets."""
    image = kind == "image"
    authors_profile = (AUTHORS_PROFILE,) if name in authors.AUTHORS_DATASETS else ()
    return DatasetInfo(
        name,
        kind,
        bool(files),
        dict(zip(("train", "val", "test"), sizes)),
        n_features,
        10 if image else 2,
        description,
        files,
        image_shape,
        (IMAGE_PROFILES if image else TABULAR_PROFILES) + authors_profile,
        "raw01" if image else "default",
    )


_ENTRIES = (
    _info(
        "mnist",
        "image",
        (51_000, 9_000, 10_000),
        784,
        "MNIST handwritten digits (LeCun et al.), 28x28 grayscale; official test set; train split 85/15.",
        tuple(f"mnist/{n}" for n in MNIST_FILES),
        (1, 28, 28),
    ),
    _info(
        "cifar10",
        "image",
        (42_500, 7_500, 10_000),
        3072,
        "CIFAR-10 (Krizhevsky), 32x32 colour; official test batch; train split 85/15.",
        tuple(f"cifar10/{CIFAR_FOLDER}/{n}" for n in CIFAR_FILES),
        (3, 32, 32),
    ),
    _info(
        "cardio",
        "tabular",
        (48_025, 10_291, 10_292),
        32,
        "Kaggle Cardiovascular Disease dataset; public cohort filters keep 68,608 of 70,000 rows; fixed bounds to [-1, 1]; "
        "split 70/15/15.",
        ("cardio/cardio_train.csv",),
    ),
    _info(
        "heart",
        "tabular",
        (212, 45, 46),
        47,
        "UCI Heart Disease, Cleveland processed file (303 rows), target num > 0; fixed bounds to [-1, 1]; split 70/15/15.",
        ("heart/processed.cleveland.data",),
    ),
    _info(
        "digits",
        "image",
        (1_257, 269, 271),
        64,
        "scikit-learn bundled digits (1,797 images, 8x8, values 0..16 scaled by the fixed max 16); split 70/15/15; "
        "needs no files.",
        image_shape=(1, 8, 8),
    ),
    _info(
        "breast-cancer",
        "tabular",
        (398, 85, 86),
        30,
        "scikit-learn bundled Wisconsin diagnostic breast cancer (569 rows, 30 features), fixed bounds to [-1, 1], "
        "1 = malignant; split 70/15/15; needs no files.",
    ),
)
DATASETS: dict[str, DatasetInfo] = {info.name: info for info in _ENTRIES}

DATASET_NAMES: tuple[str, ...] = tuple(DATASETS)


def dataset_info(name: str) -> DatasetInfo:
    """Registry entry for ``name``; an unknown name is a :class:`UsageError` listing the allowed ones.

    Args:
        name: the dataset name.

    Returns:
        Its registry entry.

    Raises:
        UsageError: an unknown name.
    """
    return DATASETS[one_of("dataset", name, DATASET_NAMES)]


def _check_profile(info: DatasetInfo, profile: str | None) -> str:
    if profile is None:
        return info.default_profile
    return one_of(f"profile for {info.kind} dataset {info.name}", profile, info.profiles)


def profile_files(name: str, profile: str | None = None) -> tuple[str, ...]:
    """Files (relative to the data directory) that ``name`` needs under ``profile``."""
    info = dataset_info(name)
    if _check_profile(info, profile) == AUTHORS_PROFILE:
        return authors.FILES.get(name, info.files)
    return info.files


def profile_split_sizes(name: str, profile: str | None = None) -> dict:
    """Partition sizes of ``name`` under ``profile`` for the full, original files (public)."""
    info = dataset_info(name)
    if _check_profile(info, profile) == AUTHORS_PROFILE:
        return authors.split_sizes(name)
    return dict(info.split_sizes)


def load_dataset(
    name: str, *, data_dir=None, split_seed: int | None = None, profile: str | None = None
) -> PreparedDataset:
    """Load ``name`` with its fixed preprocessing and its seeded public split. ``profile`` / ``split_seed``: None means the
    dataset's default (:data:`DATASETS`; seed 2026). ``data_dir``: the argument, else ``$DPAUDIT_DATA_DIR`` (not needed for digits
    and breast-cancer). Raises :class:`UsageError` for a bad name/profile/seed and :class:`DataError` for missing or corrupt files.

    The result declares ``reference_size``: the definition's train size under ``profile`` (:func:`profile_split_sizes`), whatever
    the files hold (a file with one row more or less keeps the same DP-SGD schedule).

    Args:
        name: a registered dataset name (:data:`DATASET_NAMES`).
        data_dir: the data directory (default ``$DPAUDIT_DATA_DIR``).
        split_seed: the seed of the public split (None: the dataset's default).
        profile: the preprocessing profile (None: the dataset's default).

    Returns:
        The prepared dataset with its public split.

    Raises:
        UsageError: an unknown name, profile or an invalid seed.
        DataError: missing or corrupt files.
    """
    info = dataset_info(name)
    profile = _check_profile(info, profile)
    seed = (
        info.default_split_seed
        if split_seed is None
        else non_negative_int("split_seed", split_seed)
    )
    data = _load(info, name, data_dir, seed, profile)
    return dataclasses.replace(
        data, reference_size=int(profile_split_sizes(name, profile)["train"])
    )


def _load(info, name, data_dir, seed, profile) -> PreparedDataset:
    if profile == AUTHORS_PROFILE:
        return authors.load(info, data_dir, seed)[0]
    if name in ("mnist", "cifar10"):
        return _load_official_image(info, name, data_dir, seed, profile)
    if name == "digits":
        return _load_digits(info, seed, profile)
    x, y, src, file_ids, schema, notes = _read_tabular(name, data_dir)
    described = dict(feature_names=feature_names(schema), source_files=src, notes=notes)
    return _split_70_15_15(info, x, y, seed, file_ids, **described)


def _read_tabular(name, data_dir) -> tuple:
    """(x, y, source files, file row id of each record, schema, notes) of a tabular dataset."""
    if name == "breast-cancer":
        x, y = load_breast_cancer_encoded()
        note = "scikit-learn load_breast_cancer (bundled); fixed upper bounds, see dpaudit.data.tabular."
        return x, y, {}, np.arange(len(y)), BREAST_CANCER_SCHEMA, note
    root = resolve_data_dir(data_dir)
    if name == "cardio":
        x, y, src, file_ids = load_cardio_raw(root)
        note = count_note("cohort filters kept", len(y), CARDIO_N_ROWS)
        note += "; " + sums_note(root, root / "cardio", tuple(src))
        return x, y, dict(src), file_ids, CARDIO_SCHEMA, note + "."
    if name == "heart":
        x, y, src = load_heart_raw(root, "cleveland")
        sums = sums_note(root, root / "heart", tuple(src))
        note = f"UCI Cleveland processed file; target num > 0; {sums}."
        return x, y, dict(src), np.arange(len(y)), HEART_SCHEMA, note
    raise AssertionError(name)


def _split_70_15_15(info, x, y, seed, file_ids, **described) -> PreparedDataset:
    """Tabular data and the bundled digits: the 70 / 15 / 15 split of ``x``, ``y`` and the rows
    (``file_ids`` of each record) each partition reads; ``described``: the other fields."""
    tr, va, te = split_indices(len(y), seed, 70, 15)
    ids = {"train": file_ids[tr], "val": file_ids[va], "test": file_ids[te]}
    return info.prepared(
        seed, **partitions(x, y, tr, va, te), rows=row_sets(SOURCES[info.name], ids), **described
    )


def _load_official_image(info, which, data_dir, seed, profile) -> PreparedDataset:
    x_tr, y_tr, x_te, y_te, src, official, sums = load_official(resolve_data_dir(data_dir), which)
    if official is None:
        notes = f"official MNIST test set; training set split 85/15; {sums}."
    else:
        verified = "." if official else "; structure verified only."
        notes = (
            "official CIFAR-10 test batch; training batches split 85/15; "
            f"{CIFAR_MD5_NOTE[official]}{verified} {sums}."
        )
    tr, va = train_val_indices(len(y_tr), seed, 85)
    # Apply the profile per partition so memory stays at one float copy of each; each finished
    # partition is hashed (the dataset's digest) while the next is prepared.
    digest, (x_train, shape) = BackgroundDigest(), apply_profile(x_tr[tr], profile)
    digest.add(x_train, y_tr[tr])
    digest.add(apply_profile(x_tr[va], profile)[0], y_tr[va])
    digest.add(apply_profile(x_te, profile)[0], y_te)
    test_ids = TEST_OFFSET[which] + np.arange(len(y_te))
    arrays = dict(zip(("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"), digest.arrays))
    return info.prepared(
        seed,
        **arrays,
        digest_job=digest,
        profile=profile,
        image_shape=shape,
        source_files=dict(src),
        notes=notes,
        rows=row_sets(SOURCES[which], {"train": tr, "val": va, "test": test_ids}),
    )


DIGITS_MAX = 16.0  # load_digits pixel values are integer counts 0..16 (fixed by construction)


def _load_digits(info, seed, profile) -> PreparedDataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32)  # (1797, 8, 8), values 0..16
    y = np.asarray(bunch.target, dtype=np.int64)
    # float32 operations: torch's floats, without importing torch
    t = images[:, None] / np.float32(DIGITS_MAX)
    if profile == "centered":
        t = (t - np.float32(0.5)) / np.float32(0.5)
    elif profile == "half-resolution":
        import torch
        from torchvision import transforms

        t = transforms.Resize((4, 4), antialias=True)(torch.from_numpy(t)).clamp(0.0, 1.0).numpy()
    shape = tuple(int(s) for s in t.shape[1:])
    x = t.reshape(len(y), -1).astype(np.float32)
    notes = "scikit-learn load_digits (bundled); pixels / 16; split 70/15/15."
    return _split_70_15_15(
        info, x, y, seed, np.arange(len(y)), profile=profile, image_shape=shape, notes=notes
    )
