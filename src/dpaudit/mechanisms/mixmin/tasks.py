"""Data-mixing tasks for DP-MixMin: public sources, private targets, proxies (DP-MixMin paper, sec. 4-5).

- ``digits-mix`` (embedded, scikit-learn digits) and ``mnist-mix`` (real MNIST from the data dir): public sources are the images
  the registry dataset (``digits``, ``mnist``) only validates on, with the ten one-vs-rest digit labels as k = 10 sources sharing
  one input space; the private training records are the registry dataset's training partition (the same people: the ledger
  composes the two names), with binary targets with a direct source match (``digit-3``), partial matches (unions of classes:
  ``loops-0689``, ``small-0to4``) and no match (``ink-heavy``: more ink than the public median, not expressible by the digit
  sources); validation and test are the registry's test rows, halved.
- ``heart-mix`` (real UCI Heart): the Hungarian, Switzerland and VA centres are the public sources (k = 3), Cleveland is the
  private target (heart disease, num > 0), split exactly as the registry's ``heart`` (train private, validation and test read
  without noise).

Every task declares its rows (``MixMinTask.rows``, :mod:`dpaudit.data.rows`) against the same sources as the registry, so the
ledger composes the private rows both read under both names.

Proxies are trained on public data only and never see private records (that is what makes the mixture stage's privacy cost exactly
that of Algorithm 1). Shared-input tasks use one multi-class proxy whose coordinates serve as the k source proxies (the paper's
cost-saving trick) or, with ``proxy_mode="per-source"``, one binary proxy per source. Public randomness comes from
``public_rng(seed, ...)``, except which records are private: fixed per task (:data:`TASK_DIVISION_KEYS`, :func:`mixture_split`).

Bring-your-own proxies: :func:`load_proxy_predictions` reads ``FILE.npz`` with ``probs`` (n, k), ``labels`` (n,), optional
``user_ids`` (n,) and ``source_names`` (k,).

A proxy file's people are its rows, not its bytes (:func:`proxy_row_sets`; docs/ledger.md, "One
budget per person"): each row (its ``probs`` and label) is quantised to a grid of step
:data:`PROXY_GRID_STEP` and hashed, once on the grid and once on the grid shifted by half a step,
and declared as private rows of the sources :data:`PROXY_SOURCES`. The ledger keys those hashes
and composes every name whose rows meet; one shared row is enough. A shuffled copy and a copy with
rows removed (or added) share rows with the original exactly. A copy whose values moved by less
than a quarter step (a 1e-12 jitter) keeps each row's cell on at least one grid, unless two of the
row's coordinates sit within the jitter of a boundary, one on each grid: it shares nearly every
row. Only a file whose every row moved by a quarter step or more can leave both grids' cells; it is
budgeted as other data (its predictions then differ by that much). The row hashes are local only
(never in release.json)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from ...data import load_dataset, load_heart_centre, load_mnist_raw
from ...data.base import array_sha256
from ...data.rows import SOURCES, TEST_OFFSET, RowSet, row_sets
from ...data.splits import DEFAULT_SPLIT_SEED, split_indices, train_val_indices
from ...errors import DataError, UsageError
from ...lazy import lazy_import, torch_module_classes
from ...noise import public_rng
from ...validation import one_of, open_unit
from ..dpsgd.core import AdamState, adam_update
from .solver import MixMinConfig, check_inputs

np = lazy_import("numpy")
torch = lazy_import("torch")

TASKS = ("digits-mix", "mnist-mix", "heart-mix")
DIGIT_TARGETS = ("digit-3", "loops-0689", "small-0to4", "ink-heavy")
DIGIT_TARGET_KINDS = {
    "digit-3": "direct",
    "loops-0689": "partial",
    "small-0to4": "partial",
    "ink-heavy": "none",
}
PROXY_MODES = ("joint", "per-source")
_TAG_SPLIT, _TAG_PROXY, _TAG_USERS = 0x5EED01, 0x5EED02, 0x5EED03

#: The public key that fixes each task's public / private division: a constant of the task, NOT the run's ``--seed`` (a dataset
#: name must mean one set of private records). It is the registry's default split seed, so the task and the registry dataset read
#: the same private rows and no public source row is private under the registry name.
TASK_DIVISION_KEYS = dict.fromkeys(TASKS, DEFAULT_SPLIT_SEED)
#: The former division (public halves that held registry training rows). Kept only so that an audit can rebuild a release
#: made on it (``load_task(..., division=42)``); a new release always uses :data:`TASK_DIVISION_KEYS`. Its tasks declare no rows.
FORMER_DIVISION_KEY = 42

#: Public name of the D_mix / D_ft split rule of :func:`mixture_split` (recorded in releases and ledger declarations); stable under
#: add/remove, so the two stages see disjoint records and compose in parallel.
SPLIT_RULE = "keyed-bernoulli-v1"
#: Split rules with that stability property; any other split must compose sequentially.
STABLE_SPLIT_RULES = (SPLIT_RULE,)

#: Declared public size N0 of each task's private training partition (records): the registry dataset's train size on the same
#: split (a test checks each against the loaded task). Both stages' schedules (q, T, m0) and noise are built from it
#: (:func:`reference_units`), never from the private counts |D_mix|, |D_ft|, so a neighbouring dataset runs the identical
#: mechanism.
REFERENCE_SIZES = {"digits-mix": 1257, "mnist-mix": 51000, "heart-mix": 212}


def reference_units(
    n0: int, rho: float, *, records_per_user: int = 1, whole: bool = False
) -> tuple[int, int]:
    """(D_mix units, D_ft records) a plan assumes for N0 training records: round(rho * U0) of the U0 = ceil(N0 / G) units (users
    of G records, the grouping of :func:`synthetic_user_ids`; G = 1 for records) and the other N0 - round(rho * N0) records;
    ``whole``: both stages read all N0."""
    units = -(-int(n0) // int(records_per_user))
    if whole:
        return units, int(n0)
    n_mix, n_ft = int(round(rho * units)), int(n0) - int(round(rho * n0))
    if n_mix < 1 or n_ft < 1:
        raise UsageError(
            f"rho * reference size must leave both D_mix and D_ft non-empty, got {n_mix} and {n_ft} of {n0} with rho={rho!r}."
        )
    return n_mix, n_ft


@dataclass(frozen=True)
class MixtureSettings:
    """Hyper-parameters of the mixture stage (defaults: paper A.3.1 C = 13, B = 1000, 200 steps)."""

    steps: int = 200
    batch_size: int = 1000
    clipping_norm: float = 13.0
    step_size: float = 0.5
    loss: str = "bce"
    records_per_user: int = 1

    def config(
        self, *, k: int, n_units: int, noise_multiplier: float, privacy_unit: str = "record"
    ) -> MixMinConfig:
        """MixMinConfig for ``n_units`` records (or users): B = min(batch_size, n_units), q = B / n_units."""
        b = min(self.batch_size, n_units)
        kept = ("loss", "steps", "clipping_norm", "step_size", "records_per_user")  # as set here
        return MixMinConfig(
            k=k,
            noise_multiplier=noise_multiplier,
            sample_rate=b / n_units,
            expected_batch_size=float(b),
            privacy_unit=privacy_unit,
            **{name: getattr(self, name) for name in kept},
        )


#: Public defaults of the embedded ``digits-mix`` task. Its private training partition has only 539 records, so the paper's
#: setting (rho = 0.1, C = 13, tuned for tens of thousands of records) leaves ~54 records whose clipped gradients drown in noise
#: at eps = 1. Two changes, chosen on PUBLIC data only (``benchmarks/bench_mixmin_defaults.py select``: the task rebuilt from its
#: public half, seeds 0-9, never the private or test records): C = 1, about the norm of the per-record gradients near the optimum
#: (the noise is sigma * C, and past convergence the signal is those small gradients), and rho = 0.5, twice the records per noisy
#: sum. Steps, batch and step size stay the paper's.
EMBEDDED_MIXTURE = MixtureSettings(steps=200, batch_size=1000, clipping_norm=1.0, step_size=0.5)
EMBEDDED_RHO = 0.5
#: Paper defaults (A.3.1) for the other tasks.
PAPER_RHO = 0.1


def default_mixture(task: str | None) -> MixtureSettings:
    """Mixture-stage defaults: the paper's A.3.1 settings, except for the embedded ``digits-mix``."""
    return EMBEDDED_MIXTURE if task == "digits-mix" else MixtureSettings()


def default_rho(task: str | None) -> float:
    """Fraction of the private training records (users) that learn the mixture."""
    return EMBEDDED_RHO if task == "digits-mix" else PAPER_RHO


def request_task(request) -> str | None:
    """The built-in task a :class:`~dpaudit.requests.MixMinRequest` runs on (None: a proxy file)."""
    return None if request.proxy_predictions else request.task


def resolved_rho(request) -> float:
    """The request's rho, or its task's public default."""
    return default_rho(request_task(request)) if request.rho is None else float(request.rho)


def resolved_mixture(request) -> MixtureSettings:
    """The request's mixture settings: unset options take the task's public defaults, set ones override them; G (default 4) for a
    task's synthetic users."""
    given = {
        name: getattr(request.mixture, name)
        for name in ("steps", "batch_size", "clipping_norm", "step_size")
        if getattr(request.mixture, name) is not None
    }
    mixture = replace(default_mixture(request_task(request)), loss=request.mixture.loss, **given)
    if request.privacy_unit == "user" and request_task(request) is not None:
        g = 4 if request.records_per_user is None else int(request.records_per_user)
        mixture = replace(mixture, records_per_user=g)
    return mixture


def split_partition(rho: float, seed: int, privacy_unit: str) -> str:
    """The ledger partition of a keyed split. The rule is in the name: partitions declared by older versions
    (``train/mixmin-rho0.1-seed42``, a permutation split that was not stable under add/remove) keep their own names and never
    merge with these."""
    unit = "-user" if privacy_unit == "user" else ""
    return f"train/mixmin{unit}-{SPLIT_RULE}-rho{rho:g}-seed{int(seed)}"


@dataclass(frozen=True)
class MixMinTask:
    """Public sources and a private target dataset. ``public_x`` (N, d); ``public_y`` (N, k) per-source binary labels (NaN where a
    row does not belong to a source); ``public_source`` (N,) the source a row belongs to, -1 for rows shared by every source
    (shared input space). Private: ``private_x`` (n, d), ``private_records`` (n,) the underlying record label (e.g. the digit),
    ``targets`` name -> (n,) {0, 1}, and the public split of the private rows into ``train`` / ``val`` / ``test`` index arrays.

    ``record_ids`` (n,): a stable identifier of each private row, its row in the task's source data (independent of which other
    rows exist), used to split D_mix / D_ft per record;
    ``public_record_ids``: the same for the public rows where they come from the same source (None when the public rows come from
    other files). ``division_key``: the task constant (:data:`TASK_DIVISION_KEYS`) that fixed the public / private division;
    ``seed`` only drives public randomness that never changes which records are private (proxies, pretraining)."""

    name: str
    source_names: tuple[str, ...]
    public_x: np.ndarray
    public_y: np.ndarray
    public_source: np.ndarray
    private_x: np.ndarray
    private_records: np.ndarray
    targets: dict
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    seed: int
    target_kinds: dict = field(default_factory=dict)
    image: bool = False
    record_ids: np.ndarray | None = None
    public_record_ids: np.ndarray | None = None
    division_key: int | None = None
    #: the source rows each role reads (dpaudit.data.rows): the ledger budgets their people
    rows: tuple = ()

    @property
    def k(self) -> int:
        return len(self.source_names)

    @property
    def train_record_ids(self) -> np.ndarray:
        """Stable identifiers of the private training records (what :func:`mixture_split` keys on)."""
        if self.record_ids is None:
            raise UsageError(
                f"record_ids must be set on task {self.name!r} to split it stably, got None."
            )
        return np.asarray(self.record_ids)[self.train_idx]

    def source_rows(self, source: int) -> np.ndarray:
        """The public rows source ``source`` trains on: its own and those every source shares."""
        return np.flatnonzero((self.public_source == source) | (self.public_source < 0))

    @property
    def shared_inputs(self) -> bool:
        return bool(np.all(self.public_source < 0))

    def target_labels(self, target: str | None) -> tuple[str, np.ndarray]:
        name = next(iter(self.targets)) if target is None else target
        if name not in self.targets:
            raise UsageError(f"target must be one of {', '.join(self.targets)}, got {name!r}.")
        return name, self.targets[name]

    def data_digest(self) -> str:
        """Unkeyed SHA-256 of the private training records. LOCAL ONLY (``Release.data_digest``): it tells neighbouring datasets
        apart, so it is never published; the ledger keeps a keyed fingerprint of it."""
        tr = self.train_idx
        return array_sha256(self.private_x[tr], self.private_records[tr])

    def dataset_identity(self) -> dict:
        """The public identity of the private training records (all targets share them, so they share one budget). No hash of the
        records (see :meth:`data_digest`); the sizes are public as in :meth:`dpaudit.data.base.PreparedDataset.identity`: val /
        test only, the training count is private (plans use :data:`REFERENCE_SIZES`)."""
        return {
            "name": self.name,
            "kind": "image" if self.image else "tabular",
            "split_seed": self.division_key if self.division_key is not None else self.seed,
            "split_sizes": {"val": int(len(self.val_idx)), "test": int(len(self.test_idx))},
            "n_features": int(self.private_x.shape[1]),
            "public_sources": list(self.source_names),
            "public_size": int(self.public_x.shape[0]),
        }


# ---- Task construction


def _digit_targets(digits: np.ndarray, ink: np.ndarray, ink_threshold: float) -> dict:
    return {
        "digit-3": (digits == 3).astype(np.int64),
        "loops-0689": np.isin(digits, (0, 6, 8, 9)).astype(np.int64),
        "small-0to4": (digits <= 4).astype(np.int64),
        "ink-heavy": (ink > ink_threshold).astype(np.int64),
    }


def _split_three(
    n: int, rng: np.random.Generator, fractions=(0.6, 0.2)
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    perm = rng.permutation(n)
    a = int(round(fractions[0] * n))
    b = a + int(round(fractions[1] * n))
    return np.sort(perm[:a]), np.sort(perm[a:b]), np.sort(perm[b:])


def _former_division(n_train_file: int, n_test_file: int) -> tuple:
    """(train, public, val, test) source ids of the former division: a seeded public half of the training file; the other
    half private, split 60/20/20 (no test file) or used whole as train with the test file halved into val / test."""
    rng = public_rng(FORMER_DIVISION_KEY, _TAG_SPLIT)
    perm = rng.permutation(n_train_file)
    pub, priv = np.sort(perm[: n_train_file // 2]), np.sort(perm[n_train_file // 2 :])
    if not n_test_file:
        tr, va, te = _split_three(len(priv), rng)
        return priv[tr], pub, priv[va], priv[te]
    te_perm = rng.permutation(n_test_file)
    half = n_test_file // 2
    return priv, pub, n_train_file + np.sort(te_perm[:half]), n_train_file + np.sort(te_perm[half:])


def _is_current_division(name: str, division: int | None) -> bool:
    """Whether ``division`` is the task's current one (None or its key); else it must be the former."""
    if division is None or division == TASK_DIVISION_KEYS[name]:
        return True
    if division != FORMER_DIVISION_KEY:
        raise UsageError(
            f"division of task {name} must be {TASK_DIVISION_KEYS[name]} or {FORMER_DIVISION_KEY}, got {division!r}."
        )
    return False


def _division(
    name: str, train, public, held_out, n_train_file: int, n_test_file: int, division: int | None
) -> tuple:
    """(train, public, val, test, rows) source ids of ``division`` (None: the task's current one: the registry's split,
    ``held_out`` halved into val / test)."""
    if _is_current_division(name, division):
        perm = public_rng(TASK_DIVISION_KEYS[name], _TAG_SPLIT).permutation(len(held_out))
        held_out, half = np.asarray(held_out), len(held_out) // 2
        val, test = np.sort(held_out[perm[:half]]), np.sort(held_out[perm[half:]])
        train, public = np.sort(train), np.sort(public)
        rows = row_sets(
            SOURCES[name], {"train": train, "public": np.concatenate([public, val, test])}
        )
        return train, public, val, test, rows
    return (*_former_division(n_train_file, n_test_file), ())


def _digit_division(name: str, parts: tuple, x, y, seed: int, division: int | None) -> MixMinTask:
    """A digit task from ``parts`` = (train, public, val, test, rows) source ids; ``x``, ``y`` are indexed by source row id
    (dpaudit.data.rows)."""
    train, public, val, test, rows = parts
    ids = np.concatenate([train, val, test])
    n_tr, n_va = len(train), len(val)
    x_pub, d_pub, x_priv, d_priv = x[public], y[public], x[ids], y[ids]
    # the ink threshold is public: the median ink mass of the public images
    thr = float(np.median(x_pub.sum(axis=1)))
    return MixMinTask(
        name=name,
        source_names=tuple(f"digit-{c}" for c in range(10)),
        public_x=x_pub,
        public_y=(d_pub[:, None] == np.arange(10)[None, :]).astype(np.float32),
        public_source=np.full(len(d_pub), -1, dtype=np.int64),
        private_x=x_priv,
        private_records=d_priv,
        targets=_digit_targets(d_priv, x_priv.sum(axis=1), thr),
        train_idx=np.arange(n_tr),
        val_idx=np.arange(n_tr, n_tr + n_va),
        test_idx=np.arange(n_tr + n_va, len(ids)),
        seed=seed,
        target_kinds=dict(DIGIT_TARGET_KINDS),
        image=True,
        record_ids=np.asarray(ids, dtype=np.int64),
        public_record_ids=np.asarray(public, dtype=np.int64),
        division_key=TASK_DIVISION_KEYS[name] if division is None else int(division),
        rows=rows,
    )


def load_digits_task(seed: int = 42, division: int | None = None) -> MixMinTask:
    """scikit-learn's bundled 8x8 digits (1,797 images) on the registry ``digits`` split: private train = its 1,257 training rows,
    public sources = its 269 validation rows, validation / test
    = its 271 test rows halved (fixed by the task, :data:`TASK_DIVISION_KEYS`, whatever ``seed``;
    ``division`` :data:`FORMER_DIVISION_KEY` rebuilds the former one for audits). Record ids are the rows of
    ``sklearn.datasets.load_digits()``."""
    from sklearn.datasets import load_digits

    ds = load_digits()
    x = (ds.data / 16.0).astype(np.float32)
    y = ds.target.astype(np.int64)
    tr, va, te = split_indices(len(y), TASK_DIVISION_KEYS["digits-mix"], 70, 15)
    return _digit_division(
        "digits-mix", _division("digits-mix", tr, va, te, len(y), 0, division), x, y, seed, division
    )


def load_mnist_task(seed: int = 42, data_dir=None, division: int | None = None) -> MixMinTask:
    """MNIST on the registry ``mnist`` split: private train = its 51,000 training images, public sources = its 9,000 validation
    images, validation / test = the official test set halved (fixed by the task, :data:`TASK_DIVISION_KEYS`, whatever ``seed``;
    ``division`` as in :func:`load_digits_task`). Record ids are training-file rows, and 60,000 + row for the official test file
    (dpaudit.data.rows)."""
    x_tr, y_tr, x_te, y_te = load_mnist_raw(data_dir)
    x = np.concatenate([x_tr, x_te]).reshape(len(y_tr) + len(y_te), -1).astype(np.float32) / 255.0
    y = np.concatenate([y_tr, y_te])
    tr, va = train_val_indices(len(y_tr), TASK_DIVISION_KEYS["mnist-mix"], 85)
    offset = TEST_OFFSET["mnist"]
    assert offset == len(y_tr), "MNIST's training file must hold 60,000 rows"
    parts = _division(
        "mnist-mix", tr, va, offset + np.arange(len(y_te)), len(y_tr), len(y_te), division
    )
    return _digit_division("mnist-mix", parts, x, y, seed, division)


def load_heart_task(seed: int = 42, data_dir=None, division: int | None = None) -> MixMinTask:
    """UCI Heart: Hungarian, Switzerland and VA as public sources; Cleveland private, split as the registry's ``heart`` (70/15/15
    at split seed 2026: train private, validation / test read without noise), whatever ``seed`` (``division`` as in
    :func:`load_digits_task`); record ids are the rows of the Cleveland file. The public centres differ in covariates (the
    paper's no-covariate-shift assumption does not hold here, see its conclusion)."""
    names = ("hungarian", "switzerland", "va")
    xs, ys = zip(*(load_heart_centre(c, data_dir) for c in names))
    x_pub = np.concatenate(xs).astype(np.float32)
    source = np.repeat(np.arange(len(names), dtype=np.int64), [len(y) for y in ys])
    y_pub = np.full((len(source), len(names)), np.nan, dtype=np.float32)
    y_pub[np.arange(len(source)), source] = np.concatenate(ys)
    x_priv, y_priv = load_heart_centre("cleveland", data_dir)
    # The registry's heart split (same file, same seed): the same people are private under both names.
    train, val, test = (
        np.sort(i) for i in split_indices(len(y_priv), TASK_DIVISION_KEYS["heart-mix"], 70, 15)
    )
    rows = row_sets(SOURCES["heart"], {"train": train, "val": val, "test": test}) + tuple(
        RowSet(f"uci-heart-{c}", "public", tuple(range(len(ys[i])))) for i, c in enumerate(names)
    )
    if not _is_current_division("heart-mix", division):
        train, val, test = _split_three(len(y_priv), public_rng(FORMER_DIVISION_KEY, _TAG_SPLIT))
        rows = ()
    return MixMinTask(
        name="heart-mix",
        source_names=names,
        public_x=x_pub,
        public_y=y_pub,
        public_source=source,
        private_x=x_priv.astype(np.float32),
        private_records=y_priv.astype(np.int64),
        targets={"cleveland": y_priv.astype(np.int64)},
        train_idx=train,
        val_idx=val,
        test_idx=test,
        seed=seed,
        target_kinds={"cleveland": "partial"},
        record_ids=np.arange(len(y_priv), dtype=np.int64),
        division_key=TASK_DIVISION_KEYS["heart-mix"] if division is None else int(division),
        rows=rows,
    )


_TASK_CACHE: dict = {}


def load_task(
    name: str, *, seed: int = 42, data_dir=None, division: int | None = None
) -> MixMinTask:
    """Build (and cache in memory) one of :data:`TASKS` (``division``: see :data:`FORMER_DIVISION_KEY`)."""
    one_of("task", name, TASKS)
    key = (name, int(seed), str(data_dir), division)
    if key not in _TASK_CACHE:
        if name == "digits-mix":  # embedded: no data directory
            _TASK_CACHE[key] = load_digits_task(seed, division)
        else:
            loader = load_mnist_task if name == "mnist-mix" else load_heart_task
            _TASK_CACHE[key] = loader(seed, data_dir, division)
    return _TASK_CACHE[key]


def declared_rows(name: str, *, data_dir=None) -> tuple:
    """The :class:`~dpaudit.data.rows.RowSet` s a built-in dataset or task ``name`` reads under its
    default split: what ``ledger cap`` declares. Loads the data (row ids are positions in its files);
    a name dpaudit does not know is refused by :func:`~dpaudit.data.registry.load_dataset`
    (UsageError)."""
    if name in TASKS:
        return tuple(load_task(name, data_dir=data_dir).rows)
    return tuple(load_dataset(name, data_dir=data_dir).rows)


# ---- Small torch models, trained on public data only (proxies and the downstream model)

#: Built on first use (:func:`dpaudit.lazy.torch_module_classes`): importing this module runs no torch.
__getattr__, _build_classes = torch_module_classes(globals(), "MLP")


class _MLP:
    """d -> hidden (ReLU) -> out. ``hidden=0`` gives a linear model."""

    def __init__(self, d: int, hidden: int, out: int):
        super().__init__()
        self.hidden = hidden
        if hidden > 0:
            self.body = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU())
            self.head = torch.nn.Linear(hidden, out)
        else:
            self.body = torch.nn.Identity()
            self.head = torch.nn.Linear(d, out)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def torch_generator(seed: int, *tags: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(public_rng(seed, *tags).integers(0, 2**62)))
    return g


def new_mlp(d: int, hidden: int, out: int, seed: int, *tags: int) -> MLP:
    """An MLP initialised from public randomness only."""
    _build_classes()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(public_rng(seed, *tags).integers(0, 2**62)))
        return MLP(d, hidden, out)


def fit(
    model: MLP,
    x: np.ndarray,
    target: np.ndarray,
    *,
    loss: str,
    epochs: int,
    key: tuple,
    batch_size: int = 128,
    lr: float = 1e-3,
    callback=None,
) -> MLP:
    """Adam on public data. ``loss``: ``softmax`` (target = class index) or ``bce`` (soft targets (n, out) in [0, 1]). ``key``:
    (seed, *tags) of the public batch order. ``callback(epoch, model)`` after each epoch."""
    g = torch_generator(*key)
    xt = torch.as_tensor(x, dtype=torch.float32)
    tt = torch.as_tensor(target, dtype=torch.int64 if loss == "softmax" else torch.float32)
    params = list(model.parameters())
    # torch.optim.Adam(lr=lr), bit for bit
    state = AdamState.zeros_like([p.detach() for p in params])
    config = SimpleNamespace(lr=lr, betas=(0.9, 0.999), adam_eps=1e-8)
    n, functional = xt.shape[0], torch.nn.functional
    for epoch in range(1, epochs + 1):
        model.train()
        perm = torch.randperm(n, generator=g)
        for s in range(0, n, batch_size):
            idx = perm[s : s + batch_size]
            out = model(xt[idx])
            if loss == "softmax":
                lv = functional.cross_entropy(out, tt[idx])
            else:
                lv = functional.binary_cross_entropy_with_logits(out, tt[idx].reshape(out.shape))
            for p in params:
                p.grad = None
            lv.backward()
            adam_update(params, [p.grad for p in params], state, config)
        if callback is not None:
            callback(epoch, model)
    model.eval()
    return model


@dataclass
class Proxies:
    """Proxy predictor f(x) -> (n, k) probabilities; trained on public data only."""

    mode: str
    models: list
    softmax: bool

    def predict(self, x: np.ndarray) -> np.ndarray:
        xt = torch.as_tensor(x, dtype=torch.float32)
        with torch.no_grad():
            if self.mode == "joint":
                out = self.models[0](xt)
                p = torch.softmax(out, dim=1) if self.softmax else torch.sigmoid(out)
            else:
                p = torch.cat([torch.sigmoid(m(xt)) for m in self.models], dim=1)
        return p.double().numpy()


_PROXY_CACHE: dict = {}


def train_proxies(
    task: MixMinTask, *, mode: str = "joint", seed: int | None = None, epochs: int | None = None
) -> Proxies:
    """Proxies on the public sources only (never on private data); cached per task and seed."""
    one_of("proxy_mode", mode, PROXY_MODES)
    seed = task.seed if seed is None else int(seed)
    key = (task.name, task.division_key, task.seed, seed, mode, epochs, task.public_x.shape)
    if key not in _PROXY_CACHE:
        if epochs is None:
            epochs = 6 if task.name == "mnist-mix" else 40 if task.image else 200
        train = _joint_proxy if task.shared_inputs and mode == "joint" else _per_source_proxies
        _PROXY_CACHE[key] = train(task, seed, epochs, 256 if task.name == "mnist-mix" else 64)
    return _PROXY_CACHE[key]


def _joint_proxy(task: MixMinTask, seed: int, epochs: int, batch_size: int) -> Proxies:
    """One network for every source (shared inputs): softmax on one-hot targets, else BCE."""
    one_hot = np.all(task.public_y.sum(axis=1) == 1)
    m = new_mlp(task.public_x.shape[1], 128 if task.image else 0, task.k, seed, _TAG_PROXY, 0)
    target, loss = (task.public_y.argmax(axis=1), "softmax") if one_hot else (task.public_y, "bce")
    key = (seed, _TAG_PROXY, 1)
    fit(m, task.public_x, target, loss=loss, epochs=epochs, key=key, batch_size=batch_size)
    return Proxies("joint", [m], softmax=bool(one_hot))


def _per_source_proxies(task: MixMinTask, seed: int, epochs: int, batch_size: int) -> Proxies:
    """One binary network per source, on its public rows and the rows every source shares."""
    models = []
    for i in range(task.k):
        rows = task.source_rows(i)
        m = new_mlp(task.public_x.shape[1], 128 if task.image else 0, 1, seed, _TAG_PROXY, 10 + i)
        x, y, key = task.public_x[rows], task.public_y[rows, i : i + 1], (seed, _TAG_PROXY, 100 + i)
        lr = 1e-3 if task.image else 1e-2
        fit(m, x, y, loss="bce", epochs=epochs, key=key, batch_size=batch_size, lr=lr)
        models.append(m)
    return Proxies("per-source", models, softmax=False)


# ---- Splits of the private training records


def synthetic_user_ids(n: int, records_per_user: int, seed: int) -> np.ndarray:
    """Public grouping of records into users of ``records_per_user`` records (tasks without users). The grouping defines who the
    users are, so the pipeline passes the task's constant ``division_key`` (not the run's seed): every release on a task then
    refers to the same users."""
    perm = public_rng(seed, _TAG_USERS).permutation(n)
    uid = np.empty(n, dtype=np.int64)
    uid[perm] = np.arange(n) // max(1, records_per_user)
    return uid


def _id_bytes(value) -> bytes:
    """Canonical bytes of one identifier: integers and strings never collide with each other."""
    if isinstance(value, (str, np.str_)):
        return b"s:" + str(value).encode("utf-8")
    if isinstance(value, (bytes, np.bytes_)):
        return b"b:" + bytes(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return b"i:" + str(int(value)).encode("ascii")
    raise UsageError(
        f"record and user identifiers must be integers or strings, got {value!r} ({type(value).__name__})."
    )


def keyed_membership(ids, rho: float, seed: int, *, unit: str = "record") -> np.ndarray:
    """Boolean (len(ids),): is each identifier in D_mix under :data:`SPLIT_RULE`? Membership of identifier i is ``blake2b(key,
    unit || i) / 2**64 < rho``, with the key derived from the rule name and the public ``seed``: a keyed pseudo-random function,
    so the memberships behave as independent Bernoulli(rho) draws, and each depends on that one identifier only (never on n or on
    the other identifiers). That is the property parallel composition of the two stages needs under add/remove adjacency. The seed
    is public (it is in the release); the split needs no secret, only independence from the other records."""
    open_unit("rho", rho)
    key = f"dpaudit/mixmin-split/{SPLIT_RULE}/seed={int(seed)}".encode("ascii")
    # rho * 2**64 rounded down: P(h < threshold) = threshold / 2**64, within 2**-64 of rho.
    threshold = int(rho * 2.0**64)
    prefix = unit.encode("ascii") + b"|"
    hashes = [
        hashlib.blake2b(prefix + _id_bytes(v), key=key, digest_size=8).digest()
        for v in np.asarray(ids).tolist()
    ]
    return np.array([int.from_bytes(h, "big") < threshold for h in hashes], dtype=bool)


def mixture_split(
    record_ids, rho: float, seed: int, user_ids: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint (D_mix, D_ft) position arrays under :data:`SPLIT_RULE` (public randomness only).

    ``record_ids``: a stable identifier per record (its row in the task's source data), or an int n as shorthand for ids 0..n-1
    (stable only if positions are). Each record (with ``user_ids``: each user, its records following it) is in D_mix by
    :func:`keyed_membership`. The sizes are Binomial: forcing a size, or fixing up an empty side (a :class:`UsageError`), would
    make membership depend on the other records."""
    ids = np.arange(int(record_ids)) if np.ndim(record_ids) == 0 else np.asarray(record_ids)
    n = len(ids)
    if user_ids is None:
        if len(np.unique(ids)) != n:
            raise UsageError(
                f"record_ids must be distinct, got {n - len(np.unique(ids))} duplicate(s)."
            )
        in_mix = keyed_membership(ids, rho, seed, unit="record")
        unit = "records"
    else:
        user_ids = np.asarray(user_ids)
        if user_ids.shape != (n,):
            raise UsageError(
                f"user_ids must have one entry per record ({n}), got shape {user_ids.shape}."
            )
        users, inverse = np.unique(user_ids, return_inverse=True)
        in_mix = keyed_membership(users, rho, seed, unit="user")[inverse]
        unit = "users"
    mix, ft = np.flatnonzero(in_mix), np.flatnonzero(~in_mix)
    if len(mix) == 0:
        raise UsageError(
            f"D_mix must not be empty, got no {unit} of {n} records in D_mix with rho={rho!r}, seed={seed}: use a larger rho or another seed."
        )
    if len(ft) == 0:
        raise UsageError(
            f"D_ft must not be empty, got every one of the {unit} of {n} records in D_mix with rho={rho!r}, seed={seed}: use a smaller rho or another seed."
        )
    return mix, ft


# ---- Bring-your-own proxy predictions


#: Grid step of a proxy row's content identity (module docstring): coarse enough that a float jitter
#: cannot hide a row, fine enough that distinct predictions rarely share a cell (a shared cell only
#: composes two files' budgets: fail closed).
PROXY_GRID_STEP = 2.0**-10
#: The two sources a proxy row is declared under: the grid and the grid shifted by half a step.
PROXY_SOURCES = ("proxy-predictions-grid-0", "proxy-predictions-grid-half")


def proxy_row_sets(probs, labels) -> tuple:
    """The private :class:`~dpaudit.data.rows.RowSet` s of a proxy predictions file: per row and grid,
    a 64-bit hash of the quantised ``probs`` and label (module docstring). The same rows give the
    same ids in any order or subset."""
    values = np.column_stack(
        [np.asarray(probs, dtype=np.float64), np.asarray(labels, dtype=np.float64)]
    )
    out = []
    for source, shift in zip(PROXY_SOURCES, (0.0, 0.5)):
        cells = np.floor(values / PROXY_GRID_STEP + shift).astype(np.int64)
        ids = {
            int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "big")
            for row in cells
        }
        out.append(RowSet(source, "private", tuple(sorted(ids))))
    return tuple(out)


@dataclass(frozen=True)
class ProxyPredictions:
    probs: np.ndarray
    labels: np.ndarray
    user_ids: np.ndarray | None
    source_names: tuple[str, ...]
    path: str
    sha256: str
    #: the file's rows as the ledger budgets them (:func:`proxy_row_sets`; local only)
    rows: tuple = ()


def load_proxy_predictions(path: str | os.PathLike, *, loss: str = "bce") -> ProxyPredictions:
    """Read ``FILE.npz``: ``probs`` (n, k), ``labels`` (n,), optional ``user_ids`` (n,) and ``source_names`` (k,). Any problem is
    a one-line :class:`DataError` naming the bad array."""
    p = Path(path)
    arrays = _read_npz(p)
    probs, labels = arrays["probs"], arrays["labels"]
    try:
        check_inputs(probs, labels, loss)
    except DataError as e:
        raise DataError(
            f"proxy predictions file {p}: array '{'labels' if str(e).startswith('labels') else 'probs'}' is malformed: {e}"
        ) from None
    user_ids, source_names = _optional_arrays(p, arrays, *probs.shape)
    # The content digest (LOCAL ONLY: the ledger keys it, and names the dataset after the keyed fingerprint, so a renamed copy of
    # the file shares the budget). Taken over the arrays as the mechanism uses them (float64), so re-saving the same values in
    # another float dtype does not escape the budget either.
    p64, y64 = np.asarray(probs, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    sha = array_sha256(p64, y64, *([user_ids] if user_ids is not None else []))
    return ProxyPredictions(
        p64, y64, user_ids, source_names, str(p), sha, rows=proxy_row_sets(p64, y64)
    )


def _read_npz(p: Path) -> dict:
    """The arrays of a proxy predictions file, which must hold ``probs`` and ``labels``."""
    if not p.is_file():
        raise DataError(f"proxy predictions file not found: {p}.")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(
            f"proxy predictions file {p} is not a readable .npz archive without pickled objects: {msg}."
        ) from None
    for required in ("probs", "labels"):
        if required not in arrays:
            raise DataError(
                f"proxy predictions file {p}: array '{required}' is missing (found: {', '.join(sorted(arrays)) or 'none'})."
            )
    return arrays


def _optional_arrays(
    p: Path, arrays: dict, n: int, k: int
) -> tuple[np.ndarray | None, tuple[str, ...]]:
    """The file's optional ``user_ids`` (n integers or strings) and ``source_names`` (k distinct strings)."""
    user_ids = arrays.get("user_ids")
    if user_ids is not None and (user_ids.shape != (n,) or user_ids.dtype.kind not in "iuU"):
        raise DataError(
            f"proxy predictions file {p}: array 'user_ids' must be {n} integers or strings, got shape {user_ids.shape} dtype {user_ids.dtype}."
        )
    names = arrays.get("source_names")
    if names is None:
        return user_ids, tuple(f"source-{i}" for i in range(k))
    if names.shape != (k,) or names.dtype.kind not in "U":
        raise DataError(
            f"proxy predictions file {p}: array 'source_names' must be {k} strings, got shape {names.shape} dtype {names.dtype}."
        )
    if len(set(names.tolist())) != k:
        raise DataError(
            f"proxy predictions file {p}: array 'source_names' must hold distinct names, got duplicates."
        )
    return user_ids, tuple(str(s) for s in names)
