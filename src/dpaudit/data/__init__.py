"""dpaudit.data: datasets with fixed, data-independent preprocessing and seeded public splits.

Paper 001 (DP-RVFL), section 4.1 and Table 1. See :mod:`dpaudit.data.registry` for the table of datasets and split sizes,
:mod:`dpaudit.data.images` for MNIST / CIFAR-10 and the image profiles, :mod:`dpaudit.data.tabular` for every Cardio / Heart /
breast-cancer bound, and :mod:`dpaudit.data.splits` for the split rule; :mod:`dpaudit.data.authors` for the DP-RVFL authors' own
pipeline (profile ``authors``)."""

from .base import DATA_DIR_ENV, PreparedDataset, array_sha256, resolve_data_dir
from .images import IMAGE_PROFILES, load_cifar10_raw, load_mnist_raw
from .registry import (
    AUTHORS_PROFILE,
    DATASET_NAMES,
    DATASETS,
    TABULAR_PROFILES,
    DatasetInfo,
    dataset_info,
    load_dataset,
    profile_files,
    profile_split_sizes,
)
from .splits import DEFAULT_SPLIT_SEED, split_counts, split_indices
from .tabular import HEART_CENTRES, load_heart_centre

__all__ = [
    "AUTHORS_PROFILE",
    "DATASETS",
    "DATASET_NAMES",
    "DATA_DIR_ENV",
    "DEFAULT_SPLIT_SEED",
    "DatasetInfo",
    "HEART_CENTRES",
    "IMAGE_PROFILES",
    "PreparedDataset",
    "TABULAR_PROFILES",
    "array_sha256",
    "dataset_info",
    "load_cifar10_raw",
    "load_dataset",
    "load_heart_centre",
    "load_mnist_raw",
    "profile_files",
    "profile_split_sizes",
    "resolve_data_dir",
    "split_counts",
    "split_indices",
]
