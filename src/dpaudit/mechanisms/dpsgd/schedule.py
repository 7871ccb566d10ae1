"""DP-RVFL and its controls, end to end: one private training run -> a :class:`~dpaudit.records.Release`.

Models (DP-RVFL paper, sections 3.3-3.6): :data:`MODELS`, described in :data:`dpaudit.catalogue.CATALOGUE`; the frozen
features of the head models are in :mod:`dpaudit.mechanisms.dpsgd.features`.

Protocol: the one DP-SGD loop (:mod:`dpaudit.mechanisms.dpsgd.loop`) at q = 1/J, T = E J, C = 1,
Adam(1e-3, 0.9, 0.999, 1e-8), sigma calibrated with the RDP accountant for (q, T, delta).
Epochs: 10 for images, 30 for tabular; batch 256 (Heart 64; the small embedded ``digits`` and
``breast-cancer`` sets also use 64 so that a default run has more than a handful of steps).
Binary tasks use one logit (K = 1) with sigmoid cross-entropy (section 3.5: "K = 1 for binary
gradient-trained models"); multiclass tasks use K softmax logits.

**Privacy contract.** A release made here is (epsilon, delta)-DP under add/remove-one-record
adjacency on the *training partition* for the event ``SubsampledGaussian(sigma, q, T)``; frozen
features, projections, initialisation and the split come from public seeds. Validation data is
never read. After training, executed steps must equal accounted steps and the recomputed epsilon
must not exceed the target, else :class:`~dpaudit.errors.AccountingMismatchError` and nothing is
published. The release itself runs on the mechanism contract (``MECHANISM``, defined in
:mod:`dpaudit.mechanisms.dpsgd.mechanism`) through :func:`dpaudit.releasing.release`
(docs/architecture.md); ``non_private=True`` trains without clipping or noise and makes no claim
(``epsilon = inf``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ...accounting import SubsampledGaussian, calibrate_noise_multiplier, dp_sgd_schedule
from ...accounting.accountants import rdp_curve, rdp_to_epsilon
from ...catalogue import CATALOGUE, names as catalogue_names
from ...errors import UsageError
from ...lazy import lazy_import
from ...progress import JobProgress
from ...validation import positive_int
from .core import DPSGDConfig

np = lazy_import("numpy")

ACCOUNTANT = "rdp"
TAG_HEAD = 0x48454144  # "HEAD": public stream of the head initialisation


@dataclass(frozen=True)
class ModelSpec:
    """A model family: ``family`` "head" (frozen features + linear head) or "module" (trainable)."""

    name: str
    family: str
    features: str | None = None  # a features.FEATURE_KINDS value for heads
    module: str | None = None  # a models.TRAINABLE_MODELS value for modules
    description: str = ""


def _model_spec(entry) -> ModelSpec:
    """The DP-SGD side of a catalogue entry: its feature kind or module is the model name without
    its ``dp-`` prefix (dp-rvfl -> rvfl, dp-cnn -> cnn)."""
    kind = entry.name.removeprefix("dp-")
    if entry.family == "dp-sgd-head":
        return ModelSpec(entry.name, "head", features=kind, description=entry.description)
    return ModelSpec(entry.name, "module", module=kind, description=entry.description)


#: The DP-SGD models, in catalogue order (the names live in :data:`dpaudit.catalogue.CATALOGUE`).
MODELS: dict[str, ModelSpec] = {
    n: _model_spec(CATALOGUE[n]) for n in catalogue_names(family=("dp-sgd-head", "dp-sgd-module"))
}
MODEL_NAMES = tuple(MODELS)

#: Datasets that use a requested batch of 64 instead of 256 (module docstring).
SMALL_BATCH_DATASETS = ("heart", "digits", "breast-cancer")
DEFAULT_DATASET = "digits"


def default_protocol(dataset_name: str, kind: str) -> tuple[int, int]:
    """(epochs, batch_size) of the paper's protocol for a dataset (section 4.1, Table 2)."""
    epochs = 10 if kind == "image" else 30
    batch = 64 if dataset_name in SMALL_BATCH_DATASETS else 256
    return epochs, batch


def epsilon_curve(
    noise_multiplier: float, sample_rate: float, delta: float
) -> Callable[[int], float]:
    """Epsilon spent after t steps, cheap to evaluate: RDP is linear in t, so
    eps(t) = conversion(t * rdp_one_step) (same orders and conversion as the claim)."""
    one = rdp_curve([SubsampledGaussian(noise_multiplier, sample_rate, 1)])
    return lambda t: rdp_to_epsilon(one * t, delta)[0] if t > 0 else 0.0


def _auroc(pos: np.ndarray, score: np.ndarray) -> float:
    """Area under the ROC curve: the Mann-Whitney statistic with ties counted half (= scikit-learn's)."""
    _, inv, cnt = np.unique(score, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(cnt) - (cnt - 1) / 2)[inv]  # average ranks
    n_pos = int(pos.sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * (pos.size - n_pos)))


def _average_precision(pos: np.ndarray, score: np.ndarray) -> float:
    """sum_n (R_n - R_{n-1}) P_n over the distinct thresholds, highest first (= scikit-learn's)."""
    order = np.argsort(-score, kind="mergesort")
    s = score[order]
    last = np.r_[np.flatnonzero(np.diff(s)), s.size - 1]  # the last row of each distinct score
    tps = np.cumsum(pos[order])[last]
    return float(np.sum(np.diff(np.r_[0.0, tps / tps[-1]]) * tps / (last + 1)))


def classification_metrics(y_true: np.ndarray, proba: np.ndarray) -> dict:
    """accuracy, macro precision/recall/F1 (0 for a class never predicted or absent), AUROC and AUPRC
    (average precision), as scikit-learn defines them (tests compare), in numpy: importing
    sklearn.metrics took longer than a whole DP-RVFL training.

    Binary: AUROC / AUPRC of the positive class. Multiclass: one-vs-rest macro averages (AUROC
    only when every class is present, AUPRC over the present classes).
    """
    y_true = np.asarray(y_true).astype(np.int64)
    proba = np.asarray(proba, dtype=np.float64)
    k = proba.shape[1]
    pred = proba.argmax(axis=1)
    tp = np.bincount(y_true[pred == y_true], minlength=k).astype(np.float64)
    pp, ap = np.bincount(pred, minlength=k), np.bincount(y_true, minlength=k)
    ratio = lambda a, b: np.divide(a, b, out=np.zeros(k), where=b > 0)  # noqa: E731
    out = {
        "accuracy": float(np.mean(pred == y_true)),
        "precision_macro": float(ratio(tp, pp).mean()),
        "recall_macro": float(ratio(tp, ap).mean()),
        "f1_macro": float(ratio(2 * tp, pp + ap).mean()),
    }
    present = np.unique(y_true)
    if k == 2:
        both = present.size == 2
        out["auroc"] = _auroc(y_true == 1, proba[:, 1]) if both else float("nan")
        out["auprc"] = _average_precision(y_true == 1, proba[:, 1]) if both else float("nan")
    else:
        out["auroc"] = (
            float(np.mean([_auroc(y_true == c, proba[:, c]) for c in range(k)]))
            if present.size == k
            else float("nan")
        )
        out["auprc"] = float(
            np.mean([_average_precision(y_true == c, proba[:, c]) for c in present])
        )
    return out


def _progress_callable(progress, steps: int, eps_of: Callable[[int], float] | None):
    """Turn ``progress`` (True / False / None / callable(done, total, epsilon)) into the engine's
    callback, and return (callback, closer)."""
    if progress is None or progress is False:
        return None, lambda: None
    if callable(progress):
        return (
            lambda done, total: progress(done, total, eps_of(done) if eps_of else float("inf"))
        ), lambda: None
    bar = JobProgress("steps").__enter__()
    task = bar.add("training", steps, info="eps spent 0.000" if eps_of else "(non-private)")
    shown = [-1.0]

    def cb(done, total):
        now = time.monotonic()
        # shown at most every 0.1 s (each epsilon is an RDP conversion)
        if done < total and now - shown[0] < 0.1:
            return
        shown[0] = now
        bar.update(task, completed=done, info=f"eps spent {eps_of(done):.3f}" if eps_of else None)

    return cb, lambda: bar.__exit__(None, None, None)


RECORD_ADJACENCY = "add-remove-record"
USER_ADJACENCY = "add-remove-user"


@dataclass(frozen=True)
class DPSGDSetup:
    """The public DP-SGD set-up of a run: :func:`plan_schedule`'s result."""

    epochs: int
    batch_size: int
    schedule: object  # dpaudit.accounting.schedule.Schedule
    noise_multiplier: float  # 0.0 for a non-private run
    event: object  # SubsampledGaussian, None for a non-private run
    calibrated_epsilon: float  # the calibration's epsilon (inf: non-private)

    def config(self, **settings) -> DPSGDConfig:
        """The DP-SGD config of this schedule and sigma, with ``settings`` (e.g. the optimizer's)."""
        fields = {**self.schedule.to_dict(), "noise_multiplier": self.noise_multiplier}
        return DPSGDConfig.from_dict(fields, **settings)


def plan_schedule(
    data,
    reference_size: int,
    epsilon: float | None,
    delta: float,
    epochs: int | None = None,
    batch_size: int | None = None,
    *,
    non_private: bool = False,
    adjacency: str = RECORD_ADJACENCY,
) -> DPSGDSetup:
    """Schedule -> calibrated sigma -> event, from public quantities only.

    ``data``: the dataset's public facts (its ``name`` and ``kind``). The paper's protocol (:func:`~dpaudit.mechanisms.dpsgd.schedule.default_protocol`) unless ``epochs`` /
    ``batch_size`` are given; q, T, m0 from ``reference_size`` units (N0 records or n_users);
    sigma the smallest noise multiplier whose RDP epsilon at ``delta`` under ``adjacency`` does
    not exceed ``epsilon``. (An audit of a release replaces q, T, m0 and sigma by the release's
    recorded ones: :func:`~dpaudit.mechanisms.dpsgd.head_audit.recorded_schedule`.)
    """
    e0, b0 = default_protocol(data.name, data.kind)
    epochs = positive_int("epochs", epochs) if epochs is not None else e0
    batch = positive_int("batch_size", batch_size) if batch_size is not None else b0
    sched = dp_sgd_schedule(int(reference_size), batch, epochs)
    if non_private:
        return DPSGDSetup(epochs, batch, sched, 0.0, None, float("inf"))
    cal = calibrate_noise_multiplier(
        target_epsilon=epsilon,
        delta=delta,
        sample_rate=sched.sample_rate,
        steps=sched.steps,
        accountant=ACCOUNTANT,
        adjacency=adjacency,
    )
    sigma = float(cal.noise_multiplier)
    event = SubsampledGaussian(sigma, sched.sample_rate, sched.steps)
    return DPSGDSetup(epochs, batch, sched, sigma, event, cal.epsilon)


def planned_reference_size(
    requested: int | None, declared: int | None, *, unit: str = "record"
) -> int:
    """The public size N0 a DP-SGD schedule is built from: ``requested`` (``--reference-size``),
    else ``declared`` (the dataset definition's train size; none for users). Never the actual
    count of the private data: that would make q, T and m0 differ between neighbours."""
    if requested is not None:
        return positive_int("reference_size", requested)
    if declared is None:
        raise UsageError(
            f"reference_size must be given (--reference-size: the public number of training {unit}s the schedule is "
            f"built from) for data whose definition declares none, got None."
        )
    return positive_int("reference_size", declared)


def audit_reference_size(data, count: int) -> int:
    """The reference size of an audit's own base data (no release schedule to replay): the
    declared one, as a release of ``data`` plans, else ``count`` (the audit's fixed base, the
    same in both of its worlds; e.g. a public subsample of the training rows)."""
    declared = getattr(data, "reference_size", None)
    return int(count) if declared is None else int(declared)
