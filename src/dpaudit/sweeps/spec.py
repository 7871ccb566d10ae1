"""Sweep specifications: a TOML grid of tasks (runner x model x dataset x epsilon x seed).

A spec is read with the standard library's :mod:`tomllib`. Two layouts are accepted::

    # one grid
    name = "heart-eps2"
    models = ["dp-rvfl", "logistic-raw"]     # alias: model, mechanism, mechanisms
    datasets = ["heart"]                     # alias: dataset
    epsilons = [2.0]                         # alias: eps
    seeds = [42, 43, 44, 45, 46]             # alias: seed
    profiles = ["default", "authors"]        # alias: profile; optional (default: ["default"])
    [settings]                               # alias: fixed; applied to every task
    delta = 1e-5
    reproducible_noise = true

    # several grid blocks (e.g. the DP-RVFL primary grid: five models at six budgets plus
    # three models at eps = 2 only), each may override settings
    name = "my-grid"
    [settings]
    delta = 1e-5
    [[grid]]
    models = ["dp-rvfl"]
    datasets = ["heart"]
    epsilons = [0.5, 2]
    seeds = [42, 43]
    [[grid]]
    models = ["dp-cnn"]
    datasets = ["heart"]
    epsilons = [2]
    seeds = [42, 43]
    settings = { epochs = 30 }

A task's identity is the SHA-256 of its full *public* configuration (runner, model, dataset,
epsilon, seed and every fixed setting, canonical JSON); where the results are written, the data
directory and the executor are not part of it (docs/architecture.md, rule 4: speed settings never change a
privacy-relevant field), so the same task run on a laptop or a cluster has the same key and a
resumed sweep skips it. Unknown setting names are refused rather than ignored: a typo in a
privacy setting must never silently fall back to a default.

Preprocessing profiles are a grid axis (``profiles``, train runner only): ``"default"`` is each
dataset's own default profile and adds nothing to a task (so the keys of every grid written
before the axis existed are unchanged); any other profile (e.g. ``"authors"``, the DP-RVFL
authors' pipeline, :mod:`dpaudit.data.authors`) is stored as the task setting ``profile`` and
so gives a different key. :func:`with_profile` moves a whole spec (e.g. a built-in grid) to one
profile: ``dpaudit sweep --builtin dp-rvfl-primary --profile authors`` runs the sweep
``dp-rvfl-primary-authors``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError, UsageError
from ..validation import non_negative_int, positive_finite

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")

# Keys of a grid block and their accepted spellings.
_ALIASES = {
    "models": ("models", "model", "mechanism", "mechanisms"),
    "datasets": ("datasets", "dataset"),
    "epsilons": ("epsilons", "eps", "epsilon"),
    "seeds": ("seeds", "seed"),
    "profiles": ("profiles", "profile"),
}
#: A profiles-axis value meaning "each dataset's own default profile" (no task setting).
DEFAULT_PROFILE = "default"


@dataclass(frozen=True)
class Task:
    """One unit of work of a sweep: a single training (or self-test) run.

    ``epsilon`` is ``None`` only for non-private tasks (``settings["non_private"]`` true).
    ``settings`` is a sorted tuple of ``(name, value)`` pairs so the task is hashable.
    """

    runner: str
    model: str
    dataset: str
    epsilon: float | None
    seed: int
    settings: tuple = ()

    def config(self) -> dict:
        """The full public configuration; its canonical JSON is hashed into :attr:`key`."""
        return {
            "runner": self.runner,
            "model": self.model,
            "dataset": self.dataset,
            "epsilon": self.epsilon,
            "seed": self.seed,
            "settings": dict(self.settings),
        }

    @property
    def key(self) -> str:
        return config_key(self.config())

    @classmethod
    def from_config(cls, config: dict) -> "Task":
        return cls(
            runner=config["runner"], model=config["model"], dataset=config["dataset"],
            epsilon=config["epsilon"], seed=int(config["seed"]),
            settings=_settings_tuple(config.get("settings", {})),
        )


def canonical_json(obj) -> str:
    """Deterministic JSON (sorted keys, no whitespace) used for hashing configurations."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_key(config: dict) -> str:
    """SHA-256 hex digest of the canonical JSON of a public task configuration."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


@dataclass(frozen=True)
class GridBlock:
    models: tuple[str, ...]
    datasets: tuple[str, ...]
    epsilons: tuple[float | None, ...]
    seeds: tuple[int, ...]
    settings: tuple = ()
    #: Profiles axis: None = the dataset's default profile (no task setting); else a profile name.
    profiles: tuple[str | None, ...] = (None,)


@dataclass(frozen=True)
class SweepSpec:
    """A named grid of tasks. ``blocks`` are expanded in order; duplicates are dropped."""

    name: str
    runner: str = "train"
    blocks: tuple[GridBlock, ...] = ()
    description: str = ""
    source: str = ""  # where the spec came from (file path or "builtin:NAME")

    def tasks(self) -> list[Task]:
        from .tasks import profile_setting

        seen: set[str] = set()
        out: list[Task] = []
        for b in self.blocks:
            for dataset in b.datasets:
                for profile in b.profiles:
                    # The dataset's own default adds no setting, so such a task keeps its key.
                    prof = profile_setting(dataset, profile) if self.runner == "train" else None
                    settings = b.settings if prof is None else _settings_tuple({**dict(b.settings), "profile": prof})
                    for model in b.models:
                        for eps in b.epsilons:
                            for seed in b.seeds:
                                t = Task(self.runner, model, dataset, eps, seed, settings)
                                k = t.key
                                if k not in seen:
                                    seen.add(k)
                                    out.append(t)
        return out

    @property
    def datasets(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for b in self.blocks:
            for d in b.datasets:
                seen.setdefault(d)
        return tuple(seen)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "runner": self.runner,
            "description": self.description,
            "source": self.source,
            "grid": [
                {
                    "models": list(b.models), "datasets": list(b.datasets),
                    "epsilons": list(b.epsilons), "seeds": list(b.seeds), "settings": dict(b.settings),
                    # only a grid with a profiles axis says so (older specs read back unchanged)
                    **({} if b.profiles == (None,) else {"profiles": [p or DEFAULT_PROFILE for p in b.profiles]}),
                }
                for b in self.blocks
            ],
        }


@dataclass(frozen=True)
class TaskFilter:
    """Run only a slice of a spec (e.g. ``--dataset heart --eps 2``); keys stay those of the full grid."""

    models: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    epsilons: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()

    def __call__(self, task: Task) -> bool:
        if self.models and task.model not in self.models:
            return False
        if self.datasets and task.dataset not in self.datasets:
            return False
        if self.epsilons and (task.epsilon is None or not any(math.isclose(task.epsilon, e) for e in self.epsilons)):
            return False
        if self.seeds and task.seed not in self.seeds:
            return False
        return True

    def is_empty(self) -> bool:
        return not (self.models or self.datasets or self.epsilons or self.seeds)


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UsageError(
            f"sweep name must be 1-80 characters of letters, digits, '.', '_' or '-' starting with a letter or digit, got {name!r}."
        )
    return name


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
            raise UsageError(f"{where} setting {k} must be a number, string, boolean or list, got a table.")
    return dict(raw)


def _block(table: dict, base_settings: dict, runner: str, where: str) -> GridBlock:
    from .tasks import validate_block  # runner-specific checks (models, setting names)

    models = _pick(table, "models", where)
    datasets = _pick(table, "datasets", where)
    epsilons = _pick(table, "epsilons", where)
    seeds = _pick(table, "seeds", where)
    profiles = _pick(table, "profiles", where)
    settings = {**base_settings, **_settings(table.get("settings"), where)}
    extra = set(table) - {a for names in _ALIASES.values() for a in names} - {"settings"}
    if extra:
        raise UsageError(f"{where} keys must be among models, datasets, epsilons, seeds, profiles, settings, got {', '.join(sorted(extra))}.")
    if models is None or datasets is None or seeds is None:
        raise UsageError(f"{where} must list models, datasets and seeds, got keys {', '.join(sorted(table)) or 'none'}.")
    models_l = [str(m) for m in _as_list(models)]
    datasets_l = [str(d) for d in _as_list(datasets)]
    seeds_l = [non_negative_int("seed", s) for s in _as_list(seeds)]
    non_private = bool(settings.get("non_private", False))
    if non_private:
        if epsilons not in (None, [], ()):
            raise UsageError(f"{where} epsilons must be omitted for non_private = true, got {epsilons!r}.")
        eps_l: list[float | None] = [None]
    else:
        if epsilons is None:
            raise UsageError(f"{where} must list epsilons (or set non_private = true), got none.")
        eps_l = [positive_finite("epsilon", e) for e in _as_list(epsilons)]
    for name, values in (("models", models_l), ("datasets", datasets_l), ("epsilons", eps_l), ("seeds", seeds_l)):
        if not values:
            raise UsageError(f"{where} {name} must not be empty, got [].")
    validate_block(runner, models_l, datasets_l, settings, where)
    profiles_l = _profiles(runner, datasets_l, profiles, where)
    return GridBlock(
        models=tuple(dict.fromkeys(models_l)), datasets=tuple(dict.fromkeys(datasets_l)),
        epsilons=tuple(dict.fromkeys(eps_l)), seeds=tuple(dict.fromkeys(seeds_l)),
        settings=_settings_tuple(settings), profiles=tuple(dict.fromkeys(profiles_l)),
    )


def _profiles(runner: str, datasets: list[str], profiles, where: str) -> list[str | None]:
    """The profiles axis of a block: None for ``"default"``; every other name must be offered by
    every dataset of the block (checked now, before anything runs)."""
    from .tasks import profile_setting

    if profiles is None:
        return [None]
    values = _as_list(profiles)
    if not values or not all(isinstance(p, str) for p in values):
        raise UsageError(f"{where} profiles must be a non-empty list of profile names, got {profiles!r}.")
    out = [None if p == DEFAULT_PROFILE else p for p in values]
    if runner != "train" and any(p is not None for p in out):
        raise UsageError(f"{where} profiles must be [\"default\"] for the {runner} runner (it reads no dataset), got {values!r}.")
    for p in out:
        if p is not None:
            for d in datasets:
                profile_setting(d, p, where)
    return out


def with_profile(spec: SweepSpec, profile: str | None) -> SweepSpec:
    """``spec`` with every block's profiles axis replaced by the single ``profile``.

    ``None`` or ``"default"`` returns ``spec`` unchanged (its task keys stay those of the spec).
    Another profile renames the sweep ``NAME-PROFILE`` (its own store folder and ledger tag) and
    must be offered by every dataset of the spec, else a :class:`UsageError`.
    """
    if profile is None or profile == DEFAULT_PROFILE:
        return spec
    if not isinstance(profile, str) or not _NAME_RE.match(profile):
        raise UsageError(f"profile must be a profile name such as authors, got {profile!r}.")
    blocks = tuple(
        GridBlock(b.models, b.datasets, b.epsilons, b.seeds, b.settings,
                  profiles=tuple(_profiles(spec.runner, list(b.datasets), [profile], f"grid block {i + 1}")))
        for i, b in enumerate(spec.blocks)
    )
    return SweepSpec(name=validate_name(f"{spec.name}-{profile}"), runner=spec.runner, blocks=blocks,
                     description=f"{spec.description} Preprocessing profile: {profile}.".strip(),
                     source=f"{spec.source} --profile {profile}".strip())


def _settings_tuple(settings: dict) -> tuple:
    """Sorted (name, value) pairs with lists turned into tuples, so a Task stays hashable."""
    return tuple(sorted(((k, tuple(v) if isinstance(v, list) else v) for k, v in settings.items()), key=lambda kv: kv[0]))


def spec_from_dict(data: dict, *, source: str = "", default_name: str | None = None) -> SweepSpec:
    """Build and validate a :class:`SweepSpec` from a parsed TOML document."""
    from .tasks import RUNNERS

    if not isinstance(data, dict):
        raise UsageError(f"sweep spec must be a table, got {type(data).__name__}.")
    name = validate_name(data.get("name", default_name))
    runner = data.get("runner", "train")
    if runner not in RUNNERS:
        raise UsageError(f"runner must be one of {', '.join(sorted(RUNNERS))}, got {runner!r}.")
    fixed_names = [k for k in ("settings", "fixed") if k in data]
    if len(fixed_names) > 1:
        raise UsageError("sweep spec must give its fixed settings once, got both [settings] and [fixed].")
    base = _settings(data.get(fixed_names[0]) if fixed_names else None, "spec")
    grid = data.get("grid")
    top_level = [a for names in _ALIASES.values() for a in names if a in data]
    if grid is not None and top_level:
        raise UsageError(f"sweep spec must use either [[grid]] blocks or top-level grid keys, got both ({', '.join(top_level)}).")
    if grid is None:
        tables = [{k: data[k] for k in top_level}]
    elif isinstance(grid, list) and grid and all(isinstance(g, dict) for g in grid):
        tables = grid
    else:
        raise UsageError(f"grid must be a non-empty array of tables ([[grid]]), got {grid!r}.")
    known_top = {"name", "runner", "description", "settings", "fixed", "grid", *top_level}
    extra = set(data) - known_top
    if extra:
        raise UsageError(f"sweep spec top-level keys must be among name, runner, description, settings, grid, got {', '.join(sorted(extra))}.")
    blocks = tuple(_block(t, base, runner, f"grid block {i + 1}") for i, t in enumerate(tables))
    return SweepSpec(name=name, runner=runner, blocks=blocks, description=str(data.get("description", "")), source=source)


def load_spec(path: str | Path) -> SweepSpec:
    """Read a TOML sweep spec; the sweep name defaults to the file's stem."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise DataError(f"sweep spec not found: {p}.") from None
    except tomllib.TOMLDecodeError as e:
        raise DataError(f"sweep spec {p} is not valid TOML: {e}.") from None
    except OSError as e:
        raise DataError(f"cannot read sweep spec {p}: {e.strerror}.") from None
    return spec_from_dict(data, source=str(p), default_name=p.stem)


def parse_spec(text: str, *, source: str = "<string>") -> SweepSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DataError(f"sweep spec {source} is not valid TOML: {e}.") from None
    return spec_from_dict(data, source=source)


# --------------------------------------------------------------------------------------------
# Built-in specs
# --------------------------------------------------------------------------------------------

#: The five frozen-feature and logistic models of the DP-RVFL study (paper 001, section 3).
FROZEN_AND_LOGISTIC = ("dp-rvfl", "dp-elm-sgd", "frozen-dense-matched", "logistic-raw", "logistic-projected")
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
DP_ELM_PRIMARY = ("dp-elm-L1", "dp-elm-L3", "dp-elm-L5", "dp-elm-L10")

_BUILTIN_TOML = {
    "dp-rvfl-primary": f"""
name = "dp-rvfl-primary"
runner = "train"
description = "DP-RVFL primary grid (paper 001, sections 4.1-4.3): the five frozen-feature and logistic models at six budgets, Dense and CNN at eps = 2, attention at eps = 2 on the image datasets, seeds 42-46, delta = 1e-5; datasets without local files (CIFAR-10 here) are skipped and reported."
[settings]
delta = 1e-5
[[grid]]
models = {list(FROZEN_AND_LOGISTIC)!r}
datasets = {list(PRIMARY_DATASETS)!r}
epsilons = {list(PRIMARY_EPSILONS)!r}
seeds = {list(PRIMARY_SEEDS)!r}
[[grid]]
models = {list(TRAINABLE[:2])!r}
datasets = {list(PRIMARY_DATASETS)!r}
epsilons = [2.0]
seeds = {list(PRIMARY_SEEDS)!r}
[[grid]]
models = ["dp-attention"]
datasets = {list(IMAGE_DATASETS)!r}
epsilons = [2.0]
seeds = {list(PRIMARY_SEEDS)!r}
""",
    # The paper's full primary suite, "1540 primary tasks" (paper 001, sections 4.1-4.3):
    # (7 gradient models + 4 DP-ELM widths) x 4 datasets x (6 budgets + non-private) x 5 seeds.
    # The private gradient tasks carry exactly the settings of dp-rvfl-primary (delta = 1e-5),
    # so a task present in both grids has the same key. DP-ELM tasks carry no delta: the
    # mechanism is pure epsilon-DP (delta = 0; section 4.1) and its release says so.
    "dp-rvfl-primary-full": f"""
name = "dp-rvfl-primary-full"
runner = "train"
description = "DP-RVFL full primary suite (paper 001, sections 4.1-4.3, the 1540 primary tasks): the seven gradient-trained models (DP-RVFL, DP-ELM-SGD, FrozenDenseMatched, LogisticRaw, LogisticProjected, Dense, CNN; DP-SGD, delta = 1e-5) and the closed-form Laplace DP-ELM at widths L = 1, 3, 5, 10 (pure eps-DP, delta = 0), each at eps in {{0.1, 0.5, 1, 2, 4, 8}} and non-private, seeds 42-46, on MNIST, CIFAR-10, Cardio and Heart. Meant for a cluster (--executor dask); datasets without local files (CIFAR-10 here) are skipped and reported."
[[grid]]
models = {list(GRADIENT_PRIMARY)!r}
datasets = {list(PRIMARY_DATASETS)!r}
epsilons = {list(PRIMARY_EPSILONS)!r}
seeds = {list(PRIMARY_SEEDS)!r}
settings = {{ delta = 1e-5 }}
[[grid]]
models = {list(GRADIENT_PRIMARY)!r}
datasets = {list(PRIMARY_DATASETS)!r}
seeds = {list(PRIMARY_SEEDS)!r}
settings = {{ non_private = true }}
[[grid]]
models = {list(DP_ELM_PRIMARY)!r}
datasets = {list(PRIMARY_DATASETS)!r}
epsilons = {list(PRIMARY_EPSILONS)!r}
seeds = {list(PRIMARY_SEEDS)!r}
[[grid]]
models = {list(DP_ELM_PRIMARY)!r}
datasets = {list(PRIMARY_DATASETS)!r}
seeds = {list(PRIMARY_SEEDS)!r}
settings = {{ non_private = true }}
""",
    "selftest": """
name = "selftest"
runner = "selftest"
description = "A tiny grid of synthetic Gaussian-mechanism tasks (no data, about a second each): checks an executor or a cluster end to end."
[settings]
delta = 1e-5
reproducible_noise = true
[[grid]]
models = ["mean", "median"]
datasets = ["synthetic"]
epsilons = [1.0, 2.0]
seeds = [42, 43, 44]
""",
}

BUILTIN_SPECS = tuple(_BUILTIN_TOML)


def builtin_spec(name: str) -> SweepSpec:
    if name not in _BUILTIN_TOML:
        raise UsageError(f"builtin must be one of {', '.join(BUILTIN_SPECS)}, got {name!r}.")
    return parse_spec(_BUILTIN_TOML[name], source=f"builtin:{name}")
