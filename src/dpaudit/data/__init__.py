"""dpaudit.data: datasets with fixed, data-independent preprocessing and seeded public splits.

Paper 001 (DP-RVFL), section 4.1 and Table 1. See :mod:`dpaudit.data.registry` for the table of datasets and split sizes,
:mod:`dpaudit.data.images` for MNIST / CIFAR-10 and the image profiles, :mod:`dpaudit.data.tabular` for every Cardio / Heart /
breast-cancer bound, and :mod:`dpaudit.data.splits` for the split rule; :mod:`dpaudit.data.authors` for the DP-RVFL authors' own
pipeline (profile ``authors``).

The imports below are the package's public API (one list: no ``__all__`` repeating it)."""

# ruff: noqa: F401

from .base import DATA_DIR_ENV, PreparedDataset, array_sha256, resolve_data_dir
from .images import IMAGE_PROFILES, load_cifar10_raw, load_mnist_raw
from .registry import AUTHORS_PROFILE, DATASET_NAMES, DATASETS, TABULAR_PROFILES, DatasetInfo
from .registry import dataset_info, load_dataset, profile_files, profile_split_sizes
from .splits import DEFAULT_SPLIT_SEED, split_counts, split_indices
from .tabular import HEART_CENTRES, load_heart_centre
