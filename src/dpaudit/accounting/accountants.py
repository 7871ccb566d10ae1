"""The accountant registry: turn a stored event into (epsilon, delta) under a declared adjacency.

One module per analysis, each accountant owning its support check (which (event, adjacency)
pairs it can bound):

- ``rdp`` (:mod:`.rdp`): Rényi DP of the Poisson-subsampled Gaussian via Opacus's analysis.
- ``prv`` (:mod:`.prv`): privacy random variables via ``prv-accountant``; the claim is the upper
  bound.
- ``pld`` (:mod:`.pld`): pessimistic privacy loss distributions via Google's ``dp-accounting``.
- ``pure`` (:mod:`.pure`): pure epsilon-DP, delta = 0, composition by summation.

The built-ins and any user accountant (:class:`~.base.Accountant`, whose contract and the
conventions of every built-in are in :mod:`.base`) live in one registry
(:func:`register_accountant`, :func:`get_accountant`), which :func:`compute_epsilon` wraps.
**Adjacency is an input, never a label**: a pair an accountant does not support
(:func:`support_error`) is refused with a one-line :class:`~dpaudit.errors.UnsupportedEventError`,
and so is an answer labelled with another adjacency or accountant.
"""

from __future__ import annotations


from ..errors import UnsupportedEventError, UsageError
from ..validation import non_negative_finite, open_unit
from .adjacency import Adjacency, AdjacencyLike
from .base import ADD_REMOVE, Accountant, AccountantResult, DeltaResult, Event, unsupported
from .base import branches, first_line, merge_leaves  # noqa: F401 - the ledger reads them here
from .pld import PLD
from .prv import PRV
from .pure import PureAccountant
from .rdp import RDP, RDP_ORDERS, rdp_curve, rdp_to_epsilon  # noqa: F401 - likewise

#: Every accountant :func:`compute_epsilon` knows, in the order tools list them.
ACCOUNTANTS = ("rdp", "prv", "pld", "pure")

#: Every registered accountant by name, the built-ins first.
_REGISTRY: dict[str, Accountant] = {acc.name: acc for acc in (RDP, PRV, PLD, PureAccountant())}
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
#: Names the CLI gives another meaning (``--accountant all``).
_RESERVED_NAMES = frozenset({"all"})


def register_accountant(accountant: Accountant, *, replace: bool = False) -> Accountant:
    """Add ``accountant`` to the registry (then :func:`get_accountant`, :func:`compute_epsilon`,
    :func:`accountants_supporting` and ``dpaudit account --accountant all`` see it).

    The built-ins cannot be replaced: ledgers and releases record an accountant by name, and
    "rdp" must always mean the same computation. Another user accountant of the same name is
    replaced only with ``replace=True``.

    Args:
        accountant: an object implementing the Accountant protocol.
        replace: replace a user accountant already registered under the same name.

    Returns:
        ``accountant``, registered.

    Raises:
        UsageError: not an Accountant, an invalid or reserved name, a built-in's name, or a name
            already registered without ``replace``.
    """
    if not isinstance(accountant, Accountant):
        raise UsageError(
            "accountant must implement the Accountant protocol (name, uses_delta, "
            f"supports, support_error, epsilon), got {accountant!r}."
        )
    name = accountant.name
    if not (isinstance(name, str) and name and set(name) <= _NAME_CHARS) or name in _RESERVED_NAMES:
        raise UsageError(
            "accountant name must be a non-empty string of a-z, 0-9, '-', '_' other "
            f"than 'all', got {name!r}."
        )
    if name in ACCOUNTANTS and name in _REGISTRY:
        raise UsageError(
            f"accountant name must not be a built-in ({', '.join(ACCOUNTANTS)}), got {name!r}."
        )
    if name in _REGISTRY and not replace:
        raise UsageError(
            f"accountant name must be new (or pass replace=True), got {name!r}, which "
            "is already registered."
        )
    _REGISTRY[name] = accountant
    return accountant


def unregister_accountant(name: str) -> None:
    """Remove a user accountant from the registry (the built-ins stay).

    Args:
        name: the user accountant's name.

    Raises:
        UsageError: a built-in, or a name that is not registered.
    """
    if name in ACCOUNTANTS:
        raise UsageError(f"accountant must be a user-registered one, got the built-in {name!r}.")
    if name not in _REGISTRY:
        raise UsageError(
            f"accountant must be one of the registered {', '.join(_REGISTRY)}, got {name!r}."
        )
    del _REGISTRY[name]


def accountant_names() -> tuple[str, ...]:
    """Names of the registered accountants, built-ins first."""
    return tuple(_REGISTRY)


def get_accountant(accountant: "str | Accountant") -> Accountant:
    """The registered accountant called ``accountant``; an :class:`Accountant` object is returned
    as it is (so unregistered accountants can be used directly).

    Args:
        accountant: a registered name or an Accountant.

    Returns:
        The accountant.

    Raises:
        UsageError: an unknown name or another kind of object.
    """
    if isinstance(accountant, str) and accountant in _REGISTRY:
        return _REGISTRY[accountant]
    if not isinstance(accountant, str) and isinstance(accountant, Accountant):
        return accountant
    rule = "" if isinstance(accountant, str) else " or an Accountant"
    raise UsageError(f"accountant must be one of {', '.join(_REGISTRY)}{rule}, got {accountant!r}.")


def support_error(
    accountant: "str | Accountant", event: Event, adjacency: AdjacencyLike = ADD_REMOVE
) -> str | None:
    """Why ``accountant`` (a registered name or an :class:`Accountant`) declines ``event`` under
    ``adjacency`` (a one-line reason), or None.

    Structural only: an accountant may still decline a supported pair at compute time for a
    numerical reason (prv far in the tails), always with :class:`UnsupportedEventError`.

    Args:
        accountant: a registered name or an Accountant.
        event: the event to account for.
        adjacency: the neighbouring relation.

    Returns:
        The one-line reason, or None when the pair is supported.

    Raises:
        UsageError: an unknown accountant or adjacency.
    """
    return get_accountant(accountant).support_error(event, Adjacency.parse(adjacency))


def supports(accountant: "str | Accountant", event: Event, adjacency: AdjacencyLike = ADD_REMOVE):
    """True when ``accountant`` can account for ``event`` under ``adjacency`` (see
    :func:`support_error`)."""
    return support_error(accountant, event, adjacency) is None


def accountants_supporting(event: Event, adjacency: AdjacencyLike) -> tuple[str, ...]:
    """Names of the registered accountants that support ``(event, adjacency)``, in registration
    order (the built-ins first, in :data:`ACCOUNTANTS` order)."""
    adj = Adjacency.parse(adjacency)
    return tuple(name for name, acc in _REGISTRY.items() if acc.support_error(event, adj) is None)


def refuse_unsupported(acc: Accountant, event: Event, adj: Adjacency) -> None:
    """Refuse (:class:`UnsupportedEventError`) a pair ``acc`` does not support, in one line naming
    the accountant, the event and the adjacency: the accountant's own reason when it already names
    the accountant and the adjacency (the built-ins' do), else with them."""
    reason = acc.support_error(event, adj)
    if reason is None:
        return
    line = (str(reason).splitlines()[0].strip() if str(reason).strip() else "") or "no reason given"
    if acc.name not in line or adj.value not in line:
        line = f"{unsupported(acc.name, event, adj)}: {line}"
    raise UnsupportedEventError(line)


def _result_problem(acc: Accountant, result, adj: Adjacency, field: str, asked: float):
    """What keeps an accountant's answer from being reported (None: nothing): it must be the result
    type callers read, labelled with the accountant and with the adjacency it was asked about (a
    bound for another relation is refused, never relabelled), a number >= 0 (not NaN), and at the
    other parameter it was asked at or a stronger one (``asked``: the delta of an epsilon question,
    the epsilon of a delta one)."""
    kind, other = (AccountantResult, "delta") if field == "epsilon" else (DeltaResult, "epsilon")
    if not isinstance(result, kind):
        return f"returned {type(result).__name__}, not a {kind.__name__}; its result is refused"
    if result.accountant != acc.name:
        return f"labelled its result {result.accountant!r}; its result is refused"
    label, value = getattr(result, "adjacency", None), getattr(result, field, None)
    if label != adj.value:
        return f"answered for {label!r} adjacency when asked about {adj}; its result is refused"
    if not (isinstance(value, (int, float)) and value >= 0):  # NaN >= 0 is False: refused
        return f"returned {field} {value!r}; a bound must be a number >= 0"
    at = getattr(result, other)
    if (field == "delta" or getattr(acc, "uses_delta", True)) and not at <= asked:
        return f"answered at {other} {at!r} when asked at {asked!r}; its result is refused"
    return None


def _answer(acc: Accountant, event: Event, adj: Adjacency, field: str, asked: float):
    """``acc``'s answer about a pair it supports, as it may be reported (:func:`_result_problem`);
    else a one-line :class:`UnsupportedEventError`."""
    refuse_unsupported(acc, event, adj)
    result = acc.epsilon(event, asked, adj) if field == "epsilon" else acc.delta(event, asked, adj)
    problem = _result_problem(acc, result, adj, field, asked)
    if problem is not None:
        raise UnsupportedEventError(f"the {acc.name} accountant {problem}.")
    return result


def compute_epsilon(
    event: Event,
    *,
    delta: float,
    accountant: "str | Accountant" = "rdp",
    adjacency: AdjacencyLike = ADD_REMOVE,
) -> AccountantResult:
    """Epsilon of ``event`` at ``delta`` under ``adjacency`` with ``accountant`` (a registered
    name or an :class:`Accountant`; ``delta`` ignored for accountants that do not use it).

    A thin wrapper over the registry. Raises :class:`UnsupportedEventError` (one line naming the
    accountant, the event and the adjacency; for the built-ins also an accountant that supports
    the pair) when the accountant does not support ``(event, adjacency)``: the result is always
    computed under the adjacency it is labelled with, never relabelled.

    Args:
        event: the event to account for.
        delta: in (0, 1) (ignored by accountants that do not use delta).
        accountant: a registered name or an Accountant.
        adjacency: the neighbouring relation the bound is for.

    Returns:
        The accountant's result, labelled with the accountant and the adjacency.

    Raises:
        UsageError: an invalid delta, accountant or adjacency.
        UnsupportedEventError: the accountant declines the event, or its answer is not a valid
            bound (another label, a negative or NaN epsilon, a weaker delta).
    """
    adj = Adjacency.parse(adjacency)
    acc = get_accountant(accountant)
    if getattr(acc, "uses_delta", True):
        open_unit("delta", delta)
    return _answer(acc, event, adj, "epsilon", delta)


def compute_delta(
    event: Event,
    *,
    epsilon: float,
    accountant: "str | Accountant" = "rdp",
    adjacency: AdjacencyLike = ADD_REMOVE,
) -> DeltaResult:
    """An upper bound on the delta of ``event`` at ``epsilon`` under ``adjacency``, for
    accountants with a ``delta`` method (rdp, pld, pure; prv has none).

    Args:
        event: the event to account for.
        epsilon: >= 0, finite.
        accountant: a registered name or an Accountant with a ``delta`` method.
        adjacency: the neighbouring relation the bound is for.

    Returns:
        The accountant's delta bound, labelled with the accountant and the adjacency.

    Raises:
        UsageError: an invalid epsilon, accountant or adjacency.
        UnsupportedEventError: the accountant has no ``delta`` method, declines the event, or
            answers with an invalid bound.
    """
    adj = Adjacency.parse(adjacency)
    acc = get_accountant(accountant)
    eps = non_negative_finite("epsilon", epsilon)
    if not callable(getattr(acc, "delta", None)):
        able = [n for n, a in _REGISTRY.items() if callable(getattr(a, "delta", None))]
        raise UnsupportedEventError(
            f"the {acc.name} accountant cannot compute delta at a given "
            f"epsilon; use {' or '.join(able)}."
        )
    return _answer(acc, event, adj, "delta", eps)


def compared_accountants(adjacency: Adjacency) -> list[str]:
    """The accountants compared side by side (``dpaudit account --accountant all``): rdp and prv;
    under replace-record also pld, the one of them that analyses the replace-one pair of a
    subsampled Gaussian (rdp / prv decline it); then every accountant registered with
    :func:`register_accountant`."""
    builtin = ["rdp", "prv", "pld"] if adjacency is Adjacency.REPLACE_RECORD else ["rdp", "prv"]
    return builtin + [name for name in accountant_names() if name not in ACCOUNTANTS]


def compare(event: Event, *, delta: float, adjacency: Adjacency, names) -> tuple[list[dict], dict]:
    """Each accountant's result for ``event`` (``AccountantResult.to_dict``) and ``{name: reason}``
    of those that decline it. With several names, one that declines this (event, adjacency) is a
    row without epsilon, never a number computed under another adjacency; a single accountant's
    refusal, or everyone's, raises :class:`UnsupportedEventError`.

    Args:
        event: the event to account for.
        delta: in (0, 1).
        adjacency: the neighbouring relation.
        names: the accountants to compare (see :func:`compared_accountants`).

    Returns:
        ``(rows, skipped)``: one row per accountant (``epsilon`` None when it declined) and the
        reasons of those that declined.

    Raises:
        UnsupportedEventError: the only accountant, or every accountant, declines the event.
    """
    results, skipped = [], {}
    for n in names:
        try:
            result = compute_epsilon(event, delta=delta, accountant=n, adjacency=adjacency)
            results.append(result.to_dict())
        except UnsupportedEventError as e:
            if len(names) == 1:
                raise
            skipped[n] = first_line(e)
            row = AccountantResult(n, None, delta, adjacency.value)  # type: ignore[arg-type]
            results.append({**row.to_dict(), "skipped": skipped[n]})
    if all(r["epsilon"] is None for r in results):
        reasons = "; ".join(f"{k}: {v.rstrip('.')}" for k, v in skipped.items())
        raise UnsupportedEventError(f"no accountant could bound this run: {reasons}.")
    return results, skipped
