"""The catalogue: the one table of mechanism names dpaudit knows (train, audit, sweep, report).

One :class:`CatalogueEntry` per mechanism name. Every other list of mechanism names in dpaudit
(the DP-RVFL model table, the audit aliases and default epsilons, the head models of the
audits, the supported canaries, the sweep's DP-SGD models, the ``dpaudit train`` commands) is
derived from :data:`CATALOGUE`, so adding a mechanism is one module, one line here and one in
:mod:`dpaudit.mechanisms.registry` (docs/architecture.md, "How to add a mechanism").

The entry names its implementation by the mechanism object's contract name; the mechanisms layer maps names to objects
(:func:`dpaudit.mechanisms.registry.mechanism`; tests/test_catalogue.py checks that the two agree). This module is the base
layer: it imports the standard library, :mod:`dpaudit.errors` and :mod:`dpaudit.requests` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UsageError
from .requests import REQUEST_TYPES

#: Families: how a mechanism releases (the audits and sweeps group mechanisms by it).
FAMILIES = ("dp-sgd-head", "dp-sgd-module", "dp-elm", "dp-mixmin", "gaussian", "other")


@dataclass(frozen=True)
class CatalogueEntry:
    """One mechanism name.

    ``implementation`` is the ``name`` of the mechanism object that releases it (the mechanism contract,
    :mod:`dpaudit.mechanisms.contract`; found with :func:`dpaudit.mechanisms.registry.mechanism`); ``canaries`` are the canary kinds its audit supports,
    the first being the default (empty: not auditable); ``default_epsilon`` is the epsilon an
    audit without ``--eps`` calibrates for; ``audit_only`` marks a calibration target that
    ``dpaudit train`` does not release (the synthetic Gaussian mechanism of the audits).
    """

    name: str
    implementation: str
    family: str
    canaries: tuple[str, ...] = ()
    default_epsilon: float = 2.0
    aliases: tuple[str, ...] = ()
    description: str = ""
    audit_only: bool = False

    def request_type(self) -> type:
        """The :class:`~dpaudit.requests.Request` subclass this mechanism is asked with.

        :data:`dpaudit.requests.REQUEST_TYPES` by family, else by name (the mechanism object's ``request_type``:
        tests/mechanisms/test_mechanism_contract.py).
        """
        return REQUEST_TYPES.get(self.family) or REQUEST_TYPES[self.name]


#: The head canary kinds, first = the default; each is chosen by the function of that name in
#: :data:`dpaudit.mechanisms.dpsgd.head_canaries.CHOOSERS` (a new kind: a function and a line there, its name here).
HEAD_CANARIES = ("max-clip", "mislabeled", "natural", "ood-record")
#: The module models' canary kinds (:class:`dpaudit.mechanisms.dpsgd.module_audit.ModuleTarget`).
MODULE_CANARIES = ("max-clip", "mislabeled")
_RVFL = "dp-sgd"
#: The DP-SGD models (one mechanism, ``_RVFL``), by family: name -> description.
_DPSGD_MODELS = {
    ("dp-sgd-head", HEAD_CANARIES): {
        "dp-rvfl": "RVFL: direct link + 200 random tanh features, private head",
        "dp-elm-sgd": "RVFL without the direct link (z = h)",
        "frozen-dense-matched": "frozen tanh layer of width d'+200, no link",
        "logistic-raw": "affine classifier on the full prepared input",
        "logistic-projected": "affine classifier on the projected input",
    },
    ("dp-sgd-module", MODULE_CANARIES): {
        "dp-dense": "fully connected baseline, all weights private",
        "dp-cnn": "CNN baseline (2-D images, 1-D tabular), all weights private",
        "dp-attention": "compact attention control (images)",
        "dp-gru": "GRU over image rows (tabular: features), all weights private",
    },
}

CATALOGUE: dict[str, CatalogueEntry] = {
    e.name: e
    for e in (
        *(
            CatalogueEntry(name, _RVFL, family, canaries, description=description)
            for (family, canaries), models in _DPSGD_MODELS.items()
            for name, description in models.items()
        ),
        CatalogueEntry(
            "dp-elm",
            "dp-elm",
            "dp-elm",
            ("worst-case", "natural", "mislabeled"),
            description="Laplace DP-ELM: noise L(L+2)/eps on H^T H and H^T Y (pure epsilon-DP)",
        ),
        CatalogueEntry(
            "dp-mixmin",
            "dp-mixmin",
            "dp-mixmin",
            ("max-clip", "natural", "mislabeled"),
            1.0,
            aliases=("mixmin",),
            description="DP-MixMin: public-data mixture weights learned privately",
        ),
        CatalogueEntry(
            "noisy-sum",
            "noisy-sum",
            "other",
            ("max-clip", "natural"),
            1.0,
            description="clipped sum of a dataset's rows + Gaussian noise (docs/architecture.md example)",
        ),
        CatalogueEntry(
            "gaussian",
            "gaussian",
            "gaussian",
            ("max-clip", "natural"),
            1.0,
            audit_only=True,
            description="synthetic Gaussian sum query with an exact epsilon (audit calibration target only)",
        ),
    )
}

#: Alias -> canonical name (every canonical name maps to itself).
ALIASES: dict[str, str] = {
    **{e.name: e.name for e in CATALOGUE.values()},
    **{a: e.name for e in CATALOGUE.values() for a in e.aliases},
}


def names(
    *,
    family: str | tuple[str, ...] | None = None,
    trainable: bool | None = None,
    auditable: bool | None = None,
) -> tuple[str, ...]:
    """Canonical names in catalogue order, optionally only those of ``family`` (one or several),
    those ``dpaudit train`` releases (``trainable``) or those with an audit (``auditable``)."""
    fams = (family,) if isinstance(family, str) else family
    return tuple(
        e.name
        for e in CATALOGUE.values()
        if (fams is None or e.family in fams)
        and (trainable is None or (not e.audit_only) == trainable)
        and (auditable is None or bool(e.canaries) == auditable)
    )


def lookup(name: str) -> CatalogueEntry:
    """The entry of ``name`` (a canonical name or an alias); UsageError naming the allowed names."""
    if not isinstance(name, str) or name not in ALIASES:
        raise UsageError(f"mechanism must be one of {', '.join(ALIASES)}, got {name!r}.")
    return CATALOGUE[ALIASES[name]]
