"""What every accountant shares: results, the protocol, the event tree and the support check.

**Accountants behind one protocol** (:class:`Accountant`, in the spirit of dp_accounting's
``PrivacyAccountant``). **Adjacency is an input, never a label**: a pair an accountant does not
support is refused with a one-line :class:`~dpaudit.errors.UnsupportedEventError`. The conventions
every accountant uses for a ``SubsampledGaussian`` event (DP-SGD): each record's (or, at user
level, each user's) clipped contribution to the noisy *sum* has L2 norm at most C, the noise std
is ``noise_multiplier * C``, and each record (user) is in a step's batch independently with
probability ``sample_rate``. Then, per step and conditioned on the rest of the batch, the output
pair of a neighbouring dataset pair is dominated by (units of C):

- add/remove (record or user): ``(1-q) N(0, s^2) + q N(1, s^2)`` vs ``N(0, s^2)``, both
  orders (the removed unit's contribution is present or absent);
- replace-one: ``(1-q) N(0, s^2) + q N(1, s^2)`` vs ``(1-q) N(0, s^2) + q N(-1, s^2)`` (the old
  unit's contribution is replaced by the new one's, pointing the opposite way: the sum moves
  by up to 2C). At q = 1 this is ``N(1)`` vs ``N(-1)``: the Gaussian mechanism with
  sensitivity 2C, i.e. add/remove with noise multiplier ``s / 2``.

Sequential composition is exact inside each accountant (RDP curves add; PRVs and PLDs
convolve). Parallel composition (events on disjoint records) takes the worst case over which
part holds the differing record: every "branch" of the event tree is composed sequentially and
the largest epsilon is reported.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable, Protocol, runtime_checkable

from ..errors import UnsupportedEventError
from ..lazy import lazy_import
from ..validation import non_negative_finite, open_unit
from .adjacency import Adjacency, AdjacencyLike
from .events import Composed, Event, Parallel, PureEpsilon, SubsampledGaussian

np = lazy_import("numpy")

ADD_REMOVE = Adjacency.ADD_REMOVE_RECORD
_MAX_BRANCHES = 4096


class Record:
    """A frozen dataclass that reads as a JSON-ready dict."""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class AccountantResult(Record):
    """What an accountant says about an event, under a declared adjacency."""

    accountant: str
    epsilon: float  # the claim: for prv this is the upper bound
    delta: float
    adjacency: str
    epsilon_lower: float | None = None
    epsilon_estimate: float | None = None
    optimal_order: float | None = None


#: What an accountant's ``epsilon`` returns (dp_accounting's name for the same idea).
EpsilonResult = AccountantResult


@dataclass(frozen=True)
class DeltaResult(Record):
    """What an accountant says about delta at a given epsilon, under a declared adjacency."""

    accountant: str
    delta: float  # an upper bound on delta at ``epsilon``
    epsilon: float
    adjacency: str
    optimal_order: float | None = None


@runtime_checkable
class Accountant(Protocol):
    """An accountant: turns an event into (epsilon, delta) under a declared adjacency.

    Privacy contract of every implementation (built-in or registered by a user):

    - ``epsilon(event, delta, adjacency)`` returns an :data:`EpsilonResult` whose ``epsilon`` is
      an *upper bound* on the privacy loss of ``event`` at ``delta`` for every pair of datasets
      that neighbour under ``adjacency``: computed for that relation and labelled with it
      (``result.adjacency == adjacency.value``), never a bound for another relation relabelled.
    - ``support_error(event, adjacency)`` is None exactly for the pairs it can bound, else a
      one-line reason naming the accountant, the event and the adjacency; ``epsilon`` refuses
      the other pairs with :class:`~dpaudit.errors.UnsupportedEventError` (never 0, never a guess).
      ``supports`` is ``support_error(...) is None``.
    - ``uses_delta``: False when the bound holds at delta 0 (pure DP); the delta argument is then
      not validated and is ignored.
    - optionally ``delta(event, epsilon, adjacency) -> DeltaResult``: an upper bound on delta at
      ``epsilon`` (the built-ins rdp, pld and pure have it; see ``compute_delta``).
    """

    name: str
    uses_delta: bool

    def support_error(self, event: Event, adjacency: Adjacency) -> str | None: ...

    def supports(self, event: Event, adjacency: Adjacency) -> bool: ...

    def epsilon(self, event: Event, delta: float, adjacency: Adjacency) -> AccountantResult: ...


def first_line(error: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def refuse(reason: str | None) -> None:
    """Raise an accountant's refusal (None: nothing to refuse)."""
    if reason is not None:
        raise UnsupportedEventError(reason)


@contextlib.contextmanager
def quiet_numerics():
    """No floating-point warnings: accountant libraries warn far in the tails where they fail, and
    the failure (an error), not the warning, is what callers are told."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def branches(event: Event) -> list[list[SubsampledGaussian | PureEpsilon]]:
    """Sequential leaf lists, one per choice of child in every Parallel node."""
    if isinstance(event, (SubsampledGaussian, PureEpsilon)):
        return [[event]]
    if isinstance(event, Composed):
        parts = list(map(branches, event.events))
        total = math.prod(map(len, parts))
        if total > _MAX_BRANCHES:
            raise UnsupportedEventError(
                f"event tree has {total} parallel branches; at most {_MAX_BRANCHES} are supported."
            )
        return [sum(combo, []) for combo in itertools.product(*parts)]
    if isinstance(event, Parallel):
        return [leaves for e in event.events for leaves in branches(e)] or [[]]
    raise UnsupportedEventError(
        "accountants understand subsampled-gaussian, pure-epsilon, "
        f"composed and parallel events, got {event!r}."
    )


def merge_leaves(leaves: list) -> list:
    """Merge identical mechanisms of one sequential branch: T1 then T2 steps of the same
    subsampled Gaussian are exactly T1 + T2 steps of it (likewise counts of one pure epsilon).

    Exact for every accountant, and it keeps a ledger of hundreds of releases that share a few
    (noise multiplier, sample rate) pairs as cheap to account as a handful of events.
    """
    steps, counts = Counter(), Counter()  # in order of first appearance
    for leaf in leaves:
        if isinstance(leaf, SubsampledGaussian):
            steps[leaf.noise_multiplier, leaf.sample_rate] += leaf.steps
        elif isinstance(leaf, PureEpsilon):
            counts[leaf.epsilon] += leaf.count
        else:
            raise UnsupportedEventError(
                f"accountants understand subsampled-gaussian and pure-epsilon leaves, got {leaf!r}."
            )
    gaussians = [SubsampledGaussian(s, q, t) for (s, q), t in steps.items()]
    return gaussians + [PureEpsilon(e, c) for e, c in counts.items()]


def event_kind(event) -> str:
    """The type name an event serialises under (``subsampled-gaussian``, ...), for messages."""
    try:
        kind = event.to_dict().get("type")
    except Exception:  # noqa: BLE001 - no or a failing to_dict: only a message is at stake
        kind = None
    return kind if isinstance(kind, str) else type(event).__name__


def unsupported(accountant: str, event, adj: Adjacency) -> str:
    """The start of every refusal of an (event, adjacency) pair, naming all three."""
    kind = event_kind(event)
    return f"the {accountant} accountant does not support {kind} events under {adj} adjacency"


def replace_gaussian_noise(leaf: SubsampledGaussian, adjacency: Adjacency) -> float:
    """Noise multiplier of the add/remove Gaussian that is *exactly* this leaf's mechanism under
    ``adjacency``: halved for replace-one without subsampling (module docstring); the accountants
    that use it refuse replace-one with q < 1 before (:func:`add_remove_only`)."""
    replace = adjacency is Adjacency.REPLACE_RECORD
    return leaf.noise_multiplier / 2.0 if replace else leaf.noise_multiplier


def add_remove_only(
    accountant: str, analysis: str, leaf: SubsampledGaussian, adj: Adjacency
) -> str | None:
    """The refusal of an accountant whose subsampled-Gaussian ``analysis`` is of the add/remove
    pair (rdp: Opacus's, Mironov, Talwar & Zhang 2019; prv: prv-accountant's). It supports
    replace-one only without subsampling (q = 1), where the exact conversion to noise multiplier
    / 2 applies (:func:`replace_gaussian_noise`). Relabelling the add/remove epsilon would
    under-report (sigma 1, q 0.005, T 2000: 1.21 add/remove vs 1.93 replace-one) and the generic
    group-privacy conversion is loose, so it refuses and points to pld, which analyses the
    replace-one pair directly."""
    if adj is Adjacency.REPLACE_RECORD and leaf.sample_rate < 1.0:
        return (
            f"the {accountant} accountant does not support subsampled-gaussian events with "
            f"sample_rate < 1 under {adj.value} adjacency ({analysis} is for add/remove "
            "neighbours); use the pld accountant."
        )
    return None


class BuiltinAccountant:
    """Shared behaviour of the built-ins: a support check over every leaf of every parallel branch
    (merged as the computation merges them), each accountant stating what it supports in
    :meth:`gaussian_error` and :meth:`branch_error`, and a refusal of every pair outside it, also
    when ``epsilon`` / ``delta`` or an analysis of leaves are called directly.

    Every accountant supports, under every adjacency:

    - add-remove-user where it supports add-remove-record: a user-level event is the same
      mechanism with the user as the unit (user-level clipping bounds a whole user's contribution
      by C and users are Poisson sampled);
    - PureEpsilon: the stored epsilon is a claim *under the release's own adjacency*; the ledger
      only composes releases that share one adjacency, and eps-DP of a neighbouring pair implies
      the RDP / PRV / PLD bounds of that same pair;
    - a subsampled Gaussian of 0 steps (nothing happened: epsilon 0).
    """

    name: str = ""
    uses_delta: bool = True

    def gaussian_error(self, leaf: SubsampledGaussian, adj: Adjacency) -> str | None:
        """Why it cannot account for a subsampled Gaussian of >= 1 step (None: it can)."""
        return None

    def branch_error(self, leaves: list, event: Event, adj: Adjacency) -> str | None:
        """Why it cannot account for one merged sequential branch whose leaves it supports."""
        return None

    def leaf_error(self, leaf, adj: Adjacency) -> str | None:
        """Why it cannot account for one leaf under ``adj`` (None: it can)."""
        if isinstance(leaf, SubsampledGaussian):
            return self.gaussian_error(leaf, adj) if leaf.steps > 0 else None
        if isinstance(leaf, PureEpsilon):
            return None
        return f"{unsupported(self.name, leaf, adj)}."

    def leaves_error(self, leaves: list, event: Event, adj: Adjacency) -> str | None:
        """Why it cannot account for the sequentially composed ``leaves`` of ``event``."""
        reason = next(filter(None, (self.leaf_error(leaf, adj) for leaf in leaves)), None)
        return reason or self.branch_error(leaves, event, adj)

    def support_error(self, event: Event, adjacency: AdjacencyLike = ADD_REMOVE) -> str | None:
        adj = Adjacency.parse(adjacency)
        try:
            trees = branches(event)
        except UnsupportedEventError as e:
            # an event type no accountant understands, or too many branches: a refusal, not a crash
            return f"{unsupported(self.name, event, adj)} ({first_line(e).rstrip('.')})."
        for leaves in trees:
            # branches() yields subsampled-Gaussian and pure-epsilon leaves only: they merge
            reason = self.leaves_error(merge_leaves(leaves), event, adj)
            if reason is not None:
                return reason
        return None

    def supports(self, event: Event, adjacency: AdjacencyLike = ADD_REMOVE) -> bool:
        return self.support_error(event, adjacency) is None

    def checked(self, event: Event, adjacency: AdjacencyLike) -> Adjacency:
        """The adjacency, parsed, of a pair this accountant supports; else its refusal."""
        adj = Adjacency.parse(adjacency)
        refuse(self.support_error(event, adj))
        return adj

    def checked_leaves(self, leaves: list, adjacency: AdjacencyLike) -> Adjacency:
        """The adjacency, parsed, of sequentially composed leaves this accountant supports (its
        analysis of leaves checks them first, for direct callers); else its refusal."""
        adj = Adjacency.parse(adjacency)
        refuse(self.leaves_error(leaves, Composed(tuple(leaves)), adj))
        return adj

    def epsilon(self, event: Event, delta: float, adjacency: AdjacencyLike = ADD_REMOVE):
        if self.uses_delta:
            open_unit("delta", delta)
        return self.event_epsilon(event, delta, self.checked(event, adjacency))

    def delta_question(self, event: Event, epsilon: float, adjacency: AdjacencyLike) -> tuple:
        """``(epsilon, adjacency)`` of a delta question about a supported pair, validated."""
        return non_negative_finite("epsilon", epsilon), self.checked(event, adjacency)

    @staticmethod
    def worst(event: Event, value: Callable, key: Callable = lambda answer: answer):
        """The largest ``value(merged leaves)`` over the parallel branches of ``event`` (the first
        of the largest): parallel composition is the worst case over the branches."""
        return max((value(merge_leaves(leaves)) for leaves in branches(event)), key=key)

    def __repr__(self) -> str:
        return f"<{self.name} accountant>"
