"""What one sweep task does on a worker: the runners.

A runner takes the task's public configuration (see :class:`dpaudit.sweeps.spec.Task`) and a :class:`RunContext` (where to write,
where the data and the ledger are) and returns a JSON-able result dict. Runners are plain module-level functions so they pickle to
worker processes and to Dask workers alike.

- ``train``: one release of a catalogue mechanism (:func:`_run_train`; its budget: :func:`planned_release`), recorded by the
  coordinator under the sweep's name: the tasks of a sweep compose on their training partition.
- ``selftest``: a noisy estimate of a synthetic mean (no data files, no release, no ledger, no privacy claim), used to check
  executors and clusters end to end. Its extra settings (``sleep``, ``fail_seeds``, ``exit_once_marker``) exist to test failure
  handling.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import DataError, UsageError
from ..lazy import lazy_import
from ..mechanisms import registry
from ..mechanisms.contract import DataInfo
from ..noise import public_rng
from ..records import write_release
from ..releasing import held_by_caller, make_noise_source, planned_noise_tail, release
from ..validation import one_of
from .spec import RUNNER_NAMES, config_key, task_request

np = lazy_import("numpy")

#: Release fields a sweep table needs (the full release stays in release.json).
RESULT_FIELDS = tuple(
    "epsilon target_epsilon delta accountant adjacency noise_multiplier sample_rate steps "
    "steps_executed non_private noise_source".split()
)
#: Config entries of closed-form mechanisms (DP-ELM: width, Laplace scale L(L+2)/epsilon, sampler), copied into the result when
#: the release's config records them.
RESULT_CONFIG = ("width", "noise_scale", "sampler")


@dataclass(frozen=True)
class RunContext:
    """Where a task writes and reads; not part of the task key (speed/location settings only)."""

    sweep: str
    out_dir: str  # the sweep's folder; releases go below it
    data_dir: str | None = None
    ledger_path: str | None = None
    record: bool = True  # record releases in the ledger
    #: ``(task key, reservation id)`` of the coordinator's open reservations holding the sweep's
    #: budget (:func:`held_for`)
    reservations: tuple = ()

    def to_dict(self) -> dict:
        return asdict(self)


def task_dir(out_dir: str | os.PathLike, config: dict, key: str) -> Path:
    """A readable, unique folder for one task's artefacts."""
    eps = "nonprivate" if config["epsilon"] is None else f"eps{config['epsilon']:g}"
    profile = (config.get("settings") or {}).get("profile")
    dataset = config["dataset"] if profile is None else f"{config['dataset']}-{profile}"
    return Path(
        out_dir, "releases", config["model"], dataset, eps, f"seed{config['seed']}-{key[:12]}"
    )


def held_for(context: RunContext, key: str) -> tuple[str, ...]:
    """The reservation that already holds task ``key``'s planned release: its own pre-check leaves
    it out (releasing.held_by_caller) and counts every other task's reservation, so the sweep's
    tasks together stay within every cap, those reached through shared people included."""
    return tuple(rid for task, rid in context.reservations if task == key)


def execute_task(payload: tuple[dict, dict]) -> dict:
    """Entry point on a worker: ``payload = (task config, RunContext as dict)``."""
    config, ctx = payload
    one_of("runner", config["runner"], sorted(RUNNER_NAMES))
    return RUNNERS[config["runner"]](config, RunContext(**ctx), config_key(config))


# ---- train


def _run_train(config: dict, context: RunContext, key: str) -> dict:
    """Release the task's Request (its own preflight refuses over-cap work before training) and write release.json tagged with
    the sweep; the coordinator (:func:`dpaudit.sweeps.runner.run_sweep`), the ledger's single writer, records it."""
    name, request = task_request(config, context.data_dir)
    out = task_dir(context.out_dir, config, key)
    with held_by_caller(held_for(context, key)):
        rel = release(
            name,
            request,
            out_dir=str(out),
            ledger_path=context.ledger_path,
            record=False,
            progress=False,
        )
    # The sweep tag: which sweep and task made this release (the ledger shows it per release).
    tagged = dataclasses.replace(
        rel, config={**rel.config, "sweep": {"name": context.sweep, "task": key}}
    )
    write_release(tagged, out)
    result = release_result(tagged, out)
    # Handed to the coordinator (the ledger writer) with its local-only data digest, so the ledger can store the keyed
    # fingerprint; the coordinator pops it before storing the result.
    result["release"] = tagged.to_dict(local=True)
    return result


def planned_release(config: dict):
    """(dataset, partition, adjacency, event, noise_tail_delta) a ``train`` task will spend, from the plan its release runs
    (``mechanism.plan`` on the registry's public facts under the task's profile), before it runs: ``event`` None for a
    non-private task (unbounded cost), the tail from :func:`dpaudit.releasing.planned_noise_tail`. None for runners that touch
    no real data."""
    if config["runner"] != "train":
        return None
    name, request = task_request(config)
    plan = registry.mechanism(name).plan(
        request, DataInfo.from_registry(request.dataset, config["settings"].get("profile"))
    )
    return plan.data_name, plan.partition, plan.adjacency, plan.event, planned_noise_tail(plan)


def planned_rows(config: dict, data_dir: str | None = None, ledger_path=None):
    """The source rows (:mod:`dpaudit.data.rows`) a ``train`` task's release will read, from its
    mechanism's own data loading as the run does it, so that the coordinator reserves exactly the
    rows the run reads. None when its data cannot be loaded (the task then fails when it runs,
    releasing nothing)."""
    name, request = task_request(config, data_dir)
    mech = registry.mechanism(name)
    try:
        request = mech.validate(request)
        data = mech.load(request, **({"ledger_path": ledger_path} if mech.load_uses_ledger else {}))
    except (DataError, UsageError):
        return None
    return tuple(getattr(data, "rows", None) or ()) or None


def planned_event(config: dict):
    """(dataset, partition, adjacency, event) of :func:`planned_release` (None: no real data)."""
    planned = planned_release(config)
    return None if planned is None else planned[:4]


def release_result(rel, out: Path) -> dict:
    """The part of a release a sweep table needs (the full release stays in release.json)."""
    d = rel.to_dict() if hasattr(rel, "to_dict") else dict(rel)
    cfg = d.get("config") or {}
    return {
        "release_id": d.get("id"),
        "mechanism": d.get("mechanism"),
        **{k: d.get(k) for k in RESULT_FIELDS},
        "dataset": {k: (d.get("dataset") or {}).get(k) for k in ("name", "profile")},
        "partition": d.get("partition"),
        "metrics": d.get("metrics", {}),
        "timings": d.get("timings", {}),
        "release_dir": str(out.resolve()),
        **{k: cfg[k] for k in RESULT_CONFIG if k in cfg},
    }


# ---- selftest


def _run_selftest(config: dict, context: RunContext, key: str) -> dict:
    """Release a statistic of synthetic data in [0, 1] with the Gaussian mechanism.

    Data: ``n`` public draws from Beta(2, 5) seeded by the task seed. The noise scale is sqrt(2 ln(1.25/delta)) / ((n - 1)
    epsilon), the classic Gaussian-mechanism formula (Dwork & Roth, Thm 3.22; its guarantee holds for epsilon < 1 only), used here
    just to give the workload an epsilon-dependent noise level: this runner makes **no privacy claim**, touches no real data,
    writes no release and records nothing in the ledger. The noise still comes from a NoiseSource (reproducible only on request),
    like every mechanism's. The ``median`` model is the noisy mean of the lower half (a second, correlated workload)."""
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
        seed=seed,
        reproducible_noise=bool(s.get("reproducible_noise", False)),
        noise_source=str(s.get("noise_source", "os-entropy")),
    )
    delta = float(s.get("delta", 1e-5))
    if s.get("non_private") or config["epsilon"] is None:
        sigma = 0.0
    else:
        sigma = (
            math.sqrt(2.0 * math.log(1.25 / delta))
            * (1.0 / (len(data) - 1))
            / float(config["epsilon"])
        )
    estimate = truth + float(noise.gaussian_numpy((), sigma)) if sigma > 0 else truth
    err = abs(estimate - truth)
    return {
        "mechanism": f"selftest-{config['model']}",
        "epsilon": config["epsilon"],
        "delta": delta,
        "noise_scale": sigma,
        "metrics": {"accuracy": max(0.0, 1.0 - 10.0 * err), "abs_error": err, "estimate": estimate},
        "timings": {"train_seconds": time.perf_counter() - t0},
    }


RUNNERS = {"train": _run_train, "selftest": _run_selftest}
