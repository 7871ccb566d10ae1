"""Audit target for DP-SGD linear heads on frozen features: DP-RVFL and its frozen-feature controls.

Models: ``dp-rvfl``, ``dp-elm-sgd``, ``frozen-dense-matched``, ``logistic-raw``,
``logistic-projected`` (DP-RVFL paper, sections 3.3-3.5). Each trial trains the head on the
release's loop (:func:`~dpaudit.mechanisms.dpsgd.loop.train_heads`), R runs per batched call.
Features, initialisation and split are public and fixed across trials.

Canaries (:mod:`~dpaudit.mechanisms.dpsgd.head_canaries`) and scores (the adversary sees the released
head W (K, d+1)): a ``max-clip`` gradient canary on W[0, j] scores W[0, j]; a record canary the
log-probability of its label (:func:`canary_scores`).
The no-noise control keeps clipping and sampling and sets the noise multiplier to 1e-12
(DPSGDConfig refuses 0 without ``non_private``, which would also switch clipping off).

Threat models (``threat_model``): ``final-model`` (default) scores the released head only;
``trajectory`` (max-clip canary only) lets the adversary see every iterate, as the accountant's
guarantee allows: the engine records the privatised sum x_t at the canary's coordinate at every
step (the data gradient there is zero), and the score is the exact Neyman-Pearson statistic
(:func:`trajectory_log_lr`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ...accounting import compute_epsilon
from ...accounting.events import SubsampledGaussian, event_from_dict
from ...audits.canaries import check_canary
from ...audits.targets import AuditTarget, load_target_data, training_partition
from ...catalogue import names as catalogue_names
from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource, public_rng
from ...requests import THREAT_MODELS
from ...validation import one_of
from .core import NO_NOISE_MULTIPLIER, DPSGDConfig, head_outputs, init_head
from .loop import CanaryHook, head_layout, train_heads
from .features import build_features
from .head_canaries import dead_features, head_canary  # noqa: F401 - dead_features is read from here too
from .schedule import MODELS, TAG_HEAD, USER_ADJACENCY, audit_reference_size, plan_schedule

np = lazy_import("numpy")

#: The frozen-feature head models (catalogue family dp-sgd-head).
HEAD_MODELS = catalogue_names(family="dp-sgd-head")


def trajectory_log_lr(
    x: np.ndarray, *, sample_rate: float, noise_multiplier: float, clipping_norm: float
) -> np.ndarray:
    """The log-likelihood ratio "canary in" vs "canary out" of privatised sums ``x`` (R, T) at a
    coordinate whose data gradient is zero: out, x_t ~ N(0, s^2) with s = sigma C; in, the canary
    (+C there) is sampled w.p. q at each step independently, x_t ~ (1 - q) N(0, s^2) + q N(C, s^2).
    Per step the ratio is 1 - q + q exp((x_t C - C^2/2) / s^2); the steps are independent, so the
    sum of logs over t is the exact Neyman-Pearson statistic. Computed as a log-sum-exp (finite for
    the no-noise control's tiny sigma)."""
    x = np.asarray(x, dtype=np.float64)
    c, s2 = float(clipping_norm), (float(noise_multiplier) * float(clipping_norm)) ** 2
    a = (x * c - 0.5 * c * c) / s2
    q = float(sample_rate)
    per_step = a if q >= 1.0 else np.logaddexp(np.log1p(-q), np.log(q) + a)
    return per_step.sum(axis=-1)


def class_log_probs(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities (..., n_classes) of a head's logits (..., K): one sigmoid logit for
    class 1 when K = 1, else a softmax over K classes."""
    if logits.shape[-1] == 1:
        s = logits[..., 0]
        return np.stack([-np.logaddexp(0.0, s), -np.logaddexp(0.0, -s)], axis=-1)
    m = logits.max(axis=-1, keepdims=True)
    return logits - (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))


def label_log_prob(w: np.ndarray, z: np.ndarray, label: int) -> np.ndarray:
    """Log-probability of ``label`` for record features ``z`` under each run's head ``w`` (R, K, d+1)."""
    return class_log_probs(w[:, :, :-1] @ z + w[:, :, -1])[:, label]


def canary_scores(target, w: np.ndarray) -> np.ndarray:
    """Each run's score of a head target's canary (its ``_choice``, :mod:`dpaudit.mechanisms.dpsgd.head_canaries`)
    from its head ``w`` (R, K, d+1): the gradient canary's weight, else the mean log-probability of its records' labels."""
    ch = target._choice
    if ch.coordinate is not None:
        return w[:, 0, ch.coordinate]
    return sum(label_log_prob(w, z, int(y)) for z, y in zip(ch.z, ch.y)) / len(ch.z)


def head_model(model: str, n_features: int, n_classes: int, seed: int):
    """The public model set-up a head release's run and its audit share: (frozen features, head
    outputs K, initial head) from the public ``seed``."""
    feats = build_features(MODELS[model].features, n_features, seed)
    k = head_outputs(n_classes, binary_logit=n_classes == 2)
    return feats, k, init_head(feats.output_dim, k, public_rng(seed, TAG_HEAD))


def requested_schedule(asked, data, reference_size: int, adjacency: str, non_private=False):
    """:func:`plan_schedule` of what ``asked`` (a DP-SGD request, or a head target planning
    itself) asks for (epsilon, delta, epochs, batch size) on ``data`` (its public facts)."""
    claim_and_schedule = (asked.epsilon, asked.delta, asked.epochs, asked.batch_size)
    return plan_schedule(
        data, reference_size, *claim_and_schedule, non_private=non_private, adjacency=adjacency
    )


def head_schedule(target, data, reference_size: int, adjacency: str):
    """(epochs, batch size, DP-SGD config) of a head target: its plan's as it is, with a release's
    recorded sigma and schedule in place of the plan's (for old releases they are the truth);
    without a plan, planned here by the release's ``plan_schedule`` over ``reference_size``."""
    if target.plan is not None:
        plan = target.plan
        epochs, batch = plan.config["epochs"], plan.config["batch_size"]
        config = DPSGDConfig.from_dict(plan.config["dp_sgd"])
    else:
        setup = requested_schedule(target, data, reference_size, adjacency)
        epochs, batch, config = setup.epochs, setup.batch_size, setup.config()
    if target.release is not None:
        config = recorded_schedule(config, target.release)
    return epochs, batch, config


def recorded_schedule(config, release, **recorded) -> DPSGDConfig:
    """``config`` with ``release``'s recorded schedule (q, T, m0) and sigma, and ``recorded``:
    an audit of a release trains with what it recorded (for old releases, the truth)."""
    return dataclasses.replace(
        config,
        sample_rate=float(release.sample_rate),
        steps=int(release.steps),
        normalizer=int(release.normalizer),
        noise_multiplier=float(release.noise_multiplier),
        **recorded,
    )


def setup_head(
    target,
    data,
    x: np.ndarray,
    y: np.ndarray,
    *,
    reference_size: int,
    adjacency: str = "add-remove-record",
    facts: dict,
):
    """The public set-up every head audit target shares (record or user level), over
    ``reference_size`` units (records, or users; used only without a plan). Sets the target's
    ``_event``, ``_rdp_epsilon``, ``_claimed``, ``_config``, ``_n_classes``, ``_binary``, ``_z``,
    ``_y``, ``_init``, ``_k``, ``_dataset_name`` and ``_info`` (its recorded set-up: model,
    features, the unit's ``facts``, schedule, claim); returns the features."""
    epochs, batch, config = head_schedule(target, data, reference_size, adjacency)
    sigma = config.noise_multiplier
    # the schedule's event: the claim the audit's trade-off curve is built from (unless a release gives its own)
    event = target._event = SubsampledGaussian(sigma, config.sample_rate, config.steps)
    target._rdp_epsilon = compute_epsilon(
        event, delta=target.delta, accountant="rdp", adjacency=adjacency
    ).epsilon
    # A release's claim may come from another accountant (e.g. PRV, tighter than RDP): audit that claim.
    rel = target.release
    target._claimed = target._rdp_epsilon if rel is None else float(rel.epsilon)
    target._config = config if target.noise else config.without_noise()
    feats, target._k, target._init = head_model(
        target.model, data.n_features, data.n_classes, target.seed
    )
    target._n_classes = int(data.n_classes)
    target._binary = target._n_classes == 2
    target._z = feats.transform(x)
    target._y = y.astype(np.int64)
    target._dataset_name = data.name
    target._info = {
        "model": target.model,
        "features": feats.describe(),
        **facts,
        "epochs": epochs,
        "batch_size": batch,
        **({"batch_size_unit": "users"} if adjacency == USER_ADJACENCY else {}),
        **target._config.to_dict(),
        "noise_multiplier": sigma,
        "target_epsilon": target.epsilon,
        "rdp_epsilon": target._rdp_epsilon,
        "accountant": "rdp",
        "seed": target.seed,
    }
    return feats


def lay_out(target) -> None:
    """Lay the training rows out once for every trial of the audit (``_layout``:
    :func:`~dpaudit.mechanisms.dpsgd.loop.head_layout`, the target's canary rows last); ``_z`` becomes
    a view of them, so one copy of the features is held and forked workers share its pages."""
    lay = target._layout = head_layout(
        target._z, target._y, target._n_classes, canary=target._canary, binary_logit=target._binary
    )
    target._z = lay.z1[: lay.n, : lay.d]


def dirac_gradient(target, j: int) -> np.ndarray:
    """C e_(0, j) on a (K, d+1) head of a prepared target: a gradient canary of norm exactly C,
    the worst case clipping allows."""
    grad = np.zeros((target._k, target._z.shape[1] + 1))
    grad[0, j] = target._config.clipping_norm
    return grad


@dataclass
class HeadAuditTarget(AuditTarget):
    """What the record- and user-level head targets share: their fields, the model check, the
    claim of their public set-up (:func:`setup_head`, in ``prepare``), the no-noise control and
    ``describe``. At user level ``epsilon``, ``batch_size``, ``epochs`` and the claim count users."""

    model: str = "dp-rvfl"
    dataset: str | None = "digits"
    data_dir: str | None = None
    epsilon: float = 2.0  # target epsilon the noise is calibrated for (RDP accountant)
    delta: float = 1e-5
    canary: str = "max-clip"
    seed: int = 42  # public model seed (features, head initialisation; synthetic users)
    epochs: int | None = None
    batch_size: int | None = None
    profile: str | None = None
    split_seed: int | None = None
    noise: bool = True
    adjacency: str = "add-remove-record"
    default_chunk_size: int = 64
    prepared: object | None = field(default=None, repr=False)  # an already loaded PreparedDataset
    #: The plan audited (:meth:`~dpaudit.mechanisms.dpsgd.mechanism.DPSGDMechanism.plan`): its
    #: schedule, sigma and optimizer are taken as they are; None: planned from the fields above.
    plan: object | None = field(default=None, repr=False)
    #: The release audited: its recorded claim, event, accountant, dataset identity, sigma and
    #: schedule are audited (for old releases they are the truth).
    release: object | None = field(default=None, repr=False)

    @classmethod
    def of_plan(cls, plan, canary: str, *, release=None, **unit):
        """The target of ``plan`` (``release``: the Release audited; ``unit``: a user-level
        target's fields): the request's fields read from the plan, which is then taken as it is."""
        r = plan.request
        return cls(
            model=r.model,
            dataset=plan.data_name,
            data_dir=r.data_dir,
            epsilon=float(plan.target_epsilon),
            delta=plan.delta,
            canary=canary,
            seed=plan.seed,
            epochs=plan.config["epochs"],
            batch_size=plan.config["batch_size"],
            profile=plan.dataset.get("profile", r.profile),
            split_seed=plan.dataset.get("split_seed", r.split_seed),
            plan=plan,
            release=release,
            **unit,
        )

    def __post_init__(self) -> None:
        one_of("model", self.model, HEAD_MODELS)
        check_canary("head", self.canary)
        self._ready = False

    @property
    def mechanism(self) -> str:  # type: ignore[override]
        return self.model

    @property
    def claimed_epsilon(self) -> float:  # type: ignore[override]
        self.prepare()
        return self._claimed

    @property
    def claimed_event(self):  # type: ignore[override]
        """The claim as an event: the release's, else the plan's SubsampledGaussian(sigma, q, T)
        under the target's adjacency (q the user rate at user level)."""
        if self.release is not None:
            return event_from_dict(self.release.guarantee)
        self.prepare()
        return self._event

    @property
    def accountant(self) -> str:  # type: ignore[override]
        """The accountant of the claim: the release's; RDP for a computed claim."""
        return "rdp" if self.release is None else self.release.accountant

    @property
    def expected_identity(self) -> dict | None:
        """The release's public dataset identity: a different dataset is refused (an old
        release's data checksum, ``sha256``, included)."""
        return None if self.release is None else (self.release.dataset or {})

    expected_sha256 = None  # in expected_identity

    private_data = training_partition  # every trial trains on the training partition

    def __getstate__(self) -> dict:
        # ``_z`` is a view of the layout (:func:`lay_out`): pickled alone it would be a second copy
        laid_out = "_layout" in self.__dict__
        return {k: v for k, v in self.__dict__.items() if k != "_z" or not laid_out}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "_layout" in state:
            self._z = self._layout.z1[: self._layout.n, : self._layout.d]

    def _replace(self, **changes):
        """The same target with ``changes``, reusing the public set-up when prepared."""
        t = dataclasses.replace(self, **changes)
        if self._ready:
            t.__dict__.update({k: v for k, v in self.__dict__.items() if k.startswith("_")})
        return t

    def without_noise(self):
        """The no-noise control: the same public set-up (features, canary, schedule) with the noise
        multiplier set to NO_NOISE_MULTIPLIER."""
        t = self._replace(noise=False)
        if self._ready:
            t._config = self._config.without_noise()
        return t

    def _build_canary(self, data, feats) -> None:
        """The canary of :mod:`.head_canaries` as the loop's hook: its records (one, or a canary
        user's G), trained on like any, or a gradient on W[0, j] (:meth:`_canary_gradient`)."""
        users = getattr(self, "records_per_user", None)  # user-level targets only
        ch = self._choice = head_canary(self.canary)(self, data, feats, users)
        self._canary_info, self._coord = ch.info, ch.coordinate
        if ch.coordinate is None:
            hook = dict(z=np.asarray(ch.z, dtype=np.float64), y=np.asarray(ch.y, dtype=np.int64))
        else:
            hook = dict(gradient=self._canary_gradient(dirac_gradient(self, ch.coordinate)))
        self._canary = CanaryHook(included=np.zeros(1, bool), **hook)

    def _canary_gradient(self, gradient: np.ndarray) -> np.ndarray:
        """What a gradient canary adds: one record's gradient of norm C, as it is."""
        return gradient

    def _runs(self, canary_in: np.ndarray, noise: NoiseSource, **loop):
        """The trials' runs on the release's head loop, one per entry of ``canary_in`` (the canary
        in where True), from the laid-out rows; ``loop``: more of :func:`train_heads`'s options."""
        c = np.asarray(canary_in, dtype=bool)
        canary = dataclasses.replace(self._canary, included=c)
        return train_heads(
            None,  # the rows and labels: the layout's
            None,
            self._n_classes,
            self._config,
            noise=noise,
            runs=c.size,
            init=self._init,
            canary=canary,
            layout=self._layout,
            **loop,
        )

    def describe(self) -> dict:
        """The recorded set-up, with the noise multiplier actually used by the no-noise control."""
        self.prepare()
        cfg = dict(self._info)
        if not self.noise:
            cfg["noise_multiplier_used"] = NO_NOISE_MULTIPLIER
        # user-level head targets: final model only
        cfg["threat_model"] = getattr(self, "threat_model", "final-model")
        return dict(
            task=None, dataset=self._dataset_name, config=cfg, canary_info=self._canary_info
        )


@dataclass
class HeadTarget(HeadAuditTarget):
    """Audit of one frozen-feature model's DP-SGD head (see module docstring)."""

    max_train: int | None = None  # public subsample of the training partition (fast tests only)
    threat_model: str = "final-model"  # "trajectory": score every iterate (module docstring)

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of("threat model", self.threat_model, THREAT_MODELS)
        if self.threat_model == "trajectory" and self.canary != "max-clip":
            raise UsageError(
                f"canary must be max-clip with the trajectory threat model (its coordinate's per-step likelihood ratio), got {self.canary!r}."
            )

    # ------------------------------------------------------------------ public set-up (once)
    def prepare(self) -> None:
        if self._ready:
            return
        data = load_target_data(self)
        x, y = np.asarray(data.x_train), np.asarray(data.y_train)
        reference = None
        if self.max_train is not None and self.max_train < len(y):
            keep = np.sort(
                public_rng(self.seed, 0x5AB).choice(len(y), size=self.max_train, replace=False)
            )
            x, y = x[keep], y[keep]
            reference = self.max_train  # a public subsample: its own size
        reference = audit_reference_size(data, len(y)) if reference is None else reference
        facts = {"n_train": int(len(y)), "reference_size": int(reference)}
        feats = setup_head(self, data, x, y, reference_size=reference, facts=facts)
        self._build_canary(data, feats)
        lay_out(self)
        self._info["max_train"] = self.max_train
        self._ready = True

    # -------------------------------------------------------------------------------- trials
    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        """Final model: the canary's score on each run's head. Trajectory (every iterate seen): the exact
        log-likelihood ratio of the privatised sums at the max-clip canary's coordinate (module docstring)."""
        self.prepare()
        cfg, every = self._config, self.threat_model == "trajectory"
        res = self._runs(
            canary_in, noise, chunk_runs=64, record=[(0, self._coord)] if every else None
        )
        if not every:
            return canary_scores(self, res.weights)  # res.weights: (R, K, d+1)
        return trajectory_log_lr(
            res.recorded[:, :, 0],
            sample_rate=cfg.sample_rate,
            noise_multiplier=cfg.noise_multiplier,
            clipping_norm=cfg.clipping_norm,
        )

    def with_threat_model(self, threat_model: str) -> "HeadTarget":
        """The same audit (public set-up reused when prepared) under another threat model."""
        return self._replace(threat_model=threat_model)
