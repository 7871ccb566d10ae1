"""Cardio, Heart (UCI, four centres) and breast-cancer: fixed, data-independent preprocessing.

Paper 001, section 4.1 and Table 1. No mean, median, variance, category vocabulary or scaler is fitted to any record: every
constant below is written here, before any data is read.

Encoding rules (section 4.1)
----------------------------
- Numerical field with bounds [lo, hi]: clip to [lo, hi], then ``2 (x - lo) / (hi - lo) - 1`` (so the value lies in [-1, 1]). A
  missing or non-finite value becomes the midpoint (0 after the map) and the field's missingness indicator (``<name>__missing``)
  is 1, else 0.
- Categorical field with a prespecified value set: one indicator per value (``<name>=<value>``) plus ``<name>=unknown``, which is
  1 for any value outside the set and for a missing value.
- Labels are binary int64 {0, 1}, 1 = disease present.
- Splits: 70 / 15 / 15 with the seeded permutation of :mod:`dpaudit.data.splits`.

Missing-value tokens in the CSV files: the empty string, ``?``, ``NA``, ``NaN``/``nan``, ``null``. ``inf``/``-inf`` parse as
non-finite and are treated as missing. Any other non-numeric token is a :class:`DataError` naming the file, line and column.

Cardio (``<data_dir>/cardio/cardio_train.csv``, ``;``-separated, 70,000 rows)
--------------------------------------------------------------------------------
Cleaning: drop ``id``; ``age_years = age_days / 365.25``; ``bmi = weight / (height / 100)^2``. Public cohort filters (inclusive; a
row with a missing value in a filtered field fails the filter): height 120-220 cm, weight 30-200 kg, ap_hi 80-250, ap_lo 40-150,
ap_hi >= ap_lo. This keeps 68,608 of 70,000 rows (the paper's count); no duplicate removal (the paper records zero removed).
Target ``cardio`` in {0, 1}.

Fields, bounds and value sets, each with its reason: :data:`CARDIO_SCHEMA`.
6 numerical x 2 + (3 + 4 + 4 + 3 + 3 + 3) categorical = **32 features** (Table 1).

Heart (UCI processed files, ``<data_dir>/heart/processed.<centre>.data``, no header)
--------------------------------------------------------------------------------------
Columns ``age, sex, cp, trestbps, chol, fbs, restecg, thalach, exang, oldpeak, slope, ca, thal, num``; ``?`` = missing. Target
``num > 0``. No cohort filter: all 303 Cleveland rows are kept (paper); a row whose target is missing or negative is a
:class:`DataError`. In the UCI files a value of exactly 0 in ``trestbps`` or ``chol`` is the code for "not measured"
(Switzerland's ``chol`` is 0 in every row), so it is read as missing; Cleveland has no such 0. The primary dataset is Cleveland;
:func:`load_heart_centre` gives any centre in the same feature space.

Fields, bounds and value sets, each with its reason: :data:`HEART_SCHEMA`.
5 numerical x 2 + (3 + 6 + 3 + 4 + 3 + 5 + 6 + 7) categorical = **47 features** (Table 1). The paper's Table S2 (its list of
bounds and sets) is not in the text available here, so these constants are a reconstruction: the categorical sets are the union of
the UCI codes (cp 1-4, slope 1-3, ca 0-3, thal 3/6/7) and the codes of the widely used Kaggle recoding of the same file (cp 0-3,
slope 0-2, ca 0-4, thal 0-3), which is the prespecified schema that gives exactly the 47 features of Table 1. With the UCI file
the extra codes are always 0.

breast-cancer (scikit-learn ``load_breast_cancer``, bundled, 569 rows, 30 features)
-------------------------------------------------------------------------------------
Features are the mean, standard error ("error") and worst value of ten nuclear measurements from digitised images. All are
non-negative by definition, so every lower bound is 0; the upper bounds are round numbers fixed here once, generous relative to
the value ranges printed in the dataset's published description (WDBC, UCI / scikit-learn DESCR) and tied together by geometry
(perimeter ~ 2 pi radius, area ~ pi radius^2). They are constants, never recomputed from records; values above are clipped. No
missingness indicators (the bundled copy has no missing values; a non-finite value would be encoded as the midpoint). Label: 1 =
malignant (scikit-learn's target 0), 0 = benign. Split 70 / 15 / 15: 398 / 85 / 86. The bounds: :data:`BREAST_CANCER_UPPER`."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..lazy import lazy_import
from ..validation import one_of
from .base import resolve_data_dir
from .files import hash_and_verify, read_text

np = lazy_import("numpy")


@dataclass(frozen=True)
class NumericField:
    """A numerical field: clipped to [lower, upper], mapped linearly to [-1, 1]."""

    name: str
    lower: float
    upper: float
    unit: str = ""
    missing_indicator: bool = True
    zero_is_missing: bool = False  # UCI heart code for "not measured"


@dataclass(frozen=True)
class CategoricalField:
    """A categorical field: one indicator per prespecified value plus an unknown indicator."""

    name: str
    values: tuple[float, ...]


Field = NumericField | CategoricalField


def feature_names(schema: tuple[Field, ...]) -> tuple[str, ...]:
    names: list[str] = []
    for f in schema:
        if isinstance(f, NumericField):
            names.append(f.name)
            if f.missing_indicator:
                names.append(f"{f.name}__missing")
        else:
            names += [f"{f.name}={_fmt(v)}" for v in f.values] + [f"{f.name}=unknown"]
    return tuple(names)


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def scale_to_unit(x: np.ndarray, lower: float, upper: float) -> np.ndarray:
    """Clip to [lower, upper] and map linearly to [-1, 1] (non-finite entries are left as NaN)."""
    x = np.asarray(x, dtype=np.float64)
    return 2.0 * (np.clip(x, lower, upper) - lower) / (upper - lower) - 1.0


def encode(columns: dict[str, np.ndarray], schema: tuple[Field, ...]) -> np.ndarray:
    """Encode raw float64 columns (NaN = missing) with a fixed schema -> float32 (n, d)."""
    blocks: list[np.ndarray] = []
    for f in schema:
        x = np.asarray(columns[f.name], dtype=np.float64)
        if isinstance(f, NumericField):
            missing = ~np.isfinite(x)
            if f.zero_is_missing:
                missing |= x == 0
            # The midpoint of [lower, upper] maps to exactly 0.
            val = np.where(
                missing, 0.0, scale_to_unit(np.where(missing, f.lower, x), f.lower, f.upper)
            )
            blocks.append(val[:, None])
            if f.missing_indicator:
                blocks.append(missing.astype(np.float64)[:, None])
        else:
            onehot = np.zeros((len(x), len(f.values) + 1))
            known = np.zeros(len(x), dtype=bool)
            for j, v in enumerate(f.values):
                hit = x == v  # NaN never equals a value, so missing goes to "unknown"
                onehot[:, j] = hit
                known |= hit
            onehot[:, -1] = ~known
            blocks.append(onehot)
    return np.concatenate(blocks, axis=1).astype(np.float32)


# --------------------------------------------------------------------------- CSV parsing

_MISSING_TOKENS = {"", "?", "na", "nan", "null"}


def _parse_float(tok: str, path: Path, line_no: int, col: str) -> float:
    t = tok.strip()
    if t.lower() in _MISSING_TOKENS:
        return math.nan
    try:
        return float(t)
    except ValueError:
        raise DataError(
            f"{path} line {line_no} column {col} must be a number or a missing marker (?, empty, NA), got {t!r}."
        ) from None


def _fast_parse(lines: list[str], sep: str, n_cols: int) -> np.ndarray | None:
    """NumPy's C parser for the common all-numeric case; None sends the caller to the slow path. Any line it cannot parse (missing
    markers, bad tokens, wrong field counts) makes it give up, and the line-by-line parser then handles missing values and reports
    errors with line numbers."""
    body = [ln for ln in lines if ln.strip()]
    if not body:
        return None
    try:
        arr = np.loadtxt(
            io.StringIO("\n".join(body)), delimiter=sep, dtype=np.float64, ndmin=2, comments=None
        )
    except ValueError:
        return None
    if arr.shape != (len(body), n_cols):
        return None
    return arr


def read_table(
    path: Path, sep: str, columns: tuple[str, ...], header: bool
) -> dict[str, np.ndarray]:
    """Read a delimited numeric table into float64 columns (NaN = missing)."""
    lines = read_text(path, "utf-8-sig").splitlines()
    start = _check_header(lines, path, sep, columns) if header else 0
    arr = _fast_parse(lines[start:], sep, len(columns))
    if arr is None:
        arr = _checked_parse(lines, start, path, sep, columns)
    return {c: arr[:, j] for j, c in enumerate(columns)}


def _check_header(lines: list[str], path: Path, sep: str, columns: tuple[str, ...]) -> int:
    """1 (the data start after the header), once the first line is checked to name ``columns``."""
    if not lines:
        raise DataError(f"{path} is empty; expected a header {sep.join(columns)}.")
    got = tuple(c.strip().strip('"') for c in lines[0].split(sep))
    if got != columns:
        raise DataError(f"{path} header must be {sep.join(columns)}, got {lines[0].strip()!r}.")
    return 1


def _checked_parse(lines: list[str], start: int, path: Path, sep: str, columns) -> np.ndarray:
    """The rows from ``start`` on, parsed field by field (a bad field is named, with its line)."""
    rows: list[list[float]] = []
    for i in range(start, len(lines)):
        line = lines[i]
        if not line.strip():
            continue
        toks = line.split(sep)
        if len(toks) != len(columns):
            raise DataError(
                f"{path} line {i + 1} must have {len(columns)} fields, got {len(toks)}."
            )
        rows.append([_parse_float(t, path, i + 1, c) for t, c in zip(toks, columns)])
    if not rows:
        raise DataError(f"{path} must contain at least one data row, got none.")
    return np.asarray(rows, dtype=np.float64)


# --------------------------------------------------------------------------- Cardio

CARDIO_FILE = "cardio_train.csv"
CARDIO_COLUMNS = tuple(
    "id age gender height weight ap_hi ap_lo cholesterol gluc smoke alco active cardio".split()
)
DAYS_PER_YEAR = 365.25

#: Public cohort filters (inclusive), paper section 4.1.
CARDIO_FILTERS = {
    "height": (120.0, 220.0),
    "weight": (30.0, 200.0),
    "ap_hi": (80.0, 250.0),
    "ap_lo": (40.0, 150.0),
}

CARDIO_SCHEMA: tuple[Field, ...] = (
    NumericField("age_years", 18.0, 100.0, "years"),  # adult lifespan; cohort ages are 29-65
    CategoricalField("gender", (1.0, 2.0)),  # file codes (1 = women, 2 = men)
    NumericField("height", 120.0, 220.0, "cm"),  # the cohort filter range
    NumericField("weight", 30.0, 200.0, "kg"),  # the cohort filter range
    NumericField("ap_hi", 80.0, 250.0, "mmHg"),  # the cohort filter range (systolic)
    NumericField("ap_lo", 40.0, 150.0, "mmHg"),  # the cohort filter range (diastolic)
    CategoricalField("cholesterol", (1.0, 2.0, 3.0)),  # normal / above normal / well above normal
    CategoricalField("gluc", (1.0, 2.0, 3.0)),  # normal / above normal / well above normal
    CategoricalField("smoke", (0.0, 1.0)),
    CategoricalField("alco", (0.0, 1.0)),
    CategoricalField("active", (0.0, 1.0)),  # flags
    NumericField("bmi", 10.0, 60.0, "kg/m^2"),  # physiological range; larger values are clipped
)
CARDIO_N_ROWS = 68_608


def cardio_cohort_mask(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Rows kept by the public cohort filters (a NaN fails every comparison, so it is dropped)."""
    keep = np.ones(len(cols["id"]), dtype=bool)
    with np.errstate(invalid="ignore"):
        for name, (lo, hi) in CARDIO_FILTERS.items():
            keep &= (cols[name] >= lo) & (cols[name] <= hi)
        keep &= cols["ap_hi"] >= cols["ap_lo"]
    return keep


def cardio_kept(
    cols: dict[str, np.ndarray], keep: np.ndarray, what: str
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The kept Cardio rows with the derived ``age_years`` and ``bmi``, and the target (DataError naming ``what`` unless 0/1)."""
    cols = {k: np.asarray(v, dtype=np.float64)[keep] for k, v in cols.items()}
    y = cols["cardio"]
    bad = ~np.isin(y, (0.0, 1.0))
    if bad.any():
        raise DataError(
            f"{what} column cardio must be 0 or 1 in every kept row, got {sorted(set(y[bad].tolist()))[:5]}."
        )
    cols["age_years"] = cols["age"] / DAYS_PER_YEAR
    with np.errstate(divide="ignore", invalid="ignore"):
        cols["bmi"] = cols["weight"] / (cols["height"] / 100.0) ** 2
    return cols, y.astype(np.int64)


def prepare_cardio_file(path: Path, *, with_rows: bool = False):
    """Cleaned, encoded Cardio rows in file order: ``(x float32 (n, 32), y int64)``; with ``with_rows`` also the kept rows'
    positions in the file (their identity, dpaudit.data.rows)."""
    cols = read_table(path, ";", CARDIO_COLUMNS, header=True)
    keep = cardio_cohort_mask(cols)
    cols, y = cardio_kept(cols, keep, str(path))
    x = encode(cols, CARDIO_SCHEMA)
    return (x, y, np.flatnonzero(keep)) if with_rows else (x, y)


def load_cardio_raw(data_dir: Path) -> tuple[np.ndarray, np.ndarray, dict[str, str], np.ndarray]:
    folder = data_dir / "cardio"
    hashes = hash_and_verify(data_dir, folder, (CARDIO_FILE,), "Cardio")
    x, y, rows = prepare_cardio_file(folder / CARDIO_FILE, with_rows=True)
    return x, y, hashes, rows


# --------------------------------------------------------------------------- Heart

HEART_CENTRES = ("cleveland", "hungarian", "switzerland", "va")
HEART_COLUMNS = tuple(
    "age sex cp trestbps chol fbs restecg thalach exang oldpeak slope ca thal num".split()
)
HEART_SCHEMA: tuple[Field, ...] = (
    NumericField("age", 18.0, 100.0, "years"),  # adult lifespan (same as Cardio)
    CategoricalField("sex", (0.0, 1.0)),  # file codes
    CategoricalField("cp", (0.0, 1.0, 2.0, 3.0, 4.0)),  # chest-pain type
    # resting systolic; Cardio's ap_hi range
    NumericField("trestbps", 80.0, 250.0, "mmHg", zero_is_missing=True),
    # serum cholesterol, physiological range
    NumericField("chol", 100.0, 600.0, "mg/dl", zero_is_missing=True),
    CategoricalField("fbs", (0.0, 1.0)),  # fasting blood sugar > 120 mg/dl
    CategoricalField("restecg", (0.0, 1.0, 2.0)),  # resting ECG result
    NumericField("thalach", 60.0, 220.0, "bpm"),  # maximum heart rate achieved
    CategoricalField("exang", (0.0, 1.0)),  # exercise-induced angina
    NumericField("oldpeak", -3.0, 7.0, "mm"),  # ST depression (negatives occur in UCI)
    CategoricalField("slope", (0.0, 1.0, 2.0, 3.0)),  # slope of the peak exercise ST segment
    CategoricalField("ca", (0.0, 1.0, 2.0, 3.0, 4.0)),  # number of major vessels coloured
    CategoricalField("thal", (0.0, 1.0, 2.0, 3.0, 6.0, 7.0)),  # thallium scan result
)


def prepare_heart_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Encoded rows of one UCI processed file, in file order: ``(x float32 (n, 47), y int64)``."""
    cols = read_table(path, ",", HEART_COLUMNS, header=False)
    num = cols["num"]
    if not (np.all(np.isfinite(num)) and np.all(num >= 0)):
        raise DataError(
            f"{path} column num must be a number >= 0 in every row, got a missing or negative value."
        )
    return encode(cols, HEART_SCHEMA), (num > 0).astype(np.int64)


def load_heart_centre(centre: str, data_dir=None) -> tuple[np.ndarray, np.ndarray]:
    """One UCI Heart centre with the fixed Heart preprocessing: ``(x float32 (n, 47), y int64 {0,1})``. ``centre`` in cleveland,
    hungarian, switzerland, va. All four share one feature space (the schema above); no row is dropped (Heart has no cohort
    filter). Rows are in file order."""
    x, y, _ = load_heart_raw(resolve_data_dir(data_dir), one_of("centre", centre, HEART_CENTRES))
    return x, y


def load_heart_raw(
    data_dir: Path, centre: str = "cleveland"
) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    folder = data_dir / "heart"
    name = f"processed.{centre}.data"
    hashes = hash_and_verify(data_dir, folder, (name,), "Heart")
    x, y = prepare_heart_file(folder / name)
    return x, y, hashes


# --------------------------------------------------------------------------- breast-cancer

#: Upper bounds (mean, error, worst); every lower bound is 0 (how they were chosen: the module docstring).
BREAST_CANCER_UPPER = {
    "radius": (30.0, 3.0, 40.0),
    "texture": (40.0, 5.0, 50.0),
    "perimeter": (200.0, 25.0, 260.0),
    "area": (2500.0, 550.0, 4500.0),
    "smoothness": (0.2, 0.04, 0.25),
    "compactness": (0.4, 0.15, 1.1),
    "concavity": (0.5, 0.4, 1.3),
    "concave points": (0.25, 0.06, 0.3),
    "symmetry": (0.4, 0.08, 0.7),
    "fractal dimension": (0.1, 0.03, 0.21),
}
BREAST_CANCER_SCHEMA: tuple[Field, ...] = tuple(
    NumericField(name.format(m), 0.0, upper[k], missing_indicator=False)
    for k, name in enumerate(("mean {}", "{} error", "worst {}"))
    for m, upper in BREAST_CANCER_UPPER.items()
)


def load_breast_cancer_encoded() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled WDBC, encoded: ``(x float32 (569, 30) in [-1, 1], y int64, 1 = malignant)``."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    names = tuple(str(n) for n in bunch.feature_names)
    expected = tuple(f.name for f in BREAST_CANCER_SCHEMA)
    if names != expected:
        raise DataError(
            f"scikit-learn breast-cancer feature names must be {expected}, got {names}."
        )
    data = np.asarray(bunch.data, dtype=np.float64)
    cols = {n: data[:, j] for j, n in enumerate(names)}
    y = 1 - np.asarray(bunch.target, dtype=np.int64)  # sklearn: 0 = malignant; here 1 = malignant
    return encode(cols, BREAST_CANCER_SCHEMA), y
