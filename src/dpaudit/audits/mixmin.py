"""Audit target for DP-MixMin's mixture-learning step (DP-MixMin paper, appendix A.8).

Threat model (A.8): the adversary sees the released weights lambda and knows every private
record except the canary, the proxies and all hyper-parameters. Trials run Algorithm 1 through
the batched runner :func:`~dpaudit.mechanisms.mixmin.run_mixmin_batched` (fresh Poisson masks
and noise per run), on D_mix with or without the canary.

Scores (from lambda alone). The canary's clipped gradient g enters the mirror-descent step as
log lambda <- log lambda - eta g / B (then a shift that renormalises), so its footprint on the
release is along -g in log-weight space, orthogonal to the all-ones shift. The score is
<log lambda, -u> with u the zero-sum unit direction of the canary's gradient: the max-clip
direction itself, or for a record canary its clipped gradient at the adversary's reference
mixture (the noiseless, canary-free non-private solution, computable by this adversary).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..accounting import calibrate_noise_multiplier, compute_epsilon
from ..errors import UsageError
from ..noise import NoiseSource, public_rng
from .canaries import check_canary
from .targets import AuditTarget


@dataclass
class MixMinTarget(AuditTarget):
    """DP-MixMin trials on fixed proxy predictions ``probs`` (n, k) and ``labels`` (n,).

    ``holdout_probs`` / ``holdout_labels``: records *not* in D_mix, from which the natural and
    mislabeled canaries are drawn (public seed). ``config`` is a
    :class:`~dpaudit.mechanisms.mixmin.MixMinConfig`; its noise multiplier is what is audited,
    ``claimed_epsilon`` the release's claim for it.
    """

    probs: np.ndarray
    labels: np.ndarray
    config: object  # MixMinConfig
    claimed_epsilon: float | None
    delta: float
    canary: str = "max-clip"
    holdout_probs: np.ndarray | None = None
    holdout_labels: np.ndarray | None = None
    seed: int = 0
    top: int = 1
    task: str | None = None
    dataset: str | None = None
    source_names: tuple = ()
    noise: bool = True
    mechanism: str = "dp-mixmin"
    adjacency: str = "add-remove-record"
    default_chunk_size: int = 500
    info: dict = field(default_factory=dict)
    accountant: str = "rdp"  # the accountant of claimed_epsilon (a release's own, when audited from one)
    #: {"dataset", "partition"} of the private records D_mix is (set for a task's D_mix); None: unnamed
    ledger_scope: dict | None = None

    def __post_init__(self) -> None:
        check_canary("dp-mixmin", self.canary)
        from ..mechanisms.mixmin import MixMinCanary, max_clip_direction, per_example_gradients, solve_mixmin

        self.probs = np.asarray(self.probs, dtype=np.float64)
        self.labels = np.asarray(self.labels, dtype=np.float64)
        # The adversary's reference mixture: everything but the canary is known to it.
        self._reference = solve_mixmin(self.probs, self.labels, self.config.loss, steps=500)
        if self.canary == "max-clip":
            d = max_clip_direction(self._reference, top=self.top)
            self._canary = MixMinCanary(kind="gradient", direction=d)
            self._canary_info = {"kind": "max-clip", "direction": d.tolist(), "top_sources": self._top_names(),
                                 "norm": self.config.clipping_norm}
        else:
            if self.holdout_probs is None or len(self.holdout_probs) == 0:
                raise UsageError(f"holdout records must be given for a {self.canary} canary, got none.")
            rng = public_rng(self.seed, 0xCA7A)
            i = int(rng.integers(len(self.holdout_probs)))
            f = np.asarray(self.holdout_probs[i], dtype=np.float64)
            y = float(self.holdout_labels[i]) if self.holdout_labels is not None else 0.0
            if self.canary == "mislabeled":
                y = 1.0 - y  # binary targets: the wrong label
            self._canary = MixMinCanary(kind="record", probs=f, label=y)
            g = per_example_gradients(f[None, :], np.array([y]), self._reference, self.config.loss)[0]
            d = g - g.mean()
            if not np.linalg.norm(d) > 0:
                d = max_clip_direction(self._reference)
            self._canary_info = {"kind": self.canary, "holdout_index": i, "label": y, "probs": f.tolist()}
        self._u = d / np.linalg.norm(d)

    @property
    def claimed_event(self):  # type: ignore[override]
        """The mixture step's event, SubsampledGaussian(sigma, q, steps) of ``config`` (the no-noise
        control claims it too): the claim about every record of D_mix, where the canary goes."""
        from ..accounting.events import SubsampledGaussian

        if self.claimed_epsilon is None or not float(self.config.noise_multiplier) > 0:
            return None  # a configuration without noise claims nothing
        return SubsampledGaussian(float(self.config.noise_multiplier), float(self.config.sample_rate), int(self.config.steps))

    def _top_names(self) -> list:
        order = np.argsort(-self._reference, kind="stable")[: self.top]
        return [self.source_names[j] if j < len(self.source_names) else int(j) for j in order]

    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        from ..mechanisms.mixmin import run_mixmin_batched

        c = np.asarray(canary_in, dtype=bool)
        w = run_mixmin_batched(self.probs, self.labels, self._config_now(), noise=noise, runs=c.size, canary=self._canary, canary_in=c)
        return -np.log(np.maximum(w, 1e-300)) @ self._u

    def _config_now(self):
        return self.config if self.noise else dataclasses.replace(self.config, noise_multiplier=0.0)

    def private_data(self) -> dict | None:
        return self.ledger_scope

    def without_noise(self) -> "MixMinTarget":
        t = dataclasses.replace(self, noise=False)
        return t

    def describe(self) -> dict:
        cfg = self.config.to_dict()
        return {"task": self.task, "dataset": self.dataset,
                "config": {**cfg, "n_mix": int(self.probs.shape[0]), "reference_weights": self._reference.tolist(), **self.info},
                "canary_info": self._canary_info}


def mixmin_config_for(*, n_mix: int, k: int, epsilon: float, delta: float, loss: str = "bce", expected_batch_size: float = 1000.0,
                      steps: int = 200, clipping_norm: float = 1.0, step_size: float = 1.0, accountant: str = "rdp"):
    """A calibrated MixMinConfig (sigma for (epsilon, delta) at q = B / n_mix) and its claimed epsilon."""
    from ..accounting import SubsampledGaussian
    from ..mechanisms.mixmin import MixMinConfig

    q = min(1.0, expected_batch_size / n_mix)
    cal = calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=q, steps=steps, accountant=accountant)
    cfg = MixMinConfig(k=k, loss=loss, noise_multiplier=cal.noise_multiplier, sample_rate=q, expected_batch_size=q * n_mix,
                       steps=steps, clipping_norm=clipping_norm, step_size=step_size)
    claimed = compute_epsilon(SubsampledGaussian(cal.noise_multiplier, q, steps), delta=delta, accountant=accountant).epsilon
    return cfg, claimed


def mixmin_task_target(
    task: str = "digits-mix",
    target: str | None = None,
    *,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    rho: float | None = None,
    canary: str = "max-clip",
    seed: int = 42,
    data_dir=None,
    proxy_mode: str = "joint",
    settings=None,
    noise_multiplier: float | None = None,
    top: int = 1,
    whole_train: bool = False,
    division: int | None = None,
    n_mix_units: int | None = None,
) -> MixMinTarget:
    """A :class:`MixMinTarget` for a built-in task (``digits-mix`` embedded, ``mnist-mix``, ``heart-mix``).

    Mirrors the pipeline's mixture stage: proxies trained on public data only, proxy
    predictions on the private training records, the seeded ``rho`` split into D_mix / D_ft,
    sigma calibrated with RDP for (epsilon, delta) at q = B / |D_mix| (``rho`` and ``settings``
    default to the training defaults of the task: :func:`~dpaudit.mechanisms.mixmin_pipeline.default_rho`, ``default_mixture``). Canary records for ``natural`` / ``mislabeled`` come from the
    task's private test rows (never in D_mix). ``whole_train``: D_mix is every private training
    record (the pipeline's sequential composition) instead of the ``rho`` split. ``division``: the
    task division a release was made on (its identity's ``split_seed``; None: today's).
    ``n_mix_units``: the |D_mix| q = B / |D_mix| is built from (default: the plan's, from the
    task's declared reference size; on the former division, whose releases used the actual
    count, that count).
    """
    from ..accounting import SubsampledGaussian
    from ..mechanisms.mixmin_pipeline import default_mixture, default_rho
    from ..mechanisms.mixmin_tasks import REFERENCE_SIZES, TASK_DIVISION_KEYS, load_task, mixture_split, reference_units, train_proxies

    # The same public defaults as `dpaudit train mixmin` (the embedded task has its own), so the
    # audit tests the mechanism a default release runs.
    settings = settings or default_mixture(task)
    rho = default_rho(task) if rho is None else rho
    t = load_task(task, seed=seed, data_dir=data_dir, division=division)
    tname, y_all = t.target_labels(target)
    proxies = train_proxies(t, mode=proxy_mode)
    tr = t.train_idx
    probs_tr = proxies.predict(t.private_x[tr])
    # The same keyed split of the task's stable record ids as the release path (rule keyed-bernoulli-v1).
    mix = np.arange(len(tr)) if whole_train else mixture_split(t.train_record_ids, rho, seed)[0]
    probs, labels = probs_tr[mix], np.asarray(y_all[tr][mix], dtype=np.float64)
    if n_mix_units is None:
        current = division is None or division == TASK_DIVISION_KEYS[task]
        n_mix_units = reference_units(REFERENCE_SIZES[task], rho, whole=whole_train)[0] if current else len(mix)
    b = min(settings.batch_size, n_mix_units)
    q = b / n_mix_units
    if noise_multiplier is None:
        noise_multiplier = calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=q, steps=settings.steps,
                                                      accountant="rdp").noise_multiplier
    cfg = settings.config(k=t.k, n_units=n_mix_units, noise_multiplier=noise_multiplier)
    claimed = compute_epsilon(SubsampledGaussian(noise_multiplier, q, settings.steps), delta=delta, accountant="rdp").epsilon
    te = t.test_idx
    # Where the release of this configuration is charged: D_mix is the keyed split's mix child
    # (dp-mixmin's release partition), or the whole training partition.
    from ..mechanisms.mixmin_pipeline import _split_partition

    scope = {"dataset": t.dataset_identity()["name"], "partition": "train" if whole_train else _split_partition(rho, seed, "record") + "/mix"}
    return MixMinTarget(
        probs=probs, labels=labels, config=cfg, claimed_epsilon=claimed, delta=delta, canary=canary,
        holdout_probs=proxies.predict(t.private_x[te]), holdout_labels=np.asarray(y_all[te], dtype=np.float64),
        seed=seed, top=top, task=f"{task}/{tname}", dataset=task, source_names=tuple(t.source_names), ledger_scope=scope,
        info={"target": tname, "target_kind": t.target_kinds.get(tname), "rho": None if whole_train else rho, "proxy_mode": proxy_mode,
              "target_epsilon": epsilon, "accountant": "rdp", "seed": seed},
    )
