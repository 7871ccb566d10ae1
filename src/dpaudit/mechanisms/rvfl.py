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
published. ``non_private=True`` trains without clipping or noise and makes no claim
(``epsilon = inf``).
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..accounting import SubsampledGaussian, calibrate_noise_multiplier, compute_epsilon, dp_sgd_schedule
from ..accounting.accountants import rdp_curve, rdp_to_epsilon
from ..errors import DataError, UsageError
from ..noise import GAUSSIAN_SAMPLER_DESCRIPTION, gaussian_run_tail, public_rng
from ..records import Release, check_accounting, check_out_dir, round_timings
from ..releasing import budget_session
from ..validation import one_of, open_unit, positive_finite, positive_int
from .dpsgd import DPSGDConfig, HeadResult, head_outputs, head_probabilities, init_head, train_linear_head, train_module_dp_sgd
from .features import build_features

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


MODELS: dict[str, ModelSpec] = {
    "dp-rvfl": ModelSpec("dp-rvfl", "head", features="rvfl", description="RVFL: direct link + 200 random tanh features, private head"),
    "dp-elm-sgd": ModelSpec("dp-elm-sgd", "head", features="elm-sgd", description="RVFL without the direct link (z = h)"),
    "frozen-dense-matched": ModelSpec("frozen-dense-matched", "head", features="frozen-dense-matched", description="frozen tanh layer of width d'+200, no link"),
    "logistic-raw": ModelSpec("logistic-raw", "head", features="logistic-raw", description="affine classifier on the full prepared input"),
    "logistic-projected": ModelSpec("logistic-projected", "head", features="logistic-projected", description="affine classifier on the projected input"),
    "dp-dense": ModelSpec("dp-dense", "module", module="dense", description="fully connected baseline, all weights private"),
    "dp-cnn": ModelSpec("dp-cnn", "module", module="cnn", description="CNN baseline (2-D images, 1-D tabular), all weights private"),
    "dp-attention": ModelSpec("dp-attention", "module", module="attention", description="compact attention control (images)"),
}
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

    from ..cli.common import err_console

    bar = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("steps  eps spent {task.fields[eps]}"), TimeElapsedColumn(), console=err_console, transient=False)
    task = bar.add_task("training", total=steps, eps="0.000" if eps_of else "inf")
    bar.start()

    def cb(done, total):
        bar.update(task, completed=done, eps=f"{eps_of(done):.3f}" if eps_of else "inf (non-private)")

    return cb, bar.stop


def _command_line(model, *, dataset, data_dir, epsilon, delta, seed, non_private, reproducible_noise, noise_source, out_dir, epochs, batch_size, profile, split_seed,
                  extra: tuple[str, ...] = ()) -> str:
    parts = ["dpaudit", "train", model, "--dataset", dataset]
    if data_dir is not None:
        parts += ["--data-dir", str(data_dir)]
    if non_private:
        parts += ["--non-private"]
    else:
        parts += ["--eps", repr(float(epsilon)), "--delta", repr(float(delta))]
    parts += ["--seed", str(seed), "--out", str(out_dir)]
    if reproducible_noise:
        parts += ["--reproducible-noise"]
    elif noise_source != "os-entropy":
        parts += ["--noise-source", noise_source]
    if epochs is not None:
        parts += ["--epochs", str(epochs)]
    if batch_size is not None:
        parts += ["--batch-size", str(batch_size)]
    if profile is not None:
        parts += ["--profile", profile]
    if split_seed is not None:
        parts += ["--split-seed", str(split_seed)]
    parts += list(extra)  # the privacy unit's own flags (user level: --privacy-unit user ...)
    return shlex.join(parts)


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
) -> Release:
    """Load ``dataset``, train ``model`` with the paper's DP-SGD protocol, check, publish.

    ``prepared`` may hold an already loaded :class:`~dpaudit.data.base.PreparedDataset` (then
    ``dataset``/``data_dir``/``profile``/``split_seed`` are not used to load). ``progress``: True
    for a rich bar on stderr, False/None for silence, or a callable ``(steps_done, steps_total,
    epsilon_spent)``. ``record=False`` writes release.json but skips the ledger (tests only; the
    preflight budget check still runs for private releases).

    ``privacy_unit="user"`` trains with user-level DP-SGD (adjacency ``add-remove-user``) given
    ``user_ids`` and ``records_per_user`` G: see
    :func:`dpaudit.mechanisms.user_level.train_and_release_user_level`, which this delegates to.
    """
    one_of("privacy_unit", privacy_unit, ("record", "user"))
    if privacy_unit == "user":
        from .user_level import train_and_release_user_level

        return train_and_release_user_level(
            model, records_per_user=records_per_user, user_ids=user_ids, dataset=dataset, data_dir=data_dir, epsilon=epsilon, delta=delta,
            seed=seed, non_private=non_private, reproducible_noise=reproducible_noise, noise_source=noise_source, out_dir=out_dir,
            ledger_path=ledger_path, epochs=epochs, batch_size=batch_size, profile=profile, split_seed=split_seed, progress=progress,
            record=record, prepared=prepared)
    if user_ids is not None or records_per_user is not None:  # never ignore a request for user-level privacy
        raise UsageError("privacy_unit must be 'user' when user ids or records_per_user are given, got 'record'.")

    def load():
        if prepared is not None:
            return prepared
        from ..data import load_dataset

        return load_dataset(dataset, data_dir=data_dir, split_seed=split_seed, profile=profile)

    def record_unit(data) -> _UnitPlan:
        # N0, the size of the training partition, is the public reference size (section 3.2).
        return _UnitPlan(name="record", adjacency=ADJACENCY, reference_size=int(data.y_train.shape[0]),
                         train_head=train_linear_head, train_module=train_module_dp_sgd)

    return _train_and_release_unit(
        model, load=load, unit_of=record_unit, data_dir=data_dir, epsilon=epsilon, delta=delta, seed=seed, non_private=non_private,
        reproducible_noise=reproducible_noise, noise_source=noise_source, out_dir=out_dir, ledger_path=ledger_path, epochs=epochs,
        batch_size=batch_size, profile=profile, split_seed=split_seed, progress=progress, record=record)


@dataclass(frozen=True)
class _UnitPlan:
    """What the privacy unit changes in a DP-SGD release; everything else is shared.

    ``reference_size`` is the public size the schedule is built from (N0 records, or n_users);
    ``train_head(z, y, n_classes, config, *, noise, init, progress, binary_logit,
    z_has_bias_column)`` and ``train_module(module, x, y, config, *, noise, loss, progress)`` are
    the unit's trainers; ``config`` holds extra ``Release.config`` keys (placed after
    ``"schedule"``), ``command_args`` extra CLI flags, ``run_tag`` goes into the default out_dir.
    """

    name: str  # Release.privacy_unit
    adjacency: str
    reference_size: int
    train_head: Callable[..., HeadResult]
    train_module: Callable[..., int]
    run_tag: str = ""
    config: dict = field(default_factory=dict)
    batch_size_unit: str | None = None
    command_args: tuple[str, ...] = ()


@budget_session  # the budget reserved below is settled by publish() or cancelled if training fails
def _train_and_release_unit(
    model: str,
    *,
    load: Callable[[], object],
    unit_of: Callable[[object], _UnitPlan],
    data_dir,
    epsilon: float,
    delta: float,
    seed: int,
    non_private: bool,
    reproducible_noise: bool,
    noise_source: str,
    out_dir,
    ledger_path,
    epochs: int | None,
    batch_size: int | None,
    profile: str | None,
    split_seed: int | None,
    progress,
    record: bool,
) -> Release:
    """The one DP-SGD release pipeline behind :func:`train_and_release` (records) and
    :func:`dpaudit.mechanisms.user_level.train_and_release_user_level` (users).

    ``load()`` returns the prepared dataset (after the unit's own data checks); ``unit_of(data)``
    the unit's plan. Privacy contract (either unit): sigma is calibrated with the RDP accountant
    for ``SubsampledGaussian(sigma, q, T)`` with q, T from the unit's public reference size; the
    budget preflight runs before any training; after training executed steps must equal
    accounted steps and the recomputed epsilon (under the unit's adjacency) must not exceed the
    target, else :class:`~dpaudit.errors.AccountingMismatchError` and nothing is published.
    """
    one_of("model", model, MODEL_NAMES)
    spec = MODELS[model]
    if not non_private:
        epsilon = positive_finite("epsilon", epsilon)
    delta = open_unit("delta", delta)
    seed = int(seed)
    # A bad --out must fail before anything is loaded, calibrated, reserved or trained.
    out_dir = check_out_dir(out_dir) if out_dir is not None else None
    t_setup = time.perf_counter()
    data = load()
    if data.y_train.size == 0:
        raise DataError(f"dataset {data.name} has an empty training partition.")
    unit = unit_of(data)
    if out_dir is None:
        out_dir = check_out_dir(Path("runs") / f"{model}-{data.name}{unit.run_tag}-seed{seed}-{'nonprivate' if non_private else f'eps{epsilon:g}'}")
    default_epochs, default_batch = default_protocol(data.name, data.kind)
    epochs = positive_int("epochs", epochs) if epochs is not None else default_epochs
    batch_size = positive_int("batch_size", batch_size) if batch_size is not None else default_batch
    schedule = dp_sgd_schedule(unit.reference_size, batch_size, epochs)

    if non_private:
        sigma, event, calib_eps = 0.0, None, float("inf")
    else:
        calib = calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=schedule.sample_rate, steps=schedule.steps, accountant=ACCOUNTANT)
        sigma = calib.noise_multiplier
        event = SubsampledGaussian(sigma, schedule.sample_rate, schedule.steps)
        calib_eps = calib.epsilon
    # Check, then commit: refuse an over-cap release before any computation on the data. A
    # non-private release (event None) makes the dataset's budget unbounded, so a capped
    # dataset refuses it here. The budget is reserved atomically (concurrent runs see it), and the
    # data's digest must match the dataset's recorded version.
    from ..releasing import reserve

    reserve(dataset=data.name, partition="train", event=event, adjacency=unit.adjacency, ledger_path=ledger_path, record=record,
            data_digest=data.sha256, data_info={"split_seed": data.split_seed, "profile": data.profile}, mechanism=model)

    config = DPSGDConfig(sample_rate=schedule.sample_rate, steps=schedule.steps, normalizer=schedule.normalizer,
                         noise_multiplier=sigma, non_private=non_private)
    from ..releasing import make_noise_source

    noise = make_noise_source(seed=seed, reproducible_noise=reproducible_noise, noise_source=noise_source)
    # The spent-epsilon curve costs one RDP evaluation: only build it when progress is shown.
    eps_of = epsilon_curve(sigma, schedule.sample_rate, delta) if (not non_private and progress not in (None, False)) else None
    n_classes = int(data.n_classes)
    binary = n_classes == 2
    model_config: dict = {"model": model, "family": spec.family, "description": spec.description}

    def noise_tail_check(eps: float | None = None) -> float:
        # Every step adds N(0, (sigma C)^2) to every trainable parameter (empty batches included).
        if non_private:
            return 0.0
        return gaussian_run_tail(schedule.steps, model_config["trainable_parameters"], epsilon if eps is None else eps, delta,
                                 what=f"{model} run ({schedule.steps} steps x {model_config['trainable_parameters']} noised parameters)")

    if spec.family == "head":
        feats = build_features(spec.features, data.n_features, seed)
        t_feat = time.perf_counter()
        z_train = feats.transform(data.x_train, bias_column=True)  # [z, 1]: the head's input
        feature_seconds = time.perf_counter() - t_feat
        k = head_outputs(n_classes, binary_logit=binary)
        init = init_head(feats.output_dim, k, public_rng(seed, TAG_HEAD))
        model_config.update({"features": feats.describe(), "head_outputs": k, "head_init": "U(-1/sqrt(d), 1/sqrt(d)) (torch nn.Linear default)",
                             "loss": "sigmoid cross-entropy (K=1)" if k == 1 else "softmax cross-entropy",
                             "trainable_parameters": k * (feats.output_dim + 1)})
        noise_tail_check()  # public dimensions: refuse truncated-noise runs before training
        setup_seconds = time.perf_counter() - t_setup
        cb, close = _progress_callable(progress, schedule.steps, eps_of)
        t_train = time.perf_counter()
        try:
            head = unit.train_head(z_train, data.y_train, n_classes, config, noise=noise, init=init, progress=cb, binary_logit=binary,
                                   z_has_bias_column=True)
        finally:
            close()
        train_seconds = time.perf_counter() - t_train
        steps_executed = head.steps_executed
        proba = head_probabilities(head.weight, feats.transform(data.x_test))
        arrays = {"head_weight": head.weight.astype(np.float32)}
        for name, a in (("projection", feats.projection), ("hidden_weight", feats.weight), ("hidden_bias", feats.bias)):
            if a is not None:
                arrays[name] = a.astype(np.float32)
        weights_name = "weights.npz"
    else:
        from .models import build_module

        module = build_module(spec.module, kind=data.kind, n_features=data.n_features, n_classes=n_classes, image_shape=data.image_shape, seed=seed)
        loss = "bce" if binary else "cross_entropy"
        x_train = torch.as_tensor(np.asarray(data.x_train, dtype=np.float32))
        y_train = torch.as_tensor(np.asarray(data.y_train, dtype=np.int64))
        feature_seconds = 0.0
        model_config.update({"module": repr(module), "loss": "BCEWithLogits (K=1)" if binary else "CrossEntropy",
                             "trainable_parameters": sum(p.numel() for p in module.parameters() if p.requires_grad),
                             "init": "torch defaults from a generator seeded by the public seed"})
        noise_tail_check()  # public dimensions: refuse truncated-noise runs before training
        setup_seconds = time.perf_counter() - t_setup
        cb, close = _progress_callable(progress, schedule.steps, eps_of)
        t_train = time.perf_counter()
        try:
            steps_executed = unit.train_module(module, x_train, y_train, config, noise=noise, loss=loss, progress=cb)
        finally:
            close()
        train_seconds = time.perf_counter() - t_train
        module.eval()
        with torch.no_grad():
            out = module(torch.as_tensor(np.asarray(data.x_test, dtype=np.float32))).double()
        if binary:
            p1 = torch.sigmoid(out.reshape(-1)).numpy()
            proba = np.stack([1.0 - p1, p1], axis=1)
        else:
            proba = torch.softmax(out, dim=1).numpy()
        arrays = None
        weights_name = "model.pt"

    if non_private:
        claimed = float("inf")
        epsilons = {}
        guarantee = {"type": "non-private"}
    else:
        # Recompute the claim from the event itself rather than trusting the calibration value.
        claimed = compute_epsilon(event, delta=delta, accountant=ACCOUNTANT, adjacency=unit.adjacency).epsilon
        check_accounting(steps_executed=steps_executed, steps_accounted=schedule.steps, epsilon=claimed, target_epsilon=epsilon)
        epsilons = {"rdp": claimed}
        try:
            epsilons["prv"] = compute_epsilon(event, delta=delta, accountant="prv", adjacency=unit.adjacency).epsilon
        except Exception as e:  # noqa: BLE001 -- a comparison value only; the claim is rdp
            epsilons["prv"] = f"unavailable: {type(e).__name__}"
        guarantee = event.to_dict()

    metrics = classification_metrics(data.y_test, proba)
    timings = {"setup_seconds": setup_seconds, "train_seconds": train_seconds, "feature_seconds": feature_seconds,
               "torch_threads": torch.get_num_threads()}
    out_dir.mkdir(parents=True, exist_ok=True)  # checked creatable and writable before training (the check leaves none behind)
    if arrays is not None:
        np.savez(out_dir / weights_name, **arrays)
    else:
        torch.save(module.state_dict(), out_dir / weights_name)

    release = Release(
        mechanism=model,
        dataset=data.identity(),  # public identity only; the digest stays local (data_digest)
        adjacency=unit.adjacency,
        accountant=ACCOUNTANT,
        epsilon=claimed,
        delta=delta,
        guarantee=guarantee,
        seed=seed,
        noise_source=noise.spec.to_dict(),
        target_epsilon=None if non_private else epsilon,
        noise_multiplier=sigma,
        sample_rate=schedule.sample_rate,
        steps=schedule.steps,
        steps_executed=steps_executed,
        clipping_norm=config.clipping_norm,
        normalizer=schedule.normalizer,
        partition="train",
        privacy_unit=unit.name,
        non_private=non_private,
        epsilons=epsilons,
        config={
            **model_config,
            "dp_sgd": config.to_dict(),
            "schedule": schedule.to_dict(),
            **unit.config,
            "epochs": epochs,
            "batch_size": batch_size,
            **({"batch_size_unit": unit.batch_size_unit} if unit.batch_size_unit is not None else {}),
            "reference_size": unit.reference_size,
            "calibrated_epsilon": calib_eps,
            "seeds": {"model_seed": seed, "split_seed": data.split_seed},
            "profile": data.profile,
            "validation_used": False,
        },
        metrics=metrics,  # on the test partition: evaluation data outside the DP claim (Release docstring)
        timings=round_timings(timings),  # published rounded (data-dependent via Poisson batch sizes)
        exact_timings=timings,  # local.json only
        data_digest=data.sha256,  # never published; the ledger keeps a keyed fingerprint of it
        artefacts={"weights": weights_name},
        command=_command_line(model, dataset=data.name, data_dir=data_dir, epsilon=epsilon, delta=delta, seed=seed, non_private=non_private,
                              reproducible_noise=reproducible_noise, noise_source=noise_source, out_dir=out_dir,
                              epochs=None if epochs == default_epochs else epochs, batch_size=None if batch_size == default_batch else batch_size,
                              profile=profile, split_seed=split_seed, extra=unit.command_args),
        noise_sampler="none (non-private)" if non_private else GAUSSIAN_SAMPLER_DESCRIPTION,
        noise_tail_delta=noise_tail_check(claimed),
    )
    from ..releasing import publish

    publish(release, out_dir, ledger_path=ledger_path, record=record)
    return release
