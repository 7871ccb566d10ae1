"""Trainable-representation baselines of the DP-RVFL paper (sections 3.3 and 3.6), as torch modules.

- :class:`Dense`: images 256-128-10, tabular 64-32-1; ReLU after each hidden layer, dropout 0.2
  after the first (eqs. 7-9).
- :class:`CNN2d`: two 3x3 convolutions (16/32 channels for 1-channel images, 32/64 for 3-channel),
  unit padding, ReLU and 2x2 max-pooling after each, FC 128 + ReLU, 10 outputs. No dropout or
  batch norm.
- :class:`CNN1d`: tabular vector as a 1-channel sequence; two kernel-3 convolutions (16, 32),
  unit padding, ReLU; adaptive average pooling; FC 32 + ReLU; one logit. The paper does not state
  the pooled length (its Table S1 is not available); we use ``pool_size=1`` (global average).
- :class:`CompactAttention`: 4x4 patches -> 32-d linear embedding + fixed 2-D sinusoidal positions,
  one 4-head self-attention block (trainable q/k/v/out projections) with residual, a 64-unit ReLU
  feed-forward sublayer with residual, mean token pooling, linear classifier. No layer norm,
  dropout or pretraining. Attention is written with ``nn.Linear`` layers so per-sample gradients
  work with both ``torch.func`` and Opacus.
- :class:`GRU`: an image read row by row (tabular: feature by feature) by one 32-unit
  ``nn.GRUCell``, linear classifier on the last state. Ghost clipping does not cover the cell:
  its clipped sums come from the per-sample reference kernel (:mod:`.ghost_clip`), on the CPU.
  (``nn.GRU`` itself fails under ``torch.func.vmap``, which that kernel uses; ``GRUCell`` works.)

A model is one entry of :data:`BUILDERS` and one catalogue line (``dp-NAME``, family
``dp-sgd-module``): releases, audits and sweeps find it from there.

Every module is initialised by PyTorch's default rules from a torch generator seeded by the public
seed (:func:`build_module`), never from data. Binary tasks use one output logit (K = 1, BCE).
"""

from __future__ import annotations

import math

from ...errors import UsageError
from ...lazy import lazy_import, torch_module_classes
from ...noise import public_rng
from ...validation import one_of

torch = lazy_import("torch")
nn = lazy_import("torch.nn")

#: The torch modules, built on first use (:func:`dpaudit.lazy.torch_module_classes`): importing this module runs no torch.
__getattr__, _build_classes = torch_module_classes(
    globals(), "Dense", "CNN2d", "CNN1d", "CompactAttention", "GRU"
)


class _Dense:
    def __init__(
        self, n_inputs: int, hidden: tuple[int, int], n_outputs: int, dropout: float = 0.2
    ):
        super().__init__()
        self.fc1 = nn.Linear(n_inputs, hidden[0])
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden[0], hidden[1])
        self.fc3 = nn.Linear(hidden[1], n_outputs)

    def forward(self, x):
        x = x.reshape(x.shape[0], -1)
        a1 = self.drop(torch.relu(self.fc1(x)))
        a2 = torch.relu(self.fc2(a1))
        return self.fc3(a2)


class _CNN2d:
    def __init__(self, image_shape: tuple[int, int, int], n_outputs: int = 10):
        super().__init__()
        c, h, w = image_shape
        c1, c2 = (16, 32) if c == 1 else (32, 64)
        self.conv1 = nn.Conv2d(c, c1, 3, padding=1)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.fc1 = nn.Linear(c2 * (h // 2 // 2) * (w // 2 // 2), 128)
        self.fc2 = nn.Linear(128, n_outputs)
        self.image_shape = tuple(image_shape)

    def forward(self, x):
        x = x.reshape(x.shape[0], *self.image_shape)
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class _CNN1d:
    def __init__(self, n_inputs: int, n_outputs: int = 1, pool_size: int = 1):
        super().__init__()
        self.conv1 = nn.Conv1d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv1d(16, 32, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool1d(pool_size)
        self.fc1 = nn.Linear(32 * pool_size, 32)
        self.fc2 = nn.Linear(32, n_outputs)

    def forward(self, x):
        x = x.reshape(x.shape[0], 1, -1)
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc2(torch.relu(self.fc1(self.pool(x).flatten(1))))


def sinusoidal_positions_2d(rows: int, cols: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sine/cosine positions (rows*cols, dim): half the channels encode the row, half the
    column, each with the 1-D transformer encoding (Vaswani et al. 2017)."""
    if dim % 4:
        raise UsageError(f"embedding dim must be a multiple of 4, got {dim!r}.")
    quarter = dim // 4
    freq = torch.exp(-math.log(10000.0) * torch.arange(quarter, dtype=torch.float64) / quarter)

    def enc(pos: torch.Tensor) -> torch.Tensor:
        a = pos[:, None].double() * freq[None, :]
        return torch.cat([torch.sin(a), torch.cos(a)], dim=1)

    r = torch.arange(rows).repeat_interleave(cols)
    c = torch.arange(cols).repeat(rows)
    return torch.cat([enc(r), enc(c)], dim=1).float()


class _CompactAttention:
    def __init__(
        self,
        image_shape: tuple[int, int, int],
        n_outputs: int = 10,
        patch: int = 4,
        dim: int = 32,
        heads: int = 4,
        ff: int = 64,
    ):
        super().__init__()
        c, h, w = image_shape
        if h % patch or w % patch:
            raise UsageError(f"image height and width must be multiples of {patch}, got {h}x{w}.")
        self.image_shape, self.patch, self.heads, self.dim = tuple(image_shape), patch, heads, dim
        self.embed = nn.Linear(c * patch * patch, dim)
        self.register_buffer("positions", sinusoidal_positions_2d(h // patch, w // patch, dim))
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.ff1 = nn.Linear(dim, ff)
        self.ff2 = nn.Linear(ff, dim)
        self.head = nn.Linear(dim, n_outputs)

    def forward(self, x):
        n = x.shape[0]
        c, h, w = self.image_shape
        p = self.patch
        x = (
            x.reshape(n, c, h // p, p, w // p, p)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(n, (h // p) * (w // p), c * p * p)
        )
        t = self.embed(x) + self.positions.to(x.dtype)
        hd = self.dim // self.heads

        def split(u):
            return u.reshape(n, -1, self.heads, hd).transpose(1, 2)

        q, k, v = split(self.q(t)), split(self.k(t)), split(self.v(t))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        a = (att @ v).transpose(1, 2).reshape(n, -1, self.dim)
        t = t + self.out(a)
        t = t + self.ff2(torch.relu(self.ff1(t)))
        return self.head(t.mean(dim=1))


class _GRU:
    def __init__(self, steps: int, width: int, n_outputs: int, hidden: int = 32):
        super().__init__()
        self.steps, self.width = steps, width
        self.cell = nn.GRUCell(width, hidden)
        self.head = nn.Linear(hidden, n_outputs)

    def forward(self, x):
        x = x.reshape(x.shape[0], self.steps, self.width)
        state = x.new_zeros(x.shape[0], self.cell.hidden_size)
        for t in range(self.steps):
            state = self.cell(x[:, t], state)
        return self.head(state)


def _dense(kind, n_features, n_out, image_shape):
    return Dense(n_features, (256, 128) if kind == "image" else (64, 32), n_out)


def _cnn(kind, n_features, n_out, image_shape):
    if kind != "image":
        return CNN1d(n_features, n_out)
    if image_shape is None:
        raise UsageError("image_shape must be given for an image CNN, got None.")
    return CNN2d(tuple(image_shape), n_out)


def _attention(kind, n_features, n_out, image_shape):
    if kind != "image" or image_shape is None:
        raise UsageError(f"dataset kind must be image for the attention control, got {kind!r}.")
    return CompactAttention(tuple(image_shape), n_out)


def _gru(kind, n_features, n_out, image_shape):
    if kind == "image" and image_shape is not None:
        channels, rows, cols = image_shape
        return GRU(rows, channels * cols, n_out)
    return GRU(n_features, 1, n_out)


#: Each trainable model's builder (kind, n_features, n_outputs, image_shape) -> module and the
#: tensors holding its one-run audit's gradient canaries (names as in ``named_parameters``).
BUILDERS = {
    "dense": (_dense, ("fc1.weight",)),
    "cnn": (_cnn, ("fc1.weight",)),
    "attention": (_attention, ("ff1.weight", "ff2.weight")),
    "gru": (_gru, ("cell.weight_hh",)),
}
TRAINABLE_MODELS = tuple(BUILDERS)


def build_module(
    model: str, *, kind: str, n_features: int, n_classes: int, image_shape=None, seed: int = 42
) -> nn.Module:
    """A freshly initialised baseline for a dataset (module docstring), in a forked RNG (global
    RNG state untouched)."""
    one_of("model", model, TRAINABLE_MODELS)
    _build_classes()
    n_out = 1 if n_classes == 2 else n_classes
    torch_seed = int(public_rng(seed, 0x494E4954).integers(0, 2**63 - 1))  # "INIT"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_seed)
        return BUILDERS[model][0](kind, n_features, n_out, image_shape)


def module_for(model: str, data, seed: int) -> nn.Module:
    """:func:`build_module` for the public schema of ``data`` (a prepared dataset or a plan's
    :class:`~dpaudit.mechanisms.contract.DataInfo`: kind, features, classes, image shape)."""
    return build_module(
        model,
        kind=data.kind,
        n_features=data.n_features,
        n_classes=int(data.n_classes),
        image_shape=data.image_shape,
        seed=seed,
    )
