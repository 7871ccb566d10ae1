"""Audit target for DP-MixMin's mixture-learning step (DP-MixMin paper, appendix A.8).

Threat model (A.8): the adversary sees the released weights lambda and knows every private record except the canary, the proxies
and all hyper-parameters. Trials run Algorithm 1 through the loop releases run, :func:`~dpaudit.mechanisms.mixmin.solver.run_mixmin_runs`
(fresh Poisson masks and noise per run), on D_mix with or without the canary. :meth:`~dpaudit.mechanisms.mixmin.mechanism.DPMixMin.audit_target`
builds D_mix with the loader of releases.

Scores (from lambda alone). The canary's clipped gradient g enters the mirror-descent step as log lambda <- log lambda - eta g / B
(then a shift that renormalises), so its footprint on the release is along -g in log-weight space, orthogonal to the all-ones
shift. The score is <log lambda, -u> with u the zero-sum unit direction of the canary's gradient: the max-clip direction itself,
or for a record canary its clipped gradient at the adversary's reference mixture (the noiseless, canary-free non-private solution,
computable by this adversary)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...accounting import calibrate_noise_multiplier, compute_epsilon
from ...audits.canaries import check_canary
from ...audits.targets import AuditTarget
from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource, public_rng
from .solver import (
    MixMinCanary,
    MixMinConfig,
    max_clip_direction,
    per_example_gradients,
    run_mixmin_runs,
    solve_mixmin,
)

np = lazy_import("numpy")


@dataclass
class MixMinTarget(AuditTarget):
    """DP-MixMin trials on fixed proxy predictions ``probs`` (n, k) and ``labels`` (n,). ``holdout_probs`` / ``holdout_labels``:
    records *not* in D_mix, from which the natural and mislabeled canaries are drawn (public seed). ``config`` is a
    :class:`~dpaudit.mechanisms.mixmin.solver.MixMinConfig`; its noise multiplier is what is audited, ``claimed_epsilon`` the release's
    claim for it."""

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
    #: the accountant of claimed_epsilon (a release's own, when audited from one)
    accountant: str = "rdp"
    #: {"dataset", "partition"} of the private records D_mix is (set for a task's D_mix); None: unnamed
    ledger_scope: dict | None = None

    def __post_init__(self) -> None:
        check_canary("dp-mixmin", self.canary)
        self.probs = np.asarray(self.probs, dtype=np.float64)
        self.labels = np.asarray(self.labels, dtype=np.float64)
        # The adversary's reference mixture: everything but the canary is known to it.
        self._reference = solve_mixmin(self.probs, self.labels, self.config.loss, steps=500)
        if self.canary == "max-clip":
            d = max_clip_direction(self._reference, top=self.top)
            self._canary = MixMinCanary(kind="gradient", direction=d)
            top = np.argsort(-self._reference, kind="stable")[: self.top]
            names = [self.source_names[j] if j < len(self.source_names) else int(j) for j in top]
            self._canary_info = {
                "kind": "max-clip",
                "direction": d.tolist(),
                "top_sources": names,
                "norm": self.config.clipping_norm,
            }
        else:
            if self.holdout_probs is None or len(self.holdout_probs) == 0:
                raise UsageError(
                    f"holdout records must be given for a {self.canary} canary, got none."
                )
            i = int(public_rng(self.seed, 0xCA7A).integers(len(self.holdout_probs)))
            f = np.asarray(self.holdout_probs[i], dtype=np.float64)
            y = float(self.holdout_labels[i]) if self.holdout_labels is not None else 0.0
            if self.canary == "mislabeled":
                y = 1.0 - y  # binary targets: the wrong label
            self._canary = MixMinCanary(kind="record", probs=f, label=y)
            g = per_example_gradients(f[None, :], np.array([y]), self._reference, self.config.loss)
            d = g[0] - g[0].mean()
            if not np.linalg.norm(d) > 0:
                d = max_clip_direction(self._reference)
            self._canary_info = {
                "kind": self.canary,
                "holdout_index": i,
                "label": y,
                "probs": f.tolist(),
            }
        self._u = d / np.linalg.norm(d)

    @property
    def claimed_event(self):  # type: ignore[override]
        """The mixture step's event, SubsampledGaussian(sigma, q, steps) of ``config`` (the no-noise control claims it too): the
        claim about every record of D_mix, where the canary goes."""
        if self.claimed_epsilon is None or not float(self.config.noise_multiplier) > 0:
            return None  # a configuration without noise claims nothing
        return self.config.event()

    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        c = np.asarray(canary_in, dtype=bool)
        w = run_mixmin_runs(
            self.probs,
            self.labels,
            self._config_now(),
            noise=noise,
            runs=c.size,
            canary=self._canary,
            canary_in=c,
        )
        return -np.log(np.maximum(w, 1e-300)) @ self._u

    def _config_now(self):
        return self.config if self.noise else replace(self.config, noise_multiplier=0.0)

    def private_data(self) -> dict | None:
        return self.ledger_scope

    def without_noise(self) -> "MixMinTarget":
        return replace(self, noise=False)

    def describe(self) -> dict:
        return {
            "task": self.task,
            "dataset": self.dataset,
            "config": {
                **self.config.to_dict(),
                "n_mix": int(self.probs.shape[0]),
                "reference_weights": self._reference.tolist(),
                **self.info,
            },
            "canary_info": self._canary_info,
        }


def mixmin_config_for(
    *,
    n_mix: int,
    k: int,
    epsilon: float,
    delta: float,
    expected_batch_size: float = 1000.0,
    **settings,
):
    """A MixMinConfig with sigma calibrated (RDP) for (epsilon, delta) at q = B / n_mix, and its claimed epsilon (for targets on
    given proxy predictions). ``settings``: further MixMinConfig fields (``loss``, ``steps``, ``clipping_norm``, ``step_size``;
    default bce, 200, 1, 1)."""
    q = min(1.0, expected_batch_size / n_mix)
    settings = {"loss": "bce", "steps": 200, "clipping_norm": 1.0, "step_size": 1.0, **settings}
    steps = settings["steps"]
    sigma = calibrate_noise_multiplier(
        target_epsilon=epsilon, delta=delta, sample_rate=q, steps=steps, accountant="rdp"
    ).noise_multiplier
    cfg = MixMinConfig(
        k=k, noise_multiplier=sigma, sample_rate=q, expected_batch_size=q * n_mix, **settings
    )
    return cfg, compute_epsilon(cfg.event(), delta=delta, accountant="rdp").epsilon
