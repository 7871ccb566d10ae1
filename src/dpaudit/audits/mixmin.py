"""Compatibility for the hand-built dp-mixmin branches of :mod:`dpaudit.audits.build` until it
audits through :meth:`dpaudit.mechanisms.mixmin_pipeline.DPMixMin.audit_target` (issue 24; then
this module goes). The target lives beside the mechanism, :mod:`dpaudit.mechanisms.mixmin_audit`."""

from __future__ import annotations

import dataclasses
import os

from ..accounting import compute_epsilon
from ..mechanisms.mixmin import MixMinConfig
from ..mechanisms.mixmin_audit import MixMinTarget, mixmin_config_for, task_target  # noqa: F401
from ..mechanisms.mixmin_pipeline import MECHANISM
from ..mechanisms.mixmin_tasks import TASK_DIVISION_KEYS, load_task, mixture_split, resolved_rho
from ..requests import MixMinRequest


def mixmin_task_target(task: str = "digits-mix", target: str | None = None, *, canary: str = "max-clip", settings=None,
                       noise_multiplier: float | None = None, whole_train: bool = False, division: int | None = None, **request) -> MixMinTarget:
    """The target of the :class:`~dpaudit.requests.MixMinRequest` these arguments make (``request``:
    its epsilon, delta, rho, seed, data_dir, proxy_mode), planned as a release plans it; a
    release's recorded ``settings`` (:class:`~dpaudit.mechanisms.mixmin_tasks.MixtureSettings`)
    and ``noise_multiplier`` replace the defaults and the calibration. On the former task
    ``division`` q is built from the actual |D_mix| (what the releases made on it used)."""
    kw = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in request.items() if v is not None}
    if settings is not None:
        kw.update(steps=settings.steps, batch_size=settings.batch_size, clipping_norm=settings.clipping_norm, step_size=settings.step_size,
                  loss=settings.loss)
    req = MixMinRequest(task=task, target=target, **({"stage": "pipeline", "composition": "sequential"} if whole_train else {}), **kw)
    data = MECHANISM.load(req)
    plan = MECHANISM.plan(req, MECHANISM.data_info(req, data))
    mix = plan.parts[0]
    cfg = MixMinConfig(**mix.config["mixmin_config"])
    if noise_multiplier is not None:
        cfg = dataclasses.replace(cfg, noise_multiplier=float(noise_multiplier))
    if division is not None and division != TASK_DIVISION_KEYS[task]:
        t = load_task(task, seed=req.seed, data_dir=req.data_dir, division=division)
        n = len(t.train_idx) if whole_train else len(mixture_split(t.train_record_ids, resolved_rho(req), req.seed)[0])
        b = min(cfg.expected_batch_size, n)
        cfg = dataclasses.replace(cfg, sample_rate=b / n, expected_batch_size=float(b))
    claimed = compute_epsilon(cfg.event(), delta=req.delta, accountant="rdp").epsilon
    return task_target(req, cfg, canary=canary, claimed=claimed, division=division,
                       scope={"dataset": task, "partition": mix.partition})
