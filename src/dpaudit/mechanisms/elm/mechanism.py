"""Laplace DP-ELM (Ono et al., as reproduced in the DP-RVFL paper, section 3.5): one pure-DP release.

Mechanism (DP-RVFL paper, section 3.5; Ono et al., Algorithm 1):

- hidden features ``H = sigmoid(X W + b)`` with ``W`` (d x L) and ``b`` (L) drawn N(0, 1) from
  the *public* seed; one-hot targets ``Y`` (n x K); float64 arithmetic;
- sufficient statistics ``H^T H`` (L x L) and ``H^T Y`` (L x K), accumulated over 1024-record
  chunks;
- independent Laplace noise of scale ``b = L (L + 2) / epsilon`` on *every* entry of both
  matrices (no symmetrisation, no ridge term);
- output weights ``beta`` solve ``(H^T H + E) beta = H^T Y + F``; the pseudoinverse is used only
  when that noised system is singular (post-processing of the noised matrices only);
- widths L in {1, 3, 5, 10} (:data:`ELM_WIDTHS`), all reported, none selected.

**Privacy contract.** Each sigmoid feature lies in (0, 1) (in [0, 1] after the grid rounding
below) and each target row is one-hot, so one record contributes entries in [0, 1] to the
L^2 entries of H^T H and to L entries of one column of H^T Y.

- replace-one (the published analysis): the joint L1 change is at most L^2 (Gram) + 2L (two
  columns of H^T Y change) = L (L + 2);
- add/remove-one: at most L^2 + L = L (L + 1) <= L (L + 2).

Laplace noise of scale L (L + 2) / epsilon on every entry therefore gives pure epsilon-DP under
either adjacency (add/remove with slack: its exact value is epsilon (L + 1) / (L + 2)). The
release claims ``epsilon`` (accountant ``pure``, delta = 0, event ``PureEpsilon(epsilon)``)
under the adjacency chosen (default ``add-remove-record``, the relation the rest of dpaudit's
releases use so the ledger can compose them) and records both analyses.

Finite precision. With the default sampler ``discrete-laplace`` the hidden features are
rounded to multiples of 2^-20 *per record, before the sums* (so the bounds above hold exactly),
the statistics are exact int64 (units of 2^-40 for H^T H, 2^-20 for H^T Y) and the noise exact
discrete Laplace on those grids: exactly epsilon-DP (:mod:`dpaudit.mechanisms.elm.laplace`).
``sampler="textbook"`` (the published float64 implementation) holds in ideal arithmetic only
and the release says ``certified: false``.

The random features, the split and the chunking are public; the noise and nothing else
comes from the private :class:`~dpaudit.noise.NoiseSource`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from ...accounting import PureEpsilon
from ...accounting.adjacency import Adjacency
from ...audits.canaries import check_canary
from ...audits.targets import AuditTarget, load_target_data, prepared, training_partition
from ...errors import DataError, UsageError
from ...lazy import lazy_import
from ...ledger.book import sampler_uncertified_reason
from ...noise import NoiseSource, public_rng
from ...requests import DPELMRequest
from ...validation import one_of, positive_finite, positive_int
from ..contract import MechanismBase, RunOutput, data_plan, public_inputs
from .laplace import DEFAULT_SAMPLER, SAMPLERS, add_grid_laplace, grid_to_float, sampler_guarantee
from ..dpsgd.head_canaries import TAG_CANARY
from ..dpsgd.schedule import classification_metrics

np = lazy_import("numpy")

NAME = "dp-elm"  # the mechanism name (MECHANISM is the contract object, below)
ACCOUNTANT = "pure"
ADJACENCIES = ("add-remove-record", "replace-record")
ELM_WIDTHS = (1, 3, 5, 10)
CHUNK = 1024  # records per accumulation chunk (section 3.5)
FEATURE_BITS = 20  # discrete sampler: hidden features rounded to multiples of 2^-20
TAG_ELM = 0x454C4D  # "ELM": public stream of W and b
_MAX_RECORDS_EXACT = 2**22  # n * 2^40 must stay below 2^63 in the int64 Gram accumulation


def noise_scale(width: int, epsilon: float) -> float:
    """Laplace scale ``L (L + 2) / epsilon`` on each entry (section 3.5; 60 at L=10, eps=2)."""
    width = positive_int("width", width)
    epsilon = positive_finite("epsilon", epsilon)
    return width * (width + 2) / epsilon


def l1_sensitivity(width: int, adjacency: str = "replace-record") -> int:
    """Joint L1 sensitivity of (H^T H, H^T Y): L(L+2) for replace-one, L^2 + L for add/remove."""
    width = positive_int("width", width)
    adj = Adjacency.parse(adjacency)
    if adj is Adjacency.REPLACE_RECORD:
        return width * (width + 2)
    if adj is Adjacency.ADD_REMOVE_RECORD:
        return width * (width + 1)
    raise UsageError(f"adjacency must be one of {', '.join(ADJACENCIES)}, got {adj.value!r}.")


def privacy_analyses(width: int, epsilon: float) -> dict:
    """Both analyses of the scale ``L(L+2)/epsilon``, as recorded in the release."""
    scale = noise_scale(width, epsilon)
    sources = {
        "replace-record": "published analysis (Ono et al.; DP-RVFL paper section 3.5)",
        "add-remove-record": "conservative comparison (DP-RVFL paper section 3.5): joint L1 contribution L^2 + L",
    }
    return {
        adj: {
            "l1_sensitivity": l1_sensitivity(width, adj),
            "epsilon": l1_sensitivity(width, adj) / scale,
            "source": source,
        }
        for adj, source in sources.items()
    }


def _covering_analyses(width: int, epsilon: float, adjacency: str) -> dict:
    """Both analyses of the scale, refusing one that does not cover the claim under ``adjacency``."""
    analyses = privacy_analyses(width, epsilon)
    covered = analyses[adjacency]["epsilon"]
    if covered > epsilon * (1 + 1e-12):
        raise UsageError(
            f"noise scale must cover epsilon {epsilon} under {adjacency}, got {covered}."
        )
    return analyses


def _uncertified(sampler: str) -> str | None:
    """Why a private release's sampler is uncertified (textbook Laplace), or None."""
    return None if sampler_guarantee(sampler).certified else sampler_uncertified_reason(sampler)


@dataclass(frozen=True)
class ElmFeatures:
    """The public random hidden layer: ``sigmoid(x @ weight + bias)``, N(0, 1) entries."""

    weight: np.ndarray  # (d, L) float64
    bias: np.ndarray  # (L,) float64
    seed: int

    @property
    def width(self) -> int:
        return int(self.weight.shape[1])

    def transform(self, x: np.ndarray) -> np.ndarray:
        """Sigmoid features, float64, shape (n, L); written as exp of -|z| so it never overflows."""
        z = np.asarray(x, dtype=np.float64) @ self.weight + self.bias
        e = np.exp(-np.abs(z))
        return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    def statistics(self, x, y, *, n_classes: int, sampler: str) -> ElmStatistics:
        """:func:`elm_sufficient_statistics` of the records (x, y) on this hidden layer."""
        return elm_sufficient_statistics(
            x, y, self.width, self.seed, n_classes=n_classes, sampler=sampler, features=self
        )


def elm_features(n_features: int, width: int, seed: int) -> ElmFeatures:
    """W ~ N(0, 1)^(d x L), b ~ N(0, 1)^L from the public stream ``public_rng(seed, TAG_ELM)``."""
    n_features = positive_int("n_features", n_features)
    width = positive_int("width", width)
    rng = public_rng(seed, TAG_ELM)
    weight = rng.standard_normal((n_features, width))
    bias = rng.standard_normal(width)
    return ElmFeatures(weight=weight, bias=bias, seed=int(seed))


def _quantize(h: np.ndarray) -> np.ndarray:
    """Features as int64 multiples of 2^-FEATURE_BITS, in [0, 2^FEATURE_BITS] (exact per record)."""
    q = np.rint(h * float(2**FEATURE_BITS))  # scaling by a power of two is exact
    return np.clip(q, 0, 2**FEATURE_BITS).astype(np.int64)


@dataclass(frozen=True)
class ElmStatistics:
    """The un-noised sufficient statistics (H^T H, H^T Y) of a set of records.

    ``grid_bits = FEATURE_BITS``: exact int64 statistics in units of 2^-(2 grid_bits) (Gram) and
    2^-grid_bits (cross), from grid-rounded features (discrete sampler). ``grid_bits = None``:
    float64 statistics (textbook sampler). Statistics add (:meth:`plus`), so an auditor can add
    one record's contribution without recomputing the rest.
    """

    gram: np.ndarray  # (L, L)
    cross: np.ndarray  # (L, K)
    n_records: int
    n_classes: int
    grid_bits: int | None

    @property
    def width(self) -> int:
        return int(self.gram.shape[0])

    def _layout(self) -> tuple:
        return self.grid_bits, self.gram.shape, self.cross.shape

    def plus(self, other: "ElmStatistics") -> "ElmStatistics":
        if self._layout() != other._layout():
            raise UsageError(
                "statistics must share width, classes and grid to be combined, got different ones."
            )
        return ElmStatistics(
            self.gram + other.gram,
            self.cross + other.cross,
            self.n_records + other.n_records,
            self.n_classes,
            self.grid_bits,
        )

    def as_float(self) -> tuple[np.ndarray, np.ndarray]:
        """(H^T H, H^T Y) as float64 (grid statistics scaled by their exact power of two)."""
        if self.grid_bits is None:
            return self.gram, self.cross
        return (
            self.gram.astype(np.float64) * 2.0 ** (-2 * self.grid_bits),
            self.cross.astype(np.float64) * 2.0 ** (-self.grid_bits),
        )


def _check_xy(
    x: np.ndarray, y: np.ndarray, n_classes: int, n_features: int
) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y)
    if x.ndim != 2 or x.shape[1] != n_features:
        raise UsageError(f"x must have shape (n, {n_features}), got {x.shape}.")
    if y.shape != (x.shape[0],):
        raise UsageError(f"y must have shape ({x.shape[0]},), got {y.shape}.")
    if not np.all(np.isfinite(x)):
        raise DataError("x must hold finite values only, got NaN or infinity.")
    if y.size and (y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= n_classes):
        raise UsageError(f"y must hold integer labels in [0, {n_classes - 1}], got values outside.")
    return x, y.astype(np.int64)


def elm_sufficient_statistics(
    x: np.ndarray,
    y: np.ndarray,
    width: int,
    seed: int,
    *,
    n_classes: int,
    sampler: str = DEFAULT_SAMPLER,
    features: ElmFeatures | None = None,
) -> ElmStatistics:
    """H^T H and H^T Y of the records (x, y), accumulated over 1024-record chunks.

    ``features`` (the public hidden layer) defaults to :func:`elm_features` for ``seed``.
    ``sampler`` chooses the exact integer statistics (``discrete-laplace``) or float64
    (``textbook``). Zero records give zero matrices (used by auditors as a neutral element).
    """
    one_of("sampler", sampler, SAMPLERS)
    n_classes = positive_int("n_classes", n_classes)
    width = positive_int("width", width)
    x = np.asarray(x)
    if features is None:
        features = elm_features(x.shape[1] if x.ndim == 2 else 0, width, seed)
    if features.width != width:
        raise UsageError(f"features must have width {width}, got {features.width}.")
    x, y = _check_xy(x, y, n_classes, features.weight.shape[0])
    exact = sampler == "discrete-laplace"
    n = x.shape[0]
    if exact and n > _MAX_RECORDS_EXACT:
        raise UsageError(
            f"number of records must be at most {_MAX_RECORDS_EXACT} for exact statistics, got {n}."
        )
    dtype = np.int64 if exact else np.float64
    gram = np.zeros((width, width), dtype=dtype)
    cross = np.zeros((width, n_classes), dtype=dtype)
    for start in range(0, n, CHUNK):
        h = features.transform(x[start : start + CHUNK])
        if exact:
            h = _quantize(h)
        onehot = np.zeros((h.shape[0], n_classes), dtype=dtype)
        onehot[np.arange(h.shape[0]), y[start : start + CHUNK]] = 1
        gram += h.T @ h
        cross += h.T @ onehot
    return ElmStatistics(gram, cross, int(n), n_classes, FEATURE_BITS if exact else None)


@dataclass(frozen=True)
class ElmResult:
    """A fitted (DP-)ELM: public hidden layer + output weights, and how they were obtained."""

    features: ElmFeatures
    beta: np.ndarray  # (L, K)
    noisy_gram: np.ndarray  # (L, L) the released (noised) statistic, float64
    noisy_cross: np.ndarray  # (L, K)
    epsilon: float | None  # None: non-private reference fit
    noise_scale: float | None
    sampler: str | None
    solver: str  # "solve" or "pinv" (fallback when the noised system is singular)
    n_records: int

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Regression outputs ``sigmoid(x W + b) beta`` (n, K)."""
        return self.features.transform(x) @ self.beta

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.scores(x).argmax(axis=1)

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """Softmax of the scores (only for ranking metrics; the ELM is a least-squares model)."""
        s = self.scores(x)
        s = s - s.max(axis=1, keepdims=True)
        e = np.exp(s)
        return e / e.sum(axis=1, keepdims=True)


def solve_output_weights(gram: np.ndarray, cross: np.ndarray) -> tuple[np.ndarray, str]:
    """beta with gram @ beta = cross; the pseudoinverse only when ``gram`` is singular."""
    try:
        return np.linalg.solve(gram, cross), "solve"
    except np.linalg.LinAlgError:
        return np.linalg.pinv(gram) @ cross, "pinv"


def _noise_tail_fields(sampler: str, non_private: bool, epsilon: float, n_values: int) -> dict:
    """``noise_sampler`` / ``noise_tail_delta`` of a DP-ELM release (see dpaudit.noise).

    ``discrete-laplace`` is exact (unbounded rejection loops, no truncated tail): tail delta 0.
    ``textbook`` doubles miss mass 2^-52 per value (|noise| <= b 52 ln 2), so by the dpaudit.noise
    argument the release is at best (epsilon, (e^eps + 1) n 2^-52)-DP; reported, not refused, as
    the textbook sampler is uncertified anyway (the ledger counts it as unbounded)."""
    if non_private:
        return {"noise_sampler": "none (non-private)", "noise_tail_delta": 0.0}
    if sampler == "discrete-laplace":
        return {
            "noise_sampler": "discrete-laplace: exact (Canonne, Kamath & Steinke 2020), unbounded support, no truncated tail",
            "noise_tail_delta": 0.0,
        }
    tau = min(1.0, n_values * 2.0**-52)
    tail = math.inf if tau >= 1.0 or epsilon > 700 else (math.exp(epsilon) + 1.0) * tau
    return {
        "noise_sampler": "textbook: inverse-CDF Laplace doubles, |noise| <= 52 ln 2 b (uncertified; Mironov 2012)",
        "noise_tail_delta": tail,
    }


def privatize_statistics(
    stats: ElmStatistics, epsilon: float, noise: NoiseSource, *, sampler: str = DEFAULT_SAMPLER
) -> tuple[np.ndarray, np.ndarray]:
    """Noised (H^T H, H^T Y) as float64: Laplace scale L(L+2)/epsilon on every entry.

    ``discrete-laplace`` needs exact statistics (``grid_bits`` set) and adds exact discrete
    Laplace noise on the grids 2^-40 (Gram) and 2^-20 (cross); ``textbook`` adds inverse-CDF
    Laplace doubles to float64 statistics.
    """
    one_of("sampler", sampler, SAMPLERS)
    width = stats.width
    epsilon = positive_finite("epsilon", epsilon)
    if sampler == "discrete-laplace":
        if stats.grid_bits is None:
            raise UsageError(
                "statistics must be exact (grid) statistics for the discrete-laplace sampler, got float64 ones."
            )
        # The scale as an exact rational from the float epsilon: L(L+2) / epsilon.
        scale = Fraction(width * (width + 2)) / Fraction(epsilon)
        g = add_grid_laplace(stats.gram, scale, 2 * stats.grid_bits, noise)
        c = add_grid_laplace(stats.cross, scale, stats.grid_bits, noise)
        return grid_to_float(g, 2 * stats.grid_bits), grid_to_float(c, stats.grid_bits)
    if stats.grid_bits is not None:
        raise UsageError(
            "statistics must be float64 statistics for the textbook sampler, got grid ones."
        )
    scale = noise_scale(width, epsilon)
    return tuple(s + noise.laplace(s.shape, scale) for s in (stats.gram, stats.cross))


def fit_from_statistics(
    stats: ElmStatistics,
    features: ElmFeatures,
    epsilon: float | None,
    *,
    noise: NoiseSource | None,
    sampler: str = DEFAULT_SAMPLER,
) -> ElmResult:
    """Noise the statistics (unless ``epsilon`` is None: non-private reference) and solve."""
    if epsilon is None:
        (gram, cross), scale = stats.as_float(), None
    else:
        if noise is None:
            raise UsageError("noise must be a NoiseSource for a private fit, got None.")
        gram, cross = privatize_statistics(stats, epsilon, noise, sampler=sampler)
        scale = noise_scale(stats.width, epsilon)
    beta, solver = solve_output_weights(gram, cross)
    return ElmResult(
        features=features,
        beta=beta,
        noisy_gram=gram,
        noisy_cross=cross,
        epsilon=None if epsilon is None else float(epsilon),
        noise_scale=scale,
        sampler=None if epsilon is None else sampler,
        solver=solver,
        n_records=stats.n_records,
    )


def fit_dp_elm(
    x: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    width: int,
    epsilon: float | None,
    *,
    seed: int,
    noise: NoiseSource | None,
    sampler: str = DEFAULT_SAMPLER,
) -> ElmResult:
    """One DP-ELM fit on (x, y): features from the public ``seed``, noise from ``noise``.

    Pure ``epsilon``-DP under replace-one and add/remove-one adjacency (module docstring);
    ``epsilon=None`` fits the non-private closed-form reference (no noise, no claim).
    Cheap at small n (the discrete sampler costs about 6 us per noised entry, L^2 + L K entries).
    """
    width = positive_int("width", width)
    x = np.asarray(x)
    if x.ndim != 2:
        raise UsageError(f"x must be a 2-D array, got shape {x.shape}.")
    feats = elm_features(x.shape[1], width, seed)
    stats_sampler = sampler if epsilon is not None else "textbook"  # no noise: float64 statistics
    stats = feats.statistics(x, y, n_classes=n_classes, sampler=stats_sampler)
    return fit_from_statistics(stats, feats, epsilon, noise=noise, sampler=sampler)


def worst_case_input(weight: np.ndarray, bias: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """x in [lo, hi]^d maximising min_u (x W + b)_u (a linear program): all features near 1."""
    from scipy.optimize import linprog

    d, L = weight.shape
    # variables (x_1..x_d, t): maximise t subject to t - (x W + b)_u <= 0 for every unit u
    c = np.zeros(d + 1)
    c[-1] = -1.0
    a_ub = np.hstack([-weight.T, np.ones((L, 1))])
    b_ub = bias.astype(np.float64)
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=[(lo, hi)] * d + [(None, None)], method="highs")
    if res.status != 0:
        raise UsageError(
            f"worst-case canary search must converge, got status {res.status}: {res.message}."
        )
    return np.clip(res.x[:d], lo, hi)


@dataclass
class ElmTarget(AuditTarget):
    """Audit of a Laplace DP-ELM release (pure epsilon-DP).

    The un-noised statistics are computed once (:func:`elm_sufficient_statistics`); each trial
    adds the canary's own statistics in the "in" world (add/remove adjacency), or replaces a
    natural record by the canary (replace-one), then draws fresh noise and solves
    (:func:`fit_from_statistics`, as the release does). Canaries: ``worst-case`` (the record in the data's
    input box whose sigmoid features are as large as possible in every unit, from a linear
    program), ``natural`` and ``mislabeled`` (a held-out test record, with its true / a wrong
    label). Score: h_c^T beta[:, y_c] - mean_{k != y_c} h_c^T beta[:, k]."""

    dataset: str | None = "digits"
    data_dir: str | None = None
    width: int = 10
    epsilon: float = 2.0
    canary: str = "worst-case"
    seed: int = 42
    sampler: str = "discrete-laplace"
    adjacency: str = "add-remove-record"
    split_seed: int | None = None
    profile: str | None = None
    noise: bool = True
    mechanism: str = "dp-elm"
    delta: float = 0.0
    accountant: str = "pure"  # the release's accountant: epsilon of PureEpsilon(epsilon) is epsilon
    default_chunk_size: int = 250
    # an old release's data checksum; a different dataset is refused
    expected_sha256: str | None = None
    # the release's public dataset identity; a different one is refused
    expected_identity: dict | None = None
    prepared: object | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_canary("dp-elm", self.canary)
        one_of("adjacency", self.adjacency, ADJACENCIES)
        self._ready = False

    @property
    def claimed_epsilon(self) -> float:  # type: ignore[override]
        return float(self.epsilon)

    @property
    def uncertified_sampler(self) -> str | None:  # type: ignore[override]
        return None if sampler_guarantee(self.sampler).certified else self.sampler

    @property
    def claimed_event(self):  # type: ignore[override]
        """The release's event: one pure epsilon-DP Laplace release, ``PureEpsilon(epsilon)``."""
        return PureEpsilon(float(self.epsilon))

    def prepare(self) -> None:
        if self._ready:
            return
        data = load_target_data(self)
        self._n_classes = int(data.n_classes)
        self._feats = elm_features(data.n_features, self.width, self.seed)
        stat = lambda x, y: self._feats.statistics(  # noqa: E731
            np.asarray(x),
            np.asarray(y, dtype=np.int64),
            n_classes=self._n_classes,
            sampler=self.sampler,
        )
        self._base = stat(data.x_train, data.y_train)
        rng = public_rng(self.seed, TAG_CANARY)
        i = int(rng.integers(len(data.y_test)))  # drawn for every kind: the stream stays the same
        if self.canary == "worst-case":
            lo, hi = float(np.min(data.x_train)), float(np.max(data.x_train))
            x_c, y_c = worst_case_input(self._feats.weight, self._feats.bias, lo, hi)[None, :], 0
            info = {"kind": "worst-case", "input_box": [lo, hi], "label": y_c}
        else:
            x_c, y_nat = np.asarray(data.x_test[i : i + 1], dtype=np.float64), int(data.y_test[i])
            y_c = (y_nat + 1) % self._n_classes if self.canary == "mislabeled" else y_nat
            info = {"kind": self.canary, "test_index": i, "true_label": y_nat, "label": y_c}
        self._hc, self._yc = self._feats.transform(x_c)[0], y_c
        info["features"] = self._hc.tolist()
        if self.adjacency == "replace-record":
            # out world: base + a natural record; in world: base + the canary (same size)
            j = int(rng.integers(len(data.y_test)))
            self._out_stats = self._base.plus(stat(data.x_test[j : j + 1], [int(data.y_test[j])]))
            info["replaced_test_index"] = j
        else:
            self._out_stats = self._base
        self._in_stats = self._base.plus(stat(x_c, [y_c]))
        self._canary_info = info
        self._dataset_name = data.name
        self._analyses = privacy_analyses(self.width, self.epsilon)
        self._ready = True

    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        self.prepare()
        out = np.empty(len(canary_in))
        for r, c in enumerate(np.asarray(canary_in, dtype=bool)):
            st = self._in_stats if c else self._out_stats
            # the release's own noise-and-solve (no noise: the un-noised statistics, solved alike)
            beta = fit_from_statistics(
                st,
                self._feats,
                self.epsilon if self.noise else None,
                noise=noise,
                sampler=self.sampler,
            ).beta
            o = self._hc @ beta
            out[r] = o[self._yc] - (o.sum() - o[self._yc]) / max(len(o) - 1, 1)
        return out

    private_data = training_partition  # every trial trains on the training partition

    def without_noise(self) -> "ElmTarget":
        t = dataclasses.replace(self, noise=False)
        if self._ready:
            t.__dict__.update({k: v for k, v in self.__dict__.items() if k.startswith("_")})
        return t

    def describe(self) -> dict:
        self.prepare()
        return {
            "task": None,
            "dataset": self._dataset_name,
            "config": {
                "width": self.width,
                "epsilon": self.epsilon,
                "sampler": self.sampler,
                "seed": self.seed,
                "noise_scale": noise_scale(self.width, self.epsilon),
                "analyses": self._analyses,
                "accountant": ACCOUNTANT,
            },
            "canary_info": self._canary_info,
        }


#: The release fields ``dpaudit train dp-elm --json`` shows of the claim, in order.
_SUMMARY_CLAIM = "adjacency accountant target_epsilon epsilon delta noise_source seed".split()


class DPELMMechanism(MechanismBase):
    """Laplace DP-ELM on the mechanism contract (:mod:`dpaudit.mechanisms.contract`; privacy
    contract: module docstring). Run by :func:`dpaudit.releasing.release`: the budget of
    ``PureEpsilon(epsilon)`` is reserved before the private statistics are touched, and the
    claim is recomputed from the event (accountant ``pure``, delta 0) after the fit."""

    name = NAME
    request_type = DPELMRequest
    record_out_dir = True  # artefacts["out_dir"], read by `dpaudit train dp-elm`

    def validate(self, r):
        positive_int("width", r.width)
        if not r.non_private:
            positive_finite("epsilon", r.epsilon)
        one_of("sampler", r.sampler, SAMPLERS)
        one_of("adjacency", r.adjacency, ADJACENCIES)
        return r

    def plan(self, r, info):
        """Public quantities only: the event, the noise scale and the analyses of ``width``.

        Args:
            r: the validated :class:`~dpaudit.requests.DPELMRequest`.
            info: the dataset's public description (name, identity, classes, split seed).

        Returns:
            The :class:`ReleasePlan`: one pure ``epsilon`` event (None when non-private) under
            ``r.adjacency``, one step, delta 0, the Laplace scale ``L (L + 2) / epsilon``.

        Raises:
            UsageError: the scale does not cover ``epsilon`` under the adjacency claimed.
        """
        width, sampler, adjacency = int(r.width), r.sampler, r.adjacency
        private = not r.non_private
        epsilon = float(r.epsilon) if private else None
        analyses = _covering_analyses(width, epsilon, adjacency) if private else None
        n_values = width * width + width * int(info.n_classes)  # entries of H^T H and H^T Y
        return data_plan(
            r,
            info,
            mechanism=NAME,
            adjacency=adjacency,
            accountant=ACCOUNTANT,
            event=PureEpsilon(epsilon) if private else None,
            target_epsilon=epsilon,
            delta=0.0,
            steps=1,
            # Non-private and uncertified-sampler releases count as unbounded in the ledger.
            uncertified=_uncertified(sampler) if private else None,
            config={
                "model": NAME,
                "width": width,
                "noise_scale": noise_scale(width, epsilon) if private else None,
                "noise_scale_formula": "L (L + 2) / epsilon on every entry of H^T H and H^T Y",
                "sampler": sampler if private else None,
                "sampler_guarantee": sampler_guarantee(sampler).to_dict() if private else None,
                "claim_adjacency": adjacency,
                "analyses": analyses,
                "targets": "one-hot",
                "n_classes": int(info.n_classes),
                "chunk": CHUNK,
                "symmetrised": False,
                "ridge": 0.0,
                **public_inputs(r, info),
            },
            release_fields=_noise_tail_fields(
                sampler, not private, epsilon if private else math.inf, n_values
            ),
        )

    def run(self, plan, data, noise, *, progress=None):
        """Args:
            plan: the plan, executed as it is (one noisy release of the statistics).
            data: the prepared private dataset.
            noise: the private NoiseSource, the only source of the Laplace noise.
            progress: unused (one step).

        Returns:
            The RunOutput: test metrics, the output weights and the public random features, timings.
        """
        r = plan.request
        width, seed, sampler = int(r.width), int(r.seed), r.sampler
        private = plan.event is not None
        feats = elm_features(data.n_features, width, seed)
        started = time.perf_counter()
        stats_sampler = sampler if private else "textbook"
        stats = feats.statistics(
            data.x_train, data.y_train, n_classes=int(data.n_classes), sampler=stats_sampler
        )
        counted = time.perf_counter()
        result = fit_from_statistics(
            stats, feats, plan.target_epsilon if private else None, noise=noise, sampler=sampler
        )
        fitted = time.perf_counter()
        metrics = classification_metrics(data.y_test, result.probabilities(data.x_test))
        return RunOutput(
            steps_executed=1,
            metrics=metrics,  # on the test partition: outside the DP claim (Release docstring)
            arrays={
                "hidden_weight": feats.weight,
                "hidden_bias": feats.bias,
                "beta": result.beta,
                "noisy_gram": result.noisy_gram,
                "noisy_cross": result.noisy_cross,
            },
            config={
                "features": {
                    "activation": "sigmoid",
                    "init": "N(0, 1) weights and biases",
                    "seed": seed,
                    "tag": TAG_ELM,
                    "grid_bits": stats.grid_bits,
                },
                "dtype": "float64"
                if stats.grid_bits is None
                else "int64 exact on grid, float64 solve",
                "solver": result.solver,
            },
            timings={
                "train_seconds": fitted - started,
                "statistics_seconds": counted - started,
                "noise_and_solve_seconds": fitted - counted,
                "eval_seconds": time.perf_counter() - fitted,
            },
        )

    def notes(self, r) -> list[str]:
        if r.non_private:
            positive_int("width", r.width)
            return [
                "[yellow]non-private:[/] closed-form ELM without noise; the release makes no privacy claim."
            ]
        scale = noise_scale(r.width, r.epsilon)  # validates width and epsilon before any loading
        lines = [
            f"noise scale L(L+2)/eps = {scale:g} on every entry of H^T H and H^T Y (L={r.width}, eps={r.epsilon:g})"
        ]
        if r.sampler == "textbook":  # the warning comes first
            lines.insert(
                0,
                "[yellow]warning:[/] the textbook Laplace sampler leaks through floating-point low bits (Mironov 2012); "
                "the release is marked certified: false.",
            )
        return lines

    def summary(self, rel, ledger=None) -> tuple[dict, list[str]]:
        cfg = rel.config
        d = {
            "mechanism": rel.mechanism,
            "dataset": rel.dataset["name"],
            **{k: cfg[k] for k in ("width", "noise_scale", "sampler")},
            "sampler_certified": None if rel.non_private else cfg["sampler_guarantee"]["certified"],
            **{k: getattr(rel, k) for k in _SUMMARY_CLAIM},
            "solver": cfg["solver"],
            "metrics": rel.metrics,
            "timings": rel.timings,
            "release_id": rel.id,
            "release": str(Path(rel.artefacts["out_dir"]) / "release.json"),
        }
        head = f"[bold]dp-elm[/] on {d['dataset']}: L={d['width']}, " + (
            "non-private (no noise, no claim)"
            if rel.non_private
            else f"noise scale {d['noise_scale']:g}, sampler {d['sampler']}, epsilon {d['epsilon']:g} (pure, delta 0, {d['adjacency']})"
        )
        metrics = "  " + ", ".join(
            f"{k} {v:.4f}" for k, v in rel.metrics.items() if isinstance(v, float)
        )
        return d, [head, metrics, f"  release written to {d['release']}"]

    def out_dir_tag(self, plan) -> str:
        return f"-L{plan.config['width']}"

    def audit_target(
        self, plan, canary: str, *, release=None, user_ids=None, no_noise: bool = False
    ):
        """The DP-ELM audit target of this plan (:class:`ElmTarget`): its width, epsilon, sampler,
        adjacency, seed and dataset; a ``release``'s claim, accountant and dataset identity.

        Args:
            plan: the plan audited, taken as it is.
            canary: the canary kind.
            release: the Release audited (None: the plan's claim).
            user_ids: unused (record-level only).
            no_noise: build the no-noise control.

        Returns:
            The prepared :class:`ElmTarget`.

        Raises:
            UsageError: a non-private plan (no claim to audit).
        """
        if plan.event is None:
            raise UsageError(
                "release must be private to be audited, got a non-private dp-elm release."
            )
        r = plan.request
        fields = {
            "dataset": plan.data_name,
            "data_dir": r.data_dir,
            "width": int(r.width),
            "epsilon": float(plan.target_epsilon),
            "canary": canary,
            "seed": plan.seed,
            "sampler": r.sampler,
            "adjacency": r.adjacency,
            "profile": plan.dataset.get("profile", r.profile),
            "split_seed": plan.dataset.get("split_seed", r.split_seed),
        }
        if release is not None:  # the release's recorded claim and data identity are audited
            fields.update(
                epsilon=float(release.epsilon),
                accountant=release.accountant,
                expected_identity=release.dataset,
                expected_sha256=(release.dataset or {}).get("sha256"),
            )
        return prepared(ElmTarget(**fields), no_noise)


MECHANISM = DPELMMechanism()
