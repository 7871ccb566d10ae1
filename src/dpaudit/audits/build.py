"""Build an :class:`~dpaudit.audits.targets.AuditTarget` from a mechanism name or a release.

This is the library behind ``dpaudit audit MECHANISM ...`` (the CLI only parses): a Python user
gets the same target with :func:`build_target` or :func:`target_from_release`.
"""

from __future__ import annotations

import os

from ..errors import DataError, UsageError
from ..validation import one_of, open_unit, positive_finite, positive_int
from .canaries import SUPPORTED, check_canary
from .heads import HEAD_MODELS
from .targets import AuditTarget

#: MECHANISM names the CLI accepts (aliases map to the release's mechanism name).
ALIASES = {"mixmin": "dp-mixmin", "dp-mixmin": "dp-mixmin", "gaussian": "gaussian", "dp-elm": "dp-elm",
           **{m: m for m in HEAD_MODELS}}
MECHANISMS = tuple(ALIASES)
DEFAULT_EPSILON = {"dp-mixmin": 1.0, "gaussian": 1.0, "dp-elm": 2.0}
DEFAULT_TASK = "digits-mix"
#: Privacy units ``dpaudit audit --privacy-unit`` accepts (user: the DP-SGD head models only).
PRIVACY_UNITS = ("record", "user")


def family(mechanism: str) -> str:
    m = ALIASES[mechanism]
    return "head" if m in HEAD_MODELS else m


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


def target_from_release(release, *, canary: str | None = None, data_dir: str | os.PathLike | None = None,
                        no_noise: bool = False, mechanism: str | None = None, user_ids=None) -> AuditTarget:
    """The audit target reproducing the configuration recorded in a release (``Release`` or path).

    ``mechanism``, when given (the CLI's MECHANISM), must name the release's mechanism.

    A user-level head release (``privacy_unit`` user) gives a
    :class:`~dpaudit.audits.user_level.UserHeadTarget` (a canary user of the release's G records,
    adjacency ``add-remove-user``). Its users come from ``user_ids`` (array or ``.npy`` path), else
    from the ``--user-ids`` file named in the release's command, else from the public grouping of
    :func:`~dpaudit.audits.user_level.synthetic_user_ids`; whichever is used must give the
    release's users per partition (and, for an old release that published one, its user-id
    checksum), else :class:`~dpaudit.errors.DataError`.

    The noise multiplier, sampling and steps are taken from the release (not re-calibrated), the
    public seed and dataset identity too; the claim audited is the release's epsilon (under its
    own accountant). Data whose public identity (name, kind, profile, split seed, split sizes,
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
    fam = family(mech)
    canary = check_canary(fam, canary or SUPPORTED[fam][0])
    ds = rel.dataset or {}
    cfg = rel.config or {}
    if fam == "head" and rel.privacy_unit == "user":
        from .user_level import UserHeadTarget

        if rel.adjacency != "add-remove-user":
            raise DataError(f"a user-level release must have adjacency add-remove-user, got {rel.adjacency!r}.")
        g = cfg.get("records_per_user")
        if g is None:
            raise DataError("release must record records_per_user for a user-level audit, got none.")
        if user_ids is None:
            user_ids = _release_user_ids_path(rel)
        t = UserHeadTarget(model=mech, records_per_user=int(g), dataset=ds.get("name"), data_dir=data_dir,
                           epsilon=float(rel.target_epsilon or rel.epsilon), delta=float(rel.delta), canary=canary, seed=int(rel.seed),
                           user_ids=user_ids, noise_multiplier=float(rel.noise_multiplier), epochs=cfg.get("epochs"), batch_size=cfg.get("batch_size"),
                           schedule=(float(rel.sample_rate), int(rel.steps), int(rel.normalizer)), profile=ds.get("profile"),
                           split_seed=ds.get("split_seed"), claimed=float(rel.epsilon), expected_sha256=ds.get("sha256"),
                           expected_user_ids_sha256=ds.get("user_ids_sha256"), expected_n_users=cfg.get("n_users"),
                           expected_identity=ds)
    elif user_ids is not None:
        raise UsageError(f"user ids must only be given for a user-level release, got a {rel.privacy_unit}-level release of {mech}.")
    elif rel.privacy_unit != "record" and fam == "head":
        raise UsageError(f"release privacy unit must be record or user, got {rel.privacy_unit!r}.")
    elif fam == "head":
        from .heads import HeadTarget

        t = HeadTarget(model=mech, dataset=ds.get("name"), data_dir=data_dir, epsilon=float(rel.target_epsilon or rel.epsilon),
                       delta=float(rel.delta), canary=canary, seed=int(rel.seed), noise_multiplier=float(rel.noise_multiplier),
                       schedule=(float(rel.sample_rate), int(rel.steps), int(rel.normalizer)),
                       profile=ds.get("profile"), split_seed=ds.get("split_seed"), claimed=float(rel.epsilon),
                       expected_sha256=ds.get("sha256"), expected_identity=ds)
    elif fam == "dp-elm":
        from .elm import ElmTarget

        t = ElmTarget(dataset=ds.get("name"), data_dir=data_dir, width=int(cfg.get("width", 10)), epsilon=float(rel.epsilon), canary=canary,
                      seed=int(rel.seed), sampler=cfg.get("sampler", "discrete-laplace"), adjacency=rel.adjacency,
                      profile=ds.get("profile"), split_seed=ds.get("split_seed"), expected_sha256=ds.get("sha256"),
                      expected_identity=ds)
    elif fam == "dp-mixmin":
        from ..mechanisms.mixmin_pipeline import MixtureSettings
        from .mixmin import mixmin_task_target

        task = cfg.get("task")
        if not task:
            raise DataError("release must record the mixmin task to be rebuilt, got none (bring-your-own proxy predictions cannot be re-run).")
        if rel.privacy_unit != "record":
            raise UsageError(f"release privacy unit must be record for the batched audit runner, got {rel.privacy_unit!r}.")
        whole_train = cfg.get("stage") == "pipeline" and cfg.get("composition") == "sequential"
        if not whole_train:
            # The audit rebuilds D_mix with today's keyed split; a release whose D_mix came from
            # another rule (an old permutation split, a caller-supplied split) would be audited on
            # other records than it was trained on, so refuse rather than audit the wrong thing.
            from ..mechanisms.mixmin_tasks import SPLIT_RULE

            rule = (cfg.get("split") or {}).get("rule")
            if rule != SPLIT_RULE:
                raise DataError(f"release's mixture split rule must be {SPLIT_RULE!r} to rebuild its D_mix, got {rule!r}.")
        mc = cfg.get("mixmin_config") or {}
        settings = MixtureSettings(steps=int(mc.get("steps", rel.steps)), batch_size=int(round(float(mc.get("expected_batch_size", rel.normalizer)))),
                                   clipping_norm=float(mc.get("clipping_norm", rel.clipping_norm)),
                                   step_size=float(mc.get("step_size", cfg.get("step_size", 0.5))), loss=mc.get("loss", cfg.get("loss", "bce")))
        t = mixmin_task_target(task, cfg.get("target"), epsilon=float(rel.target_epsilon or rel.epsilon), delta=float(rel.delta),
                               rho=float(cfg.get("rho", 0.1)), canary=canary, seed=int(rel.seed), data_dir=data_dir,
                               settings=settings, noise_multiplier=float(rel.noise_multiplier), proxy_mode=cfg.get("proxy_mode") or "joint",
                               whole_train=whole_train)
        for name in ("sample_rate", "steps"):
            got, want = getattr(t.config, name), getattr(rel, name)
            if want is not None and abs(float(got) - float(want)) > 1e-12:
                raise DataError(f"rebuilt {name} must equal the release's {want}, got {got}.")
        t.claimed_epsilon = float(rel.epsilon)  # the release's claim, under its own accountant
    else:  # gaussian releases are not produced by dpaudit train
        raise UsageError(f"release mechanism must be a trained model, got {mech!r}.")
    t.prepare()
    return t.without_noise() if no_noise else t


def _release_user_ids_path(rel) -> str | None:
    """The ``--user-ids`` file named in a release's command line (None when there is none)."""
    import shlex

    try:
        argv = shlex.split(rel.command or "")
    except ValueError:
        return None
    for i, a in enumerate(argv):
        if a == "--user-ids" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--user-ids="):
            return a.split("=", 1)[1]
    return None
