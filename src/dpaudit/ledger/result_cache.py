"""On-disk cache of the prv accountant's answers for ledger totals (``dpaudit ledger summary``).

``import prv_accountant`` alone takes ~1.3 s, and a ledger summary asks it about the same composed
events until a release is recorded. So, inside :func:`enabled` (``ledger summary``), the prv answers
(bounds or refusals) are kept in ``prv_results.json`` in :func:`dpaudit.paths.cache_dir`.

Privacy contract:

- An entry is used only for exactly the computation it records: the key is a hash of the event
  (its serialised form), delta (``repr``), the adjacency, the accountant, the dpaudit version,
  the sources of :mod:`dpaudit.accounting` (:mod:`~dpaudit.accounting.prv` sets the prv error
  budget and the guards around the library) and the source of the installed prv-accountant package.
  Any change to one of them is a miss, and the number is recomputed.
- Each entry carries a hash of its key and its values; a damaged or half-written entry (or file)
  is ignored, never read as a number. Writes are atomic (rename), so readers see an old or a new
  file, never a mix.
- The rdp bound is always recomputed. The file is not protected by the ledger's chain, and anyone
  who can write the cache directory can edit it (the check hash is unkeyed): so it only ever
  speeds up what is *shown* (``ledger summary``, comparison values). A budget decision (a cap
  check before training, a reservation, an audit's cap check) runs inside :func:`recomputed`,
  where every lookup misses and answers remembered from the file in this process are not reused
  (:mod:`.compose`): a cap is never decided by a number read from this file.
- A cached refusal only drops the prv bound (the total can only go up); a failure that is not a
  refusal (:class:`~dpaudit.errors.UnsupportedEventError`) is never cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
from pathlib import Path

from .. import __version__
from ..accounting.accountants import AccountantResult
from ..errors import UnsupportedEventError
from ..paths import cache_dir, write_atomically

#: Accountants whose answers are cached (rdp is recomputed: numpy only, milliseconds).
CACHED_ACCOUNTANTS = frozenset({"prv"})
_FILE = "prv_results.json"
_FORMAT = 1
#: Entries kept (oldest dropped first); each is ~300 bytes.
MAX_ENTRIES = 4096
#: The numbers an entry keeps of an answer.
_NUMBERS = ("epsilon", "epsilon_lower", "epsilon_estimate")

_fingerprint: str | None = None
#: How many :func:`enabled` blocks (the cache is off unless a command turns it on: library callers
#: and tests that replace an accountant must see their own computation, never a remembered one)
#: and :func:`recomputed` blocks (a budget decision: nothing is read from the file) are open.
_open = {"enabled": 0, "deciding": 0}


@contextlib.contextmanager
def _inside(block: str):
    _open[block] += 1
    try:
        yield
    finally:
        _open[block] -= 1


def enabled():
    """Use the on-disk cache inside this block (``dpaudit ledger summary`` does)."""
    return _inside("enabled")


def recomputed():
    """Within this block every answer is computed afresh (a budget decision): :func:`lookup` misses.
    Fresh answers are still stored (they are what the file should hold)."""
    return _inside("deciding")


def deciding() -> bool:
    """True inside :func:`recomputed`: answers read from the file must not be used."""
    return bool(_open["deciding"])


def kept(accountant: str) -> bool:
    """True when answers of ``accountant`` are kept here (while enabled); the others are recomputed."""
    return bool(_open["enabled"]) and accountant in CACHED_ACCOUNTANTS


def _cache_path() -> Path:
    return cache_dir() / _FILE


def _code_fingerprint() -> str:
    """Hash of the code that computes a prv answer: the accounting package's and prv-accountant's
    sources."""
    global _fingerprint
    if _fingerprint is None:
        h = hashlib.sha256(f"dpaudit {__version__}\n".encode())
        for path in sorted((Path(__file__).parents[1] / "accounting").glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
        spec = importlib.util.find_spec("prv_accountant")  # locates it without importing it
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        for root in roots:
            for path in sorted(Path(root).rglob("*.py")):
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
        if not roots:
            h.update(b"prv-accountant not installed")
        _fingerprint = h.hexdigest()
    return _fingerprint


def _key(event, delta: float, accountant: str, adjacency: str) -> str:
    code = (_FORMAT, _code_fingerprint())
    fields = [*code, accountant, adjacency, repr(float(delta)), event.to_dict()]
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _check(key: str, value: dict) -> str:
    return hashlib.sha256((key + json.dumps(value, sort_keys=True)).encode()).hexdigest()


def _load() -> dict:
    try:
        with open(_cache_path()) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and data.get("format") == _FORMAT
    return data if ok and isinstance(data.get("entries"), dict) else {}


def lookup(event, delta: float, accountant: str, adjacency: str):
    """The cached answer: an :class:`~dpaudit.accounting.accountants.AccountantResult`, an
    :class:`~dpaudit.errors.UnsupportedEventError` (the accountant's refusal) or None (no valid entry)."""
    if not kept(accountant) or deciding():
        return None
    try:
        key = _key(event, delta, accountant, adjacency)
    except (OSError, TypeError, ValueError, AttributeError):
        return None
    entry = _load().get("entries", {}).get(key)
    value = entry.get("value") if isinstance(entry, dict) else None
    if not isinstance(value, dict) or entry.get("check") != _check(key, value):
        return None
    if "refusal" in value:
        return UnsupportedEventError(str(value["refusal"]))
    nums = _cached_numbers(value)
    if nums is None:
        return None
    epsilon, lower, estimate = nums
    return AccountantResult(
        accountant, epsilon, float(delta), adjacency, epsilon_lower=lower, epsilon_estimate=estimate
    )


def _cached_numbers(value: dict) -> list[float] | None:
    """``[epsilon, epsilon_lower, epsilon_estimate]`` of a checked entry's value; None when one is
    missing or not a float, or epsilon is not >= 0 (NaN included)."""
    nums = [value.get(k) for k in _NUMBERS]
    return nums if all(isinstance(x, float) for x in nums) and nums[0] >= 0.0 else None


def store(event, delta: float, accountant: str, adjacency: str, result) -> None:
    """Remember ``result`` (an AccountantResult or an UnsupportedEventError); failures to write only cost time."""
    if not kept(accountant):
        return
    if isinstance(result, UnsupportedEventError):
        value = {"refusal": str(result)}
    elif isinstance(result, BaseException):
        return
    else:
        value = {name: getattr(result, name) for name in _NUMBERS}
        value["epsilon"] = float(result.epsilon)
        if not all(isinstance(v, float) for v in value.values()):
            return
    try:
        key = _key(event, delta, accountant, adjacency)
        entries = _load().get("entries", {})
        entries.pop(key, None)
        entries[key] = {"value": value, "check": _check(key, value)}
        while len(entries) > MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        write_atomically(_cache_path(), json.dumps({"format": _FORMAT, "entries": entries}))
    except (OSError, TypeError, ValueError, AttributeError):
        pass
