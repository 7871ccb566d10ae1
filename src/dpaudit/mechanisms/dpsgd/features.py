"""Frozen, data-independent representations: Gaussian projection and random tanh features.

DP-RVFL paper, sections 3.4-3.5:
- inputs with more than 1024 flattened dimensions are first projected, x' = x P, with
  P_jk ~ N(0, 1/1024) (eq. 15); otherwise x' = x;
- the random hidden layer is h = tanh(x' W_r + b_r), W_r ~ U(-1, 1), b_r ~ U(0, 1) (eq. 16);
- DP-RVFL uses the direct link z = [x', h] with 200 hidden units (eq. 18); DP-ELM-SGD uses z = h
  with the same projection, seed and 200 units; FrozenDenseMatched uses z = h with d' + 200 units
  (so its head has exactly as many coefficients as RVFL's); LogisticRaw uses z = x and
  LogisticProjected z = x'.

**Privacy contract.** Every frozen parameter is drawn from :func:`dpaudit.noise.public_rng` with
the public seed and fixed tags, never from the data, so the map x -> z is a fixed public function
and only the head trained on z consumes privacy budget. RVFL and DP-ELM-SGD share P, W_r and b_r
for a given seed (same tags), as the paper requires.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...data.base import empty_small_pages
from ...lazy import lazy_import
from ...noise import public_rng
from ...validation import one_of, positive_int

np = lazy_import("numpy")

PROJECTION_THRESHOLD = 1024  # project when the flattened input dimension exceeds this
PROJECTION_DIM = 1024
HIDDEN_UNITS = 200

FEATURE_KINDS = ("rvfl", "elm-sgd", "frozen-dense-matched", "logistic-raw", "logistic-projected")

# Public stream tags (arbitrary fixed constants) so that the projection, the hidden layer and
# the head initialisation never share a random stream.
TAG_PROJECTION = 0x50524F4A  # "PROJ"
TAG_HIDDEN = 0x48494444  # "HIDD"


@dataclass(frozen=True, eq=False)
class FrozenFeatures:
    """A frozen map x (n, d) -> z (n, d_z). ``None`` parts are absent."""

    kind: str
    n_inputs: int
    projection: np.ndarray | None  # (d, d') with d' = PROJECTION_DIM, or None
    weight: np.ndarray | None  # (d', L) or None
    bias: np.ndarray | None  # (L,) or None
    direct_link: bool  # z includes x'

    @property
    def reduced_dim(self) -> int:
        """d': the input dimension after the optional projection."""
        return self.projection.shape[1] if self.projection is not None else self.n_inputs

    @property
    def hidden_units(self) -> int:
        return 0 if self.weight is None else int(self.weight.shape[1])

    @property
    def output_dim(self) -> int:
        return (self.reduced_dim if self.direct_link else 0) + self.hidden_units

    @property
    def frozen_parameters(self) -> int:
        return sum(int(a.size) for a in (self.projection, self.weight, self.bias) if a is not None)

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "n_inputs": self.n_inputs,
            "projected": self.projection is not None,
            "reduced_dim": self.reduced_dim,
            "hidden_units": self.hidden_units,
            "activation": "tanh" if self.weight is not None else None,
            "direct_link": self.direct_link,
            "output_dim": self.output_dim,
            "frozen_parameters": self.frozen_parameters,
            "projection_init": "N(0, 1/1024)" if self.projection is not None else None,
            "hidden_init": "W ~ U(-1, 1), b ~ U(0, 1)" if self.weight is not None else None,
        }

    def transform(
        self, x: np.ndarray, *, chunk: int = 4096, dtype="float32", bias_column: bool = False
    ) -> np.ndarray:
        """z for every row of ``x``, computed in chunks (float32 by default, or float64).

        ``bias_column=True`` appends a column of ones ([z, 1], the head's bias input) without a
        second copy of the whole matrix. The values are the formula's up to float rounding.
        """
        x = np.asarray(x)
        one_of("dtype", np.dtype(dtype).name, ("float32", "float64"))
        n_out = self.output_dim + (1 if bias_column else 0)
        out = empty_small_pages((x.shape[0], n_out), dtype)
        if bias_column:
            out[:, -1] = 1.0
        p = self.projection.astype(dtype) if self.projection is not None else None
        w = self.weight.astype(dtype) if self.weight is not None else None
        b = self.bias.astype(dtype) if self.bias is not None else None
        link = self.reduced_dim if self.direct_link else 0
        self._fill(x, out, p, w, b, link, chunk, dtype)
        return out

    def _fill(self, x, out, p, w, b, link, chunk, dtype) -> None:
        """Write z = [x', tanh(x' W + b)] (the parts present) into ``out`` chunk by chunk: NumPy's
        GEMM (no torch import for a head's release) with its BLAS thread count."""
        rows = min(chunk, x.shape[0])
        # GEMM results land in contiguous chunk buffers (reused), then one copy into z's columns:
        # a BLAS's rounding may depend on the output's row stride, and z with or without the bias
        # column must hold identical values. The copy costs ~1% of the GEMM.
        xr_buf = np.empty((rows, link), dtype=dtype) if p is not None and self.direct_link else None
        h_buf = np.empty((rows, w.shape[1]), dtype=dtype) if w is not None else None
        for s in range(0, x.shape[0], chunk):
            e = min(s + chunk, x.shape[0])
            # The input is converted (or, already of this dtype and C-contiguous, only viewed) once per chunk.
            xc = np.ascontiguousarray(x[s:e], dtype=dtype)
            if p is not None:
                xr = np.matmul(xc, p, out=xr_buf[: e - s]) if xr_buf is not None else xc @ p
            else:
                xr = xc
            if self.direct_link:
                out[s:e, :link] = xr
            if w is not None:
                h = np.matmul(xr, w, out=h_buf[: e - s])
                h += b  # x' W + b
                np.tanh(h, out=h)
                out[s:e, link : link + w.shape[1]] = h


def _shape(kind: str, n_inputs: int, hidden_units: int) -> tuple[bool, int, int]:
    """(projected?, d', hidden units L) of a family's features: public dimensions only."""
    one_of("kind", kind, FEATURE_KINDS)
    n_inputs = positive_int("n_inputs", n_inputs)
    project = n_inputs > PROJECTION_THRESHOLD and kind != "logistic-raw"
    d_red = PROJECTION_DIM if project else n_inputs
    if kind in ("logistic-raw", "logistic-projected"):
        return project, d_red, 0
    return project, d_red, hidden_units if kind in ("rvfl", "elm-sgd") else d_red + hidden_units


def feature_dim(kind: str, n_inputs: int, *, hidden_units: int = HIDDEN_UNITS) -> int:
    """``build_features(kind, n_inputs, seed).output_dim`` without drawing the features (a plan's
    count of noised head parameters, known before anything is reserved)."""
    _, d_red, units = _shape(kind, n_inputs, hidden_units)
    direct = kind in ("logistic-raw", "logistic-projected", "rvfl")
    return (d_red if direct else 0) + units


def build_features(
    kind: str, n_inputs: int, seed: int, *, hidden_units: int = HIDDEN_UNITS
) -> FrozenFeatures:
    """The frozen representation of one model family (sections 3.4-3.5), from the public seed:
    P (d, d') ~ N(0, 1/d') (eq. 15); W_r (d', L) ~ U(-1, 1), then b_r (L,) ~ U(0, 1) (eq. 16)."""
    project, d_red, units = _shape(kind, n_inputs, hidden_units)
    n_inputs = int(n_inputs)
    proj = (
        public_rng(seed, TAG_PROJECTION).normal(
            0.0, 1.0 / np.sqrt(PROJECTION_DIM), size=(n_inputs, PROJECTION_DIM)
        )
        if project
        else None
    )
    if kind in ("logistic-raw", "logistic-projected"):
        return FrozenFeatures(kind, n_inputs, proj, None, None, direct_link=True)
    rng = public_rng(seed, TAG_HIDDEN)
    w = rng.uniform(-1.0, 1.0, size=(d_red, units))
    b = rng.uniform(0.0, 1.0, size=units)
    return FrozenFeatures(kind, n_inputs, proj, w, b, direct_link=(kind == "rvfl"))
