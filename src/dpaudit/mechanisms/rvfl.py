"""DP-RVFL and its controls, end to end: one private training run -> a :class:`~dpaudit.records.Release`.

Models (DP-RVFL paper, sections 3.3-3.6):

=====================  ==================================================================
``dp-rvfl``            z = [x', tanh(x' W_r + b_r)], 200 units; head trained with DP-SGD
``dp-elm-sgd``         z = tanh(x' W_r + b_r) (no direct link), same P, W_r, b_r as RVFL
``frozen-dense-matched`` z = tanh(x' W + b) with d' + 200 frozen units (head size = RVFL's)
``logistic-raw``       z = x (full prepared input)
``logistic-projected`` z = x' (Gaussian projection when d > 1024, else z = x)
``dp-dense``           Dense baseline, all weights trained with DP-SGD
``dp-cnn``             CNN baseline (2-D for images, 1-D for tabular)
``dp-attention``       compact attention control (images only)
=====================  ==================================================================

Protocol (section 3.2, Algorithm 1): Poisson sampling at q = 1/J, T = E J steps (empty batches
counted), per-example clipping to C = 1, N(0, sigma^2 C^2) on the clipped sum, division by the
fixed m0, Adam(1e-3, 0.9, 0.999, 1e-8), sigma calibrated with the RDP accountant for (q, T, delta).
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
:mod:`dpaudit.mechanisms.dpsgd_release`) through :func:`dpaudit.releasing.release`
(docs/architecture.md); :func:`train_and_release` is its thin library wrapper. ``non_private=True`` trains without clipping or noise and makes no claim
(``epsilon = inf``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..accounting import SubsampledGaussian
from ..accounting.accountants import rdp_curve, rdp_to_epsilon
from ..catalogue import CATALOGUE
from ..catalogue import names as catalogue_names

if TYPE_CHECKING:  # pragma: no cover
    from ..records import Release

ADJACENCY = "add-remove-record"
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
    """The DP-SGD side of a catalogue entry: the feature kind of a head model (a
    features.FEATURE_KINDS value) or the trainable module (a models.TRAINABLE_MODELS value) is
    the model name without its ``dp-`` prefix (dp-rvfl -> rvfl, dp-cnn -> cnn)."""
    kind = entry.name.removeprefix("dp-")
    if entry.family == "dp-sgd-head":
        return ModelSpec(entry.name, "head", features=kind, description=entry.description)
    return ModelSpec(entry.name, "module", module=kind, description=entry.description)


#: The DP-SGD models, in catalogue order (the names live in :data:`dpaudit.catalogue.CATALOGUE`).
MODELS: dict[str, ModelSpec] = {n: _model_spec(CATALOGUE[n]) for n in catalogue_names(family=("dp-sgd-head", "dp-sgd-module"))}
MODEL_NAMES = tuple(MODELS)

#: Datasets that use a requested batch of 64 instead of 256 (paper Table 2: Heart; the embedded
#: small sets follow Heart's rule, documented in the module docstring).
SMALL_BATCH_DATASETS = ("heart", "digits", "breast-cancer")
DEFAULT_DATASET = "digits"


def default_protocol(dataset_name: str, kind: str) -> tuple[int, int]:
    """(epochs, batch_size) of the paper's protocol for a dataset (section 4.1, Table 2)."""
    epochs = 10 if kind == "image" else 30
    batch = 64 if dataset_name in SMALL_BATCH_DATASETS else 256
    return epochs, batch


def epsilon_curve(noise_multiplier: float, sample_rate: float, delta: float) -> Callable[[int], float]:
    """Epsilon spent after t steps, cheap to evaluate: RDP is linear in t, so
    eps(t) = conversion(t * rdp_one_step) (same orders and conversion as the claim)."""
    one = rdp_curve([SubsampledGaussian(noise_multiplier, sample_rate, 1)])
    return lambda t: rdp_to_epsilon(one * t, delta)[0] if t > 0 else 0.0


def classification_metrics(y_true: np.ndarray, proba: np.ndarray) -> dict:
    """accuracy, macro precision/recall/F1, AUROC and AUPRC (average precision) with scikit-learn.

    Binary: AUROC / AUPRC of the positive class. Multiclass: one-vs-rest macro averages.
    """
    from sklearn.metrics import accuracy_score, average_precision_score, precision_recall_fscore_support, roc_auc_score

    y_true = np.asarray(y_true)
    proba = np.asarray(proba, dtype=np.float64)
    n_classes = proba.shape[1]
    pred = proba.argmax(axis=1)
    labels = np.arange(n_classes)
    p, r, f, _ = precision_recall_fscore_support(y_true, pred, labels=labels, average="macro", zero_division=0)
    out = {"accuracy": float(accuracy_score(y_true, pred)), "precision_macro": float(p), "recall_macro": float(r), "f1_macro": float(f)}
    present = np.unique(y_true)
    try:
        if n_classes == 2:
            out["auroc"] = float(roc_auc_score(y_true, proba[:, 1])) if present.size == 2 else float("nan")
            out["auprc"] = float(average_precision_score(y_true, proba[:, 1])) if present.size == 2 else float("nan")
        else:
            if present.size == n_classes:
                out["auroc"] = float(roc_auc_score(y_true, proba, multi_class="ovr", average="macro", labels=labels))
            else:
                out["auroc"] = float("nan")
            onehot = (y_true[:, None] == labels[None, :]).astype(int)
            out["auprc"] = float(average_precision_score(onehot[:, present], proba[:, present], average="macro"))
    except ValueError:
        out.setdefault("auroc", float("nan"))
        out.setdefault("auprc", float("nan"))
    return out


def _progress_callable(progress, steps: int, eps_of: Callable[[int], float] | None):
    """Turn ``progress`` (True / False / None / callable(done, total, epsilon)) into the engine's
    callback, and return (callback, closer)."""
    if progress is None or progress is False:
        return None, lambda: None
    if callable(progress):
        return (lambda done, total: progress(done, total, eps_of(done) if eps_of else float("inf"))), lambda: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..console import err_console

    bar = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("steps  eps spent {task.fields[eps]}"), TimeElapsedColumn(), console=err_console, transient=False)
    task = bar.add_task("training", total=steps, eps="0.000" if eps_of else "inf")
    bar.start()

    def cb(done, total):
        bar.update(task, completed=done, eps=f"{eps_of(done):.3f}" if eps_of else "inf (non-private)")

    return cb, bar.stop


def train_and_release(
    model: str,
    *,
    dataset: str = DEFAULT_DATASET,
    data_dir: str | os.PathLike | None = None,
    epsilon: float = 2.0,
    delta: float = 1e-5,
    seed: int = 42,
    non_private: bool = False,
    reproducible_noise: bool = False,
    noise_source: str = "os-entropy",
    out_dir: str | os.PathLike | None = None,
    ledger_path: str | os.PathLike | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    profile: str | None = None,
    split_seed: int | None = None,
    progress=True,
    record: bool = True,
    prepared=None,
    privacy_unit: str = "record",
    user_ids=None,
    records_per_user: int | None = None,
    reference_size: int | None = None,
) -> Release:
    """Load ``dataset``, train ``model`` with the paper's DP-SGD protocol, check, publish.

    A thin wrapper: it builds the :class:`~dpaudit.requests.DPSGDRequest` and runs the
    DP-SGD mechanism (:mod:`dpaudit.mechanisms.dpsgd_release`) through the one release skeleton
    :func:`dpaudit.releasing.release`.

    ``prepared`` may hold an already loaded :class:`~dpaudit.data.base.PreparedDataset` (then
    ``dataset``/``data_dir``/``profile``/``split_seed`` are not used to load). ``progress``: True
    for a rich bar on stderr, False/None for silence, or a callable ``(steps_done, steps_total,
    epsilon_spent)``. ``record=False`` writes release.json but skips the ledger (tests only; the
    preflight budget check still runs for private releases).

    ``privacy_unit="user"`` trains with user-level DP-SGD (adjacency ``add-remove-user``) given
    ``user_ids`` and ``records_per_user`` G: see
    :mod:`dpaudit.mechanisms.user_level`. ``reference_size``: the
    public size N0 the schedule is built from (default: the dataset definition's train size,
    ``prepared.reference_size``; users: required).
    """
    from .dpsgd_release import dpsgd_request, release_dpsgd

    request, ids = dpsgd_request(model, dataset=dataset, data_dir=data_dir, epsilon=epsilon, delta=delta, seed=seed, non_private=non_private,
                                 reproducible_noise=reproducible_noise, noise_source=noise_source, epochs=epochs, batch_size=batch_size,
                                 profile=profile, split_seed=split_seed, prepared=prepared, privacy_unit=privacy_unit, user_ids=user_ids,
                                 records_per_user=records_per_user, reference_size=reference_size)
    return release_dpsgd(request, user_ids=ids, out_dir=out_dir, ledger_path=ledger_path, record=record, progress=progress, prepared=prepared)


def __getattr__(name: str):
    # The catalogue imports this module for MECHANISM; the DP-SGD release lives in its own
    # module (which imports this one), so it is resolved on first use (PEP 562).
    if name == "MECHANISM":
        from .dpsgd_release import MECHANISM

        return MECHANISM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
