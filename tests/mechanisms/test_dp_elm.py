"""Laplace DP-ELM: scale, sensitivity, statistics against a per-record reference, exact grid
noise, the solve/pinv rule, and the release (claim, analyses, sampler, ledger, reproducibility)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.accounting import PureEpsilon
from dpaudit.data.base import PreparedDataset
from dpaudit.errors import BudgetExceededError, DataError, UsageError
from dpaudit.mechanisms.elm import mechanism as elm
from dpaudit.noise import NoiseSource, public_rng
from dpaudit.records import read_release
from dpaudit.releasing import release
from dpaudit.requests import DPELMRequest


def synthetic(n=600, d=12, k=3, seed=0, name="synthetic-elm") -> PreparedDataset:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, (k, d))

    def part(m):
        y = rng.integers(0, k, m)
        return (centres[y] + 0.7 * rng.normal(0, 1, (m, d))).astype(np.float32), y.astype(np.int64)

    xtr, ytr = part(n)
    xva, yva = part(50)
    xte, yte = part(300)
    return PreparedDataset(
        name=name,
        kind="tabular",
        x_train=xtr,
        y_train=ytr,
        x_val=xva,
        y_val=yva,
        x_test=xte,
        y_test=yte,
        n_classes=k,
        split_seed=2026,
    )


# ---------------------------------------------------------------- scale and sensitivity
def test_noise_scale_values_from_the_paper():
    assert elm.noise_scale(10, 2.0) == 60.0
    assert elm.noise_scale(10, 0.1) == pytest.approx(1200.0, rel=1e-15)
    assert [elm.noise_scale(w, 2.0) for w in elm.ELM_WIDTHS] == [1.5, 7.5, 17.5, 60.0]
    assert elm.ELM_WIDTHS == (1, 3, 5, 10)
    with pytest.raises(UsageError, match="width must be an integer >= 1"):
        elm.noise_scale(0, 2.0)
    with pytest.raises(UsageError, match="epsilon must be a finite number > 0"):
        elm.noise_scale(10, -1.0)


def test_sensitivities_and_both_analyses():
    assert elm.l1_sensitivity(10, "replace-record") == 120
    assert elm.l1_sensitivity(10, "add-remove-record") == 110
    a = elm.privacy_analyses(10, 2.0)
    assert a["replace-record"]["epsilon"] == pytest.approx(2.0)
    assert a["add-remove-record"]["epsilon"] == pytest.approx(2.0 * 11 / 12)
    with pytest.raises(UsageError, match="adjacency must be one of"):
        elm.l1_sensitivity(3, "add-remove-user")


@settings(max_examples=40, deadline=None)
@given(
    width=st.sampled_from([1, 3, 5]),
    k=st.integers(2, 4),
    seed=st.integers(0, 2**16),
    scale_a=st.sampled_from([0.0, 1.0, 50.0]),
    scale_b=st.sampled_from([0.0, 1.0, 50.0]),
)
def test_one_record_moves_the_exact_statistics_by_at_most_the_sensitivity(
    width, k, seed, scale_a, scale_b
):
    # Brute force over random and saturating records (large inputs push sigmoids to 0 or 1).
    rng = np.random.default_rng(seed)
    d = 4
    base_x, base_y = rng.normal(0, 1, (20, d)), rng.integers(0, k, 20)
    ra, rb = rng.normal(0, 1, (1, d)) * (1 + scale_a), rng.normal(0, 1, (1, d)) * (1 + scale_b)
    ya, yb = rng.integers(0, k, 1), rng.integers(0, k, 1)
    feats = elm.elm_features(d, width, seed)

    def st_(x, y):
        return elm.elm_sufficient_statistics(x, y, width, seed, n_classes=k, features=feats)

    def l1(a, b):  # real-valued L1 distance, exact from the integer units
        return (np.abs(a.gram - b.gram).sum() / 2**40) + (np.abs(a.cross - b.cross).sum() / 2**20)

    base = st_(base_x, base_y)
    with_a = st_(np.vstack([base_x, ra]), np.append(base_y, ya))
    with_b = st_(np.vstack([base_x, rb]), np.append(base_y, yb))
    assert l1(base, with_a) <= elm.l1_sensitivity(width, "add-remove-record")
    assert l1(with_a, with_b) <= elm.l1_sensitivity(width, "replace-record")


# ---------------------------------------------------------------- features and statistics
def test_features_are_public_standard_normal_and_sigmoid_is_stable():
    f = elm.elm_features(50, 10, 42)
    rng = public_rng(42, elm.TAG_ELM)
    assert np.array_equal(f.weight, rng.standard_normal((50, 10))) and np.array_equal(
        f.bias, rng.standard_normal(10)
    )
    assert not np.array_equal(elm.elm_features(50, 10, 43).weight, f.weight)
    big = np.full((2, 50), 1e6)
    h = f.transform(np.vstack([big, -big]))
    assert np.all(np.isfinite(h)) and h.min() >= 0.0 and h.max() <= 1.0
    x = np.random.default_rng(1).normal(0, 1, (5, 50))
    assert np.allclose(
        f.transform(x), 1 / (1 + np.exp(-(x @ f.weight + f.bias))), rtol=1e-14, atol=0
    )


def test_statistics_match_a_per_record_reference():
    rng = np.random.default_rng(3)
    n, d, width, k = 2500, 6, 5, 4  # > 2 chunks of 1024
    x, y = rng.normal(0, 1, (n, d)), rng.integers(0, k, n)
    f = elm.elm_features(d, width, 9)
    h = f.transform(x)
    ref_gram = sum(np.outer(h[i], h[i]) for i in range(n))
    ref_cross = sum(np.outer(h[i], np.eye(k)[y[i]]) for i in range(n))
    s = elm.elm_sufficient_statistics(x, y, width, 9, n_classes=k, sampler="textbook")
    assert s.grid_bits is None and s.n_records == n
    assert np.allclose(s.gram, ref_gram, rtol=1e-12) and np.allclose(s.cross, ref_cross, rtol=1e-12)
    # exact statistics: integer sums of the grid-rounded features, equal to an int loop exactly
    q = np.clip(np.rint(h * 2**20), 0, 2**20).astype(np.int64)
    e = elm.elm_sufficient_statistics(x, y, width, 9, n_classes=k)
    assert e.grid_bits == 20 and e.gram.dtype == np.int64
    assert np.array_equal(e.gram, sum(np.outer(q[i], q[i]) for i in range(n)))
    assert np.array_equal(
        e.cross, sum(np.outer(q[i], np.eye(k, dtype=np.int64)[y[i]]) for i in range(n))
    )
    assert np.allclose(e.as_float()[0], ref_gram, rtol=1e-5)


def test_statistics_add_one_record_exactly():
    rng = np.random.default_rng(4)
    x, y = rng.normal(0, 1, (300, 5)), rng.integers(0, 3, 300)
    full = elm.elm_sufficient_statistics(x, y, 3, 1, n_classes=3)
    rest = elm.elm_sufficient_statistics(x[:-1], y[:-1], 3, 1, n_classes=3)
    one = elm.elm_sufficient_statistics(x[-1:], y[-1:], 3, 1, n_classes=3)
    both = rest.plus(one)
    assert (
        np.array_equal(both.gram, full.gram)
        and np.array_equal(both.cross, full.cross)
        and both.n_records == 300
    )
    empty = elm.elm_sufficient_statistics(x[:0], y[:0], 3, 1, n_classes=3)
    assert np.array_equal(full.plus(empty).gram, full.gram)
    with pytest.raises(UsageError, match="statistics must share"):
        full.plus(elm.elm_sufficient_statistics(x, y, 3, 1, n_classes=3, sampler="textbook"))


def test_bad_inputs_are_refused():
    x, y = np.zeros((4, 3)), np.array([0, 1, 2, 1])
    with pytest.raises(UsageError, match="y must hold integer labels"):
        elm.elm_sufficient_statistics(x, y, 2, 0, n_classes=2)
    with pytest.raises(DataError, match="finite"):
        elm.elm_sufficient_statistics(np.full((4, 3), np.nan), y, 2, 0, n_classes=3)
    with pytest.raises(UsageError, match="sampler must be one of"):
        elm.elm_sufficient_statistics(x, y, 2, 0, n_classes=3, sampler="snapping")


# ---------------------------------------------------------------- noise and solve
def test_discrete_noise_is_on_the_grid_independent_per_entry_and_not_symmetrised():
    rng = np.random.default_rng(5)
    x, y = rng.normal(0, 1, (200, 4)), rng.integers(0, 3, 200)
    s = elm.elm_sufficient_statistics(x, y, 5, 2, n_classes=3)
    g, c = elm.privatize_statistics(s, 2.0, NoiseSource("reproducible", seed=1))
    ng, nc = np.ldexp(g, 40), np.ldexp(c, 20)
    assert np.array_equal(ng, np.floor(ng)) and np.array_equal(nc, np.floor(nc))  # on the grids
    assert not np.allclose(g, g.T)  # every entry noised independently, no symmetrisation
    assert np.all(g != s.as_float()[0])


def test_discrete_noise_has_the_laplace_variance_of_scale_L_L_plus_2_over_eps():
    rng = np.random.default_rng(6)
    x, y = rng.normal(0, 1, (50, 3)), rng.integers(0, 2, 50)
    s = elm.elm_sufficient_statistics(x, y, 1, 0, n_classes=2)  # L = 1: 1 + 2 entries
    src = NoiseSource("reproducible", seed=2)
    z = np.array(
        [
            np.concatenate([(gc[0] - s.as_float()[0]).ravel(), (gc[1] - s.as_float()[1]).ravel()])
            for gc in (elm.privatize_statistics(s, 2.0, src) for _ in range(4000))
        ]
    )
    b = elm.noise_scale(1, 2.0)  # 1.5
    assert abs(z.mean()) < 5 * math.sqrt(2 * b * b / z.size)
    assert abs(z.var() / (2 * b * b) - 1) < 0.05


def test_textbook_noise_is_the_noise_sources_laplace_draws():
    rng = np.random.default_rng(7)
    x, y = rng.normal(0, 1, (100, 4)), rng.integers(0, 2, 100)
    s = elm.elm_sufficient_statistics(x, y, 3, 0, n_classes=2, sampler="textbook")
    g, c = elm.privatize_statistics(s, 0.5, NoiseSource("reproducible", seed=8), sampler="textbook")
    ref = NoiseSource("reproducible", seed=8)
    assert np.array_equal(g, s.gram + ref.laplace((3, 3), elm.noise_scale(3, 0.5)))
    assert np.array_equal(c, s.cross + ref.laplace((3, 2), elm.noise_scale(3, 0.5)))
    with pytest.raises(UsageError, match="must be exact"):
        elm.privatize_statistics(s, 0.5, ref, sampler="discrete-laplace")


def test_solve_and_pseudoinverse_fallback_only_when_singular():
    a = np.array([[2.0, 1.0], [0.5, 3.0]])
    b = np.array([[1.0, 0.0], [0.0, 1.0]])
    beta, how = elm.solve_output_weights(a, b)
    assert how == "solve" and np.allclose(a @ beta, b)
    sing = np.array([[1.0, 2.0], [2.0, 4.0]])
    beta, how = elm.solve_output_weights(sing, b)
    assert how == "pinv" and np.allclose(beta, np.linalg.pinv(sing) @ b)


def test_non_private_fit_is_the_closed_form_least_squares_solution():
    data = synthetic()
    r = elm.fit_dp_elm(data.x_train, data.y_train, 3, 10, None, seed=42, noise=None)
    h = r.features.transform(data.x_train)
    ref = np.linalg.solve(h.T @ h, h.T @ np.eye(3)[data.y_train])
    assert (
        np.allclose(r.beta, ref, rtol=1e-8, atol=1e-10)
        and r.epsilon is None
        and r.noise_scale is None
    )
    assert (r.predict(data.x_test) == data.y_test).mean() > 0.8


def test_private_fit_reports_what_it_did_and_is_cheap_for_trials():
    data = synthetic()
    feats = elm.elm_features(data.n_features, 3, 42)
    s = elm.elm_sufficient_statistics(
        data.x_train, data.y_train, 3, 42, n_classes=3, features=feats
    )
    results = [
        elm.fit_from_statistics(s, feats, 2.0, noise=NoiseSource("reproducible", seed=i))
        for i in range(200)
    ]
    assert all(
        r.sampler == "discrete-laplace" and r.noise_scale == 7.5 and r.solver in ("solve", "pinv")
        for r in results
    )
    assert len({r.beta.tobytes() for r in results}) == 200
    p = results[0].probabilities(data.x_test)
    assert np.allclose(p.sum(axis=1), 1.0)


# ---------------------------------------------------------------- release
def _release(tmp_path, name="r", **kw):
    prepared = kw.pop("prepared", None) or synthetic()
    run = {k: kw.pop(k) for k in ("ledger_path", "record") if k in kw}
    return release(
        "dp-elm",
        DPELMRequest(dataset=prepared.name, seed=42, **kw),
        out_dir=tmp_path / name,
        prepared=prepared,
        **run,
    )


def test_release_records_the_pure_claim_both_analyses_and_the_sampler(tmp_path):
    rel = _release(tmp_path, width=5, epsilon=2.0)
    assert rel.mechanism == "dp-elm" and rel.accountant == "pure" and rel.delta == 0.0
    assert rel.guarantee == PureEpsilon(2.0).to_dict() and rel.epsilon <= rel.target_epsilon == 2.0
    assert (
        rel.adjacency == "add-remove-record"
        and rel.config["claim_adjacency"] == "add-remove-record"
    )
    cfg = rel.config
    assert cfg["width"] == 5 and cfg["noise_scale"] == 17.5 and cfg["sampler"] == "discrete-laplace"
    assert (
        cfg["sampler_guarantee"]["certified"] is True
        and cfg["sampler_guarantee"]["epsilon_inflation"] == 0.0
    )
    assert (
        cfg["analyses"]["replace-record"]["l1_sensitivity"] == 35
        and cfg["analyses"]["add-remove-record"]["l1_sensitivity"] == 30
    )
    assert cfg["symmetrised"] is False and cfg["ridge"] == 0.0 and cfg["chunk"] == 1024
    assert set(rel.metrics) == {
        "accuracy",
        "precision_macro",
        "recall_macro",
        "f1_macro",
        "auroc",
        "auprc",
    }
    back = read_release(tmp_path / "r")
    assert back.to_dict() == rel.to_dict()
    assert (tmp_path / "r" / "weights.npz").exists()


def test_release_under_replace_one_and_textbook_is_marked_uncertified(tmp_path):
    rel = _release(tmp_path, width=3, epsilon=1.0, adjacency="replace-record", sampler="textbook")
    assert rel.adjacency == "replace-record" and rel.epsilon == 1.0
    assert rel.config["sampler_guarantee"]["certified"] is False


def test_release_goes_into_the_ledger_and_preflight_refuses_over_cap(tmp_path):
    from dpaudit.ledger.book import open_ledger

    ledger = tmp_path / "ledger.sqlite"
    rel = _release(tmp_path, "a", width=3, epsilon=1.0, ledger_path=ledger)
    with open_ledger(ledger) as lg:
        assert rel.id in {e.id for e in lg.entries(kind="release")}
        lg.cap("synthetic-elm", 1.5, 1e-5)
    with pytest.raises(BudgetExceededError):
        _release(tmp_path, "b", width=3, epsilon=1.0, ledger_path=ledger)
    assert not (tmp_path / "b").exists()  # refused before anything was computed or written


def test_same_seed_gives_fresh_noise_unless_reproducible(tmp_path):
    def noised(name, **kw):
        _release(tmp_path, name, width=3, epsilon=2.0, record=False, **kw)
        with np.load(tmp_path / name / "weights.npz") as w:
            return w["noisy_gram"], w["hidden_weight"]

    g1, w1 = noised("a")
    g2, w2 = noised("b")
    assert np.array_equal(w1, w2) and not np.array_equal(
        g1, g2
    )  # public features same, noise fresh
    g3, _ = noised("c", reproducible_noise=True)
    g4, _ = noised("d", reproducible_noise=True)
    assert np.array_equal(g3, g4)
    r1, r2 = read_release(tmp_path / "c"), read_release(tmp_path / "d")
    assert (
        r1.metrics == r2.metrics
        and r1.noise_source == r2.noise_source
        and r1.noise_source["secret"] is False
    )
    g5, _ = noised("e", noise_source="cryptographic")
    assert read_release(tmp_path / "e").noise_source[
        "source"
    ] == "cryptographic" and not np.array_equal(g5, g3)


def test_release_refuses_bad_arguments_before_loading(tmp_path):
    with pytest.raises(UsageError, match="sampler must be one of"):
        _release(tmp_path, sampler="snapping")
    with pytest.raises(UsageError, match="adjacency must be one of"):
        _release(tmp_path, adjacency="add-remove-user")
    with pytest.raises(UsageError, match="epsilon must be a finite number > 0"):
        _release(tmp_path, epsilon=0.0)


def test_digits_release_end_to_end(tmp_path):
    rel = release(
        "dp-elm",
        DPELMRequest(dataset="digits", width=10, epsilon=2.0, seed=42),
        out_dir=tmp_path / "d",
        record=False,
    )
    assert rel.dataset["name"] == "digits" and rel.config["noise_scale"] == 60.0
    assert 0.0 <= rel.metrics["accuracy"] <= 1.0


def test_mnist_non_private_reference_beats_the_majority_class(data_dir):
    if not (data_dir / "mnist" / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"real data file mnist/train-images-idx3-ubyte.gz not found under {data_dir}")
    from dpaudit.data import load_dataset

    data = load_dataset("mnist", data_dir=data_dir)
    r = elm.fit_dp_elm(data.x_train, data.y_train, 10, 10, None, seed=42, noise=None)
    assert (r.predict(data.x_test) == data.y_test).mean() > 0.3  # majority class: 11.35 %


def test_non_private_release_makes_no_claim(tmp_path):
    rel = _release(tmp_path, "np", width=10, non_private=True, record=False)
    assert (
        rel.non_private is True
        and rel.epsilon == float("inf")
        and rel.guarantee == {"type": "non-private"}
    )
    assert (
        rel.target_epsilon is None
        and rel.config["noise_scale"] is None
        and rel.config["sampler"] is None
    )
    assert rel.metrics["accuracy"] > 0.8
