"""The mechanism contract: what every releasing mechanism provides to the one release skeleton.

A mechanism is a module exposing ``MECHANISM``, an object satisfying :class:`MechanismBase` (hooks
and their defaults listed there); :func:`dpaudit.releasing.release` runs them in
the one order every release follows (``docs/architecture.md``). ``audit_target`` builds the
audit of the same plan, so the code that is released is the code that is audited.

**Privacy contract of a plan.** Everything in a :class:`ReleasePlan` is public: it is a
function of the request and of :class:`DataInfo` (public sizes and schema that the guarantee
assumes public), never of the records. That is what lets a sweep coordinator reserve budgets
from plans before any task runs (:func:`dpaudit.sweeps.tasks.planned_event`) and an audit rebuild
the exact noise and schedule of a release (:func:`dpaudit.mechanisms.dpsgd.head_audit.setup_head`). The claim
the release makes is recomputed by the skeleton from ``plan.event`` with ``plan.accountant``
under ``plan.adjacency`` after the run; it must not exceed ``plan.target_epsilon`` and the steps
the run executed must equal ``plan.steps``, else nothing is published.

This module is torch-free (only dataclasses and typing), so catalogues and CLIs can import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import data as registry
from ..errors import DataError
from ..grouped import Grouped

if TYPE_CHECKING:  # pragma: no cover - typing only (keeps this module import-light)
    from ..accounting.events import Event


@dataclass(frozen=True)
class DataInfo:
    """The public facts about a dataset that ``MechanismBase.plan`` may use.

    ``reference_size``: the declared, public size of the training partition (the dataset
    definition's; :attr:`~dpaudit.data.base.PreparedDataset.reference_size`), None when nothing
    declares one: the only size a plan may build a schedule or normaliser from.
    ``n_train`` / ``n_users``: the actual counts of training records / users (None: not split
    by users). They are private under add/remove adjacency (a neighbour has one more or one
    fewer): a plan may test them (e.g. "split by users at all") but never publish them or
    build anything published from them. ``identity``: the public identity dict a
    release publishes (:meth:`~dpaudit.data.base.PreparedDataset.identity`); empty when the plan
    is made before loading (a sweep's budget check).
    """

    name: str
    kind: str
    n_train: int
    n_features: int
    n_classes: int
    profile: str | None = None
    split_seed: int | None = None
    n_users: int | None = None
    identity: dict = field(default_factory=dict)
    reference_size: int | None = None
    #: image datasets: the public (C, H, W) schema (None when planned before loading)
    image_shape: tuple | None = None

    @classmethod
    def from_prepared(cls, data) -> "DataInfo":
        """Public facts of a loaded :class:`~dpaudit.data.base.PreparedDataset`."""
        n_users = None
        if getattr(data, "user_ids", None) is not None:
            import numpy as np

            n_users = int(np.unique(np.asarray(data.user_ids["train"])).size)
        return cls(
            name=data.name,
            kind=data.kind,
            n_train=int(data.y_train.shape[0]),
            n_features=int(data.n_features),
            n_classes=int(data.n_classes),
            profile=data.profile,
            split_seed=data.split_seed,
            n_users=n_users,
            identity=data.identity(),
            reference_size=getattr(data, "reference_size", None),
            image_shape=getattr(data, "image_shape", None),
        )

    @classmethod
    def from_registry(cls, name: str, profile: str | None = None) -> "DataInfo":
        """Public facts of a registered dataset *before* loading it (from the registry's sizes
        under ``profile``): what a sweep coordinator knows when it reserves budgets."""
        info = registry.dataset_info(name)
        # the definition's declared size
        n0 = int(registry.profile_split_sizes(info.name, profile)["train"])
        return cls(
            name=info.name,
            kind=info.kind,
            n_train=n0,
            n_features=int(info.n_features),
            n_classes=int(info.n_classes),
            profile=profile,
            reference_size=n0,
        )


@dataclass(frozen=True)
class NoiseCount:
    """The number of Gaussian noise values the whole run draws when it is known from public
    quantities (the skeleton then checks the sampler's tail delta before the run and publishes
    ``noise_tail_delta``; None for non-Gaussian mechanisms), and the run's name in a refusal."""

    noise_values: int | None = None
    noise_what: str = "release"


@dataclass(frozen=True)
class Publishing:
    """Where and how a part of a multi-release plan is published: ``out_subdir``, relative to the
    release folder ("" = the folder itself); ``declarations``, the disjoint partitions
    (:class:`PartitionDeclaration`) declared to the ledger after a successful run, before
    publishing (only when the release is recorded); ``time_run`` False: the release's timings
    are the run's own (:attr:`RunOutput.timings`) only, without the skeleton's
    ``setup_seconds`` / ``train_seconds``."""

    out_subdir: str = ""
    declarations: tuple["PartitionDeclaration", ...] = ()
    time_run: bool = True


@dataclass(frozen=True)
class ReleasePlan(Grouped):
    """Everything a release will be, fixed before the private data are touched (public only).

    ``event`` None: a non-private release (no claim, ``epsilon = inf``; the ledger counts the
    dataset's budget as unbounded). ``steps``: the accounted number of steps, compared with
    :attr:`RunOutput.steps_executed`. ``config``: what ``release.json`` records under
    ``config`` (calibrated noise, schedule, ...). ``release_fields``: further
    :class:`~dpaudit.records.Release` fields fixed by the plan (``noise_multiplier``,
    ``sample_rate``, ``clipping_norm``, ``normalizer``, ``noise_sampler``, ...).
    ``noise``: :class:`NoiseCount`; ``publishing``: :class:`Publishing` (both also read and
    given by their fields' names, :mod:`dpaudit.grouped`). ``uncertified``: a reason
    the guarantee cannot be certified (the ledger then counts it as unbounded).
    ``compare_accountants``: accountants whose epsilon is recorded beside the claim
    (``Release.epsilons``; comparison values only).
    """

    mechanism: str
    request: Any
    dataset: dict
    partition: str
    adjacency: str
    accountant: str
    event: "Event | None"
    target_epsilon: float | None
    delta: float
    config: dict = field(default_factory=dict)
    steps: int = 1
    privacy_unit: str = "record"
    seed: int = 0
    data_name: str = ""
    release_fields: dict = field(default_factory=dict)
    noise: NoiseCount = field(default_factory=NoiseCount)
    uncertified: str | None = None
    compare_accountants: tuple[str, ...] = ()
    #: Multi-release plans (e.g. DP-MixMin's mixture weights, then its DP fine-tuning): one
    #: sub-plan per Release, in publishing order. The skeleton then reserves THIS plan's
    #: ``event`` on its ``partition`` once (the combined event: ``Parallel`` / ``Composed``),
    #: verifies each part's claim against the part's own event and target, and settles all the
    #: parts' releases with that one reservation. Empty: this plan is itself the one release.
    parts: tuple["ReleasePlan", ...] = ()
    publishing: Publishing = field(default_factory=Publishing)
    GROUPS = {"noise": NoiseCount, "publishing": Publishing}


def data_plan(request, info: DataInfo, **fields) -> ReleasePlan:
    """The plan of one release on the training partition of ``info``'s dataset (its public
    identity, else its name) under the request's public seed; ``fields``: the rest of the plan."""
    dataset = info.identity or {"name": info.name}
    return ReleasePlan(
        request=request,
        dataset=dataset,
        partition="train",
        seed=int(request.seed),
        data_name=info.name,
        **fields,
    )


def load_requested(source, name: str | None = None):
    """The registered dataset ``name`` (default ``source.dataset``) with the data directory, split
    seed and profile ``source`` (a request, or an audit target) asks for."""
    return registry.load_dataset(
        name or source.dataset,
        data_dir=source.data_dir,
        split_seed=source.split_seed,
        profile=source.profile,
    )


def public_inputs(request, info: DataInfo) -> dict:
    """The config entries of a release's public inputs: its seeds and data profile (validation
    data are never read)."""
    seeds = {"model_seed": int(request.seed), "split_seed": info.split_seed}
    return {"seeds": seeds, "profile": info.profile, "validation_used": False}


@dataclass(frozen=True)
class RunOutput:
    """What ``MechanismBase.run`` returns: facts of the run on the private data.

    ``arrays`` (name -> numpy array) are written to ``weights_name`` (``.npz``) unless ``save``
    is given: ``save(out_dir)`` writes the artefacts itself (e.g. a torch ``state_dict``).
    ``config`` extends ``plan.config`` (e.g. solver used); ``release_fields`` adds Release fields
    only the run knows; ``noise_values`` overrides ``plan.noise_values`` when the count is only
    known once the model is built (it is still a public quantity).
    """

    steps_executed: int
    metrics: dict = field(default_factory=dict)
    arrays: dict | None = None
    weights_name: str | None = "weights.npz"  # None: no "weights" artefact is recorded
    save: Callable[[Any], None] | None = None
    config: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    release_fields: dict = field(default_factory=dict)
    artefacts: dict = field(default_factory=dict)
    noise_values: int | None = None
    #: names the run in a refused tail's message (default plan.noise_what)
    noise_what: str | None = None
    #: Artefacts written by ``save``, as paths relative to the part's folder: the release records
    #: them resolved (absolute), e.g. ``{"head": "head.npy"}``.
    artefact_paths: dict = field(default_factory=dict)
    #: One RunOutput per :attr:`ReleasePlan.parts` (same order) for a multi-release plan.
    parts: tuple["RunOutput", ...] = ()


@dataclass(frozen=True)
class PartitionDeclaration:
    """``parent`` of ``dataset`` splits into the disjoint ``children`` (ledger
    ``declare_partition``); ``declared_by`` says on what basis (e.g. the split rule)."""

    dataset: str
    parent: str
    children: tuple[str, ...]
    declared_by: str


class MechanismBase:
    """The contract (module docstring): every hook, with its default; a mechanism subclasses it,
    overrides what it needs (so callers never probe for a hook) and provides:

    - ``name`` and ``request_type``;
    - ``plan(request, info: DataInfo) -> ReleasePlan``: the release's plan from the request and
      the data's public facts only;
    - ``run(plan, data, noise, *, progress) -> RunOutput``: the plan executed on the private
      ``data``, every noise value drawn from ``noise``;
    - ``audit_target(plan, canary, *, release=None, user_ids=None, no_noise=False)``: the prepared
      audit target of ``plan`` (``release``: the Release audited, whose recorded values the target
      reads; ``no_noise``: the noiseless control). Every catalogue entry has canaries, so every
      mechanism is audited (tests/mechanisms/test_mechanism_contract.py checks each has it).
    """

    name: str
    request_type: type
    #: True: ``artefacts["out_dir"]`` names the release folder (as DP-ELM releases always have).
    record_out_dir = False
    #: True: ``load(request, ledger_path=...)`` gets the ledger (e.g. a keyed fingerprint).
    load_uses_ledger = False

    def validate(self, request):
        """Checks before anything is loaded; returns the (possibly normalised) request."""
        return request

    def load(self, request, prepared=None):
        """The request's registered dataset (``prepared``: already loaded); an empty training partition is refused."""
        if prepared is None:
            prepared = load_requested(request)
        if prepared.y_train.size == 0:
            raise DataError(f"dataset {prepared.name} has an empty training partition.")
        return prepared

    def data_info(self, request, data) -> DataInfo:
        """The public facts of the loaded data the plan is computed from."""
        return DataInfo.from_prepared(data)

    def default_out_dir(self, plan: ReleasePlan):
        """Where a release goes when no ``out_dir`` is given:
        ``runs/<mechanism>-<dataset><tag>-seed<seed>-eps<eps>`` (:meth:`out_dir_tag`)."""
        eps = "nonprivate" if plan.event is None else f"eps{plan.target_epsilon:g}"
        tag = self.out_dir_tag(plan)
        return Path("runs") / f"{plan.mechanism}-{plan.data_name}{tag}-seed{plan.seed}-{eps}"

    def out_dir_tag(self, plan: ReleasePlan) -> str:
        """What the default release folder's name adds after the dataset's (e.g. a width)."""
        return ""

    def command_line(self, plan: ReleasePlan, out_dir) -> str | None:
        """The release's recorded command (derived from the request, never parsed back)."""
        return plan.request.command(out=out_dir) if hasattr(plan.request, "command") else None

    def link_releases(self, plan: ReleasePlan, releases: list) -> list:
        """Multi-release plans: the parts' releases before publishing (e.g. one naming another)."""
        return releases

    def after_publish(self, plan: ReleasePlan, releases: list, out_dir) -> None:
        """Multi-release plans: after every part is published (e.g. a summary file)."""

    def notes(self, request) -> list[str]:
        """One-line notes for people on ``request`` before it runs (``dpaudit train`` prints them)."""
        return []

    def summary(self, release, ledger=None) -> tuple[dict, list[str]] | None:
        """What ``dpaudit train`` prints of ``release`` (recorded in ``ledger``, a path or None for the
        default): (its ``--json`` object, its lines); None: the release record and the generic lines."""
        return None

    def plan_of_audit(self, request) -> ReleasePlan:
        """The plan of a fresh audit of ``request``: validate, load (public facts of the data),
        plan, the release's code path on the auditor's data."""
        request = self.validate(request)
        return self.plan(request, self.data_info(request, self.load(request)))

    def plan_of_release(self, request, release) -> ReleasePlan:
        """The plan ``release`` was made with, rebuilt from its ``request``; refused (DataError)
        unless it is the release's (:func:`check_plan_matches_release`)."""
        plan = self.plan_of_audit(request)
        check_plan_matches_release(plan, release)
        return plan


# ------------------------------------------------------------------ a plan rebuilt for a release

#: Release config keys a rebuilt plan must reproduce (when both record them).
_CONFIG_KEYS = ("width", "sampler", "records_per_user", "task", "stage", "composition")
#: Release fields of the schedule a rebuilt plan must reproduce (float rounding aside).
_SCHEDULE_KEYS = ("noise_multiplier", "sample_rate", "normalizer")


def check_plan_matches_release(plan, rel) -> None:
    """The one check that a rebuilt plan is the release's: its event (the guarantee), adjacency,
    seed, privacy unit, schedule (steps, sigma, q, normaliser), dataset identity (name, split seed,
    profile, users), split rule and the recorded config of its request (width, sampler, G, ...).
    A release whose request says one thing and whose record another is refused, never guessed."""
    rebuilt = {"type": "non-private"} if plan.event is None else plan.event.to_dict()
    if rebuilt != rel.guarantee:
        raise DataError(
            f"rebuilt guarantee must equal the release's {rel.guarantee}, got {rebuilt}."
        )
    bad = _first_mismatch(_requested_pairs(plan, rel), lambda got, want: got == want)
    if bad:
        raise DataError(
            "release request {0} must match the release's {2!r}, got {1!r}.".format(*bad)
        )
    numbers = {
        "steps": (plan.steps, rel.steps),
        **{k: (plan.release_fields.get(k), getattr(rel, k, None)) for k in _SCHEDULE_KEYS},
    }
    bad = _first_mismatch(
        numbers,
        lambda got, want: math.isclose(float(got), float(want), rel_tol=1e-12, abs_tol=1e-12),
    )
    if bad:
        raise DataError("rebuilt {0} must equal the release's {2}, got {1}.".format(*bad))
    _check_dataset(plan.dataset or {}, rel.dataset or {})


def _requested_pairs(plan, rel) -> dict:
    """(rebuilt, recorded) of what the release's request fixed, by name."""
    cfg = rel.config or {}
    rules = tuple((config.get("split") or {}).get("rule") for config in (plan.config, cfg))
    return {
        **{k: (getattr(plan, k), getattr(rel, k)) for k in ("adjacency", "seed", "privacy_unit")},
        **{k: (plan.config.get(k), cfg.get(k)) for k in _CONFIG_KEYS},
        "split rule": rules,
    }


def _check_dataset(rebuilt: dict, recorded: dict) -> None:
    """The rebuilt plan's dataset identity is the release's recorded one, where recorded."""
    for key in ("name", "split_seed", "profile", "user_ids_sha256"):
        if recorded.get(key) is not None and rebuilt.get(key) != recorded[key]:
            raise DataError(
                f"rebuilt dataset {key} must equal the release's {recorded[key]!r}, got {rebuilt.get(key)!r}."
            )


def _first_mismatch(pairs: dict, same):
    """The first (name, got, wanted) of ``pairs`` (name -> (got, wanted)) both known and not ``same``."""
    return next(
        (
            (n, got, want)
            for n, (got, want) in pairs.items()
            if want is not None and got is not None and not same(got, want)
        ),
        None,
    )
