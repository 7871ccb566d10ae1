"""What one sweep task does on a worker: the runners.

A runner takes the task's public configuration (see :class:`dpaudit.sweeps.spec.Task`) and a
:class:`RunContext` (where to write, where the data and the ledger are) and returns a JSON-able
result dict. Runners are plain module-level functions so they pickle to worker processes and to
Dask workers alike.

- ``train``: one private (or non-private) training run through
  :func:`dpaudit.mechanisms.rvfl.train_and_release` (the seven DP-SGD models and the attention
  control) or, for the model names ``dp-elm-L1``, ``dp-elm-L3``, ``dp-elm-L5`` and ``dp-elm-L10``,
  one closed-form Laplace DP-ELM of that width through
  :func:`dpaudit.mechanisms.dp_elm.train_and_release_dp_elm` (pure epsilon-DP, delta = 0, event
  ``PureEpsilon(epsilon)``, adjacency add-remove-record like DP-SGD so the ledger composes both
  kinds on one training partition; DP-RVFL paper section 3.5). The release is written under the sweep's
  output folder and recorded in the ledger, tagged with the sweep's name (``config["sweep"]``),
  so the ledger shows what the whole sweep spent: every task is a separate release on the same
  training partition, and they compose (the composed epsilon of a sweep is far above any single
  run's epsilon; the ledger report says so). A task's ``profile`` setting (from the spec's
  profiles axis; absent = the dataset's default) is the preprocessing profile the data are
  loaded with, e.g. ``authors`` (:mod:`dpaudit.data.authors`).
- ``selftest``: a noisy estimate of a synthetic mean (no data files, no release, no ledger,
  no privacy claim), used to check executors and clusters end to end. Its extra settings (``sleep``,
  ``fail_seeds``, ``exit_once_marker``) exist to test failure handling.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..catalogue import names as catalogue_names
from ..errors import UsageError

#: DP-SGD-trained models of the ``train`` runner (DP-RVFL family, paper 001 sections 3.3-3.6).
GRADIENT_MODELS = catalogue_names(family=("dp-sgd-head", "dp-sgd-module"))
#: Closed-form Laplace DP-ELM widths L of the primary design (paper 001, section 3.5; equal to
#: ``dpaudit.mechanisms.dp_elm.ELM_WIDTHS``, kept literal so reading a spec imports no mechanism).
DP_ELM_WIDTHS = (1, 3, 5, 10)
#: Sweep model names of the DP-ELM widths: ``dp-elm-L{width}``.
DP_ELM_MODELS = tuple(f"dp-elm-L{w}" for w in DP_ELM_WIDTHS)
#: Models the ``train`` runner accepts.
TRAIN_MODELS = GRADIENT_MODELS + DP_ELM_MODELS
#: ``delta``, ``epochs`` and ``batch_size`` concern the DP-SGD models only; a DP-ELM task of a
#: mixed block ignores them (its release claims delta = 0 and makes one closed-form pass).
TRAIN_SETTINGS = ("delta", "reproducible_noise", "noise_source", "non_private", "epochs", "batch_size")
SELFTEST_MODELS = ("mean", "median")
SELFTEST_SETTINGS = ("delta", "reproducible_noise", "noise_source", "non_private", "n", "sleep", "fail_seeds", "exit_once_marker")


@dataclass(frozen=True)
class RunContext:
    """Where a task writes and reads; not part of the task key (speed/location settings only)."""

    sweep: str
    out_dir: str  # the sweep's folder; releases go below it
    data_dir: str | None = None
    ledger_path: str | None = None
    record: bool = True  # record releases in the ledger
    #: the coordinator's open ledger reservations holding the sweep's budget (the tasks' own
    #: pre-checks leave them out: their releases are inside them; see releasing.held_by_caller)
    reservations: tuple = ()

    def to_dict(self) -> dict:
        return asdict(self)


def validate_block(runner: str, models: list[str], datasets: list[str], settings: dict, where: str) -> None:
    """Runner-specific checks of a grid block, done when the spec is read (before anything runs)."""
    if runner == "train":
        allowed_models, allowed_settings = TRAIN_MODELS, TRAIN_SETTINGS
    elif runner == "selftest":
        allowed_models, allowed_settings = SELFTEST_MODELS, SELFTEST_SETTINGS
    else:  # pragma: no cover - spec_from_dict checks the runner first
        raise UsageError(f"runner must be one of {', '.join(sorted(RUNNERS))}, got {runner!r}.")
    for m in models:
        if m not in allowed_models:
            raise UsageError(f"{where} model must be one of {', '.join(allowed_models)}, got {m!r}.")
    if runner == "train":
        from ..data import DATASET_NAMES

        for d in datasets:
            if d not in DATASET_NAMES:
                raise UsageError(f"{where} dataset must be one of {', '.join(DATASET_NAMES)}, got {d!r}.")
    elif any(d != "synthetic" for d in datasets):
        raise UsageError(f"{where} dataset must be synthetic for the selftest runner, got {', '.join(datasets)}.")
    unknown = sorted(set(settings) - set(allowed_settings))
    if unknown:
        raise UsageError(f"{where} settings must be among {', '.join(allowed_settings)}, got {', '.join(unknown)}.")
    if "delta" in settings:
        from ..validation import open_unit

        open_unit("delta", settings["delta"])


def profile_setting(dataset: str, profile: str | None, where: str = "sweep") -> str | None:
    """The ``profile`` task setting for ``dataset`` under a profiles-axis value.

    None for ``None``, ``"default"`` and the dataset's own default profile (such a task has no
    profile setting, so its key is that of a grid without the axis); else the profile name,
    which the dataset must offer (:class:`UsageError` naming the allowed ones otherwise).
    """
    from ..data import dataset_info

    if profile is None or profile == "default":
        return None
    info = dataset_info(dataset)
    if profile == info.default_profile:
        return None
    if profile not in info.profiles:
        raise UsageError(f"{where} profile for dataset {dataset} must be one of default, {', '.join(info.profiles)}, got {profile!r}.")
    return profile


def dp_elm_width(model: str) -> int | None:
    """The width L of a ``dp-elm-L{L}`` sweep model name, None for any other model."""
    return DP_ELM_WIDTHS[DP_ELM_MODELS.index(model)] if model in DP_ELM_MODELS else None


def task_dir(out_dir: str | os.PathLike, config: dict, key: str) -> Path:
    """A readable, unique folder for one task's artefacts."""
    eps = "nonprivate" if config["epsilon"] is None else f"eps{config['epsilon']:g}"
    profile = (config.get("settings") or {}).get("profile")
    dataset = config["dataset"] if profile is None else f"{config['dataset']}-{profile}"
    return Path(out_dir) / "releases" / config["model"] / dataset / eps / f"seed{config['seed']}-{key[:12]}"


def execute_task(payload: tuple[dict, dict]) -> dict:
    """Entry point on a worker: ``payload = (task config, RunContext as dict)``."""
    from .spec import config_key

    config, ctx = payload
    context = RunContext(**ctx)
    runner = RUNNERS.get(config["runner"])
    if runner is None:
        raise UsageError(f"runner must be one of {', '.join(sorted(RUNNERS))}, got {config['runner']!r}.")
    return runner(config, context, config_key(config))


# --------------------------------------------------------------------------------------------
# train
# --------------------------------------------------------------------------------------------

def _run_train(config: dict, context: RunContext, key: str) -> dict:
    """Train, write release.json tagged with the sweep, and return it for the coordinator to record.

    The trainer runs its own per-release budget preflight against ``context.ledger_path``
    (refusing over-cap work before training); the release itself is recorded in the ledger by
    the coordinating process (:func:`dpaudit.sweeps.runner.run_sweep`), the single writer, so a
    remote worker never needs the ledger file to be writable.
    """
    import dataclasses

    from ..records import write_release

    s = config["settings"]
    out = task_dir(context.out_dir, config, key)
    non_private = bool(s.get("non_private", False)) or config["epsilon"] is None
    width = dp_elm_width(config["model"])
    from ..releasing import held_by_caller

    with held_by_caller(context.reservations):
        if width is not None:
            release = _train_dp_elm(config, context, out, width, non_private)
        else:
            release = _train_gradient(config, context, out, non_private)
    # The sweep tag: which sweep and task made this release (the ledger shows it per release).
    tagged = dataclasses.replace(release, config={**release.config, "sweep": {"name": context.sweep, "task": key}})
    write_release(tagged, out)
    result = release_result(tagged, out)
    # Handed to the coordinator (the ledger writer) with its local-only data digest, so the
    # ledger can store the keyed fingerprint; the coordinator pops it before storing the result.
    result["release"] = tagged.to_dict(local=True)
    return result


def _common_kwargs(config: dict, context: RunContext, out: Path, non_private: bool) -> dict:
    """What every trainer of the ``train`` runner takes from a task (its release is not recorded here:
    the coordinator records it)."""
    s = config["settings"]
    return dict(
        dataset=config["dataset"],
        data_dir=context.data_dir,
        epsilon=config["epsilon"] if not non_private else 1.0,  # ignored when non-private
        seed=int(config["seed"]),
        non_private=non_private,
        reproducible_noise=bool(s.get("reproducible_noise", False)),
        noise_source=str(s.get("noise_source", "os-entropy")),
        out_dir=str(out),
        ledger_path=context.ledger_path,
        record=False,
        profile=s.get("profile"),  # None: the dataset's default preprocessing
    )


def _train_gradient(config: dict, context: RunContext, out: Path, non_private: bool):
    """One DP-SGD (or non-private) run of a gradient-trained model."""
    from ..mechanisms.dpsgd_release import train_and_release

    s = config["settings"]
    return train_and_release(config["model"], delta=float(s.get("delta", 1e-5)), epochs=s.get("epochs"), batch_size=s.get("batch_size"),
                             progress=False, **_common_kwargs(config, context, out, non_private))


def _train_dp_elm(config: dict, context: RunContext, out: Path, width: int, non_private: bool):
    """One closed-form Laplace DP-ELM of ``width`` (pure epsilon-DP; section 3.5).

    The trainer runs its own preflight of ``PureEpsilon(epsilon)`` against the ledger before the
    statistics are touched; adjacency stays at its default, add-remove-record (the relation of
    the DP-SGD releases, so the ledger composes both on the training partition). ``delta``,
    ``epochs`` and ``batch_size`` do not apply to this mechanism and are not passed.
    """
    from ..mechanisms.dp_elm import train_and_release_dp_elm

    return train_and_release_dp_elm(width=width, **_common_kwargs(config, context, out, non_private))


def planned_release(config: dict):
    """(dataset, partition, adjacency, event) a ``train`` task will spend, computed *before* it runs.

    The DP-SGD models' event is their mechanism's own plan
    (:meth:`dpaudit.mechanisms.dpsgd_release.DPSGDMechanism.plan`, the one the release runs):
    the public schedule of the dataset's training partition under the task's profile (paper
    Table 2) and the RDP-calibrated noise multiplier for the target epsilon. A DP-ELM task
    (``dp-elm-L*``) spends ``PureEpsilon(epsilon)`` (pure DP, delta = 0) under add-remove-record,
    exactly what :func:`dpaudit.mechanisms.dp_elm.train_and_release_dp_elm` records, so the
    sweep's up-front cap check composes it with the Gaussian events of the same partition.
    ``event`` is None for a non-private task (unbounded cost). Returns None for runners that
    touch no real data. Returns (dataset, partition, adjacency, event, noise_tail_delta): the last
    is the plan's sampler tail delta (:func:`dpaudit.releasing.planned_noise_tail`, 0 without
    Gaussian noise), which a sweep's up-front reservation holds with the event.
    """
    from ..releasing import planned_noise_tail

    if config["runner"] != "train":
        return None
    from ..data import dataset_info

    s = config["settings"]
    info = dataset_info(config["dataset"])
    width = dp_elm_width(config["model"])
    from ..mechanisms.contract import DataInfo

    if width is not None:
        from ..mechanisms.dp_elm import DEFAULT_ADJACENCY
        from ..mechanisms.dp_elm import MECHANISM as DP_ELM
        from ..requests import DPELMRequest

        if s.get("non_private") or config["epsilon"] is None:
            return info.name, "train", DEFAULT_ADJACENCY, None, 0.0
        plan = DP_ELM.plan(DPELMRequest(dataset=info.name, width=width, epsilon=float(config["epsilon"]), profile=s.get("profile")),
                           DataInfo.from_registry(info.name, s.get("profile")))
        return plan.data_name, plan.partition, plan.adjacency, plan.event, planned_noise_tail(plan)
    from ..mechanisms.dpsgd_release import MECHANISM, RECORD_ADJACENCY
    from ..requests import DPSGDRequest

    if s.get("non_private") or config["epsilon"] is None:
        return info.name, "train", RECORD_ADJACENCY, None, 0.0
    request = DPSGDRequest(model=config["model"], dataset=info.name, epsilon=float(config["epsilon"]), delta=float(s.get("delta", 1e-5)),
                           epochs=int(s["epochs"]) if s.get("epochs") else None, batch_size=int(s["batch_size"]) if s.get("batch_size") else None,
                           profile=s.get("profile"))
    # The profile decides the training partition's size (e.g. authors' Heart: 211, not 212).
    plan = MECHANISM.plan(request, DataInfo.from_registry(info.name, s.get("profile")))
    return plan.data_name, plan.partition, plan.adjacency, plan.event, planned_noise_tail(plan)


def planned_event(config: dict):
    """(dataset, partition, adjacency, event) of :func:`planned_release` (None: no real data)."""
    planned = planned_release(config)
    return None if planned is None else planned[:4]


def release_result(release, out: Path) -> dict:
    """The part of a release a sweep table needs (the full release stays in release.json)."""
    d = release.to_dict() if hasattr(release, "to_dict") else dict(release)
    out_ = {
        "release_id": d.get("id"),
        "mechanism": d.get("mechanism"),
        "epsilon": d.get("epsilon"),
        "target_epsilon": d.get("target_epsilon"),
        "delta": d.get("delta"),
        "accountant": d.get("accountant"),
        "adjacency": d.get("adjacency"),
        "noise_multiplier": d.get("noise_multiplier"),
        "sample_rate": d.get("sample_rate"),
        "steps": d.get("steps"),
        "steps_executed": d.get("steps_executed"),
        "non_private": d.get("non_private"),
        "noise_source": d.get("noise_source"),
        "dataset": {k: (d.get("dataset") or {}).get(k) for k in ("name", "profile")},
        "partition": d.get("partition"),
        "metrics": d.get("metrics", {}),
        "timings": d.get("timings", {}),
        "release_dir": str(out.resolve()),
    }
    cfg = d.get("config") or {}
    if d.get("mechanism") == "dp-elm":  # closed-form DP-ELM: its width and Laplace scale L(L+2)/epsilon
        out_.update(width=cfg.get("width"), noise_scale=cfg.get("noise_scale"), sampler=cfg.get("sampler"))
    return out_


# --------------------------------------------------------------------------------------------
# selftest
# --------------------------------------------------------------------------------------------

def _run_selftest(config: dict, context: RunContext, key: str) -> dict:
    """Release a statistic of synthetic data in [0, 1] with the Gaussian mechanism.

    Data: ``n`` public draws from Beta(2, 5) seeded by the task seed. The noise scale is
    sqrt(2 ln(1.25/delta)) / ((n - 1) epsilon), the classic Gaussian-mechanism formula (Dwork &
    Roth, Thm 3.22; its guarantee holds for epsilon < 1 only), used here just to give the
    workload an epsilon-dependent noise level: this runner makes **no privacy claim**, touches
    no real data, writes no release and records nothing in the ledger. The noise still comes
    from a NoiseSource (reproducible only on request), like every mechanism's.
    The ``median`` model is the noisy mean of the lower half (a second, correlated workload).
    """
    import numpy as np

    from ..noise import public_rng
    from ..releasing import make_noise_source

    s = config["settings"]
    seed = int(config["seed"])
    t0 = time.perf_counter()
    marker = s.get("exit_once_marker")
    if marker and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os._exit(17)  # simulate a worker dying mid-task (tests of the executors' recovery)
    if seed in set(s.get("fail_seeds", [])):
        raise RuntimeError(f"selftest task failed on purpose for seed {seed}")
    if s.get("sleep"):
        time.sleep(float(s["sleep"]))
    n = int(s.get("n", 1000))
    x = public_rng(seed, 7).beta(2.0, 5.0, size=n)
    data = np.sort(x)[: n // 2] if config["model"] == "median" else x
    truth = float(data.mean())
    noise = make_noise_source(
        seed=seed, reproducible_noise=bool(s.get("reproducible_noise", False)),
        noise_source=str(s.get("noise_source", "os-entropy")),
    )
    if s.get("non_private") or config["epsilon"] is None:
        sigma = 0.0
    else:
        delta = float(s.get("delta", 1e-5))
        sigma = math.sqrt(2.0 * math.log(1.25 / delta)) * (1.0 / (len(data) - 1)) / float(config["epsilon"])
    estimate = truth + float(noise.gaussian_numpy((), sigma)) if sigma > 0 else truth
    err = abs(estimate - truth)
    return {
        "mechanism": f"selftest-{config['model']}",
        "epsilon": config["epsilon"],
        "delta": float(s.get("delta", 1e-5)),
        "noise_scale": sigma,
        "metrics": {"accuracy": max(0.0, 1.0 - 10.0 * err), "abs_error": err, "estimate": estimate},
        "timings": {"train_seconds": time.perf_counter() - t0},
    }


RUNNERS = {"train": _run_train, "selftest": _run_selftest}
