"""dpaudit.data: datasets with fixed, data-independent preprocessing and seeded public splits.

Paper 001 (DP-RVFL), section 4.1 and Table 1. See :mod:`dpaudit.data.registry` for the table of datasets and split sizes,
:mod:`dpaudit.data.images` for MNIST / CIFAR-10 and the image profiles, :mod:`dpaudit.data.tabular` for every Cardio / Heart /
breast-cancer bound, and :mod:`dpaudit.data.splits` for the split rule; :mod:`dpaudit.data.authors` for the DP-RVFL authors' own
pipeline (profile ``authors``)."""

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

# The loaders import torch / torchvision (seconds); names load from their submodule on first use (PEP 562), so `from
# dpaudit.data.base import ...` and the CLI start without them.
_SOURCES = {
    "base": ("DATA_DIR_ENV", "PreparedDataset", "array_sha256", "resolve_data_dir"),
    "images": ("IMAGE_PROFILES", "load_cifar10_raw", "load_mnist_raw"),
    "registry": ("AUTHORS_PROFILE", "DATASET_NAMES", "DATASETS", "TABULAR_PROFILES", "DatasetInfo", "dataset_info",
                 "load_dataset", "profile_files", "profile_split_sizes"),
    "splits": ("DEFAULT_SPLIT_SEED", "split_counts", "split_indices"),
    "tabular": ("HEART_CENTRES", "load_heart_centre"),
}


_WHERE = {name: module for module, names in _SOURCES.items() for name in names}

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time the names load lazily
    from .base import DATA_DIR_ENV, PreparedDataset, array_sha256, resolve_data_dir  # noqa: F401
    from .images import IMAGE_PROFILES, load_cifar10_raw, load_mnist_raw  # noqa: F401
    from .registry import (AUTHORS_PROFILE, DATASET_NAMES, DATASETS, TABULAR_PROFILES, DatasetInfo,  # noqa: F401
                           dataset_info, load_dataset, profile_files, profile_split_sizes)
    from .splits import DEFAULT_SPLIT_SEED, split_counts, split_indices  # noqa: F401
    from .tabular import HEART_CENTRES, load_heart_centre  # noqa: F401


__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())


__all__ = sorted(_WHERE)
