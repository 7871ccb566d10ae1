"""The DP-MixMin paper's baselines end to end (section 5), for the experiments: no ledger, and
nothing claimed about composition. Calibrated from the sizes of the given splits (not a release:
releases plan from a declared reference size, :mod:`dpaudit.mechanisms.mixmin.mechanism`).

Methods: DP-MixMin, the uniform mixture, random search over m mixtures drawn uniformly from the
simplex (selected NON-privately on D_mix, as in the paper, so it over-estimates private search),
random initialisation (no pretraining) and non-private MixMin (lambda* on all private training
records, then DP fine-tuning on all of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpaudit.accounting import calibrate_noise_multiplier, dp_sgd_schedule
from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
from dpaudit.mechanisms.dpsgd.loop import train_heads
from dpaudit.mechanisms.mixmin.solver import run_mixmin, solve_mixmin
from dpaudit.mechanisms.mixmin.mechanism import (
    _TAG_PRETRAIN,
    DownstreamSettings,
    auc,
    default_downstream,
    features,
    head_init,
    head_scores,
    model_scores,
    pretrain,
)
from dpaudit.mechanisms.mixmin.tasks import MixMinTask, MixtureSettings, mixture_split, new_mlp
from dpaudit.noise import NoiseSource, public_rng
from dpaudit.validation import one_of

METHODS = ("dp-mixmin", "uniform", "random-search", "random-init", "non-private-mixmin")
_TAG_RS = 0x9E8


def learn_mixture(
    probs,
    labels,
    *,
    epsilon: float,
    delta: float,
    settings: MixtureSettings,
    noise: NoiseSource,
    privacy_unit: str = "record",
    user_ids=None,
    accountant: str = "rdp",
):
    """Calibrate sigma for (epsilon, delta) and run Algorithm 1/2. Returns (weights, config, calibration)."""
    probs = np.asarray(probs)
    if privacy_unit == "user":
        if user_ids is None:
            raise UsageError("user_ids must be given for privacy_unit user, got None.")
        n_units = len(np.unique(user_ids))
    else:
        n_units = probs.shape[0]
    b = min(settings.batch_size, n_units)
    cal = calibrate_noise_multiplier(
        target_epsilon=epsilon,
        delta=delta,
        sample_rate=b / n_units,
        steps=settings.steps,
        accountant=accountant,
    )
    cfg = settings.config(
        k=probs.shape[1],
        n_units=n_units,
        noise_multiplier=cal.noise_multiplier,
        privacy_unit=privacy_unit,
    )
    res = run_mixmin(
        probs, labels, cfg, noise=noise, user_ids=user_ids if privacy_unit == "user" else None
    )
    return res, cfg, cal


def finetune_head(
    model,
    x_ft,
    y_ft,
    *,
    epsilon: float,
    delta: float,
    settings: DownstreamSettings,
    noise: NoiseSource,
    init: np.ndarray | None,
    accountant: str = "rdp",
):
    """DP-SGD on the head over frozen features of D_ft. Returns (the head (K, d+1), DPSGDConfig, calibration, schedule)."""
    z = features(model, x_ft).astype(np.float32)
    sched = dp_sgd_schedule(
        len(y_ft), min(settings.finetune_batch_size, len(y_ft)), settings.finetune_epochs
    )
    cal = calibrate_noise_multiplier(
        target_epsilon=epsilon,
        delta=delta,
        sample_rate=sched.sample_rate,
        steps=sched.steps,
        accountant=accountant,
    )
    cfg = DPSGDConfig(
        sample_rate=sched.sample_rate,
        steps=sched.steps,
        normalizer=sched.normalizer,
        noise_multiplier=cal.noise_multiplier,
        clipping_norm=settings.finetune_clipping_norm,
        lr=settings.finetune_lr,
    )
    head = train_heads(
        z, np.asarray(y_ft, dtype=np.int64), 2, cfg, noise=noise, init=init, binary_logit=True
    ).weights[0]
    return head, cfg, cal, sched


@dataclass(frozen=True)
class MethodResult:
    method: str
    weights: np.ndarray | None
    auc_pretrained: float | None  # test AUC of the pretrained model before fine-tuning
    auc_finetuned: float  # test AUC after DP fine-tuning
    info: dict


def run_method(
    method: str,
    task: MixMinTask,
    target: str,
    probs_train: np.ndarray,
    *,
    epsilon: float,
    delta: float,
    rho: float,
    seed: int,
    noise: NoiseSource,
    mixture: MixtureSettings = MixtureSettings(),
    downstream: DownstreamSettings | None = None,
    split=None,
    cache: dict | None = None,
) -> MethodResult:
    """Run one pipeline variant on ``task``/``target`` (no ledger; the experiments' workhorse).

    ``probs_train``: proxy predictions on the private training records. ``split``: (mix, ft)
    indices into the training records (default: :func:`mixture_split` of the task's stable
    record ids with ``rho``, ``seed``). No ledger here: nothing is claimed about composition.
    """
    one_of("method", method, METHODS)
    downstream = default_downstream(task) if downstream is None else downstream
    tname, y_all = task.target_labels(target)
    tr = task.train_idx
    y_tr = y_all[tr]
    x_tr = task.private_x[tr]
    x_val, y_val = task.private_x[task.val_idx], y_all[task.val_idx]
    x_te, y_te = task.private_x[task.test_idx], y_all[task.test_idx]
    mix, ft = split if split is not None else mixture_split(task.train_record_ids, rho, seed)
    info: dict = {}
    weights = None
    ft_idx = ft if method in ("dp-mixmin", "random-search") else np.arange(len(tr))
    key = (method, tname, seed, rho, task.name, task.seed)
    if cache is not None and method != "dp-mixmin" and key in cache:
        weights, model, init, auc_pre, cinfo = cache[key]
        info.update(cinfo)
    else:
        if method == "dp-mixmin":
            res, cfg, cal = learn_mixture(
                probs_train[mix],
                y_tr[mix],
                epsilon=epsilon,
                delta=delta,
                settings=mixture,
                noise=noise,
            )
            weights = res.weights
            info["mixture_noise_multiplier"] = cal.noise_multiplier
        elif method == "uniform":
            weights = np.full(task.k, 1.0 / task.k)
        elif method == "non-private-mixmin":
            weights = solve_mixmin(probs_train, y_tr, mixture.loss)
        elif method == "random-search":
            rng = public_rng(seed, _TAG_RS)
            cands = rng.dirichlet(np.ones(task.k), size=downstream.random_search_m)
            best = (-math.inf, None)
            scores = []
            for j, c in enumerate(cands):
                m, _ = pretrain(
                    task,
                    c,
                    seed=seed,
                    settings=downstream,
                    x_val=x_tr[mix],
                    y_val=y_tr[mix],
                    tag=1000 + j,
                )
                a = auc(
                    y_tr[mix], model_scores(m, x_tr[mix])
                )  # non-private selection on D_mix (paper A.10)
                scores.append(a)
                if a > best[0]:
                    best = (a, c)
            weights = best[1]
            info["candidate_aucs"] = scores
        if method == "random-init":
            model = new_mlp(task.public_x.shape[1], downstream.hidden, 1, seed, _TAG_PRETRAIN, 999)
            init = None
            auc_pre = None
        else:
            model, pinfo = pretrain(
                task, weights, seed=seed, settings=downstream, x_val=x_val, y_val=y_val
            )
            info["pretrain"] = pinfo
            init = head_init(model)
            auc_pre = auc(y_te, model_scores(model, x_te))
        if cache is not None and method != "dp-mixmin":
            cache[key] = (weights, model, init, auc_pre, dict(info))
    head, fcfg, fcal, sched = finetune_head(
        model,
        x_tr[ft_idx],
        y_tr[ft_idx],
        epsilon=epsilon,
        delta=delta,
        settings=downstream,
        noise=noise,
        init=init,
    )
    info.update(
        finetune_noise_multiplier=fcal.noise_multiplier,
        finetune_records=int(len(ft_idx)),
        finetune_steps=sched.steps,
        finetune_sample_rate=sched.sample_rate,
    )
    auc_ft = auc(y_te, head_scores(model, head, x_te))
    return MethodResult(method, weights, auc_pre, auc_ft, info)
