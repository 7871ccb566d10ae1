"""Build an :class:`~dpaudit.audits.targets.AuditTarget` from a mechanism name or a release.

This is the library behind ``dpaudit audit MECHANISM ...`` (the CLI only parses): a Python user
gets the same target with :func:`build_target` or :func:`target_from_release`.
"""

from __future__ import annotations

import os

from ..catalogue import ALIASES as CATALOGUE_ALIASES
from ..catalogue import CATALOGUE, lookup
from ..errors import DataError, UsageError
from ..validation import one_of, open_unit, positive_finite, positive_int
from .canaries import SUPPORTED, audit_family, check_canary
from .heads import HEAD_MODELS
from .targets import AuditTarget

#: MECHANISM names the CLI accepts (aliases map to the release's mechanism name): the auditable
#: catalogue entries (those with canaries) and their aliases.
ALIASES = {a: n for a, n in CATALOGUE_ALIASES.items() if CATALOGUE[n].canaries}
MECHANISMS = tuple(ALIASES)
#: Epsilon an audit without ``--eps`` calibrates for, per audit family (:func:`family`).
DEFAULT_EPSILON = {audit_family(e): e.default_epsilon for e in CATALOGUE.values() if e.canaries}
DEFAULT_TASK = "digits-mix"
#: Privacy units ``dpaudit audit --privacy-unit`` accepts (user: the DP-SGD head models only).
PRIVACY_UNITS = ("record", "user")
#: Catalogue families whose targets are built here; any other auditable entry is audited through
#: its mechanism's ``audit_target(plan, canary)`` (:func:`generic_target`).
BUILTIN_FAMILIES = ("dp-sgd-head", "dp-elm", "dp-mixmin", "gaussian")


def family(mechanism: str) -> str:
    """The audit family of an auditable mechanism name: ``head`` for the DP-SGD head models,
    else the canonical mechanism name (:func:`dpaudit.audits.canaries.audit_family`)."""
    return audit_family(CATALOGUE[ALIASES[mechanism]])


def default_canary(mechanism: str) -> str:
    return SUPPORTED[family(one_of("mechanism", mechanism, MECHANISMS))][0]


def check_privacy_unit(mechanism: str, privacy_unit: str, records_per_user: int | None, user_ids=None) -> int | None:
    """Validate the privacy unit request before anything is loaded; returns G (None for records).

    ``user`` needs a DP-SGD head model and ``records_per_user`` G >= 1; ``record`` refuses G and
    user ids (a request for user-level privacy is never silently ignored).
    """
    one_of("privacy_unit", privacy_unit, PRIVACY_UNITS)
    if privacy_unit == "record":
        if records_per_user is not None or user_ids is not None:
            raise UsageError(f"privacy_unit must be user when records_per_user or user ids are given, got {privacy_unit!r}.")
        return None
    if family(one_of("mechanism", mechanism, MECHANISMS)) != "head":
        raise UsageError(f"mechanism must be a DP-SGD head model ({', '.join(HEAD_MODELS)}) for privacy_unit user, got {mechanism!r}.")
    if records_per_user is None:
        raise UsageError("records_per_user must be given for privacy_unit user (G >= 1), got None.")
    return positive_int("records_per_user", records_per_user)


def check_release_unit(release, privacy_unit: str | None, records_per_user: int | None) -> None:
    """An audit of a release takes its privacy unit from the release: a requested unit or G that
    says otherwise is refused (never silently ignored). ``privacy_unit=None``: not requested."""
    if privacy_unit in (None, "record") and records_per_user is None:
        return
    unit = one_of("privacy_unit", privacy_unit or "record", PRIVACY_UNITS)
    g_rel = (release.config or {}).get("records_per_user")
    if unit != release.privacy_unit or (records_per_user is not None and records_per_user != g_rel):
        raise UsageError(f"privacy_unit and records_per_user must match the release ({release.privacy_unit}"
                         f"{f', G={g_rel}' if g_rel is not None else ''}) or be omitted, got {unit}"
                         f"{f', G={records_per_user}' if records_per_user is not None else ''}.")


def build_target(
    mechanism: str,
    *,
    canary: str | None = None,
    epsilon: float | None = None,
    delta: float = 1e-5,
    task: str | None = None,
    target: str | None = None,
    dataset: str | None = None,
    data_dir: str | os.PathLike | None = None,
    seed: int = 42,
    no_noise: bool = False,
    width: int = 10,
    epochs: int | None = None,
    rho: float | None = None,
    broken_noise_factor: float = 1.0,
    privacy_unit: str = "record",
    records_per_user: int | None = None,
    user_ids=None,
    profile: str | None = None,
) -> AuditTarget:
    """The audit target for ``mechanism`` with its noise calibrated to (``epsilon``, ``delta``).

    ``profile``: the dataset's preprocessing profile (None = its default; e.g. ``authors``),
    for the frozen-feature models and ``dp-elm`` only.

    ``mixmin``/``dp-mixmin`` uses ``task`` (default the embedded ``digits-mix``) and its
    ``target``; the frozen-feature models and ``dp-elm`` use ``dataset`` (default the embedded
    ``digits``); ``gaussian`` is synthetic with an exact epsilon. ``no_noise`` returns the
    noiseless variant (the no-noise control as the main audit). ``broken_noise_factor`` (gaussian
    only) divides the noise while the claim stays: a deliberately broken mechanism.

    ``privacy_unit="user"`` (head models): user-level DP-SGD audited with one whole canary user
    of ``records_per_user`` G records, adjacency ``add-remove-user``
    (:class:`~dpaudit.audits.user_level.UserHeadTarget`); ``user_ids`` (one per row before
    splitting, array or ``.npy`` path) default to a public grouping of the rows into users of G.
    """
    one_of("mechanism", mechanism, MECHANISMS)
    entry = lookup(mechanism)
    if entry.family not in BUILTIN_FAMILIES:  # a catalogue mechanism audited through its own contract
        given = dict(epsilon=epsilon, delta=delta, task=task, target=target, dataset=dataset, data_dir=data_dir, seed=seed, width=width,
                     epochs=epochs, rho=rho, records_per_user=records_per_user, user_ids=user_ids, profile=profile)
        defaults = dict(delta=1e-5, seed=42, width=10)
        if privacy_unit != "record" or broken_noise_factor != 1.0:
            raise UsageError(f"privacy_unit and broken_noise_factor must be left at record and 1 for {mechanism}, got {privacy_unit!r}, {broken_noise_factor!r}.")
        import dataclasses

        rtype = entry.request_type()
        names = {f.name for f in dataclasses.fields(rtype)}
        bad = sorted(k for k, v in given.items() if k not in names and v is not None and v != defaults.get(k))
        if bad:
            raise UsageError(f"{bad[0]} must not be given for {mechanism} (its request has {', '.join(sorted(names))}), got {given[bad[0]]!r}.")
        kw = {k: (os.fspath(v) if isinstance(v, os.PathLike) else v) for k, v in given.items() if k in names and v is not None}
        return generic_target(entry.name, rtype(**kw), canary=canary, no_noise=no_noise)
    g = check_privacy_unit(mechanism, privacy_unit, records_per_user, user_ids)
    fam = family(mechanism)
    canary = check_canary(fam, canary or SUPPORTED[fam][0])
    eps = positive_finite("epsilon", epsilon if epsilon is not None else DEFAULT_EPSILON.get(fam, 2.0))
    if broken_noise_factor != 1.0 and fam != "gaussian":
        raise UsageError(f"broken_noise_factor must be 1 for {mechanism} (a gaussian-only test switch), got {broken_noise_factor!r}.")
    if profile is not None and fam in ("dp-mixmin", "gaussian"):
        raise UsageError(f"profile must not be given for {mechanism} (it takes no --dataset), got {profile!r}.")
    if fam == "dp-mixmin":
        if dataset is not None:
            raise UsageError(f"dataset must not be given for mixmin (use --task), got {dataset!r}.")
        from .mixmin import mixmin_task_target

        t = mixmin_task_target(task or DEFAULT_TASK, target, epsilon=eps, delta=open_unit("delta", delta), rho=rho, canary=canary,
                               seed=seed, data_dir=data_dir)
    elif fam == "gaussian":
        from .gaussian import GaussianTarget

        t = GaussianTarget.for_epsilon(eps, open_unit("delta", delta), canary=canary, seed=seed, broken_noise_factor=broken_noise_factor)
    elif fam == "dp-elm":
        from .elm import ElmTarget

        t = ElmTarget(dataset=dataset or "digits", data_dir=data_dir, width=width, epsilon=eps, canary=canary, seed=seed, profile=profile)
    else:
        if task is not None:
            raise UsageError(f"task must not be given for {mechanism} (use --dataset), got {task!r}.")
        from .heads import HeadTarget

        if g is not None:
            from .user_level import UserHeadTarget

            t = UserHeadTarget(model=ALIASES[mechanism], records_per_user=g, dataset=dataset or "digits", data_dir=data_dir, epsilon=eps,
                               delta=open_unit("delta", delta), canary=canary, seed=seed, epochs=epochs, user_ids=user_ids, profile=profile)
            t.prepare()
            return t.without_noise() if no_noise else t
        t = HeadTarget(model=ALIASES[mechanism], dataset=dataset or "digits", data_dir=data_dir, epsilon=eps,
                       delta=open_unit("delta", delta), canary=canary, seed=seed, epochs=epochs, profile=profile)
    t.prepare()
    return t.without_noise() if no_noise else t


def generic_target(mechanism: str, request, *, canary: str | None = None, no_noise: bool = False) -> AuditTarget:
    """The audit target of ``request`` for a catalogue mechanism audited through its contract:
    the mechanism's own plan (public quantities: the same code path as its release) and its
    ``audit_target(plan, canary)``; ``canary`` defaults to the entry's first."""
    entry = lookup(mechanism)
    if not entry.canaries:
        raise UsageError(f"mechanism must be auditable (a catalogue entry with canaries), got {mechanism!r}.")
    canary = canary or entry.canaries[0]
    one_of("canary", canary, entry.canaries)
    mech = entry.mechanism()
    plan = _plan(mech, request)
    t = mech.audit_target(plan, canary)
    t.prepare()
    return t.without_noise() if no_noise else t


def _plan(mech, request):
    """``mech``'s plan of ``request``: validate, load (public facts of the data), plan."""
    from ..mechanisms.contract import DataInfo

    validate = getattr(mech, "validate", None)
    if validate is not None:
        request = validate(request)
    data = mech.load(request)
    info_of = getattr(mech, "data_info", None)
    info = info_of(request, data) if info_of is not None else DataInfo.from_prepared(data)
    return mech.plan(request, info)


def release_request(release):
    """The :class:`~dpaudit.requests.Request` a release was made for.

    A release that records its request (``Release.request``) gives it back through its
    catalogue entry's request type (:meth:`~dpaudit.requests.Request.from_dict`). An older
    release (no ``request``) gets one rebuilt from its recorded fields (dataset identity, seed,
    target epsilon, config); its ``command`` is never parsed, so a ``--user-ids`` file named only
    there is not recovered (:func:`target_from_release` then asks for it).
    """
    entry = lookup(release.mechanism)
    rtype = entry.request_type()
    if release.request is not None:
        req = rtype.from_dict(release.request)
        if req.command_name() not in (entry.name, *entry.aliases):
            raise DataError(f"release request must name the release's mechanism {entry.name!r}, got {req.command_name()!r}.")
        return req
    if entry.family not in BUILTIN_FAMILIES:
        raise DataError(f"release of {entry.name} must record its request to be rebuilt, got none.")
    return _request_from_old_release(release, entry, rtype)


def _request_from_old_release(rel, entry, rtype):
    """Compatibility reader: the request of a release made before releases recorded one, from its
    recorded public fields (never from its command line)."""
    ds = rel.dataset or {}
    cfg = rel.config or {}
    eps = rel.target_epsilon if rel.target_epsilon is not None else rel.epsilon
    common = dict(seed=int(rel.seed), non_private=bool(rel.non_private))
    if not rel.non_private:
        common["epsilon"] = float(eps)
    if entry.family in ("dp-sgd-head", "dp-sgd-module"):
        g = cfg.get("records_per_user")
        return rtype(model=entry.name, dataset=ds.get("name") or "digits", delta=float(rel.delta), epochs=cfg.get("epochs"),
                     batch_size=cfg.get("batch_size"), profile=ds.get("profile"), split_seed=ds.get("split_seed"),
                     privacy_unit=rel.privacy_unit, records_per_user=None if g is None else int(g), **common)
    if entry.family == "dp-elm":
        return rtype(dataset=ds.get("name") or "digits", width=int(cfg.get("width", 10)), sampler=cfg.get("sampler") or "discrete-laplace",
                     adjacency=rel.adjacency, split_seed=ds.get("split_seed"), profile=ds.get("profile"), **common)
    if entry.family == "dp-mixmin":
        mc = cfg.get("mixmin_config") or {}
        fields = dict(target=cfg.get("target"), delta=float(rel.delta), rho=cfg.get("rho"), stage=cfg.get("stage") or "mixture",
                      privacy_unit=rel.privacy_unit,
                      records_per_user=cfg.get("records_per_user") if rel.privacy_unit == "user" else None, proxy_mode=cfg.get("proxy_mode") or "joint", composition=cfg.get("composition") or "parallel",
                      loss=mc.get("loss", cfg.get("loss", "bce")), seed=int(rel.seed))
        if not rel.non_private:
            fields["epsilon"] = float(eps)
        return rtype(task=cfg.get("task"), **fields)
    raise UsageError(f"release mechanism must be a trained model, got {rel.mechanism!r}.")


def _check_request_matches(req, rel, **pairs) -> None:
    """A request and the release fields it must agree with (a release whose request says one
    thing and whose recorded configuration another is refused, never guessed between)."""
    for name, (got, want) in pairs.items():
        if want is not None and got is not None and got != want:
            raise DataError(f"release request {name} must match the release's {want!r}, got {got!r}.")


def target_from_release(release, *, canary: str | None = None, data_dir: str | os.PathLike | None = None,
                        no_noise: bool = False, mechanism: str | None = None, user_ids=None) -> AuditTarget:
    """The audit target reproducing the configuration recorded in a release (``Release`` or path).

    A catalogue look-up of the release's mechanism and its request
    (:func:`release_request`: ``Release.request`` through the entry's request type, or the
    compatibility reader for older releases). ``mechanism``, when given (the CLI's MECHANISM),
    must name the release's mechanism. A mechanism outside the built-in audit families is
    audited through its own contract: the plan rebuilt from the request must have the release's
    guarantee, and its ``audit_target(plan, canary)`` is returned.

    A user-level head release (``privacy_unit`` user) gives a
    :class:`~dpaudit.audits.user_level.UserHeadTarget` (a canary user of the release's G records,
    adjacency ``add-remove-user``). Its users come from ``user_ids`` (array or ``.npy`` path), else
    from the request's ``user_ids`` file, else from the public grouping of
    :func:`~dpaudit.audits.user_level.synthetic_user_ids`; whichever is used must give the
    release's users per partition (and, for an old release that published one, its user-id
    checksum), else :class:`~dpaudit.errors.DataError`. An old release (no recorded request)
    whose user-ids file is named only in its command line is refused unless ``user_ids`` is given.

    The noise multiplier, sampling and steps are taken from the release (not re-calibrated), the
    public seed and dataset identity too; the claim audited is the release's epsilon (under its
    own accountant) and its recorded event (``claimed_event``, the trade-off curve the audit
    tests; the mixture step's event for dp-mixmin), with the release's ``accountant``. Data whose public identity (name, kind, profile, split seed, split sizes,
    schema, users) differs from the release's are refused
    (:func:`~dpaudit.audits.targets.check_release_identity`); old releases that published the
    data's sha256 are also checked against it. A rebuilt configuration that differs from the
    recorded one (another dataset size, another schedule) is an error.
    """
    from ..records import Release, read_release

    rel = release if isinstance(release, Release) else read_release(release)
    mech = rel.mechanism
    if mechanism is not None and ALIASES.get(mechanism, mechanism) != ALIASES.get(mech, mech):
        raise UsageError(f"MECHANISM must match the release's mechanism {mech!r}, got {mechanism!r}.")
    if mech not in ALIASES:
        raise UsageError(f"release mechanism must be one of {', '.join(sorted(set(ALIASES.values())))}, got {mech!r}.")
    if rel.non_private:
        raise UsageError("release must carry a privacy claim to be audited, got a non-private release.")
    entry = lookup(mech)
    if entry.audit_only:  # gaussian releases are not produced by dpaudit train
        raise UsageError(f"release mechanism must be a trained model, got {mech!r}.")
    req = release_request(rel)
    if entry.family not in BUILTIN_FAMILIES:
        if user_ids is not None:
            raise UsageError(f"user ids must only be given for a user-level release, got a release of {mech}.")
        return _generic_from_release(entry, req, rel, canary=canary, data_dir=data_dir, no_noise=no_noise)
    fam = family(mech)
    canary = check_canary(fam, canary or SUPPORTED[fam][0])
    ds = rel.dataset or {}
    cfg = rel.config or {}
    if fam == "head":
        _check_request_matches(req, rel, model=(req.model, mech), dataset=(req.dataset, ds.get("name")), seed=(req.seed, int(rel.seed)),
                               privacy_unit=(req.privacy_unit, rel.privacy_unit), records_per_user=(req.records_per_user, cfg.get("records_per_user")))
    if fam == "head" and rel.privacy_unit == "user":
        from .user_level import UserHeadTarget

        if rel.adjacency != "add-remove-user":
            raise DataError(f"a user-level release must have adjacency add-remove-user, got {rel.adjacency!r}.")
        g = cfg.get("records_per_user")
        if g is None:
            raise DataError("release must record records_per_user for a user-level audit, got none.")
        if user_ids is None:
            user_ids = req.user_ids
        if user_ids is None and rel.request is None and "--user-ids" in (rel.command or "").split():
            raise UsageError("user ids must be given (--user-ids FILE.npy) to audit this release: it predates recorded requests and names "
                             "its user-ids file only in its command line, which is never parsed; got none.")
        t = UserHeadTarget(model=req.model, records_per_user=int(g), dataset=ds.get("name"), data_dir=data_dir,
                           epsilon=float(rel.target_epsilon or rel.epsilon), delta=float(rel.delta), canary=canary, seed=int(req.seed),
                           user_ids=user_ids, noise_multiplier=float(rel.noise_multiplier), epochs=cfg.get("epochs"), batch_size=cfg.get("batch_size"),
                           schedule=(float(rel.sample_rate), int(rel.steps), int(rel.normalizer)), profile=ds.get("profile"),
                           split_seed=ds.get("split_seed"), claimed=float(rel.epsilon), expected_sha256=ds.get("sha256"),
                           expected_user_ids_sha256=ds.get("user_ids_sha256"), expected_n_users=cfg.get("n_users"),
                           expected_identity=ds, event=_release_event(rel), accountant=rel.accountant)
    elif user_ids is not None:
        raise UsageError(f"user ids must only be given for a user-level release, got a {rel.privacy_unit}-level release of {mech}.")
    elif rel.privacy_unit != "record" and fam == "head":
        raise UsageError(f"release privacy unit must be record or user, got {rel.privacy_unit!r}.")
    elif fam == "head":
        from .heads import HeadTarget

        t = HeadTarget(model=req.model, dataset=ds.get("name"), data_dir=data_dir, epsilon=float(rel.target_epsilon or rel.epsilon),
                       delta=float(rel.delta), canary=canary, seed=int(req.seed), noise_multiplier=float(rel.noise_multiplier),
                       schedule=(float(rel.sample_rate), int(rel.steps), int(rel.normalizer)),
                       profile=ds.get("profile"), split_seed=ds.get("split_seed"), claimed=float(rel.epsilon),
                       expected_sha256=ds.get("sha256"), expected_identity=ds, event=_release_event(rel), accountant=rel.accountant)
    elif fam == "dp-elm":
        from .elm import ElmTarget

        _check_request_matches(req, rel, dataset=(req.dataset, ds.get("name")), seed=(req.seed, int(rel.seed)),
                               width=(req.width, cfg.get("width")), adjacency=(req.adjacency, rel.adjacency),
                               sampler=(req.sampler, cfg.get("sampler")))
        t = ElmTarget(dataset=ds.get("name"), data_dir=data_dir, width=int(req.width), epsilon=float(rel.epsilon), canary=canary,
                      seed=int(req.seed), sampler=req.sampler, adjacency=req.adjacency,
                      profile=ds.get("profile"), split_seed=ds.get("split_seed"), expected_sha256=ds.get("sha256"),
                      expected_identity=ds, accountant=rel.accountant)
        if t.claimed_event.to_dict() != rel.guarantee:  # the claim audited must be the release's own
            raise DataError(f"release guarantee must be {t.claimed_event.to_dict()} for a dp-elm release of epsilon {rel.epsilon}, got {rel.guarantee}.")
    elif fam == "dp-mixmin":
        from ..mechanisms.mixmin_pipeline import MixtureSettings
        from .mixmin import mixmin_task_target

        task = cfg.get("task")
        if not task or getattr(req, "proxy_predictions", None):
            raise DataError("release must record the mixmin task to be rebuilt, got none (bring-your-own proxy predictions cannot be re-run).")
        _check_request_matches(req, rel, task=(req.task, task), seed=(req.seed, int(rel.seed)), stage=(req.stage, cfg.get("stage")),
                               composition=(req.composition, cfg.get("composition")), privacy_unit=(req.privacy_unit, rel.privacy_unit))
        if rel.privacy_unit != "record":
            raise UsageError(f"release privacy unit must be record for the batched audit runner, got {rel.privacy_unit!r}.")
        whole_train = req.stage == "pipeline" and req.composition == "sequential"
        if not whole_train:
            # The audit rebuilds D_mix with today's keyed split; a release whose D_mix came from
            # another rule (an old permutation split, a caller-supplied split) would be audited on
            # other records than it was trained on, so refuse rather than audit the wrong thing.
            from ..mechanisms.mixmin_tasks import SPLIT_RULE

            rule = (cfg.get("split") or {}).get("rule")
            if rule != SPLIT_RULE:
                raise DataError(f"release's mixture split rule must be {SPLIT_RULE!r} to rebuild its D_mix, got {rule!r}.")
        # The resolved settings (task defaults filled in) are the release's own record of them.
        mc = cfg.get("mixmin_config") or {}
        settings = MixtureSettings(steps=int(mc.get("steps", rel.steps)), batch_size=int(round(float(mc.get("expected_batch_size", rel.normalizer)))),
                                   clipping_norm=float(mc.get("clipping_norm", rel.clipping_norm)),
                                   step_size=float(mc.get("step_size", cfg.get("step_size", 0.5))), loss=mc.get("loss", cfg.get("loss", "bce")))
        t = mixmin_task_target(task, cfg.get("target") or req.target, epsilon=float(rel.target_epsilon or rel.epsilon), delta=float(rel.delta),
                               rho=float(cfg.get("rho", 0.1)), canary=canary, seed=int(req.seed), data_dir=data_dir,
                               settings=settings, noise_multiplier=float(rel.noise_multiplier), proxy_mode=req.proxy_mode or "joint",
                               whole_train=whole_train, division=(rel.dataset or {}).get("split_seed"))
        for name in ("sample_rate", "steps"):
            got, want = getattr(t.config, name), getattr(rel, name)
            if want is not None and abs(float(got) - float(want)) > 1e-12:
                raise DataError(f"rebuilt {name} must equal the release's {want}, got {got}.")
        t.claimed_epsilon = float(rel.epsilon)  # the release's claim, under its own accountant
        # The claimed curve is the mixture step's event (the release's sigma, q, T, checked above);
        # its epsilon under the release's accountant is at most the release's claim (the whole
        # pipeline's, composed), so "eps_LB > claimed_epsilon" never overstates a violation.
        t.accountant = rel.accountant
    else:
        raise UsageError(f"release mechanism must be a trained model, got {mech!r}.")
    t.prepare()
    return t.without_noise() if no_noise else t


def _release_event(rel):
    """The event a release records as its guarantee (:func:`dpaudit.accounting.events.event_from_dict`)."""
    from ..accounting.events import event_from_dict

    return event_from_dict(rel.guarantee)


def _generic_from_release(entry, req, rel, *, canary, data_dir, no_noise) -> AuditTarget:
    """A contract mechanism's audit target for its release: the plan rebuilt from the recorded
    request must carry the release's guarantee (else the audit would test another mechanism)."""
    import dataclasses

    if data_dir is not None and "data_dir" in {f.name for f in dataclasses.fields(req)}:
        req = dataclasses.replace(req, data_dir=os.fspath(data_dir))  # where the auditor keeps the data
    canary = canary or entry.canaries[0]
    one_of("canary", canary, entry.canaries)
    mech = entry.mechanism()
    plan = _plan(mech, req)
    rebuilt = {"type": "non-private"} if plan.event is None else plan.event.to_dict()
    if rebuilt != rel.guarantee:
        raise DataError(f"rebuilt guarantee must equal the release's {rel.guarantee}, got {rebuilt}.")
    for key in ("name", "split_seed", "profile"):
        want, got = (rel.dataset or {}).get(key), (plan.dataset or {}).get(key)
        if want is not None and got != want:
            raise DataError(f"rebuilt dataset {key} must equal the release's {want!r}, got {got!r}.")
    t = mech.audit_target(plan, canary)
    t.prepare()
    return t.without_noise() if no_noise else t
