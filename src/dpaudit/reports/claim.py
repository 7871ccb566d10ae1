"""Section ``claim``: one claim card per release (Release fields a reviewer checks, every
accountant's epsilon recomputed from the stored events, and the accounting check of
:func:`dpaudit.claims.verify_claim`, dpaudit's one claim check, turned into the card and notes).
"""

from __future__ import annotations

from typing import Any

from ..accounting import ACCOUNTANTS
from ..claims import verify_claim
from ..records import public_noise_reason
from .inputs import LoadedRelease, Note, dataset_name, num
from .recompute import SIDE_BY_SIDE, recomputed


def _find_key(obj: Any, key: str, depth: int = 4) -> Any:
    """First value stored under ``key`` in nested dicts (breadth-first, bounded depth)."""
    level = [obj]
    for _ in range(depth):
        nxt = []
        for d in level:
            if isinstance(d, dict):
                if d.get(key) is not None:
                    return d[key]
                nxt.extend(v for v in d.values() if isinstance(v, dict))
        level = nxt
    return None


def noise_label(ns: Any) -> tuple[str, bool | None]:
    """(label, secure?) of a release's noise source."""
    if not isinstance(ns, dict):
        return "not recorded", None
    source = str(ns.get("source") or "unknown")
    if public_noise_reason(ns) is not None:
        why = f"noise derived from the published seed {ns.get('seed')}"
        return f"NOT PRIVATE: REPRODUCIBLE ({source}, {why})", False
    if ns.get("reproducible") == "secret-seed":
        kept = "reproducible from a secret noise seed kept out of the release"
        return f"secure ({source}, {kept})", True
    return f"secure ({source}, secret)", True


def _epsilon_row(r, acc: str, delta: float | None, stored: dict) -> dict:
    """``acc``'s epsilon of the stored events beside the one the release stored for it."""
    st = stored.get(acc)
    row = {"accountant": acc, **dict.fromkeys(("epsilon", "stored", "lower", "estimate", "error"))}
    if delta is None or not (0 < delta < 1) and acc != "pure":
        return row | {"stored": num(st), "error": f"delta must be in (0, 1), got {r.delta!r}"}
    row |= recomputed(r.guarantee, delta, acc, r.adjacency)
    row["stored"] = num(st.get("epsilon")) if isinstance(st, dict) else num(st)
    return row | {"claimed_with": acc == r.accountant}


def _epsilon_rows(r, delta: float | None) -> list[dict]:
    """The stored events' epsilon under rdp and prv, and under the claimed accountant (none for a non-private release)."""
    if r.non_private:
        return []
    accountants = list(SIDE_BY_SIDE)
    if r.accountant not in accountants and r.accountant in ACCOUNTANTS:
        accountants.insert(0, r.accountant)  # the claimed accountant always gets its row
    stored = r.epsilons if isinstance(r.epsilons, dict) else {}
    return [_epsilon_row(r, acc, delta, stored) for acc in accountants]


def _claim_notes(r, check, secure: bool | None, notes: list[Note]) -> None:
    """Notes in the order a reader needs them: the epsilon verdict, then the steps rule, then public noise."""
    who = f"release {r.id[:12]} ({r.mechanism})"
    if check.epsilon_status == "mismatch":
        notes.append(Note("error", "claim", f"{who}: ACCOUNTING MISMATCH: {check.epsilon_reason}."))
    elif check.epsilon_status == "unverified":
        text = f"{who}: claim not verified: {check.epsilon_reason}."
        notes.append(Note("warning", "claim", text))
    if check.steps_reason is not None:
        notes.append(Note("error", "claim", f"{who}: {check.steps_reason}."))
    if secure is False and not r.non_private:
        text = (
            f"{who}: noise derived from a published seed: not private (anyone can "
            "recompute the noise and test membership exactly); the ledger counts it as unbounded."
        )
        notes.append(Note("error", "claim", text))


def _sampler(r) -> str:
    sampler = _find_key(r.config if isinstance(r.config, dict) else {}, "sampler")
    q = num(r.sample_rate)
    if sampler is not None or q is None:
        return "not recorded" if sampler is None else sampler
    if q >= 1.0:
        return "full batch (q = 1)"
    return (
        f"not recorded (the subsampled-Gaussian accounting assumes Poisson sampling at q = {q:g})"
    )


#: The release's fields the card's end repeats as recorded.
RECORDED_AS_IS = ("partition", "seed", "dpaudit_version", "git_commit", "created_at")


def claim_card(lr: LoadedRelease, notes: list[Note]) -> dict:
    """One claim card (its fields: docs/review-walkthrough.md, ``sections.claim``): the accounting
    check of :func:`dpaudit.claims.verify_claim` and, side by side, the epsilon of the stored events
    under rdp and prv (and the claimed accountant)."""
    r = lr.release
    label, secure = noise_label(r.noise_source)
    delta = num(r.delta)
    check = verify_claim(r)
    rows = _epsilon_rows(r, delta)
    _claim_notes(r, check, secure, notes)
    return {
        "release_id": r.id,
        "path": str(lr.path),
        "mechanism": r.mechanism,
        "non_private": bool(r.non_private),
        **{k: getattr(r, k) for k in ("privacy_unit", "adjacency", "accountant")},
        "target_epsilon": check.target_epsilon,
        "epsilon": check.recorded_epsilon,
        "delta": delta,
        "epsilons": rows,
        "noise_multiplier": num(r.noise_multiplier),
        "sample_rate": num(r.sample_rate),
        "steps_accounted": check.steps_accounted,
        "steps_executed": check.steps_executed,
        "clipping_norm": num(r.clipping_norm),
        "normalizer": r.normalizer,
        "noise_source": r.noise_source if isinstance(r.noise_source, dict) else None,
        "noise_source_label": label,
        "noise_secure": secure,
        "sampler": _sampler(r),
        "dataset": dataset_name(r.dataset),
        **{k: getattr(r, k) for k in RECORDED_AS_IS},
        "accounting_check": {"status": check.status, "message": check.reason},
    }
