"""Audit target for *user-level* DP-SGD heads: one whole canary user, adjacency ``add-remove-user``.

The mechanism audited is user-level DP-SGD (:mod:`dpaudit.mechanisms.dpsgd.user_level`, the protocol)
on the frozen-feature heads of :mod:`dpaudit.mechanisms.dpsgd.head_audit` (``dp-rvfl``,
``logistic-raw``, ...), trained by the release's own loop and kernels, with the canary user as
one more user of the same index: it is Poisson-sampled at the same rate q and clipped by the
same code.

**Privacy contract audited.** The release claims (epsilon, delta)-DP under ``add-remove-user``
adjacency for ``SubsampledGaussian(sigma, q_user, T)`` (RDP accountant), sigma calibrated for
the target epsilon from the *user* schedule (the declared number of training users N0, expected
users per step, epochs) exactly as a user-level release
(:class:`~dpaudit.mechanisms.dpsgd.mechanism.DPSGDMechanism`) does. One trial is one training run
on the base users, plus the canary user in the "in" world: neighbouring inputs differ by one
whole user (G records), so a sound mechanism must keep the audit's eps_LB at or below the claim
whatever G is.

**What the audit publishes.** The schedule (q, T, m0) is built from the public ``reference_size``
N0 (``--reference-size``; an audit of a release takes the release's recorded N0), never from
the number of users the data hold: that count differs between neighbouring datasets. A target
without N0 is refused before any data are loaded. The counts of the data (training users,
records, records per user) stay in ``audit_local.json``
(:data:`dpaudit.audit_outputs.LOCAL_AUDIT_PATHS`).

Canary users (public, chosen from the seed, recorded in audit.json): G records of a head
canary kind (:mod:`~dpaudit.mechanisms.dpsgd.head_canaries`), averaged and clipped jointly. A
``max-clip`` user's records all have gradient C e_j, so it contributes exactly C e_j, where a
mechanism that clipped each record instead of the user would move W[0, j] by G C.
With G = 1 and one record per user these are the record-level canaries of
:class:`~dpaudit.mechanisms.dpsgd.head_audit.HeadTarget` (same feature, same test record) and the trials are
bit-identical to it under reproducible noise (pinned by a test).

Users: a release's user ids (``user_ids``, e.g. the ``--user-ids`` file it was trained with), or,
for datasets without users (the embedded ``digits``), a public, seeded grouping of all rows
into users of exactly G records (:func:`synthetic_user_ids`); either way the data are split 70 /
15 / 15 *by users* (:mod:`dpaudit.data.users`), as a user-level release splits them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ...audits.targets import check_release_identity
from ..contract import load_requested
from ...data.users import attach_user_ids, check_user_split, index_users, load_user_ids, n_rows
from ...errors import DataError, UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource, public_rng
from ...validation import one_of, positive_int
from .loop import UserSampling
from .head_audit import HeadAuditTarget, canary_scores, lay_out, setup_head

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


def with_users(data, user_ids, records_per_user: int, seed: int):
    """(``data`` split by users, where its users came from): the dataset's own user ids, else
    ``user_ids`` (an array, a partition mapping or a ``.npy`` path), else the public grouping of
    every row into users of ``records_per_user`` (:func:`synthetic_user_ids` of ``seed``)."""
    if data.user_ids is not None:
        return data, "user ids of the prepared dataset"
    if isinstance(user_ids, (str, os.PathLike)):
        user_ids = load_user_ids(user_ids)
    if user_ids is not None:
        return attach_user_ids(data, user_ids), "given user ids"
    grouped = synthetic_user_ids(n_rows(data), records_per_user, seed)
    users_from = (
        f"synthetic: all rows grouped into users of {records_per_user} (public seed {seed})"
    )
    return attach_user_ids(data, grouped), users_from


def user_clipped_gradient(record_grads: np.ndarray, clipping_norm: float) -> np.ndarray:
    """One user's contribution from its records' gradients: clip((1/k) sum_i g_i) to norm C, the
    arithmetic of :func:`dpaudit.mechanisms.dpsgd.user_level.user_head_clipped_sum` (pinned by a test)
    for gradients given explicitly (a gradient canary has no input record). Float64."""
    g = np.asarray(record_grads, dtype=np.float64)
    if g.ndim < 2 or g.shape[0] < 1:
        raise UsageError(f"record_grads must have shape (k, ...) with k >= 1, got {g.shape}.")
    mean = g.sum(axis=0) / g.shape[0]
    norm = float(np.sqrt(np.sum(mean * mean)))
    return mean * min(1.0, float(clipping_norm) / max(norm, 1e-30))


# -------------------------------------------------------------------------------------- target


@dataclass
class UserHeadTarget(HeadAuditTarget):
    """User-level audit of one frozen-feature model's DP-SGD head (see module docstring).

    ``records_per_user`` is G (records per canary user, and the mechanism's per-step records
    per sampled user); ``user_ids``: an array or a ``.npy`` path, one id per row before splitting.
    """

    records_per_user: int = 1
    user_ids: object | None = field(default=None, repr=False)
    #: Public N0, the declared number of training users the schedule is built from (default:
    #: the plan's).
    reference_size: int | None = None
    adjacency: str = ADJACENCY

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int("records_per_user", self.records_per_user)
        if self.reference_size is None and self.plan is not None:
            self.reference_size = int(self.plan.config["reference_size"])
        if self.reference_size is None:  # before any data are loaded
            raise UsageError(
                "reference_size must be given (--reference-size: the public number of training "
                "users the schedule is built from; an audit of a release takes the release's), "
                "got None."
            )
        positive_int("reference_size", self.reference_size)
        one_of("adjacency", self.adjacency, (ADJACENCY,))

    @property
    def expected_n_users(self) -> int | None:
        """An old release's recorded number of training users (new ones record only N0)."""
        return None if self.release is None else (self.release.config or {}).get("n_users")

    # ------------------------------------------------------------------ public set-up (once)
    def _load(self):
        """The dataset split by users, checked against the release's identity when given."""
        data = load_requested(self) if self.prepared is None else self.prepared
        data, self._users_from = with_users(data, self.user_ids, self.records_per_user, self.seed)
        check_user_split(
            data.user_ids["train"], data.user_ids.get("val"), data.user_ids.get("test")
        )
        # Old releases published unkeyed checksums of the user ids and of the data: still checked
        # exactly. New ones publish only the public identity (users per partition, sizes, ...).
        recorded = (self.expected_identity or {}).get("user_ids_sha256")
        if recorded is not None and data.user_ids_sha256 != recorded:
            raise DataError(
                f"user ids sha256 must equal the release's {recorded[:12]}..., "
                f"got {str(data.user_ids_sha256)[:12]}... (pass the release's --user-ids file)."
            )
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
            raise DataError(
                f"training users must number the release's {self.expected_n_users}, got {users.n_users}."
            )
        # n_users, n_train and users (counts of this data) go to audit_local.json (LOCAL_AUDIT_PATHS).
        facts = {
            "privacy_unit": "user",
            "records_per_user": self.records_per_user,
            "reference_size": self.reference_size,
            "n_users": users.n_users,
            "users": users.describe(),
            "users_from": self._users_from,
            "n_train": int(len(y)),
        }
        # The schedule is the public N0's (a release's recorded one), never the count of this data's users.
        feats = setup_head(
            self, data, x, y, reference_size=self.reference_size, adjacency=ADJACENCY, facts=facts
        )
        self._users = users
        self._build_canary(data, feats)
        lay_out(self)
        self._ready = True

    def _canary_gradient(self, gradient: np.ndarray) -> np.ndarray:
        """The canary user's contribution: G records whose gradients are all ``gradient`` (C e_j),
        averaged and clipped jointly (:func:`user_clipped_gradient`)."""
        grads = np.broadcast_to(gradient, (self.records_per_user, *gradient.shape)).copy()
        return user_clipped_gradient(grads, self._config.clipping_norm)

    # -------------------------------------------------------------------------------- trials
    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        """R user-level runs on the release's head loop; the record-level score, averaged over the user's records."""
        self.prepare()
        users = UserSampling(self._users, self.records_per_user)
        return canary_scores(self, self._runs(canary_in, noise, users=users).weights)
