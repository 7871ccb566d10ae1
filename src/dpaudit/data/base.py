"""The prepared-dataset record every mechanism consumes, and where data files are looked for."""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DataError

# numpy loads in the functions that use it: the CLI reads DATA_DIR_ENV at start-up
if TYPE_CHECKING:
    import numpy as np

DATA_DIR_ENV = "DPAUDIT_DATA_DIR"
#: Partitions whose sizes a release publishes: evaluation data outside the DP claim (the training partition's actual count is
#: private; see PreparedDataset.identity).
PUBLISHED_PARTITIONS = ("val", "test")


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """The directory to read real data from: ``data_dir`` if given, else ``$DPAUDIT_DATA_DIR``. Raises :class:`DataError` when
    neither is set; nothing is ever downloaded."""
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
    return _fed(hashlib.sha256(), arrays).hexdigest()


def _fed(h, arrays):
    import numpy as np

    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.reshape(-1).view(np.uint8))  # the bytes tobytes() gives, without copying them
    return h


class BackgroundDigest:
    """:func:`array_sha256` of arrays added in order, hashed on one thread as they are added
    (hashlib releases the GIL, so loading goes on meanwhile). The arrays must not change after
    :meth:`add`; :meth:`digest_of` answers only for the very arrays that were added."""

    def __init__(self) -> None:
        self._pool, self._hash = ThreadPoolExecutor(1), hashlib.sha256()
        self._fed, self.arrays = [], ()

    def add(self, *arrays) -> None:
        self.arrays += arrays
        self._fed.append(self._pool.submit(_fed, self._hash, arrays))  # one worker: in order

    def digest_of(self, arrays) -> str | None:
        """The digest if ``arrays`` are the added ones (the same objects), else None."""
        if len(arrays) != len(self.arrays) or any(a is not b for a, b in zip(arrays, self.arrays)):
            return None
        for fed in self._fed:
            fed.result()  # re-raises a failed update: never the digest of part of the data
        self._pool.shutdown()
        return self._hash.hexdigest()


def empty_small_pages(shape, dtype) -> np.ndarray:
    """``np.empty`` without NumPy's transparent-huge-page advice (speed only).

    NumPy asks the kernel for 2 MiB pages on large arrays. Their first touch is cheap on a machine
    with untouched, unfragmented memory, but unpredictable elsewhere: on fragmented memory it waits
    for compaction (measured: ~0.4 s of system time for the 200 MB MNIST feature matrix, vs ~0.1 s
    with ordinary pages), and in a virtual machine whose memory the host has not backed yet it took
    0.06-1.0 s for the 560 MB of an MNIST run against a steady 0.28 s with ordinary pages
    (BENCHMARKS.md, section 4). An anonymous ``mmap`` carries no such advice; the array keeps the
    map alive through ``.base``. Its pages are mapped at once (``MAP_POPULATE``, where the system
    has it): one kernel pass costs less CPU than a fault per page on first write (both callers
    write every element).
    """
    import numpy as np

    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(
        mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=flags), dtype=dtype, count=count
    ).reshape(shape)


def partitions(x, y, train, val, test) -> dict:
    """The six partition arrays of :class:`PreparedDataset` (``x_train`` ... ``y_test``) cut from
    ``x``, ``y`` by the index arrays of each partition."""
    cut = {"train": train, "val": val, "test": test}
    return {f"{a}_{p}": arr[idx] for p, idx in cut.items() for a, arr in (("x", x), ("y", y))}


@dataclass(frozen=True)
class PreparedDataset:
    """A dataset after fixed, data-independent preprocessing and a seeded public split. Features are float32 arrays of shape (n,
    d) (images flattened; ``image_shape`` keeps (channels, height, width) for models that need it). Labels are int64 class
    indices. Validation is never touched by training."""

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
    #: Optional user id per record of each partition ({"train", "val", "test"} -> 1-D array), set only for data split along user
    #: boundaries (see :mod:`dpaudit.data.users`).
    user_ids: dict[str, np.ndarray] | None = None
    #: The declared, public size of the training partition (the dataset definition's, e.g. the registry's documented train size),
    #: NOT the count of ``x_train``: a record-level DP-SGD schedule (q, T, m0) is built from it, so a neighbouring dataset (one
    #: record more or less) runs the identical mechanism. None: not declared (the request must then give one).
    reference_size: int | None = None
    #: The source rows each partition reads (:mod:`dpaudit.data.rows`): the ledger budgets the people behind them across dataset
    #: names. LOCAL ONLY (never in release.json); empty: unknown.
    rows: tuple = ()
    #: The loader's :class:`BackgroundDigest` of the six arrays, or None (:attr:`sha256` hashes).
    digest_job: BackgroundDigest | None = field(default=None, repr=False, compare=False)

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def split_sizes(self) -> dict[str, int]:
        return {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}

    @functools.cached_property  # hashed once per run (data load, reservation, release)
    def sha256(self) -> str:
        """Unkeyed digest of the prepared data (all three splits). LOCAL ONLY: it tells neighbouring datasets apart exactly, so it
        is never published; releases carry it as ``Release.data_digest`` and the ledger stores only a keyed fingerprint of it."""
        arrays = (self.x_train, self.y_train, self.x_val, self.y_val, self.x_test, self.y_test)
        known = self.digest_job and self.digest_job.digest_of(arrays)
        return known or array_sha256(*arrays)

    @property
    def user_ids_sha256(self) -> str | None:
        """Unkeyed digest of the user ids of the three partitions (LOCAL ONLY, like :attr:`sha256`); None when the data are not
        split by users."""
        if self.user_ids is None:
            return None
        import numpy as np

        return array_sha256(*(np.asarray(self.user_ids[p]) for p in ("train", "val", "test")))

    def identity(self) -> dict:
        """The dataset's *public* identity, as published in ``release.json``. Every field is public configuration or a size/schema
        the guarantee assumes public:

        - ``name``, ``kind``, ``profile``, ``split_seed``: public choices of the operator;
        - ``n_features``, ``n_classes``: the schema, fixed before any record is seen;
        - ``split_sizes``: the val / test sizes only: evaluation partitions outside the DP claim (their metrics are published
          too). The training count is private (a neighbour has one record more or less) and is never published: the schedule is
          built from the declared :attr:`reference_size`, which the release records as a mechanism input;
        - ``n_users`` (user-split data): users in the val / test partitions, as above (the training users' count is private too;
          user-level schedules use a declared reference);
        - ``source_files``: the file names read (public paths of the registry), not their hashes.

        Deliberately absent: any hash of the records, of the source files or of the user ids (each one distinguishes neighbouring
        datasets exactly). Use :attr:`sha256` locally."""
        out = {
            "name": self.name,
            "kind": self.kind,
            "profile": self.profile,
            "split_seed": self.split_seed,
            "split_sizes": {p: n for p, n in self.split_sizes.items() if p in PUBLISHED_PARTITIONS},
            "n_features": self.n_features,
            "n_classes": self.n_classes,
            "source_files": sorted(self.source_files),
        }
        if self.user_ids is not None:  # user-split data: how many users each partition holds
            import numpy as np

            out["n_users"] = {
                p: int(np.unique(self.user_ids[p]).size) for p in PUBLISHED_PARTITIONS
            }
        return out
