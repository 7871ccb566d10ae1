"""Audit target for Laplace DP-ELM (Ono et al.; DP-RVFL paper section 3.5): pure epsilon-DP.

The release is the output weights beta = (H^T H + E)^-1 (H^T Y + F) with Laplace noise of
scale L(L+2)/eps on every entry (discrete Laplace on a grid by default). The un-noised
statistics are computed once (:func:`~dpaudit.mechanisms.dp_elm.elm_sufficient_statistics`);
each trial adds the canary's own statistics in the "in" world (add/remove adjacency), or
replaces a natural record by the canary (replace-one adjacency), then draws fresh noise
(:func:`~dpaudit.mechanisms.dp_elm.privatize_statistics`) and solves.

Canaries: ``worst-case`` (the record in the data's input box whose sigmoid features are as
large as possible in every unit, from a linear program: the largest contribution to H^T H and
H^T Y the analysis allows), ``natural`` and ``mislabeled`` (a held-out test record, with its
true / a wrong label). Score: the canary's regression output for its label minus the mean of
the other outputs, h_c^T beta[:, y_c] - mean_{k != y_c} h_c^T beta[:, k].
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog

from ..errors import UsageError
from ..noise import NoiseSource, public_rng
from .canaries import check_canary
from .targets import AuditTarget, load_target_data, training_partition


def worst_case_input(weight: np.ndarray, bias: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """x in [lo, hi]^d maximising min_u (x W + b)_u (a linear program): all features near 1."""
    d, L = weight.shape
    # variables (x_1..x_d, t): maximise t subject to t - (x W + b)_u <= 0 for every unit u
    c = np.zeros(d + 1)
    c[-1] = -1.0
    a_ub = np.hstack([-weight.T, np.ones((L, 1))])
    b_ub = bias.astype(np.float64)
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=[(lo, hi)] * d + [(None, None)], method="highs")
    if res.status != 0:
        raise UsageError(f"worst-case canary search must converge, got status {res.status}: {res.message}.")
    return np.clip(res.x[:d], lo, hi)


@dataclass
class ElmTarget(AuditTarget):
    """Audit of a Laplace DP-ELM release (see module docstring)."""

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
    expected_sha256: str | None = None  # an old release's data checksum; a different dataset is refused
    expected_identity: dict | None = None  # the release's public dataset identity; a different one is refused
    prepared: object | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_canary("dp-elm", self.canary)
        if self.adjacency not in ("add-remove-record", "replace-record"):
            raise UsageError(f"adjacency must be one of add-remove-record, replace-record, got {self.adjacency!r}.")
        self._ready = False

    @property
    def claimed_epsilon(self) -> float:  # type: ignore[override]
        return float(self.epsilon)

    @property
    def claimed_event(self):  # type: ignore[override]
        """The release's event: one pure epsilon-DP Laplace release, ``PureEpsilon(epsilon)``."""
        from ..accounting.events import PureEpsilon

        return PureEpsilon(float(self.epsilon))

    def prepare(self) -> None:
        if self._ready:
            return
        from ..mechanisms.dp_elm import elm_features, elm_sufficient_statistics, privacy_analyses

        data = load_target_data(self)
        self._n_classes = int(data.n_classes)
        self._feats = elm_features(data.n_features, self.width, self.seed)
        stat = lambda x, y: elm_sufficient_statistics(np.asarray(x), np.asarray(y, dtype=np.int64), self.width, self.seed,  # noqa: E731
                                                      n_classes=self._n_classes, sampler=self.sampler, features=self._feats)
        self._base = stat(data.x_train, data.y_train)
        rng = public_rng(self.seed, 0xCA7A)
        i = int(rng.integers(len(data.y_test)))
        x_nat, y_nat = np.asarray(data.x_test[i : i + 1], dtype=np.float64), int(data.y_test[i])
        if self.canary == "worst-case":
            lo, hi = float(np.min(data.x_train)), float(np.max(data.x_train))
            x_c = worst_case_input(self._feats.weight, self._feats.bias, lo, hi)[None, :]
            y_c = 0
            info = {"kind": "worst-case", "input_box": [lo, hi], "label": y_c}
        else:
            x_c = x_nat
            y_c = (y_nat + 1) % self._n_classes if self.canary == "mislabeled" else y_nat
            info = {"kind": self.canary, "test_index": i, "true_label": y_nat, "label": y_c}
        self._canary_stats = stat(x_c, [y_c])
        self._hc = self._feats.transform(x_c)[0]
        self._yc = y_c
        info["features"] = self._hc.tolist()
        if self.adjacency == "replace-record":
            # out world: base + a natural record; in world: base + the canary (same size)
            j = int(rng.integers(len(data.y_test)))
            self._out_stats = self._base.plus(stat(data.x_test[j : j + 1], [int(data.y_test[j])]))
            info["replaced_test_index"] = j
        else:
            self._out_stats = self._base
        self._in_stats = self._base.plus(self._canary_stats)
        self._canary_info = info
        self._dataset_name = data.name
        self._analyses = privacy_analyses(self.width, self.epsilon)
        self._ready = True

    def scores(self, canary_in: np.ndarray, noise: NoiseSource) -> np.ndarray:
        from ..mechanisms.dp_elm import privatize_statistics, solve_output_weights

        self.prepare()
        out = np.empty(len(canary_in))
        for r, c in enumerate(np.asarray(canary_in, dtype=bool)):
            st = self._in_stats if c else self._out_stats
            if self.noise:
                gram, cross = privatize_statistics(st, self.epsilon, noise, sampler=self.sampler)
            else:
                gram, cross = st.gram_float(), st.cross_float()
            beta, _ = solve_output_weights(gram, cross)
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
        return {"task": None, "dataset": self._dataset_name,
                "config": {"width": self.width, "epsilon": self.epsilon, "sampler": self.sampler, "seed": self.seed,
                           "noise_scale": self.width * (self.width + 2) / self.epsilon, "analyses": self._analyses,
                           "accountant": "pure"},
                "canary_info": self._canary_info}
