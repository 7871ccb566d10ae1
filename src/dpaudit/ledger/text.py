"""The ledger in words: one line per entry (``ledger list``) and the summary as a table and notes
(``ledger summary``), from :meth:`.book.Ledger.entries` and :func:`.budget.summary_rows`."""

from __future__ import annotations


def num(x, digits: int = 4) -> str:
    if x is None:
        return ""
    if isinstance(x, float):  # infinities format as "inf" / "-inf"
        return f"{x:.{digits}f}"
    return str(x)


def _kind_of(p: dict, unbounded: str = "non-private (unbounded)") -> str:
    return unbounded if p.get("non_private") else f"[{(p.get('guarantee') or {}).get('type', '?')}]"


def _voided(e) -> str:
    return f"  VOIDED by {e.voided_by}" if e.voided_by else ""


def _release(e, p) -> str:
    claim = "" if p.get("non_private") else f"eps={num(p.get('epsilon'))} delta={p.get('delta'):g} "
    what = claim + _kind_of(p)  # the guarantee's type, or "non-private (unbounded)"
    if p.get("uncertified"):
        what += f"  {p['uncertified']} (counts as unbounded)"
    tag = (p.get("sweep") or {}).get("name")
    sweep = f"  sweep {tag}" if tag else ""
    return f"{p.get('mechanism')} on {e.dataset}:{p.get('partition')}  {what}{sweep}" + _voided(e)


def _reservation(e, p) -> str:
    what = _kind_of(p) + (f" {p['uncertified']}" if p.get("uncertified") else "")
    state = {"open": "OPEN: budget held (void it if the run was killed)", None: ""}.get(
        e.status, f"{e.status} by {e.closed_by}"
    )
    return f"{p.get('mechanism') or 'run'} (pid {p.get('pid')}) reserves {e.dataset}:{p.get('partition')} {what}  {state}"


def _audit(e, p) -> str:
    what = _kind_of(p, f"non-private (unbounded: {p.get('unbounded_reason')})")
    rel = f"  of release {str(p.get('release_id'))[:12]}" if p.get("release_id") else ""
    return (
        f"audit of {p.get('mechanism')}: {p.get('trials')} trials on {e.dataset}:{p.get('partition')}  {what}{rel}"
        + _voided(e)
    )


#: What a void says of its target's artefacts (not said: nothing).
_PUBLISHED = {
    True: "artefacts were published, budget stays spent",
    False: "artefacts never published",
}


def _void(e, p) -> str:
    said = _PUBLISHED.get(p.get("artefacts_published"))
    return f"voids {p.get('target')}: {p.get('reason')}" + (f" ({said})" if said else "")


_BRIEF = {
    "release": _release,
    "reservation": _reservation,
    "audit": _audit,
    "void": _void,
    "settle": lambda e, p: (
        f"settles reservation {p.get('target')}: releases " + ", ".join(p.get("releases") or [])
    ),
    "cancel": lambda e, p: f"cancels reservation {p.get('target')}: {p.get('reason')}",
    "version": lambda e, p: (
        f"new version of {e.dataset}: data fingerprint {str(p.get('fingerprint'))[:12]} ({p.get('reason')}); "
        "versions compose sequentially"
    ),
    "cap": lambda e, p: (
        f"cap {e.dataset}: eps={num(p.get('epsilon'))} at delta={p.get('delta'):g}"
        + (", audits included" if p.get("include_audits") else "")
    ),
    "key": lambda e, p: (
        f"key {p.get('key_id')} ({p.get('name')}) registered as {p.get('role')}"
        + (f", signed by {e.signer}" if e.signer else "")
    ),
    "plan": lambda e, p: {
        "registered": f"audit plan {p.get('plan_id')} registered (seeds committed)",
        "run": f"run {p.get('audit_id')} of audit plan {p.get('plan_id')}",
        "result": f"result of run {p.get('audit_id')} of audit plan {p.get('plan_id')}: sha256 {str(p.get('sha256'))[:12]}",
    }.get(p.get("stage"), "plan"),
    "policy": lambda e, p: (
        "signatures required from here on" if p.get("require_signatures") else "policy"
    ),
    "rows": lambda e, p: (
        f"row set {str(p.get('set'))[:12]} of source {p.get('source')}: {p.get('count')} rows "
        "(keyed hashes, for overlap tests)"
    ),
    "partition": lambda e, p: (
        f"{e.dataset}:{p.get('parent')} = "
        + " + ".join(f"{e.dataset}:{c}" for c in p.get("children", []))
        + f"  (declared by {p.get('declared_by')})"
    ),
}


def describe(entry) -> str:
    """One line saying what a ledger entry records (empty for an unknown kind)."""
    brief = _BRIEF.get(entry.kind)
    return brief(entry, entry.payload) if brief else ""


SUMMARY_COLUMNS = ("partition", "rel.", "epsilon", "rdp", "prv", "naive", "delta", "cap", "left")
SUMMARY_LEGEND = (
    "rel.: releases direct/in subtree. epsilon: smallest valid bound (rdp, prv upper, pure sum) at delta; "
    "naive: sum of the releases' own claims; cap and left (cap minus the dataset total) in epsilon at delta; "
    "audits: what the audits' trials on the private data compose to (a cap marked +a counts them). "
    "Partitions never declared disjoint compose sequentially in the total."
)


def summary_table(rows: list[dict]) -> list[tuple]:
    """The cells of the summary table (:data:`SUMMARY_COLUMNS`): each node indented under its
    dataset, then the dataset's audits and releases + audits after its partitions."""
    out, shown = [], {(r["dataset"], r["partition"]) for r in rows}
    for i, r in enumerate(rows):
        out.append(_summary_row(r, shown))
        total = next(x for x in rows if x["dataset"] == r["dataset"] and x["partition"] == "*")
        last_of_dataset = i + 1 == len(rows) or rows[i + 1]["dataset"] != r["dataset"]
        if total.get("audits") and last_of_dataset:  # after the dataset's partitions
            out.append(_audit_row(f"  audits ({total['audits']})", total["audit_epsilon"], total))
            out.append(_audit_row("  releases + audits", total["epsilon_with_audits"], total))
    return out


def _audit_row(label: str, epsilon, total: dict) -> tuple:
    """A dataset's audit line of the summary table: only its epsilon and delta."""
    return (label, "", num(epsilon, 3), "", "", "", f"{total['delta']:g}", "", "")


def _summary_row(r: dict, shown: set) -> tuple:
    """One node's cells. A child shows its last segment under its parent's row (the tree): long
    names leave room for the numbers."""
    whole, (parent, _, last) = r["partition"] == "*", r["partition"].rpartition("/")
    name = last if (r["dataset"], parent) in shown else r["partition"]
    depth = 0 if whole else 1 + r["partition"].count("/")
    label = "  " * depth + (r["dataset"] + " (total)" if whole else name)
    cap = r["cap"] or {}
    cap_cell = f"{cap['epsilon']:g}" + ("+a" if cap.get("include_audits") else "") if cap else ""
    releases = f"{r['releases_subtree']}" if whole else f"{r['releases']}/{r['releases_subtree']}"
    numbers = [num(r[key], 3) for key in ("epsilon", "epsilon_rdp", "epsilon_prv", "naive_epsilon")]
    left = num(r["remaining"], 3) if whole else ""
    return (label, releases, *numbers, f"{r['delta']:g}", cap_cell, left)


def summary_notes(rows: list[dict]) -> list[str]:
    """What the table cannot show, per dataset: why it is unbounded, open reservations, shared
    people, audits, voids and declared data versions."""
    return [note for r in rows if r["partition"] == "*" for note in _dataset_notes(r)]


def _dataset_notes(r: dict) -> list[str]:
    name = r["dataset"]
    out = [
        f"{name} is unbounded: {why} (void it to exclude it)."
        for why in r.get("unbounded_reasons") or []
    ]
    if r.get("open_reservation_ids"):
        out.append(
            f"{name}: {len(r['open_reservation_ids'])} open reservation(s) count as spent: "
            + ", ".join(i[:12] for i in r["open_reservation_ids"])
        )
    if r.get("shares_people_with"):
        left = " (left is the cap minus this)" if r.get("cap") else ""
        out.append(
            f"{name} shares people with {', '.join(r['shares_people_with'])}: all composed, epsilon {num(r['epsilon_people'], 3)}{left}."
        )
    return out + _audit_and_void_notes(name, r)


def unbounded_audits(entries) -> list[str]:
    """Why each audit entry still counted (not voided) is unbounded (an empty list: none is)."""
    return [
        f"audit {e.id[:12]} is unbounded ({e.payload.get('unbounded_reason') or 'trials without DP noise'})"
        for e in entries
        if e.payload.get("non_private") and not e.voided_by
    ]


def seal_notes(sealed: dict) -> list[str]:
    """The summary's line on how far the owner has sealed a signed ledger (:meth:`.book.Ledger.seal_status`)."""
    if not sealed or sealed.get("owner") is None or not sealed.get("unsealed"):
        return []
    n = sealed["unsealed"]
    return [
        f"ledger: {n} entr{'y' if n == 1 else 'ies'} after entry #{sealed['sealed_through']} UNSEALED (not yet covered by an "
        "owner's signature; a registered member key could rewrite them): the owner runs `dpaudit ledger seal`."
    ]


def _audit_and_void_notes(name: str, r: dict) -> list[str]:
    counted = (r.get("cap") or {}).get("include_audits")
    left = ", so nothing is left under its cap, which counts audits" if counted else ""
    out = [
        f"{name}: releases + audits is INFINITE because an audit ran without DP noise or a known event: {why}{left} "
        "(void that audit to exclude it; a default audit's no-noise control does this, --no-controls avoids it)."
        for why in r.get("audit_unbounded_reasons") or []
    ]
    if r.get("audits"):
        rule = _AUDITS_RULE[bool(counted)]
        out.append(f"{name}: {r['audits']} audit(s) trained on its private data; the cap {rule}")
    return out + _void_notes(name, r)


_AUDITS_RULE = {  # what a cap does with audits: whether it counts them
    True: "includes them.",
    False: "counts releases only (--exclude-audits, or a cap written before caps counted audits).",
}


def _void_notes(name: str, r: dict) -> list[str]:
    """The summary's lines on a dataset's voided releases and its declared data versions."""
    out = []
    if r.get("voided_epsilon") is not None or r.get("voided_published_releases"):
        out.append(
            f"{name}: voided, not counted: epsilon {num(r.get('voided_epsilon'), 3) or '0'} (never-published artefacts); "
            f"voided but published, still counted: {r.get('voided_published_releases') or 0} release(s)."
        )
    if len(r.get("dataset_fingerprints") or []) > 1:
        out.append(
            f"{name}: {len(r['dataset_fingerprints'])} declared data versions, composed sequentially."
        )
    return out
