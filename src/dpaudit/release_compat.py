"""Old-release readers: the one place that knows how releases recorded before today looked.

A release records its request (``Release.request``) since requests exist; an older one gets its
request rebuilt here from its recorded public fields (dataset identity, seed, target epsilon,
config), never from its ``command`` line (so a ``--user-ids`` file named only there is not
recovered: :func:`dpaudit.auditing.target_from_release` asks for it).
"""

from __future__ import annotations

from .catalogue import lookup
from .errors import DataError, UsageError


def release_request(release):
    """The :class:`~dpaudit.requests.Request` a release was made for (its recorded request through
    its catalogue entry's request type, or :func:`request_from_old_release`)."""
    entry = lookup(release.mechanism)
    rtype = entry.request_type()
    if release.request is not None:
        req = rtype.from_dict(release.request)
        if req.command_name() not in (entry.name, *entry.aliases):
            raise DataError(
                f"release request must name the release's mechanism {entry.name!r}, got {req.command_name()!r}."
            )
        return req
    if entry.family not in _OLD_READERS:
        raise DataError(f"release of {entry.name} must record its request to be rebuilt, got none.")
    return _OLD_READERS[entry.family](release, entry, rtype)


def _common(rel) -> dict:
    eps = rel.target_epsilon if rel.target_epsilon is not None else rel.epsilon
    return dict(seed=int(rel.seed), **({} if rel.non_private else {"epsilon": float(eps)}))


def _dpsgd(rel, entry, rtype):
    ds, cfg = rel.dataset or {}, rel.config or {}
    g = cfg.get("records_per_user")
    return rtype(
        model=entry.name,
        dataset=ds.get("name") or "digits",
        delta=float(rel.delta),
        epochs=cfg.get("epochs"),
        batch_size=cfg.get("batch_size"),
        profile=ds.get("profile"),
        split_seed=ds.get("split_seed"),
        privacy_unit=rel.privacy_unit,
        records_per_user=None if g is None else int(g),
        non_private=bool(rel.non_private),
        **_common(rel),
    )


def _elm(rel, entry, rtype):
    ds, cfg = rel.dataset or {}, rel.config or {}
    return rtype(
        dataset=ds.get("name") or "digits",
        width=int(cfg.get("width", 10)),
        sampler=cfg.get("sampler") or "discrete-laplace",
        adjacency=rel.adjacency,
        split_seed=ds.get("split_seed"),
        profile=ds.get("profile"),
        non_private=bool(rel.non_private),
        **_common(rel),
    )


def _mixmin(rel, entry, rtype):
    cfg = rel.config or {}
    mc = cfg.get("mixmin_config") or {}
    return rtype(
        task=cfg.get("task"),
        target=cfg.get("target"),
        delta=float(rel.delta),
        rho=cfg.get("rho"),
        stage=cfg.get("stage") or "mixture",
        privacy_unit=rel.privacy_unit,
        records_per_user=cfg.get("records_per_user") if rel.privacy_unit == "user" else None,
        proxy_mode=cfg.get("proxy_mode") or "joint",
        composition=cfg.get("composition") or "parallel",
        loss=mc.get("loss", cfg.get("loss", "bce")),
        **_common(rel),
    )


def _not_trained(rel, entry, rtype):
    raise UsageError(f"release mechanism must be a trained model, got {rel.mechanism!r}.")


#: Families whose releases predate recorded requests, and their readers.
_OLD_READERS = {
    "dp-sgd-head": _dpsgd,
    "dp-sgd-module": _dpsgd,
    "dp-elm": _elm,
    "dp-mixmin": _mixmin,
    "gaussian": _not_trained,
}
