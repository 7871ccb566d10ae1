"""DP-RVFL models and their release (releasing.release of a DPSGDRequest): features per sections 3.4-3.5, release contract, fail-closed."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.accounting import SubsampledGaussian, compute_epsilon
from dpaudit.ledger.book import open_ledger
from dpaudit.data.base import PreparedDataset
from dpaudit.errors import AccountingMismatchError, BudgetExceededError, UsageError
from dpaudit import accounting, releasing
from dpaudit.mechanisms.dpsgd import mechanism as dpsgd_release
from dpaudit.mechanisms.dpsgd.features import build_features
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest
from dpaudit.mechanisms.dpsgd.mechanism import DPSGDMechanism
from dpaudit.mechanisms.dpsgd.schedule import (
    MODEL_NAMES,
    classification_metrics,
    default_protocol,
    epsilon_curve,
)
from dpaudit.records import read_release


def test_feature_dimensions_follow_the_paper():
    # MNIST: 784 inputs, no projection.
    assert build_features("rvfl", 784, 42).output_dim == 984
    assert build_features("elm-sgd", 784, 42).output_dim == 200
    assert build_features("frozen-dense-matched", 784, 42).output_dim == 984
    assert build_features("logistic-raw", 784, 42).output_dim == 784
    assert build_features("logistic-projected", 784, 42).output_dim == 784
    # CIFAR-10: 3072 inputs projected to 1024; RVFL head K (d' + 200 + 1) = 12,250 (Table 6).
    cifar = build_features("rvfl", 3072, 42)
    assert (
        cifar.projection.shape == (3072, 1024)
        and cifar.output_dim == 1224
        and 10 * (cifar.output_dim + 1) == 12_250
    )
    assert build_features("frozen-dense-matched", 3072, 42).output_dim == 1224
    assert build_features("elm-sgd", 3072, 42).output_dim == 200
    assert build_features("logistic-projected", 3072, 42).output_dim == 1024
    assert build_features("logistic-raw", 3072, 42).output_dim == 3072
    # Cardio: 32 features; ELM-SGD head 2 (200 + 1) = ... K = 1 for binary: 201 coefficients.
    assert build_features("rvfl", 32, 42).output_dim == 232
    assert build_features("rvfl", 1024, 42).projection is None  # only *above* 1024


def test_feature_initialisation_distributions_and_sharing():
    f = build_features("rvfl", 3072, 7)
    assert f.weight.min() >= -1 and f.weight.max() <= 1 and f.bias.min() >= 0 and f.bias.max() <= 1
    assert abs(f.projection.std() - 1 / 32) < 1e-3 and abs(f.projection.mean()) < 1e-3
    assert abs(f.weight.mean()) < 0.01 and abs(f.bias.mean() - 0.5) < 0.05
    e = build_features("elm-sgd", 3072, 7)  # same projection, seed and hidden layer as RVFL
    np.testing.assert_array_equal(e.projection, f.projection)
    np.testing.assert_array_equal(e.weight, f.weight)
    np.testing.assert_array_equal(e.bias, f.bias)
    assert not np.array_equal(build_features("rvfl", 3072, 8).weight, f.weight)


def test_feature_transform_is_the_formula():
    rng = np.random.default_rng(0)
    x = rng.random((5, 1100))
    f = build_features("rvfl", 1100, 3)
    z = f.transform(x, chunk=2, dtype=np.float64)
    xr = x @ f.projection
    np.testing.assert_allclose(
        z, np.concatenate([xr, np.tanh(xr @ f.weight + f.bias)], axis=1), rtol=1e-10, atol=1e-12
    )
    e = build_features("elm-sgd", 1100, 3).transform(x, dtype=np.float64)
    np.testing.assert_allclose(e, z[:, 1024:], rtol=1e-10, atol=1e-12)
    z1 = f.transform(x, chunk=2, dtype=np.float64, bias_column=True)
    np.testing.assert_array_equal(z1[:, :-1], z)
    np.testing.assert_array_equal(z1[:, -1], np.ones(5))
    raw = build_features("logistic-raw", 1100, 3).transform(x, dtype=np.float64)
    np.testing.assert_array_equal(raw, x)


def test_default_protocol_table2():
    assert default_protocol("mnist", "image") == (10, 256)
    assert default_protocol("cardio", "tabular") == (30, 256)
    assert default_protocol("heart", "tabular") == (30, 64)


def test_epsilon_curve_matches_accountant():
    f = epsilon_curve(1.1, 0.005, 1e-5)
    want = compute_epsilon(
        SubsampledGaussian(1.1, 0.005, 2000), delta=1e-5, accountant="rdp"
    ).epsilon
    assert f(2000) == pytest.approx(want, rel=1e-12)
    assert f(0) == 0.0 and f(100) < f(1000) < f(2000)


def test_metrics_match_sklearn_definitions():
    from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 200)
    p = rng.dirichlet(np.ones(3), 200)
    m = classification_metrics(y, p)
    assert m["accuracy"] == pytest.approx((p.argmax(1) == y).mean())
    assert m["f1_macro"] == pytest.approx(f1_score(y, p.argmax(1), average="macro"))
    assert m["auroc"] == pytest.approx(roc_auc_score(y, p, multi_class="ovr", average="macro"))
    assert m["auprc"] == pytest.approx(
        np.mean([average_precision_score(y == c, p[:, c]) for c in range(3)])
    )
    yb = rng.integers(0, 2, 100)
    pb = rng.random(100)
    mb = classification_metrics(yb, np.stack([1 - pb, pb], 1))
    assert mb["auroc"] == pytest.approx(roc_auc_score(yb, pb)) and mb["auprc"] == pytest.approx(
        average_precision_score(yb, pb)
    )


@given(st.integers(2, 5), st.integers(0, 2**16), st.sampled_from([1, 2, 8]))
@settings(max_examples=60, deadline=None)
def test_metrics_equal_sklearn_with_ties_and_missing_classes(k, seed, decimals):
    from sklearn.metrics import (
        average_precision_score,
        precision_recall_fscore_support,
        roc_auc_score,
    )

    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, 40)
    p = np.round(rng.dirichlet(np.ones(k), 40), decimals)  # coarse rounding: many tied scores
    m = classification_metrics(y, p)
    pr, rc, f1, _ = precision_recall_fscore_support(
        y, p.argmax(1), labels=np.arange(k), average="macro", zero_division=0
    )
    assert (m["precision_macro"], m["recall_macro"], m["f1_macro"]) == pytest.approx(
        (pr, rc, f1), rel=1e-12, abs=1e-15
    )
    present = np.unique(y)
    if k == 2:  # binary: the positive class's figures (nan unless both classes occur)
        assert present.size < 2 or (m["auroc"], m["auprc"]) == pytest.approx(
            (roc_auc_score(y, p[:, 1]), average_precision_score(y, p[:, 1])), rel=1e-12
        )
        return
    onehot = (y[:, None] == np.arange(k)).astype(int)
    assert m["auprc"] == pytest.approx(
        average_precision_score(onehot[:, present], p[:, present], average="macro"), rel=1e-12
    )
    if present.size == k:
        assert m["auroc"] == pytest.approx(
            np.mean([roc_auc_score(y == c, p[:, c]) for c in range(k)]), rel=1e-12
        )


def _synthetic(kind="tabular", n_classes=2, n=300, d=8, seed=0, val_fill=None):
    rng = np.random.default_rng(seed)

    def part(m):
        y = rng.integers(0, n_classes, m)
        x = rng.normal(size=(m, d)).astype(np.float32) * 0.5
        x[np.arange(m), y % d] += 1.5
        return x, y.astype(np.int64)

    xt, yt = part(n)
    xv, yv = part(60)
    xs, ys = part(100)
    if val_fill is not None:
        xv = np.full_like(xv, val_fill)
    shape = (1, 4, d // 4) if kind == "image" else None
    return PreparedDataset(
        name="synthetic",
        kind=kind,
        x_train=xt,
        y_train=yt,
        x_val=xv,
        y_val=yv,
        x_test=xs,
        y_test=ys,
        n_classes=n_classes,
        split_seed=0,
        profile="default",
        image_shape=shape,
        reference_size=n,
    )  # declared N0


REQUIRED_KEYS = [
    "mechanism",
    "dataset",
    "adjacency",
    "accountant",
    "target_epsilon",
    "epsilon",
    "delta",
    "noise_multiplier",
    "sample_rate",
    "steps",
    "steps_executed",
    "clipping_norm",
    "normalizer",
    "seed",
    "metrics",
    "timings",
]


# Every private test here shares one (epsilon, q, T) so the session's calibration cache is hit.
SAME_ACCOUNTING = dict(epsilon=4.0, epochs=2, batch_size=64)

# One head model and one module model go through the full private path (each private release
# costs a few RDP evaluations); the others are checked non-private for speed.
PRIVATE_CHECKED = ("dp-rvfl", "dp-cnn")


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_every_model_releases_on_synthetic_data(model, tmp_path):
    data = _synthetic(kind="image", n_classes=3, d=16) if model == "dp-attention" else _synthetic()
    private = model in PRIVATE_CHECKED
    rel = release(
        model,
        DPSGDRequest(
            model=model, dataset=data.name, seed=1, non_private=not private, **SAME_ACCOUNTING
        ),
        prepared=data,
        out_dir=tmp_path / "r",
        progress=False,
    )
    on_disk = json.loads((tmp_path / "r" / "release.json").read_text())
    for key in REQUIRED_KEYS:
        assert key in on_disk, key
    assert set(on_disk["metrics"]) == {
        "accuracy",
        "precision_macro",
        "recall_macro",
        "f1_macro",
        "auroc",
        "auprc",
    }
    assert all(0.0 <= v <= 1.0 for v in rel.metrics.values())
    assert set(on_disk["timings"]) >= {"setup_seconds", "train_seconds"}
    assert rel.steps_executed == rel.steps == 2 * 5  # J = ceil(300 / 64) = 5
    assert rel.sample_rate == 0.2 and rel.normalizer == 60
    assert (tmp_path / "r" / rel.artefacts["weights"]).exists()
    assert read_release(tmp_path / "r").id == rel.id
    with open_ledger(None) as ledger:
        assert [e.id for e in ledger.entries(dataset="synthetic", kind="release")] == [rel.id]
    if private:
        event = SubsampledGaussian(rel.noise_multiplier, 0.2, 10)
        assert rel.epsilon <= 4.0 and rel.guarantee == event.to_dict() and rel.target_epsilon == 4.0
        assert rel.epsilon == pytest.approx(compute_epsilon(event, delta=1e-5).epsilon)
        assert (
            rel.adjacency == "add-remove-record"
            and rel.accountant == "rdp"
            and "prv" in rel.epsilons
        )


def test_heads_learn_and_binary_uses_one_logit(tmp_path):
    rel = release(
        "dp-rvfl",
        DPSGDRequest(
            model="dp-rvfl", dataset="synthetic", non_private=True, batch_size=128, epochs=10
        ),
        prepared=_synthetic(n=2000),
        out_dir=tmp_path,
        progress=False,
        record=False,
    )
    assert rel.metrics["accuracy"] > 0.85
    assert rel.config["head_outputs"] == 1 and rel.config["trainable_parameters"] == 8 + 200 + 1
    w = np.load(tmp_path / "weights.npz")
    assert w["head_weight"].shape == (1, 209) and w["hidden_weight"].shape == (8, 200)


def test_validation_split_is_never_read(tmp_path):
    # Non-private and Poisson masks from reproducible noise: any read of validation would show.
    kw = dict(reproducible_noise=True, epochs=2, non_private=True)
    a = release(
        "dp-elm-sgd",
        DPSGDRequest(model="dp-elm-sgd", dataset="synthetic", **kw),
        prepared=_synthetic(),
        out_dir=tmp_path / "a",
        progress=False,
        record=False,
    )
    b = release(
        "dp-elm-sgd",
        DPSGDRequest(model="dp-elm-sgd", dataset="synthetic", **kw),
        prepared=_synthetic(val_fill=np.nan),
        out_dir=tmp_path / "b",
        progress=False,
        record=False,
    )
    np.testing.assert_array_equal(
        np.load(tmp_path / "a" / "weights.npz")["head_weight"],
        np.load(tmp_path / "b" / "weights.npz")["head_weight"],
    )
    assert a.metrics == b.metrics and a.config["validation_used"] is False


def test_non_private_release(tmp_path):
    rel = release(
        "logistic-raw",
        DPSGDRequest(model="logistic-raw", dataset="synthetic", non_private=True),
        prepared=_synthetic(),
        out_dir=tmp_path,
        progress=False,
    )
    assert (
        rel.non_private and rel.epsilon == float("inf") and rel.guarantee == {"type": "non-private"}
    )
    assert rel.noise_multiplier == 0.0 and rel.target_epsilon is None


def test_step_mismatch_fails_loudly_and_publishes_nothing(tmp_path, monkeypatch):
    real = dpsgd_release.train_heads

    def short(*a, **k):
        res = real(*a, **k)
        return dataclasses.replace(res, steps_executed=res.steps_executed - 1)

    monkeypatch.setattr(dpsgd_release, "train_heads", short)
    with pytest.raises(AccountingMismatchError, match="steps executed"):
        release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", dataset="synthetic", **SAME_ACCOUNTING),
            prepared=_synthetic(),
            out_dir=tmp_path,
            progress=False,
        )
    assert not (tmp_path / "release.json").exists()


def test_epsilon_over_target_fails_loudly(tmp_path, monkeypatch):
    real = accounting.compute_epsilon

    def inflated(event, **kw):
        r = real(event, **kw)
        return type(r)(**{**r.to_dict(), "epsilon": r.epsilon + 1.0})

    monkeypatch.setattr(
        releasing, "compute_epsilon", inflated
    )  # the release skeleton recomputes the claim with it (not the plan)
    with pytest.raises(AccountingMismatchError, match="exceeds the target"):
        release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", dataset="synthetic", **SAME_ACCOUNTING),
            prepared=_synthetic(),
            out_dir=tmp_path,
            progress=False,
        )
    assert not (tmp_path / "release.json").exists()


def test_over_cap_is_refused_before_training(tmp_path, monkeypatch):
    ledger_path = tmp_path / "ledger.sqlite"
    with open_ledger(ledger_path) as ledger:
        ledger.cap("synthetic", 1.0, 1e-5)

    def boom(*a, **k):
        raise AssertionError("training must not start")

    monkeypatch.setattr(dpsgd_release, "train_heads", boom)
    with pytest.raises(BudgetExceededError):
        release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", dataset="synthetic", **SAME_ACCOUNTING),
            prepared=_synthetic(),
            ledger_path=ledger_path,
            out_dir=tmp_path / "r",
            progress=False,
        )
    with pytest.raises(BudgetExceededError):
        release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", dataset="synthetic", non_private=True),
            prepared=_synthetic(),
            ledger_path=ledger_path,
            out_dir=tmp_path / "r",
            progress=False,
        )


def test_progress_callable_reports_spent_epsilon(tmp_path):
    seen = []
    rel = release(
        "logistic-raw",
        DPSGDRequest(model="logistic-raw", dataset="synthetic", **SAME_ACCOUNTING),
        prepared=_synthetic(),
        out_dir=tmp_path,
        record=False,
        progress=lambda done, total, eps: seen.append((done, total, eps)),
    )
    assert seen[-1][0] == seen[-1][1] == rel.steps
    assert seen[-1][2] == pytest.approx(rel.epsilon, rel=1e-9)
    assert all(a[2] <= b[2] for a, b in zip(seen, seen[1:]))


def test_bad_arguments():
    with pytest.raises(UsageError, match="model must be"):
        release(
            DPSGDMechanism(),
            DPSGDRequest(model="dp-nope", dataset="synthetic"),
            prepared=_synthetic(),
            progress=False,
        )
    with pytest.raises(UsageError, match="epsilon must be"):
        release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", dataset="synthetic", epsilon=-1.0),
            prepared=_synthetic(),
            progress=False,
        )
    with pytest.raises(UsageError, match="delta must be"):
        release(
            "dp-rvfl",
            DPSGDRequest(model="dp-rvfl", dataset="synthetic", delta=1.5),
            prepared=_synthetic(),
            progress=False,
        )


def test_default_dataset_digits(tmp_path):
    rel = release(
        "dp-rvfl", DPSGDRequest(model="dp-rvfl"), out_dir=tmp_path, progress=False, record=False
    )
    assert rel.dataset["name"] == "digits" and rel.steps_executed == rel.steps
    assert rel.metrics["accuracy"] > 0.5  # 10 classes: chance is 0.1


def test_mnist_one_epoch(data_dir, tmp_path):
    """Real MNIST (skipped without data): one epoch of the paper protocol already beats 80 %."""
    if not (data_dir / "mnist").is_dir():
        pytest.skip(f"real data folder mnist not found under {data_dir}")
    rel = release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", dataset="mnist", data_dir=data_dir, epochs=1),
        out_dir=tmp_path,
        progress=False,
        record=False,
    )
    assert rel.sample_rate == 0.005 and rel.normalizer == 255 and rel.steps == 200
    assert rel.metrics["accuracy"] > 0.8
