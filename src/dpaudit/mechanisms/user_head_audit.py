"""Audit target for *user-level* DP-SGD heads: one whole canary user, adjacency ``add-remove-user``.

The mechanism audited is :mod:`dpaudit.mechanisms.user_level` (DP-MixMin paper, appendix A.9,
Algorithm 2, on the DP-SGD engine of the DP-RVFL paper, section 3.2 / Algorithm 1) applied to
the frozen-feature heads of :mod:`dpaudit.mechanisms.head_audit` (``dp-rvfl``, ``logistic-raw``, ...):
at every step each *user* is Poisson-sampled at the user rate q, a sampled user u contributes
g_u = (1/k_u) sum_{i in S_u} grad l_i over k_u = min(G, |D_u|) of its records, g_u is clipped
to L2 norm C, N(0, sigma^2 C^2 I) is added to the sum and the result is divided by the fixed
normaliser. The clipped per-user sums are computed by the mechanism's own functions
(:func:`~dpaudit.mechanisms.user_level.sample_user_records` and
:func:`~dpaudit.mechanisms.user_level.user_head_clipped_sum`), with the canary user as one more
user of the same index: it is Poisson-sampled at the same rate q and clipped by the same code.

**Privacy contract audited.** The release claims (epsilon, delta)-DP under ``add-remove-user``
adjacency for ``SubsampledGaussian(sigma, q_user, T)`` (RDP accountant), sigma calibrated for
the target epsilon from the *user* schedule (n_users, expected users per step, epochs) exactly
as a user-level release (:class:`~dpaudit.mechanisms.dpsgd_release.DPSGDMechanism`) does. One trial is one
training run on the base users, plus the canary user in the "in" world: neighbouring inputs
differ by one whole user (G records), so a sound mechanism must keep the audit's eps_LB at or
below the claim whatever G is.

Canary users (public, chosen from the seed, recorded in audit.json):
  - ``max-clip``: a user of G records whose gradients are all C e_j, where e_j is the unit
    vector of one head weight W[0, j] on an input feature that is zero in every training record
    (e.g. a border pixel on the direct link), so the data never move that weight. The user's
    averaged gradient is C e_j and its joint clipped contribution exactly C e_j (clipping
    leaves it at the largest size allowed). Score: W[0, j]. A mechanism that clipped each
    record instead of the user would move that weight by G C.
  - ``mislabeled``: a user of G distinct held-out test records of one class, all relabelled to
    the same wrong class (a user who mislabels, say, every 3 as a 4), trained on like any user.
    Score: the mean log-probability of the wrong labels. ``natural``: the same records with
    their true labels.
With G = 1 and one record per user these are the record-level canaries of
:class:`~dpaudit.mechanisms.head_audit.HeadTarget` (same feature, same test record) and the trials are
bit-identical to it under reproducible noise (pinned by a test).

Users: a release's user ids (``user_ids``, e.g. the ``--user-ids`` file it was trained with), or,
for datasets without users (the embedded ``digits``), a public, seeded grouping of all rows
into users of exactly G records (:func:`synthetic_user_ids`); either way the data are split 70 /
15 / 15 *by users* (:mod:`dpaudit.data.users`), as a user-level release splits them.

Trials run on the head engine that trains user-level releases,
:func:`dpaudit.mechanisms.engine.train_heads` with user units, R runs at once: per step one
Poisson draw of users for all runs, one canary draw, each run's per-user clipped sum, one
Gaussian draw of shape (R, K, d+1) and one Adam update of all runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..audits.canaries import check_canary
from ..audits.targets import AuditTarget, check_release_identity, training_partition
from ..data import load_dataset
from ..data.users import UserIndex, attach_user_ids, check_user_split, index_users, load_user_ids, n_rows
from ..errors import DataError, UsageError
from ..lazy import lazy_import
from ..noise import NoiseSource, public_rng
from ..validation import one_of, positive_int
from .engine import CanaryHook, UserSampling, train_heads
from .head_canaries import head_canary
from .head_audit import HEAD_MODELS, canary_scores, claimed_event_of, describe_head, noiseless_copy, setup_head
np = lazy_import("numpy")

ADJACENCY = "add-remove-user"
#: Public tag of the synthetic grouping of rows into users.
TAG_USERS = 0x05E25


# ------------------------------------------------------------------------------------- users


def synthetic_user_ids(n_rows: int, records_per_user: int, seed: int) -> np.ndarray:
    """Public grouping of ``n_rows`` rows (loader order) into users of ``records_per_user`` rows.

    A seeded permutation of the rows (``public_rng(seed, TAG_USERS)``) is cut into consecutive
    blocks of G; block b is user b (the last user has n_rows mod G rows when G does not divide
    n_rows). For datasets that have no users of their own; public randomness only.
    """
    n = positive_int("n_rows", n_rows)
    g = positive_int("records_per_user", records_per_user)
    perm = public_rng(int(seed), TAG_USERS).permutation(n)
    ids = np.empty(n, dtype=np.int64)
    ids[perm] = np.arange(n, dtype=np.int64) // g
    return ids


def user_clipped_gradient(record_grads: np.ndarray, clipping_norm: float) -> np.ndarray:
    """One user's contribution from its records' gradients: clip((1/k) sum_i g_i) to norm C.

    The arithmetic of :func:`dpaudit.mechanisms.user_level.user_head_clipped_sum` for gradients
    given explicitly (a gradient canary has no input record): average over the user's k
    records (Algorithm 2, line 10), then scale by min(1, C / ||mean||) (line 11). Float64.
    Pinned against ``user_head_clipped_sum`` by a test on real records.
    """
    g = np.asarray(record_grads, dtype=np.float64)
    if g.ndim < 2 or g.shape[0] < 1:
        raise UsageError(f"record_grads must have shape (k, ...) with k >= 1, got {g.shape}.")
    mean = g.sum(axis=0) / g.shape[0]
    norm = float(np.sqrt(np.sum(mean * mean)))
    return mean * min(1.0, float(clipping_norm) / max(norm, 1e-30))


@dataclass(frozen=True, eq=False)
class UserCanary:
    """A canary user of the user-level head audits (:meth:`hook`).

    ``kind="gradient"``: ``grads`` (G, K, d+1), the gradients of its G records (independent of
    the model, a Dirac canary); its contribution at each step it is sampled is
    ``clip_user(grads, C)``. ``kind="records"``: G input records ``z`` (G, d) with labels ``y``
    (G,), one more user of the index, sampled and clipped like every user.
    """

    kind: str
    grads: np.ndarray | None = None
    z: np.ndarray | None = None
    y: np.ndarray | None = None

    def __post_init__(self) -> None:
        one_of("canary user kind", self.kind, ("gradient", "records"))
        if self.kind == "gradient" and (self.grads is None or np.ndim(self.grads) != 3 or not np.all(np.isfinite(self.grads))):
            raise UsageError("a gradient canary user must have finite grads of shape (G, K, d+1), got an invalid array.")
        if self.kind == "records" and (self.z is None or self.y is None or np.ndim(self.z) != 2 or np.shape(self.y) != (np.shape(self.z)[0],)):
            raise UsageError("a records canary user must have z (G, d) and y (G,), got an invalid pair.")

    @property
    def size(self) -> int:
        return int(np.shape(self.grads if self.kind == "gradient" else self.z)[0])

    def hook(self, canary_in, *, k: int, d: int, n_classes: int, clipping_norm: float, clip_user=None):
        """The engine's :class:`~dpaudit.mechanisms.engine.CanaryHook` of this canary user for runs
        ``canary_in`` (R,): its records as one more user of the index (rows n..n+G-1, user
        n_users: the ordinary Poisson draw never samples it, the engine's canary draw does), or
        its gradients' contribution ``clip_user(grads, C)`` (default :func:`user_clipped_gradient`)."""
        if self.kind == "records":
            cz, cy = np.asarray(self.z, dtype=np.float64), np.asarray(self.y, dtype=np.int64)
            if cz.shape[1] != d or cy.min() < 0 or cy.max() >= n_classes:
                raise UsageError(f"canary user records must have {d} features and labels in [0, {n_classes}), got {cz.shape[1]} and {cy.tolist()}.")
            return CanaryHook(included=canary_in, z=cz, y=cy)
        grads = np.asarray(self.grads, dtype=np.float64)
        if grads.shape[1:] != (k, d + 1):
            raise UsageError(f"canary user gradients must have shape (G, {k}, {d + 1}), got {grads.shape}.")
        return CanaryHook(included=canary_in, gradient=np.asarray((clip_user or user_clipped_gradient)(grads, clipping_norm), dtype=np.float64))


# -------------------------------------------------------------------------------------- target


@dataclass
class UserHeadTarget(AuditTarget):
    """User-level audit of one frozen-feature model's DP-SGD head (see module docstring).

    ``records_per_user`` is G (records per canary user, and the mechanism's per-step records
    per sampled user). ``user_ids``: one id per row of the dataset before splitting (array or
    ``.npy`` path), default :func:`synthetic_user_ids`. ``batch_size`` is the expected number of
    *users* per step and ``epochs`` counts passes over users (the release's meaning).
    """

    model: str = "dp-rvfl"
    records_per_user: int = 1
    dataset: str | None = "digits"
    data_dir: str | None = None
    epsilon: float = 2.0  # target epsilon the noise is calibrated for (RDP accountant, user level)
    delta: float = 1e-5
    canary: str = "max-clip"
    seed: int = 42  # public seed: features, head initialisation, synthetic users, canary
    user_ids: object | None = field(default=None, repr=False)
    epochs: int | None = None
    batch_size: int | None = None
    profile: str | None = None
    split_seed: int | None = None
    noise_multiplier: float | None = None  # override (e.g. from a release); else calibrated
    schedule: tuple | None = None  # (sample_rate, steps, normalizer) override, e.g. from a release
    claimed: float | None = None  # the release's claim (else RDP epsilon of the configuration)
    event: object | None = None  # the release's recorded event (else the plan's SubsampledGaussian(sigma, q_user, T))
    accountant: str = "rdp"  # the accountant of the claim (the release's; RDP for a computed claim)
    expected_sha256: str | None = None  # an old release's data checksum (after the user split)
    expected_user_ids_sha256: str | None = None  # an old release's user-id checksum
    expected_identity: dict | None = None  # the release's public dataset identity (n_users per partition included)
    expected_n_users: int | None = None
    noise: bool = True
    adjacency: str = ADJACENCY
    default_chunk_size: int = 64
    prepared: object | None = field(default=None, repr=False)
    dp_sgd: dict | None = None  # the plan's DP-SGD config (its optimizer settings); None: the paper's Adam

    def __post_init__(self) -> None:
        if self.model not in HEAD_MODELS:
            raise UsageError(f"model must be one of {', '.join(HEAD_MODELS)}, got {self.model!r}.")
        positive_int("records_per_user", self.records_per_user)
        check_canary("head", self.canary)
        one_of("adjacency", self.adjacency, (ADJACENCY,))
        self._ready = False

    @property
    def mechanism(self) -> str:  # type: ignore[override]
        return self.model

    # ------------------------------------------------------------------ public set-up (once)
    def _load(self):
        """The dataset split by users, checked against the release's identity when given."""
        data = self.prepared
        if data is None:
            data = load_dataset(self.dataset, data_dir=self.data_dir, split_seed=self.split_seed, profile=self.profile)
        if data.user_ids is None:
            ids = self.user_ids
            if isinstance(ids, (str, os.PathLike)):
                ids = load_user_ids(ids)
            if ids is None:
                ids = synthetic_user_ids(n_rows(data), self.records_per_user, self.seed)
                self._users_from = f"synthetic: all rows grouped into users of {self.records_per_user} (public seed {self.seed})"
            else:
                self._users_from = "given user ids"
            data = attach_user_ids(data, ids)
        else:
            self._users_from = "user ids of the prepared dataset"
        check_user_split(data.user_ids["train"], data.user_ids.get("val"), data.user_ids.get("test"))
        # Old releases published unkeyed checksums of the user ids and of the data: still checked
        # exactly. New ones publish only the public identity (users per partition, sizes, ...).
        if self.expected_user_ids_sha256 is not None and data.user_ids_sha256 != self.expected_user_ids_sha256:
            raise DataError(f"user ids sha256 must equal the release's {self.expected_user_ids_sha256[:12]}..., "
                            f"got {str(data.user_ids_sha256)[:12]}... (pass the release's --user-ids file).")
        check_release_identity(data, self.expected_identity, expected_sha256=self.expected_sha256)
        return data

    def prepare(self) -> None:
        if self._ready:
            return
        data = self._load()
        x, y = np.asarray(data.x_train), np.asarray(data.y_train)
        users = index_users(data.user_ids["train"])
        # Old releases recorded their actual training users (config n_users): still checked. New
        # ones record only the declared reference size, and their schedule is replayed from it.
        if self.expected_n_users is not None and users.n_users != int(self.expected_n_users):
            raise DataError(f"training users must number the release's {self.expected_n_users}, got {users.n_users}.")
        # A fresh audit's schedule counts its own base users (fixed in both worlds); a release's
        # recorded schedule (self.schedule) replaces it.
        epochs, batch, sigma, feats = setup_head(self, data, x, y, reference_size=users.n_users, adjacency=ADJACENCY)
        self._users = users
        self._build_canary(data, feats)
        self._info = {"model": self.model, "features": feats.describe(), "privacy_unit": "user", "records_per_user": self.records_per_user,
                      "n_users": users.n_users, "users": users.describe(), "users_from": self._users_from, "n_train": int(len(y)),
                      "epochs": epochs, "batch_size": batch, "batch_size_unit": "users", **self._config.to_dict(), "noise_multiplier": sigma,
                      "target_epsilon": self.epsilon, "rdp_epsilon": self._rdp_epsilon, "accountant": "rdp", "seed": self.seed}
        self._ready = True

    def _build_canary(self, data, feats) -> None:
        g = self.records_per_user
        ch = self._choice = head_canary(self.canary)(self, data, feats, g)
        self._canary_info = ch.info
        if ch.coordinate is None:
            self._canary = UserCanary(kind="records", z=ch.z, y=ch.y)
            return
        grad = np.zeros((self._k, self._z.shape[1] + 1))
        grad[0, ch.coordinate] = self._config.clipping_norm  # each record's gradient: norm exactly C on W[0, j]
        self._canary = UserCanary(kind="gradient", grads=np.broadcast_to(grad, (g,) + grad.shape).copy())

    # -------------------------------------------------------------------------------- trials
    @property
    def claimed_epsilon(self) -> float:  # type: ignore[override]
        self.prepare()
        return self._claimed

    @property
    def claimed_event(self):  # type: ignore[override]
        """The claim as an event: the release's (``event``) or the plan's SubsampledGaussian(sigma, q_user, T),
        under ``add-remove-user`` adjacency (the privacy unit is the user)."""
        return claimed_event_of(self)

    def _train(self, canary_in: np.ndarray, noise: NoiseSource, clip_user=None):
        """R user-level runs on the release's head loop (``clip_user``: a test's broken canary clipping)."""
        index = self._users if isinstance(self._users, UserIndex) else index_users(self._users)
        hook = self._canary.hook(canary_in, k=self._k, d=self._z.shape[1], n_classes=self._n_classes, clipping_norm=self._config.clipping_norm,
                                 clip_user=clip_user)
        return train_heads(self._z, self._y, self._n_classes, self._config, noise=noise, runs=canary_in.size, init=self._init,
                           users=UserSampling(index, positive_int("records_per_user", self.records_per_user)), canary=hook,
                           binary_logit=self._binary)

    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        self.prepare()
        c = np.asarray(canary_in, dtype=bool)
        return canary_scores(self, self._train(c, noise).weights)  # the record-level score, averaged over the user's records

    private_data = training_partition  # every trial trains on the training partition

    def without_noise(self) -> "UserHeadTarget":
        return noiseless_copy(self)

    def describe(self) -> dict:
        return describe_head(self)
