"""What the audit engine audits: a mechanism, a canary and a claim, producing one score per trial.

An :class:`AuditTarget` turns a vector of worlds (``canary_in[i]``: is the canary in trial i's
input?) and a private :class:`~dpaudit.noise.NoiseSource` into one score per trial, computed
from the release alone (what the threat model lets the adversary see). Batched targets run many
trials as one tensor computation; the engine only sees ``scores``.

Trials differ only in the canary's presence and in the private randomness (DP noise and Poisson
sampling masks), both drawn fresh for every trial; everything public (data, features, canary,
hyper-parameters) is fixed by the target's construction.

Targets must be picklable (they are shipped to worker processes) and must not change any
privacy-relevant setting because of batching: ``scores`` for a batch equals ``scores`` for each
trial alone in distribution.
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ..data import load_dataset
from ..errors import DataError, UsageError
from ..lazy import lazy_import
from ..noise import NoiseSource

np = lazy_import("numpy")


#: The public identity fields an audit compares with its release (a new ``release.json`` carries
#: no hash of the private data; see :meth:`dpaudit.data.base.PreparedDataset.identity`); users
#: before split sizes: the likelier cause of a user-level mismatch (another --user-ids file) and the clearer message.
IDENTITY_KEYS = tuple(
    "name kind profile split_seed n_users split_sizes n_features n_classes".split()
)

#: Identity fields holding a size per partition (a new release publishes val / test only).
PER_PARTITION_KEYS = ("n_users", "split_sizes")


def check_release_identity(
    data, expected: dict | None, *, expected_sha256: str | None = None
) -> None:
    """Refuse data whose public identity differs from the release's (``expected``, the release's
    ``dataset`` dict): name, kind, profile, split seed, split sizes, schema, users per partition.

    Content changes that keep every public field (one training record replaced, added or
    removed) pass this check: new releases publish nothing that could tell them apart, by design
    (the training count is private; the audit replays the release's recorded schedule). Old
    releases that published the unkeyed digest (``dataset["sha256"]``, or ``expected_sha256``)
    are still checked against it exactly.
    """
    if expected:
        ident = data.identity()
        for key in IDENTITY_KEYS:
            # a key the release did not record (older versions) or that does not apply is skipped
            if expected.get(key) is not None and key in ident:
                _check_identity_field(key, expected[key], ident[key])
        expected_sha256 = expected_sha256 or expected.get("sha256")
    if expected_sha256 is not None and data.sha256 != expected_sha256:
        raise DataError(
            f"dataset sha256 must equal the release's {expected_sha256[:12]}..., got {data.sha256[:12]}... (other data or split)."
        )


def _check_identity_field(key: str, want, got) -> None:
    """One public identity field of the data must equal the release's (DataError)."""
    if key in PER_PARTITION_KEYS and isinstance(want, dict):
        # Old releases also published the training count (private); compare the published partitions.
        want = {p: n for p, n in want.items() if p in got}
    if got != want:
        users = key == "n_users"
        hint = "pass the release's --user-ids file" if users else "other data, split or profile"
        raise DataError(f"dataset {key} must equal the release's {want!r}, got {got!r} ({hint}).")


def load_target_data(target):
    """The prepared dataset of a trained-model target: ``target.prepared`` or a fresh load, checked
    against the release's public dataset identity (``target.expected_identity``) and, for old
    releases that published one, its data checksum (``target.expected_sha256``)."""
    data = target.prepared
    if data is None:
        source = {name: getattr(target, name) for name in ("data_dir", "split_seed", "profile")}
        data = load_dataset(target.dataset, **source)
    check_release_identity(
        data, getattr(target, "expected_identity", None), expected_sha256=target.expected_sha256
    )
    return data


class AuditTarget(abc.ABC):
    """A (mechanism, canary, claim) triple the engine can run trials of."""

    #: mechanism name as in releases (e.g. "dp-mixmin", "dp-rvfl", "dp-elm", "gaussian")
    mechanism: str
    #: canary kind (see :mod:`dpaudit.audits.canaries`)
    canary: str
    #: the claimed epsilon under ``adjacency`` at ``delta`` (None when there is no claim)
    claimed_epsilon: float | None
    delta: float
    adjacency: str
    #: the claim as a DP event (:mod:`dpaudit.accounting.events`): the audit tests its whole
    #: trade-off curve (:func:`dpaudit.audits.curves.curve_test`, the deciding statistic). None:
    #: only the (claimed_epsilon, delta) point is known and the Clopper–Pearson eps_LB decides.
    #: The no-noise control and a deliberately broken variant keep the claim of the correct
    #: mechanism (a planted bug must be judged against what is claimed).
    claimed_event: Any = None
    #: the accountant that turns the event into ``claimed_epsilon``; the claimed-curve eps_LB is
    #: computed with the same one, so that "eps_LB > claimed_epsilon" compares like with like
    accountant: str = "rdp"
    #: False for the no-noise control (the mechanism without its DP noise; no claim applies)
    noise: bool = True
    #: trials per batch (memory / speed trade-off only; never changes what a trial is)
    default_chunk_size: int = 256
    #: the name of an uncertified noise sampler the trials use (their cost is then unbounded)
    uncertified_sampler: str | None = None

    @abc.abstractmethod
    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        """One score per trial (float array shaped like ``canary_in``)."""

    @abc.abstractmethod
    def without_noise(self) -> "AuditTarget":
        """The same target with the DP noise removed (everything else unchanged)."""

    def describe(self) -> dict:
        """Configuration for the audit record: ``task``, ``dataset``, ``config``, ``canary_info`` (split
        into audit.json and audit_local.json by :mod:`dpaudit.audit_outputs`)."""
        return {"task": None, "dataset": None, "config": {}, "canary_info": {}}

    def prepare(self) -> None:
        """Build expensive public state (features, data) once; called before trials run."""

    def private_data(self) -> dict | None:
        """``{"dataset", "partition"}`` of the private records every trial trains on (the
        ledger charges the audit's trials there, :mod:`dpaudit.audits.cost`); None for a target
        that names no private dataset (synthetic data, a bring-your-own mechanism)."""
        return None


def prepared(target: "AuditTarget", no_noise: bool = False) -> "AuditTarget":
    """``target`` with its public state built, or its noiseless control (``no_noise``)."""
    target.prepare()
    return target.without_noise() if no_noise else target


def training_partition(target) -> dict:
    """``private_data`` of a target trained on its dataset's training partition (``_dataset_name``)."""
    target.prepare()
    return {"dataset": target._dataset_name, "partition": "train"}


# ------------------------------------------------------------------------ bring your own mechanism

Mechanism = Callable[[bool, "np.random.Generator"], Any]
Score = Callable[[Any], float]


@dataclass
class CallableTarget(AuditTarget):
    """Audit any Python mechanism: ``mechanism(include_canary, rng) -> release``, ``score(release)``
    (:func:`~dpaudit.audits.engine.audit_callable`). ``rng`` is a fresh :class:`numpy.random.Generator`
    per trial from the audit's private noise source: the mechanism must take *all* its randomness
    from it, else the trials are not independent and the bound is not valid. Trials run one by one;
    ``workers=2`` with picklable (module-level) callables uses two processes.
    """

    mechanism_fn: Mechanism
    score_fn: Score
    claimed_epsilon: float | None
    delta: float
    mechanism: str = "custom"
    canary: str = "custom"
    adjacency: str = "add-remove-record"
    noiseless_mechanism: Mechanism | None = None
    noise: bool = True
    default_chunk_size: int = 64
    info: dict = field(default_factory=dict)
    claimed_event: Any = None  # the claim as an event (e.g. SubsampledGaussian(sigma, 1.0, 1)); None: CP statistic only
    accountant: str = "rdp"  # the accountant of claimed_epsilon (and of the claimed-curve eps_LB)

    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        fn = self.mechanism_fn if self.noise else self.noiseless_mechanism
        out = np.empty(len(canary_in), dtype=float)
        seeds = noise.numpy.integers(0, 2**63 - 1, size=len(canary_in))
        for i, (c, s) in enumerate(zip(canary_in, seeds)):
            out[i] = float(self.score_fn(fn(bool(c), np.random.default_rng(int(s)))))
        return out

    def without_noise(self) -> "CallableTarget":
        if self.noiseless_mechanism is None:
            raise UsageError(
                "noiseless_mechanism must be given for the no-noise control, got None."
            )
        return dataclasses.replace(self, noise=False)

    def describe(self) -> dict:
        name = getattr(self.mechanism_fn, "__qualname__", repr(self.mechanism_fn))
        return {
            "task": None,
            "dataset": None,
            "config": {"callable": name, **self.info},
            "canary_info": {"kind": self.canary},
        }
