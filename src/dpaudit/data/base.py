"""The prepared-dataset record every mechanism consumes, and where data files are looked for."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import DataError

DATA_DIR_ENV = "DPAUDIT_DATA_DIR"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """The directory to read real data from: ``data_dir`` if given, else ``$DPAUDIT_DATA_DIR``.

    Raises :class:`DataError` when neither is set; nothing is ever downloaded.
    """
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV)
    if not data_dir:
        raise DataError(
            f"no data directory given: pass --data-dir DIR or set {DATA_DIR_ENV} "
            "(dpaudit never downloads data)."
        )
    return Path(data_dir).expanduser()


def array_sha256(*arrays: np.ndarray) -> str:
    """SHA-256 over the bytes, dtypes and shapes of prepared arrays (the dataset's identity)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class PreparedDataset:
    """A dataset after fixed, data-independent preprocessing and a seeded public split.

    Features are float32 arrays of shape (n, d) (images flattened; ``image_shape`` keeps
    (channels, height, width) for models that need it). Labels are int64 class indices.
    Validation is never touched by training.
    """

    name: str
    kind: str  # "image" or "tabular"
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    split_seed: int
    profile: str = "default"
    image_shape: tuple[int, ...] | None = None
    feature_names: tuple[str, ...] | None = None
    source_files: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    notes: str = ""
    #: Optional user id per record of each partition ({"train", "val", "test"} -> 1-D array),
    #: set only for data split along user boundaries (see :mod:`dpaudit.data.users`).
    user_ids: dict[str, np.ndarray] | None = None

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def split_sizes(self) -> dict[str, int]:
        return {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}

    @property
    def sha256(self) -> str:
        """Identity of the prepared data (all three splits) for releases and the ledger."""
        return array_sha256(self.x_train, self.y_train, self.x_val, self.y_val, self.x_test, self.y_test)

    def identity(self) -> dict:
        out = {
            "name": self.name,
            "kind": self.kind,
            "sha256": self.sha256,
            "profile": self.profile,
            "split_seed": self.split_seed,
            "split_sizes": self.split_sizes,
            "n_features": self.n_features,
            "n_classes": self.n_classes,
            "source_files": dict(self.source_files),
        }
        if self.user_ids is not None:  # user-split data: who the users are is part of its identity
            out["user_ids_sha256"] = array_sha256(*(np.asarray(self.user_ids[p]) for p in ("train", "val", "test")))
            out["n_users"] = {p: int(np.unique(self.user_ids[p]).size) for p in ("train", "val", "test")}
        return out
