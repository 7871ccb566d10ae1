"""Sweep specifications: a TOML grid of tasks (runner x model x dataset x epsilon x seed; format: docs/sweeps.md).

A ``train`` task is a catalogue name and a Request (:func:`task_request`). A task's identity is the SHA-256 of its full *public*
configuration (runner, model, dataset, epsilon, seed and every setting, canonical JSON); where results go, the data directory and
the executor are not part of it (docs/architecture.md, rule 4), so the same task run on a laptop or a cluster has the same key
and a resumed sweep skips it. Unknown setting names are refused: a typo in a privacy setting must never silently fall back to a default."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..catalogue import CATALOGUE, names as catalogue_names
from .. import data as registry
from ..errors import DataError, UsageError
from ..validation import non_negative_int, one_of, open_unit, positive_finite

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")

# Keys of a grid block and their accepted spellings.
_ALIASES = {
    "models": ("models", "model", "mechanism", "mechanisms"),
    "datasets": ("datasets", "dataset"),
    "epsilons": ("epsilons", "eps", "epsilon"),
    "seeds": ("seeds", "seed"),
    "profiles": ("profiles", "profile"),
}
_GRID_KEYS = tuple(a for names in _ALIASES.values() for a in names)
#: A profiles-axis value meaning "each dataset's own default profile" (no task setting).
DEFAULT_PROFILE = "default"
#: The runners a task can name (:data:`dpaudit.sweeps.tasks.RUNNERS` implements them).
RUNNER_NAMES = ("train", "selftest")
#: Settings of the ``train`` runner; each reaches a task's Request where the Request has that field (a DP-ELM task of a mixed
#: block ignores ``delta``, ``epochs`` and ``batch_size``).
TRAIN_SETTINGS = tuple(
    "delta reproducible_noise noise_source non_private epochs batch_size".split()
)
SELFTEST_MODELS = ("mean", "median")
SELFTEST_SETTINGS = TRAIN_SETTINGS[:4] + ("n", "sleep", "fail_seeds", "exit_once_marker")
#: Model names of specs written before sweeps named catalogue entries: ``dp-elm-L{w}`` is the catalogue's ``dp-elm`` at width w
#: (paper 001, sections 3.5 and 4.5). Read only by :func:`catalogue_request`; tasks keep the name, so their keys do not change.
LEGACY_MODELS = {f"dp-elm-L{w}": ("dp-elm", {"width": w}) for w in (1, 3, 5, 10)}
#: Request fields a ``train`` task fills from itself (every sweepable Request has the first three).
_TASK_FIELDS = ("dataset", "epsilon", "seed")


@dataclass(frozen=True)
class Task:
    """One unit of work of a sweep: a single training (or self-test) run. ``epsilon`` is ``None`` only for non-private tasks
    (``settings["non_private"]`` true). ``settings`` is a sorted tuple of ``(name, value)`` pairs so the task is hashable."""

    runner: str
    model: str
    dataset: str
    epsilon: float | None
    seed: int
    settings: tuple = ()

    def config(self) -> dict:
        """The full public configuration; its canonical JSON is hashed into :attr:`key`."""
        return {**asdict(self), "settings": dict(self.settings)}

    @property
    def key(self) -> str:
        return config_key(self.config())


def canonical_json(obj) -> str:
    """Deterministic JSON (sorted keys, no whitespace) used for hashing configurations."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_key(config: dict) -> str:
    """SHA-256 hex digest of the canonical JSON of a public task configuration."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


# ---------------------------------------------------------------- a train task as catalogue name + Request


def catalogue_request(model: str) -> tuple[str, dict]:
    """(catalogue name, fixed Request fields) of a sweep model name (the one legacy-name reader)."""
    return LEGACY_MODELS.get(model, (model, {}))


def request_type(model: str) -> type | None:
    """The Request type of a ``train`` task of ``model``; None when the model is not sweepable (not in the catalogue, audit-only,
    or its Request takes no dataset, epsilon and seed)."""
    entry = CATALOGUE.get(catalogue_request(model)[0])
    if entry is None or entry.audit_only:
        return None
    rtype = entry.request_type()
    return rtype if set(_TASK_FIELDS) <= {f.name for f in fields(rtype)} else None


def train_models() -> tuple[str, ...]:
    """Every model name the ``train`` runner accepts: sweepable catalogue names, then the legacy ones."""
    return tuple(n for n in catalogue_names(trainable=True) if request_type(n) is not None) + tuple(
        LEGACY_MODELS
    )


def task_request(config: dict, data_dir: str | None = None):
    """(catalogue name, Request) of a ``train`` task's public configuration. The task's dataset, seed and epsilon (1.0, ignored,
    for a non-private task), the settings its Request has a field for, the legacy name's fixed fields and the catalogue name in
    the Request's positional field (a DP-SGD model name). ``data_dir`` is where the data are read."""
    name, fixed = catalogue_request(config["model"])
    rtype = request_type(config["model"])
    if rtype is None:
        raise UsageError(
            f"model must be one of {', '.join(train_models())}, got {config['model']!r}."
        )
    non_private = bool(config["settings"].get("non_private", False)) or config["epsilon"] is None
    values = {
        **config["settings"],
        **fixed,
        **{k: config[k] for k in ("dataset", "seed") if k in config},
        "data_dir": data_dir,
        "epsilon": 1.0 if non_private else config["epsilon"],
        "non_private": non_private,
    }
    values.update({f.name: name for f in fields(rtype) if f.metadata.get("positional")})
    taken = {f.name: values[f.name] for f in rtype.option_fields() if f.name in values}
    return name, rtype.from_dict(taken)


# ---------------------------------------------------------------- grids


@dataclass(frozen=True)
class GridBlock:
    models: tuple[str, ...]
    datasets: tuple[str, ...]
    epsilons: tuple[float | None, ...]
    seeds: tuple[int, ...]
    settings: tuple = ()
    #: Profiles axis: None = the dataset's default profile (no task setting); else a profile name.
    profiles: tuple[str | None, ...] = (None,)

    def to_dict(self) -> dict:
        d = {
            axis: list(getattr(self, axis)) for axis in ("models", "datasets", "epsilons", "seeds")
        }
        d["settings"] = dict(self.settings)
        # only a grid with a profiles axis says so (older specs read back unchanged)
        if self.profiles != (None,):
            d["profiles"] = [p or DEFAULT_PROFILE for p in self.profiles]
        return d


@dataclass(frozen=True)
class SweepSpec:
    """A named grid of tasks. ``blocks`` are expanded in order; duplicates are dropped."""

    name: str
    runner: str = "train"
    blocks: tuple[GridBlock, ...] = ()
    description: str = ""
    source: str = ""  # where the spec came from (file path or "builtin:NAME")

    def tasks(self) -> list[Task]:
        out: dict[str, Task] = {}
        for b in self.blocks:
            for dataset, profile in itertools.product(b.datasets, b.profiles):
                prof = profile_setting(dataset, profile) if self.runner == "train" else None
                settings = b.settings
                if prof is not None:
                    settings = _settings_tuple({**dict(settings), "profile": prof})
                for m, e, s in itertools.product(b.models, b.epsilons, b.seeds):
                    t = Task(self.runner, m, dataset, e, s, settings)
                    out.setdefault(t.key, t)
        return list(out.values())

    def to_dict(self) -> dict:
        described = {k: getattr(self, k) for k in ("name", "runner", "description", "source")}
        return {**described, "grid": [b.to_dict() for b in self.blocks]}


@dataclass(frozen=True)
class TaskFilter:
    """Run only a slice of a spec (e.g. ``--dataset heart --eps 2``); keys stay those of the full grid."""

    models: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    epsilons: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()

    def __call__(self, task: Task) -> bool:
        if self.epsilons and (
            task.epsilon is None or not any(math.isclose(task.epsilon, e) for e in self.epsilons)
        ):
            return False
        return all(
            not wanted or value in wanted
            for wanted, value in (
                (self.models, task.model),
                (self.datasets, task.dataset),
                (self.seeds, task.seed),
            )
        )


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UsageError(
            f"sweep name must be 1-80 characters of letters, digits, '.', '_' or '-' starting with a letter or digit, got {name!r}."
        )
    return name


def _one_of(what: str, values: list[str], allowed: tuple[str, ...]) -> None:
    for value in values:
        one_of(what, value, allowed)


def validate_block(
    runner: str, models: list[str], datasets: list[str], settings: dict, where: str
) -> None:
    """Runner-specific checks of a grid block, done when the spec is read (before anything runs)."""
    train = runner == "train"
    _one_of(f"{where} model", models, train_models() if train else SELFTEST_MODELS)
    if train:
        _one_of(f"{where} dataset", datasets, registry.DATASET_NAMES)
    elif any(d != "synthetic" for d in datasets):
        raise UsageError(
            f"{where} dataset must be synthetic for the selftest runner, got {', '.join(datasets)}."
        )
    allowed = TRAIN_SETTINGS if train else SELFTEST_SETTINGS
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise UsageError(
            f"{where} settings must be among {', '.join(allowed)}, got {', '.join(unknown)}."
        )
    if "delta" in settings:
        open_unit("delta", settings["delta"])


def profile_setting(dataset: str, profile: str | None, where: str = "sweep") -> str | None:
    """The ``profile`` task setting for ``dataset`` under a profiles-axis value. None for ``None``, ``"default"`` and the
    dataset's own default profile (such a task has no profile setting, so its key is that of a grid without the axis); else the
    profile name, which the dataset must offer (:class:`UsageError` naming the allowed ones otherwise)."""
    if profile is None or profile == DEFAULT_PROFILE:
        return None
    info = registry.dataset_info(dataset)
    if profile == info.default_profile:
        return None
    return one_of(
        f"{where} profile for dataset {dataset}", profile, (DEFAULT_PROFILE, *info.profiles)
    )


def _refuse_extra(table: dict, known: set, what: str, listed: str) -> None:
    extra = set(table) - known
    if extra:
        raise UsageError(f"{what} must be among {listed}, got {', '.join(sorted(extra))}.")


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _pick(table: dict, field_name: str, where: str):
    names = [a for a in _ALIASES[field_name] if a in table]
    if len(names) > 1:
        raise UsageError(f"{where} must give {field_name} once, got the keys {', '.join(names)}.")
    return table[names[0]] if names else None


def _settings(raw, where: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UsageError(f"{where} settings must be a table of name = value, got {raw!r}.")
    for k, v in raw.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise UsageError(f"{where} setting {k} must be finite, got {v!r}.")
        if isinstance(v, dict):
            raise UsageError(
                f"{where} setting {k} must be a number, string, boolean or list, got a table."
            )
    return dict(raw)


def _epsilons(epsilons, non_private: bool, where: str) -> list[float | None]:
    if non_private:
        if epsilons not in (None, [], ()):
            raise UsageError(
                f"{where} epsilons must be omitted for non_private = true, got {epsilons!r}."
            )
        return [None]
    if epsilons is None:
        raise UsageError(f"{where} must list epsilons (or set non_private = true), got none.")
    return [positive_finite("epsilon", e) for e in _as_list(epsilons)]


def _block(table: dict, base_settings: dict, runner: str, where: str) -> GridBlock:
    axes = {k: _pick(table, k, where) for k in _ALIASES}
    settings = {**base_settings, **_settings(table.get("settings"), where)}
    _refuse_extra(
        table,
        {*_GRID_KEYS, "settings"},
        f"{where} keys",
        "models, datasets, epsilons, seeds, profiles, settings",
    )
    if None in (axes["models"], axes["datasets"], axes["seeds"]):
        raise UsageError(
            f"{where} must list models, datasets and seeds, got keys {', '.join(sorted(table)) or 'none'}."
        )
    values = {
        "models": [str(m) for m in _as_list(axes["models"])],
        "datasets": [str(d) for d in _as_list(axes["datasets"])],
        "epsilons": _epsilons(axes["epsilons"], bool(settings.get("non_private", False)), where),
        "seeds": [non_negative_int("seed", s) for s in _as_list(axes["seeds"])],
    }
    for name, vals in values.items():
        if not vals:
            raise UsageError(f"{where} {name} must not be empty, got [].")
    validate_block(runner, values["models"], values["datasets"], settings, where)
    values["profiles"] = _profiles(runner, values["datasets"], axes["profiles"], where)
    return GridBlock(
        settings=_settings_tuple(settings),
        **{k: tuple(dict.fromkeys(v)) for k, v in values.items()},
    )


def _profiles(runner: str, datasets: list[str], profiles, where: str) -> list[str | None]:
    """The profiles axis of a block: None for ``"default"``; every other name must be offered by every dataset of the block
    (checked now, before anything runs)."""
    out = [None] if profiles is None else _profile_values(profiles, where)
    named = [p for p in out if p is not None]
    if runner != "train" and named:
        raise UsageError(
            f'{where} profiles must be ["default"] for the {runner} runner (it reads no dataset), '
            f"got {[p or DEFAULT_PROFILE for p in out]!r}."
        )
    for p, d in itertools.product(named, datasets):
        profile_setting(d, p, where)
    return out


def _profile_values(profiles, where: str) -> list[str | None]:
    values = _as_list(profiles)
    if not values or any(not isinstance(p, str) for p in values):
        raise UsageError(
            f"{where} profiles must be a non-empty list of profile names, got {profiles!r}."
        )
    return [None if p == DEFAULT_PROFILE else p for p in values]


def with_profile(spec: SweepSpec, profile: str | None) -> SweepSpec:
    """``spec`` with every block's profiles axis replaced by the single ``profile``. ``None`` or ``"default"`` returns ``spec``
    unchanged (its task keys stay those of the spec). Another profile renames the sweep ``NAME-PROFILE`` (its own store folder and
    ledger tag) and must be offered by every dataset of the spec, else a :class:`UsageError`."""
    if profile is None or profile == DEFAULT_PROFILE:
        return spec
    if not isinstance(profile, str) or not _NAME_RE.match(profile):
        raise UsageError(f"profile must be a profile name such as authors, got {profile!r}.")
    blocks = tuple(
        replace(
            b,
            profiles=tuple(
                _profiles(spec.runner, list(b.datasets), [profile], f"grid block {i + 1}")
            ),
        )
        for i, b in enumerate(spec.blocks)
    )
    return replace(
        spec,
        name=validate_name(f"{spec.name}-{profile}"),
        blocks=blocks,
        description=f"{spec.description} Preprocessing profile: {profile}.".strip(),
        source=f"{spec.source} --profile {profile}".strip(),
    )


def _settings_tuple(settings: dict) -> tuple:
    """Sorted (name, value) pairs with lists turned into tuples, so a Task stays hashable."""
    return tuple(
        sorted(
            ((k, tuple(v) if isinstance(v, list) else v) for k, v in settings.items()),
            key=lambda kv: kv[0],
        )
    )


def _grid_tables(data: dict) -> list[dict]:
    """The grid blocks of a spec: its ``[[grid]]`` tables, or one table of its top-level grid keys."""
    grid = data.get("grid")
    top_level = [a for a in _GRID_KEYS if a in data]
    if grid is not None and top_level:
        raise UsageError(
            f"sweep spec must use either [[grid]] blocks or top-level grid keys, got both ({', '.join(top_level)})."
        )
    _refuse_extra(
        data,
        {"name", "runner", "description", "settings", "fixed", "grid", *top_level},
        "sweep spec top-level keys",
        "name, runner, description, settings, grid",
    )
    if grid is None:
        return [{k: data[k] for k in top_level}]
    if isinstance(grid, list) and {isinstance(g, dict) for g in grid} == {True}:  # none empty
        return grid
    raise UsageError(f"grid must be a non-empty array of tables ([[grid]]), got {grid!r}.")


def spec_from_dict(data: dict, *, source: str = "", default_name: str | None = None) -> SweepSpec:
    """Build and validate a :class:`SweepSpec` from a parsed TOML document."""
    if not isinstance(data, dict):
        raise UsageError(f"sweep spec must be a table, got {type(data).__name__}.")
    name = validate_name(data.get("name", default_name))
    runner = data.get("runner", "train")
    one_of("runner", runner, sorted(RUNNER_NAMES))
    fixed_names = [k for k in ("settings", "fixed") if k in data]
    if len(fixed_names) > 1:
        raise UsageError(
            "sweep spec must give its fixed settings once, got both [settings] and [fixed]."
        )
    base = _settings(data.get(fixed_names[0]) if fixed_names else None, "spec")
    blocks = tuple(
        _block(t, base, runner, f"grid block {i + 1}") for i, t in enumerate(_grid_tables(data))
    )
    return SweepSpec(
        name=name,
        runner=runner,
        blocks=blocks,
        description=str(data.get("description", "")),
        source=source,
    )


def load_spec(path: str | Path) -> SweepSpec:
    """Read a TOML sweep spec; the sweep name defaults to the file's stem."""
    p = Path(path)
    try:
        text = p.read_bytes().decode()  # as tomllib.load reads a file
    except FileNotFoundError:
        raise DataError(f"sweep spec not found: {p}.") from None
    except OSError as e:
        raise DataError(f"cannot read sweep spec {p}: {e.strerror}.") from None
    return parse_spec(text, source=str(p), default_name=p.stem)


def parse_spec(
    text: str, *, source: str = "<string>", default_name: str | None = None
) -> SweepSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DataError(f"sweep spec {source} is not valid TOML: {e}.") from None
    return spec_from_dict(data, source=source, default_name=default_name)


# ---- Built-in specs

#: The five frozen-feature and logistic models of the DP-RVFL study (paper 001, section 3).
FROZEN_AND_LOGISTIC = tuple(
    "dp-rvfl dp-elm-sgd frozen-dense-matched logistic-raw logistic-projected".split()
)
#: Models with a trainable representation; the primary grid runs them at eps = 2 only.
TRAINABLE = ("dp-dense", "dp-cnn", "dp-attention")
#: Private target budgets of the primary design (paper 001, section 4.1).
PRIMARY_EPSILONS = (0.1, 0.5, 1.0, 2.0, 4.0, 8.0)
PRIMARY_SEEDS = (42, 43, 44, 45, 46)
PRIMARY_DATASETS = ("mnist", "cifar10", "cardio", "heart")
#: The attention control is defined for images only (paper 001, section 3.6).
IMAGE_DATASETS = ("mnist", "cifar10")
#: The seven gradient-trained architectures of the primary suite (paper 001, section 4.1).
GRADIENT_PRIMARY = FROZEN_AND_LOGISTIC + TRAINABLE[:2]
#: The four closed-form Laplace DP-ELM widths L in {1, 3, 5, 10} (paper 001, sections 3.5 and 4.5).
DP_ELM_PRIMARY = tuple(LEGACY_MODELS)


def _grid(models, datasets, epsilons=None, seeds=PRIMARY_SEEDS, **settings) -> dict:
    return {
        "models": list(models),
        "datasets": list(datasets),
        "seeds": list(seeds),
        **({} if epsilons is None else {"epsilons": list(epsilons)}),
        **({"settings": settings} if settings else {}),
    }


# Read by spec_from_dict like a TOML file. The descriptions are stored with every store: keep them verbatim.
_BUILTINS = {
    "dp-rvfl-primary": {
        "description": "DP-RVFL primary grid (paper 001, sections 4.1-4.3): the five frozen-feature and logistic models at six budgets, "
        "Dense and CNN at eps = 2, attention at eps = 2 on the image datasets, seeds 42-46, delta = 1e-5; datasets without "
        "local files (CIFAR-10 here) are skipped and reported.",
        "settings": {"delta": 1e-5},
        "grid": [
            _grid(FROZEN_AND_LOGISTIC, PRIMARY_DATASETS, PRIMARY_EPSILONS),
            _grid(TRAINABLE[:2], PRIMARY_DATASETS, [2.0]),
            _grid(["dp-attention"], IMAGE_DATASETS, [2.0]),
        ],
    },
    # The paper's full primary suite, "1540 primary tasks" (paper 001, sections 4.1-4.3): (7 gradient models + 4 DP-ELM widths) x
    # 4 datasets x (6 budgets + non-private) x 5 seeds. The private gradient tasks carry exactly the settings of dp-rvfl-primary
    # (delta = 1e-5), so a task present in both grids has the same key. DP-ELM tasks carry no delta: the mechanism is pure
    # epsilon-DP (delta = 0; section 4.1) and its release says so.
    "dp-rvfl-primary-full": {
        "description": "DP-RVFL full primary suite (paper 001, sections 4.1-4.3, the 1540 primary tasks): the seven gradient-trained models "
        "(DP-RVFL, DP-ELM-SGD, FrozenDenseMatched, LogisticRaw, LogisticProjected, Dense, CNN; DP-SGD, delta = 1e-5) and the "
        "closed-form Laplace DP-ELM at widths L = 1, 3, 5, 10 (pure eps-DP, delta = 0), each at eps in {0.1, 0.5, 1, 2, 4, 8} "
        "and non-private, seeds 42-46, on MNIST, CIFAR-10, Cardio and Heart. Meant for a cluster (--executor dask); datasets "
        "without local files (CIFAR-10 here) are skipped and reported.",
        "grid": [
            _grid(GRADIENT_PRIMARY, PRIMARY_DATASETS, PRIMARY_EPSILONS, delta=1e-5),
            _grid(GRADIENT_PRIMARY, PRIMARY_DATASETS, non_private=True),
            _grid(DP_ELM_PRIMARY, PRIMARY_DATASETS, PRIMARY_EPSILONS),
            _grid(DP_ELM_PRIMARY, PRIMARY_DATASETS, non_private=True),
        ],
    },
    "selftest": {
        "runner": "selftest",
        "description": "A tiny grid of synthetic Gaussian-mechanism tasks (no data, about a second each): checks an executor or a cluster end to end.",
        "settings": {"delta": 1e-5, "reproducible_noise": True},
        "grid": [_grid(["mean", "median"], ["synthetic"], [1.0, 2.0], [42, 43, 44])],
    },
}

BUILTIN_SPECS = tuple(_BUILTINS)


def builtin_spec(name: str) -> SweepSpec:
    one_of("builtin", name, BUILTIN_SPECS)
    return spec_from_dict(
        {"name": name, "runner": "train", **_BUILTINS[name]}, source=f"builtin:{name}"
    )
