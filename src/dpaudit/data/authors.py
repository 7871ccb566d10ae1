"""The DP-RVFL authors' data pipeline as the preprocessing profile ``authors``.

The DP-RVFL paper (paper 001, section 4.1) states its preprocessing in words but leaves out two things a reproduction needs: the
split rule (which generator, which cut points) and Table S2 (the bounds and categorical sets). The authors' public code states
both. This module implements those stated rules (written here from the rules, not from the authors' code) for MNIST, CIFAR-10,
Cardio and Heart, so a run can use the authors' exact partition and encoding (``load_dataset(name, profile="authors")``,
``--profile authors``). dpaudit's own profile (``default`` for tabular data, ``raw01`` for images) is unchanged;
``docs/data-profiles.md`` says how the two differ and why both exist.

Split (``split_seed`` default 2026): ``numpy.random.default_rng(split_seed)`` (PCG64 seeded directly, *not* dpaudit's tagged
:func:`dpaudit.noise.public_rng`), its first ``permutation(n)`` of the cleaned rows in file order, cut at ``int(fraction * n)``
(the float product truncated): tabular 70 / 15 / 15; images 85 / 15 of the official training set, the official test set being
the test partition in the order of the generator's second ``permutation(n_test)``. Partitions keep the permutation's order.

Encoding (record-wise, nothing fitted): as :mod:`dpaudit.data.tabular`, with the authors' bounds and
levels (:data:`CARDIO_SCHEMA`, :data:`HEART_SCHEMA`; compared in ``docs/data-profiles.md``), except that
a missing value becomes (lo + hi) / 2 before clipping, a non-finite one counts as missing, and the
columns are every numerical field (value, missing) first, then every categorical field. Cardio:
dpaudit's cohort filters, plus a present target; no duplicate removal (68,608 rows). Heart reads
``heart/heart_kaggle.csv`` (the Kaggle-format file, *not* the UCI Cleveland file of the default
profile), drops exact duplicate rows keeping the first (302 of 303) and takes ``y = target > 0``
as the file codes it (see ``shared/data/heart/SOURCE.md``). Images: ``ToTensor`` only, [0, 1].

Privacy contract: as for every profile, all of this is public, fixed, record-wise preprocessing and a public split chosen before
training; nothing is fitted to records (the de-duplication and cohort filters are public cleaning, outside the training guarantee,
paper section 3.1). The guarantee of a run covers the training partition it receives. The ledger accounts per dataset *name* and
partition, so releases on ``heart`` under both profiles compose (the two Heart files hold the same patients)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..lazy import lazy_import
from ..validation import non_negative_int
from .base import partitions, resolve_data_dir
from .files import count_note, hash_and_verify, sums_note
from .images import CIFAR_MD5_NOTE, apply_profile, load_official
from .rows import SOURCES, TEST_OFFSET, RowSet, row_sets
from .tabular import (
    CARDIO_COLUMNS,
    CARDIO_FILE,
    CategoricalField,
    Field,
    NumericField,
    cardio_cohort_mask,
    cardio_kept,
    encode,
    feature_names,
    read_table,
)

np = lazy_import("numpy")

AUTHORS_PROFILE = "authors"
#: The authors' split seed: ``numpy.random.default_rng(2026)``.
AUTHORS_SPLIT_SEED = 2026
#: Datasets the authors' pipeline covers.
AUTHORS_DATASETS = ("mnist", "cifar10", "cardio", "heart")

TABULAR_TRAIN_FRACTION = 0.70
TABULAR_TRAIN_VAL_FRACTION = 0.85
IMAGE_TRAIN_FRACTION = 0.85


def cut_point(n: int, fraction: float) -> int:
    """``int(fraction * n)``: the float product, truncated (the rule as stated, not exact integer arithmetic)."""
    return int(fraction * int(n))


@dataclass(frozen=True)
class SplitIndices:
    """Record indices of each partition, in the order the partition holds them (int64). Tabular data: indices into the cleaned
    rows (file order). Images: ``train``/``val`` index the official training set, ``test`` the official test set."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    def sizes(self) -> dict[str, int]:
        return {p: int(getattr(self, p).size) for p in ("train", "val", "test")}

    def sha256(self) -> dict[str, str]:
        """SHA-256 of each partition's *sorted* int64 indices (the set, independent of order)."""
        return {p: sorted_index_sha256(getattr(self, p)) for p in ("train", "val", "test")}


def sorted_index_sha256(indices: np.ndarray) -> str:
    return hashlib.sha256(
        np.sort(np.asarray(indices, dtype=np.int64)).astype("<i8").tobytes()
    ).hexdigest()


def tabular_split(n: int, split_seed: int = AUTHORS_SPLIT_SEED) -> SplitIndices:
    """The authors' 70 / 15 / 15 rule over ``n`` cleaned rows."""
    n = non_negative_int("n", n)
    perm = (
        np.random.default_rng(non_negative_int("split_seed", split_seed))
        .permutation(n)
        .astype(np.int64)
    )
    a, b = cut_point(n, TABULAR_TRAIN_FRACTION), cut_point(n, TABULAR_TRAIN_VAL_FRACTION)
    return SplitIndices(perm[:a], perm[a:b], perm[b:])


def image_split(n_train: int, n_test: int, split_seed: int = AUTHORS_SPLIT_SEED) -> SplitIndices:
    """The authors' 85 / 15 rule over the official training set; test = the official test set in the order of the generator's
    second permutation."""
    n_train, n_test = non_negative_int("n_train", n_train), non_negative_int("n_test", n_test)
    rng = np.random.default_rng(non_negative_int("split_seed", split_seed))
    perm = rng.permutation(n_train).astype(np.int64)
    test = rng.permutation(n_test).astype(np.int64)
    a = cut_point(n_train, IMAGE_TRAIN_FRACTION)
    return SplitIndices(perm[:a], perm[a:], test)


def _sizes(split: tuple[int, int, int]) -> dict[str, int]:
    return {"train": split[0], "val": split[1], "test": split[2]}


def split_sizes(name: str) -> dict[str, int]:
    """Partition sizes of the authors' rule on the full, original files (public, computed from the row counts)."""
    if name in ("mnist", "cifar10"):
        n_train, n_test = (60_000, 10_000) if name == "mnist" else (50_000, 10_000)
        a = cut_point(n_train, IMAGE_TRAIN_FRACTION)
        return _sizes((a, n_train - a, n_test))
    n = {"cardio": CARDIO_N_ROWS, "heart": HEART_N_ROWS}[name]
    a, b = cut_point(n, TABULAR_TRAIN_FRACTION), cut_point(n, TABULAR_TRAIN_VAL_FRACTION)
    return _sizes((a, b - a, n - b))


# --------------------------------------------------------------------------- Cardio

# The file, its columns, the day-to-year factor and the kept-row ranges (inclusive; plus ap_hi >= ap_lo and a present target) are
# the same as dpaudit's own Cardio profile: shared from tabular.
CARDIO_SCHEMA: tuple[Field, ...] = (
    NumericField("age_years", 0.0, 120.0, "years"),
    NumericField("height", 100.0, 250.0, "cm"),
    NumericField("weight", 20.0, 300.0, "kg"),
    NumericField("ap_hi", 40.0, 300.0, "mmHg"),
    NumericField("ap_lo", 20.0, 200.0, "mmHg"),
    NumericField("bmi", 5.0, 100.0, "kg/m^2"),
    CategoricalField("gender", (1.0, 2.0)),
    CategoricalField("cholesterol", (1.0, 2.0, 3.0)),
    CategoricalField("gluc", (1.0, 2.0, 3.0)),
    CategoricalField("smoke", (0.0, 1.0)),
    CategoricalField("alco", (0.0, 1.0)),
    CategoricalField("active", (0.0, 1.0)),
)
CARDIO_N_ROWS = 68_608


def prepare_cardio(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Filter, derive and encode the Cardio file: ``(x float32 (n, 32), y int64)``. The authors
    keep the cohort filters' rows with a present target (a missing value fails every comparison,
    so such a row is dropped)."""
    cols = read_table(path, ";", CARDIO_COLUMNS, header=True)
    cols, y = cardio_kept(cols, np.isfinite(cols["cardio"]) & cardio_cohort_mask(cols), "Cardio")
    return encode(cols, CARDIO_SCHEMA), y


# --------------------------------------------------------------------------- Heart (Kaggle format)

HEART_FILE = "heart_kaggle.csv"
HEART_COLUMNS = tuple(
    "age sex cp trestbps chol fbs restecg thalach exang oldpeak slope ca thal target".split()
)
HEART_SCHEMA: tuple[Field, ...] = (
    NumericField("age", 0.0, 120.0, "years"),
    NumericField("trestbps", 40.0, 300.0, "mmHg"),
    NumericField("chol", 0.0, 700.0, "mg/dl"),
    NumericField("thalach", 30.0, 250.0, "bpm"),
    NumericField("oldpeak", 0.0, 10.0, "mm"),
    CategoricalField("cp", (0.0, 1.0, 2.0, 3.0, 4.0)),
    CategoricalField("restecg", (0.0, 1.0, 2.0)),
    CategoricalField("slope", (0.0, 1.0, 2.0, 3.0)),
    CategoricalField("ca", (0.0, 1.0, 2.0, 3.0, 4.0)),
    CategoricalField("thal", (0.0, 1.0, 2.0, 3.0, 6.0, 7.0)),
    CategoricalField("sex", (0.0, 1.0)),
    CategoricalField("fbs", (0.0, 1.0)),
    CategoricalField("exang", (0.0, 1.0)),
)
HEART_N_ROWS = 302  # 303 rows in the file, one exact duplicate


def first_occurrence_mask(rows: np.ndarray) -> np.ndarray:
    """True for the first of each group of exactly equal rows (missing values equal each other)."""
    keep = np.zeros(len(rows), dtype=bool)
    seen: set[tuple] = set()
    for i, row in enumerate(np.asarray(rows, dtype=np.float64)):
        key = tuple("nan" if math.isnan(v) else float(v) for v in row)
        if key not in seen:
            seen.add(key)
            keep[i] = True
    return keep


def prepare_heart(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """De-duplicate and encode the Kaggle-format Heart file: ``(x float32 (n, 47), y int64)``."""
    cols = read_table(path, ",", HEART_COLUMNS, header=True)
    table = np.column_stack([np.asarray(cols[c], dtype=np.float64) for c in HEART_COLUMNS])
    keep = first_occurrence_mask(table)
    cols = {c: table[keep, j] for j, c in enumerate(HEART_COLUMNS)}
    target = cols["target"]
    if not np.all(np.isfinite(target)):
        raise DataError("Heart column target must be present in every row, got a missing value.")
    return encode(cols, HEART_SCHEMA), (target > 0).astype(np.int64)


#: Files each dataset needs under the authors' profile (relative to the data directory).
FILES = {"cardio": (f"cardio/{CARDIO_FILE}",), "heart": (f"heart/{HEART_FILE}",)}

CARDIO_FEATURES = feature_names(CARDIO_SCHEMA)
HEART_FEATURES = feature_names(HEART_SCHEMA)


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class AuthorsRows:
    """The cleaned, encoded records before the split, in file order.

    Tabular: ``x``/``y`` are all cleaned rows and ``x_test``/``y_test`` are None. Images: ``x``/``y`` are the official training
    set, ``x_test``/``y_test`` the official test set."""

    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    image_shape: tuple[int, int, int] | None
    feature_names: tuple[str, ...] | None
    source_files: dict[str, str]
    notes: str


def load_rows(name: str, data_dir=None) -> AuthorsRows:
    """Read and encode ``name`` (mnist, cifar10, cardio, heart) under the authors' rules, unsplit."""
    root = resolve_data_dir(data_dir)
    if name in ("cardio", "heart"):
        folder = root / name
        fname = CARDIO_FILE if name == "cardio" else HEART_FILE
        what = "Cardio" if name == "cardio" else "Heart (Kaggle format)"
        src = hash_and_verify(root, folder, (fname,), what)
        if name == "cardio":
            x, y = prepare_cardio(folder / fname)
            expected, names, kept = CARDIO_N_ROWS, CARDIO_FEATURES, "cohort filters kept"
        else:
            x, y = prepare_heart(folder / fname)
            expected, names, kept = HEART_N_ROWS, HEART_FEATURES, "exact-duplicate removal kept"
        note = f"authors' pipeline: {count_note(kept, len(y), expected)}"
        note += "; " + sums_note(root, folder, (fname,))
        return AuthorsRows(x, y, None, None, None, names, dict(src), note)
    if name not in ("mnist", "cifar10"):
        raise DataError(
            f"dataset for the authors' profile must be one of {', '.join(AUTHORS_DATASETS)}, got {name!r}."
        )

    x_tr, y_tr, x_te, y_te, src, official, sums = load_official(root, name)
    if official is None:
        note = f"authors' pipeline: official MNIST test set, ToTensor pixels in [0, 1]; {sums}"
    else:
        note = (
            "authors' pipeline: official CIFAR-10 test batch, ToTensor pixels in [0, 1]; "
            f"{CIFAR_MD5_NOTE[official]}; {sums}"
        )
    # The images stay uint8 here; load() converts each partition once (ToTensor = raw01 arithmetic).
    _, shape = apply_profile(x_tr[:1], "raw01")
    return AuthorsRows(x_tr, y_tr, x_te, y_te, shape, None, dict(src), note)


def load(info, data_dir=None, split_seed: int | None = None):
    """``(PreparedDataset, SplitIndices)`` for registry entry ``info`` under the authors' profile. The returned indices are the
    ones used to cut the partitions (see :class:`SplitIndices`); their sorted-set SHA-256 is also written into the dataset's
    ``notes``."""
    seed = AUTHORS_SPLIT_SEED if split_seed is None else non_negative_int("split_seed", split_seed)
    rows = load_rows(info.name, data_dir)
    if info.kind == "tabular":
        idx = tabular_split(len(rows.y), seed)
        arrays = partitions(rows.x, rows.y, idx.train, idx.val, idx.test)
    else:
        idx = image_split(len(rows.y), len(rows.y_test), seed)
        arrays = {}
        for p, x, y in (
            ("train", rows.x, rows.y),
            ("val", rows.x, rows.y),
            ("test", rows.x_test, rows.y_test),
        ):
            arrays[f"x_{p}"] = apply_profile(x[getattr(idx, p)], "raw01")[0]
            arrays[f"y_{p}"] = y[getattr(idx, p)]
    hashes = idx.sha256()
    notes = (
        rows.notes
        + f"; split numpy default_rng({seed}).permutation, int() cut points; sorted-index sha256 "
        + ", ".join(f"{p} {hashes[p]}" for p in ("train", "val", "test"))
        + "."
    )
    data = info.prepared(
        seed,
        **arrays,
        profile=AUTHORS_PROFILE,
        image_shape=rows.image_shape,
        feature_names=rows.feature_names,
        source_files=rows.source_files,
        notes=notes,
        rows=_row_sets(info, idx),
    )
    return data, idx


def _row_sets(info, idx: SplitIndices) -> tuple:
    """Images: rows of the official files (exact). Tabular: the authors' files are filtered or de-duplicated copies of the same
    people in another row order, so every row of the source counts as read privately (fail closed, dpaudit.data.rows)."""
    if info.kind == "tabular":
        return (RowSet(SOURCES[info.name], "private", None),)
    return row_sets(
        SOURCES[info.name],
        {"train": idx.train, "val": idx.val, "test": TEST_OFFSET[info.name] + idx.test},
    )
