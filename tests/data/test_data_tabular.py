"""Fixed tabular preprocessing on tiny synthetic files: filters, bounds, missing and unknown values."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.data import load_dataset, load_heart_centre
from dpaudit.data.tabular import (
    CARDIO_SCHEMA,
    HEART_SCHEMA,
    feature_names,
    prepare_cardio_file,
    prepare_heart_file,
)
from dpaudit.errors import DataError, UsageError

HEADER = "id;age;gender;height;weight;ap_hi;ap_lo;cholesterol;gluc;smoke;alco;active;cardio"


def _cardio(tmp_path, rows):
    folder = tmp_path / "cardio"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cardio_train.csv"
    path.write_text("\n".join([HEADER] + rows) + "\n")
    return path


def _col(x, name, schema=CARDIO_SCHEMA):
    return x[:, feature_names(schema).index(name)]


def test_schema_sizes_match_table_1():
    assert len(feature_names(CARDIO_SCHEMA)) == 32
    assert len(feature_names(HEART_SCHEMA)) == 47
    assert len(set(feature_names(HEART_SCHEMA))) == 47


def test_cardio_cohort_filters(tmp_path):
    path = _cardio(
        tmp_path,
        [
            "0;18262;1;170;70.0;120;80;1;1;0;0;1;0",  # kept
            "1;18262;1;119;70.0;120;80;1;1;0;0;1;0",  # height < 120
            "2;18262;1;220;200.0;250;150;1;1;0;0;1;1",  # every bound at its inclusive edge: kept
            "3;18262;1;170;29.5;120;80;1;1;0;0;1;0",  # weight < 30
            "4;18262;1;170;70.0;251;80;1;1;0;0;1;0",  # ap_hi > 250
            "5;18262;1;170;70.0;120;39;1;1;0;0;1;0",  # ap_lo < 40
            "6;18262;1;170;70.0;90;100;1;1;0;0;1;0",  # ap_hi < ap_lo
            "7;18262;1;;70.0;120;80;1;1;0;0;1;0",  # missing height fails the filter
            "8;18262;1;170;70.0;120;120;1;1;0;0;1;1",  # ap_hi == ap_lo: kept
        ],
    )
    x, y = prepare_cardio_file(path)
    assert x.shape == (3, 32) and x.dtype == np.float32
    np.testing.assert_array_equal(y, [0, 1, 1])
    # Independent reference values: height 170 in [120, 220] -> 2 * 50 / 100 - 1 = 0.
    np.testing.assert_allclose(_col(x, "height"), [0.0, 1.0, 0.0])
    np.testing.assert_allclose(
        _col(x, "ap_lo"), [2 * 40 / 110 - 1, 1.0, 2 * 80 / 110 - 1], rtol=1e-6
    )
    # age 18262 days = 49.998... years; bounds [18, 100].
    np.testing.assert_allclose(_col(x, "age_years"), 2 * (18262 / 365.25 - 18) / 82 - 1, rtol=1e-6)
    # BMI 70 / 1.7^2 = 24.22; 200 / 2.2^2 = 41.32; bounds [10, 60].
    np.testing.assert_allclose(
        _col(x, "bmi"),
        [
            2 * (70 / 1.7**2 - 10) / 50 - 1,
            2 * (200 / 2.2**2 - 10) / 50 - 1,
            2 * (70 / 1.7**2 - 10) / 50 - 1,
        ],
        rtol=1e-6,
    )


def test_cardio_missing_and_unknown_indicators(tmp_path):
    path = _cardio(
        tmp_path,
        [
            "0;;2;170;70.0;120;80;4;?;0;0;1;0",  # age missing; cholesterol 4 unknown; gluc missing
            "1;inf;1;170;70.0;120;80;1;2;NA;0;1;1",  # age non-finite; smoke missing
            "2;50000;1;170;70.0;120;80;3;3;1;1;0;0",  # age 136.9 years: clipped to the upper bound
        ],
    )
    x, y = prepare_cardio_file(path)
    np.testing.assert_array_equal(_col(x, "age_years"), [0.0, 0.0, 1.0])  # midpoint -> 0
    np.testing.assert_array_equal(_col(x, "age_years__missing"), [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(_col(x, "height__missing"), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(_col(x, "cholesterol=unknown"), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(
        _col(x, "cholesterol=1") + _col(x, "cholesterol=3"), [0.0, 1.0, 1.0]
    )
    np.testing.assert_array_equal(_col(x, "gluc=unknown"), [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(_col(x, "smoke=unknown"), [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(_col(x, "gender=2"), [1.0, 0.0, 0.0])
    # Each categorical block is exactly one-hot.
    names = feature_names(CARDIO_SCHEMA)
    for field in ("gender", "cholesterol", "gluc", "smoke", "alco", "active"):
        block = x[:, [i for i, n in enumerate(names) if n.startswith(field + "=")]]
        np.testing.assert_array_equal(block.sum(axis=1), 1.0)
    assert x.min() >= -1.0 and x.max() <= 1.0


def test_cardio_bad_token_and_header(tmp_path):
    path = _cardio(tmp_path, ["0;18262;1;170;seventy;120;80;1;1;0;0;1;0"])
    with pytest.raises(DataError, match=r"line 2 column weight"):
        prepare_cardio_file(path)
    path.write_text("a;b;c\n1;2;3\n")
    with pytest.raises(DataError, match="header must be"):
        prepare_cardio_file(path)
    path.write_text(HEADER + "\n0;18262;1;170;70.0;120;80;1;1;0;0;1;2\n")
    with pytest.raises(DataError, match="cardio must be 0 or 1"):
        prepare_cardio_file(path)


def test_cardio_through_load_dataset_small_file(tmp_path):
    rows = [f"{i};{18000 + i};1;170;70.0;120;80;1;1;0;0;1;{i % 2}" for i in range(20)]
    _cardio(tmp_path, rows)
    d = load_dataset("cardio", data_dir=tmp_path, split_seed=3)
    assert d.split_sizes == {"train": 14, "val": 3, "test": 3} and d.n_features == 32
    assert "differs from the published one" in d.notes
    assert list(d.source_files) == ["cardio_train.csv"]


def test_heart_missing_zero_codes_and_target(tmp_path):
    folder = tmp_path / "heart"
    folder.mkdir()
    (folder / "processed.va.data").write_text(
        "63.0,1.0,1.0,145.0,233.0,1.0,2.0,150.0,0.0,2.3,3.0,0.0,6.0,0\n"
        "67.0,1.0,4.0,0,0,0.0,2.0,108.0,1.0,-5,2.0,?,?,2\n"
    )
    x, y = load_heart_centre("va", data_dir=tmp_path)
    assert x.shape == (2, 47)
    np.testing.assert_array_equal(y, [0, 1])
    c = lambda n: _col(x, n, HEART_SCHEMA)  # noqa: E731
    np.testing.assert_allclose(c("trestbps"), [2 * (145 - 80) / 170 - 1, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(c("trestbps__missing"), [0, 1])
    np.testing.assert_array_equal(c("chol__missing"), [0, 1])
    np.testing.assert_array_equal(
        c("oldpeak"), [np.float32(2 * (2.3 + 3) / 10 - 1), -1.0]
    )  # -5 clipped to -3
    np.testing.assert_array_equal(c("ca=unknown"), [0, 1])
    np.testing.assert_array_equal(c("thal=6"), [1, 0])
    np.testing.assert_array_equal(c("cp=4"), [0, 1])
    with pytest.raises(
        UsageError, match="centre must be one of cleveland, hungarian, switzerland, va"
    ):
        load_heart_centre("boston", data_dir=tmp_path)
    with pytest.raises(DataError, match="processed.hungarian.data"):
        load_heart_centre("hungarian", data_dir=tmp_path)


def test_heart_missing_target_is_refused(tmp_path):
    path = tmp_path / "h.data"
    path.write_text("63.0,1.0,1.0,145.0,233.0,1.0,2.0,150.0,0.0,2.3,3.0,0.0,6.0,?\n")
    with pytest.raises(DataError, match="column num"):
        prepare_heart_file(path)
    path.write_text("63.0,1.0,1.0,145.0\n")
    with pytest.raises(DataError, match="must have 14 fields"):
        prepare_heart_file(path)


def test_fast_and_line_by_line_parsers_agree(tmp_path, monkeypatch):
    from dpaudit.data import tabular

    rng = np.random.default_rng(1)
    vals = rng.normal(size=(50, 13)) * 100
    path = tmp_path / "t.csv"
    path.write_text(
        HEADER + "\n" + "\n".join(";".join(repr(float(v)) for v in row) for row in vals) + "\n"
    )
    cols = tabular.CARDIO_COLUMNS
    fast = tabular.read_table(path, ";", cols, header=True)
    monkeypatch.setattr(tabular, "_fast_parse", lambda *a: None)
    slow = tabular.read_table(path, ";", cols, header=True)
    for c in cols:
        np.testing.assert_array_equal(fast[c], slow[c])
