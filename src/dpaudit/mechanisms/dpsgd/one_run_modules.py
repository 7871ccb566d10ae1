"""One-run audits of the trainable DP-SGD models (:data:`~dpaudit.mechanisms.dpsgd.models.BUILDERS`)
(Steinke, Nasr & Jagielski 2023; docs/one_run.md: the method, the canary kinds and their scores).

``gradient``: m Dirac canaries at distinct coordinates of :data:`CANARY_TENSORS` (public seed; for
dp-dense the quiet first-layer weights first), each adding C * e_j to the clipped sum when sampled
(through the loop's canary interface, :class:`DiracCanaries`): one extra unit of sensitivity C.
``input-mislabeled``: held-out records with a public wrong label, appended when included.

**Privacy contract / soundness.** The inclusion coins and the per-step canary sampling are drawn
from a generator seeded by the private ``noise`` source and never published; the scores depend on
the released parameters (and the public initialisation) only; the schedule (q, T, m0) and the
noise multiplier are the release's. Under these conditions the one-run analysis is a valid lower
bound for the claimed event of every included canary (each canary is one add/remove unit).
"""

from __future__ import annotations

import dataclasses

from ...audits.one_run import OneRunScores
from ...data import load_dataset
from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource, public_rng
from ...validation import one_of, positive_int
from . import core as dpsgd_core
from .module_training import DPSGDConfig, train_module_dp_sgd
from .head_audit import dead_features
from .models import BUILDERS, module_for
from .schedule import audit_reference_size, plan_schedule

np = lazy_import("numpy")
torch = lazy_import("torch")

ONE_RUN_MODULE_KINDS = ("gradient", "input-mislabeled")
#: Tensors that hold the gradient canaries, per trainable model (names as in ``named_parameters``).
CANARY_TENSORS: dict[str, tuple[str, ...]] = {name: spec[1] for name, spec in BUILDERS.items()}
_TAG_COORDS = 0x31524E43  # "1RNC": public choice of canary coordinates / records
_TAG_LABELS = 0x314C4142  # "1LAB": public wrong labels


def module_name(model: str) -> str:
    """``dp-dense`` -> ``dense`` (also accepts the bare module names)."""
    name = str(model).removeprefix("dp-")
    if name not in CANARY_TENSORS:
        allowed = ", ".join("dp-" + n for n in CANARY_TENSORS)
        raise UsageError(f"model must be one of {allowed}, got {model!r}.")
    return name


@dataclasses.dataclass(frozen=True)
class GradientCanaries:
    """m Dirac canaries: ``coords[i] = (tensor name, flat index)``, public."""

    tensors: tuple[str, ...]
    coords: tuple[tuple[str, int], ...]

    def describe(self) -> dict:
        return {
            "tensors": list(self.tensors),
            "coordinates": [[n, int(i)] for n, i in self.coords],
            "choice": "uniform without replacement over the tensors' coordinates, public seed",
        }

    def by_tensor(self) -> list[tuple[str, np.ndarray, torch.Tensor]]:
        """(tensor name, canary ids, their flat coordinates as an index tensor) for each tensor
        holding canaries: what :class:`DiracCanaries` adds C * e_j through, one ``index_add_`` per tensor."""
        out = []
        for t in self.tensors:
            ids = np.array([k for k, (n, _) in enumerate(self.coords) if n == t], dtype=np.int64)
            if ids.size:
                flat = np.array([self.coords[k][1] for k in ids], dtype=np.int64)
                out.append((t, ids, torch.as_tensor(flat)))
        return out


def choose_coordinates(
    named_shapes: dict[str, tuple[int, ...]],
    tensors: tuple[str, ...],
    m: int,
    seed: int,
    quiet: np.ndarray | None = None,
    *,
    tag: int = _TAG_COORDS,
) -> GradientCanaries:
    """m distinct coordinates of ``tensors`` (flat indices into their concatenation, in the listed
    order), uniformly from the public seed (``public_rng(seed, tag)``); taken first from ``quiet``
    (coordinates no training record moves) when given, the rest uniformly from the others."""
    missing = [t for t in tensors if t not in named_shapes]
    if missing:
        raise UsageError(
            f"canary tensors must be trainable parameters of the model, got {missing!r}."
        )
    sizes = [int(np.prod(named_shapes[t])) for t in tensors]
    total = sum(sizes)
    if not 2 <= m <= total:
        raise UsageError(
            f"canaries must be an integer in [2, {total}] (coordinates of {', '.join(tensors)}), got {m!r}."
        )
    rng = public_rng(seed, tag)
    quiet = np.unique(np.asarray([] if quiet is None else quiet, dtype=np.int64))
    if quiet.size >= m:
        flat = rng.choice(quiet, size=m, replace=False)
    else:
        rest = np.setdiff1d(np.arange(total), quiet)
        flat = np.concatenate([quiet, rng.choice(rest, size=m - quiet.size, replace=False)])
    starts = np.cumsum([0, *sizes])
    which = np.searchsorted(starts, flat, side="right") - 1
    coords = tuple((tensors[w], int(f - starts[w])) for w, f in zip(which, flat))
    return GradientCanaries(tuple(tensors), coords)


class DiracCanaries:
    """The loop's canaries (:func:`dpaudit.mechanisms.dpsgd.loop.run_dp_sgd`): at each step, each
    included canary is sampled w.p. ``config.sample_rate`` (``rng``, private, never the loop's ``noise``)
    and adds C * e_j to the clipped sum."""

    rows = False  # fixed gradients, no units of their own

    def __init__(
        self,
        canaries: GradientCanaries,
        names: list[str],
        included: np.ndarray,
        config: DPSGDConfig,
        rng: np.random.Generator,
    ):
        index = {n: i for i, n in enumerate(names)}
        # (parameter index, canary ids, coordinates)
        self.groups = [(index[t], ids, flat) for t, ids, flat in canaries.by_tensor()]
        self.included = np.asarray(included, dtype=bool)
        self.q, self.c = config.sample_rate, float(config.clipping_norm)
        self.rng = rng

    def draw(self) -> np.ndarray:
        return self.included & (self.rng.random(self.included.size) < self.q)

    def add(self, hit: np.ndarray, sums: list) -> None:
        for p, ids, flat in self.groups:
            on = hit[ids]
            if on.any():
                view = sums[p].view(-1)
                at = flat[torch.as_tensor(on)].to(view.device)
                view.index_add_(0, at, view.new_full((at.numel(),), self.c))


def _quiet_coordinates(
    name: str, tensors: tuple[str, ...], shapes: dict, x: np.ndarray
) -> np.ndarray:
    """Flat coordinates (into the concatenation of ``tensors``) that no training record moves: for
    the dense model, the first layer's weights on input features zero in every training record.
    The choice depends on the data but not on the canary coins: power, not soundness. Empty for
    the other models."""
    if name != "dense" or "fc1.weight" not in tensors:
        return np.zeros(0, dtype=np.int64)
    start = sum(int(np.prod(shapes[t])) for t in tensors[: tensors.index("fc1.weight")])
    rows, cols = shapes["fc1.weight"]
    zero = dead_features(x.reshape(x.shape[0], -1)) if x.shape[0] else np.arange(cols)
    return (start + (np.arange(rows)[:, None] * cols + zero[None, :]).reshape(-1)).astype(np.int64)


def _data_parts(data):
    """(dataset, x_pool, y_pool): a prepared dataset (loaded when a name is given) and its
    held-out pool (test, then validation rows) for input canaries."""
    if isinstance(data, str):
        data = load_dataset(data)
    pools = []
    for part in ("x", "y"):
        test, val = getattr(data, f"{part}_test"), getattr(data, f"{part}_val", None)
        pools.append(np.concatenate([test, val]) if val is not None and len(val) else test)
    return data, *pools


def modules_one_run(
    model: str,
    data,
    config,
    *,
    canaries: int,
    noise: NoiseSource,
    seed: int,
    kind: str = "gradient",
    noise_on: bool = True,
    tensors: tuple[str, ...] | None = None,
    progress=None,
    coins=None,
    device: str = "cpu",
):
    """Train ``model`` ONCE with DP-SGD ``config`` on ``data`` (a prepared dataset or a name) with
    ``canaries`` canaries of ``kind``; return their :class:`~dpaudit.audits.one_run.OneRunScores`.
    ``seed``: public (initialisation, canary coordinates / records); ``noise``: private (DP noise,
    sampling, canary coins); ``noise_on=False``: the no-noise control; ``tensors``: override
    :data:`CANARY_TENSORS`; ``coins``: a pre-registered audit's inclusion coins; ``device``:
    where the model trains (:func:`~dpaudit.mechanisms.dpsgd.module_training.train_module_dp_sgd`)."""
    name = module_name(model)
    one_of("kind", kind, ONE_RUN_MODULE_KINDS)
    m = positive_int("canaries", canaries)
    config = trial_config(config, noise_on)
    data, x_pool, y_pool = _data_parts(data)
    module, x, y, shapes, loss = module_run_parts(name, data, seed)
    theta0 = {n: p.detach().clone() for n, p in module.named_parameters()}
    # The canary coins and per-step draws: private, from a generator seeded by the private source
    # (drawn before training; the source's later draws are the DP noise and data sampling).
    crng = np.random.default_rng(noise.aux_seed())
    included = crng.random(m) < 0.5 if coins is None else np.asarray(coins, dtype=bool)
    info = {
        "model": f"dp-{name}",
        "dataset": getattr(data, "name", None),
        "canaries": m,
        "kind": kind,
        "seed": int(seed),
        "noise_on": bool(noise_on),
        "device": str(device),
        "dp_sgd": config.to_dict(),
        "n_train": int(y.size),
    }
    canary = None
    if kind == "gradient":
        chosen = tuple(tensors or CANARY_TENSORS[name])
        quiet = _quiet_coordinates(name, chosen, shapes, x)
        gc = choose_coordinates(shapes, chosen, m, seed, quiet=quiet)
        canary = DiracCanaries(gc, list(shapes), included, config, crng)
        info.update(
            gc.describe(),
            score="-(theta_T - theta_0)[j]",
            quiet_coordinates=int(quiet.size),
            quiet_rule="dense fc1.weight[:, f] for input features f that are zero in every training record "
            "(no data gradient); taken first, the rest uniform",
        )
    else:
        xc, yc = _input_canaries(x_pool, y_pool, m, seed, int(data.n_classes), info)
        x, y = np.concatenate([x, xc[included]]), np.concatenate([y, yc[included]])
        loss_before = _record_losses(module, xc, yc, loss)
    steps = train_module_dp_sgd(
        module,
        x,
        y,
        config,
        noise=noise,
        loss=loss,
        progress=progress,
        canary=canary,
        device=device,
    )
    info["steps_executed"] = int(steps)
    info["n_units"] = int(y.size)  # units: training records plus included input canaries
    if kind == "gradient":
        scores = coordinate_moves(module, theta0, gc.coords)
    else:
        scores = loss_before - _record_losses(module, xc, yc, loss)
    return OneRunScores(scores=scores.astype(np.float64), included=included, kind=kind, info=info)


def coordinate_moves(module, theta0: dict, coords) -> np.ndarray:
    """-(theta_T - theta_0)[j] at each canary coordinate ``(tensor name, flat index)`` of
    ``coords``: the trained ``module``'s parameters against their initial values ``theta0`` (in
    the dtype of ``theta0``: the subtraction is promoted to it)."""
    params = dict(module.named_parameters())
    return np.array(
        [-(params[n].detach().reshape(-1)[i] - theta0[n].reshape(-1)[i]).item() for n, i in coords]
    )


def trial_config(config, noise_on: bool) -> DPSGDConfig:
    """The private DP-SGD ``config`` a one-run or white-box audit trains with (the no-noise
    control's: :meth:`~DPSGDConfig.without_noise`); refused unless a private DPSGDConfig."""
    if not isinstance(config, DPSGDConfig):
        raise UsageError(f"config must be a DPSGDConfig, got {type(config).__name__}.")
    if config.non_private:
        raise UsageError(
            "config must be private (clipping bounds each canary's contribution), got non_private=True."
        )
    return config if noise_on else config.without_noise()


def module_run_parts(name: str, data, seed: int):
    """(module, x, y, shapes of its trainable parameters, loss) of one training run of module
    ``name`` on ``data``'s training partition: the public initialisation of ``seed``."""
    module = module_for(name, data, seed)
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters() if p.requires_grad}
    x, y = np.asarray(data.x_train, dtype=np.float32), np.asarray(data.y_train, dtype=np.int64)
    return module, x, y, shapes, "bce" if int(data.n_classes) == 2 else "cross_entropy"


def _input_canaries(x_pool, y_pool, m: int, seed: int, n_classes: int, info: dict):
    """m held-out records (public choice) with public wrong labels: (xc, yc); ``info`` records them."""
    if m > y_pool.size:
        raise UsageError(
            f"canaries must be at most {y_pool.size} (held-out records) for input canaries, got {m}."
        )
    rng = public_rng(seed, _TAG_COORDS)
    rows = rng.choice(y_pool.size, size=m, replace=False)
    xc = np.asarray(x_pool[rows], dtype=np.float32)
    shift = 1 + public_rng(seed, _TAG_LABELS).integers(0, n_classes - 1, size=m)  # a wrong label
    yc = (np.asarray(y_pool[rows], dtype=np.int64) + shift) % n_classes
    info.update(
        records="held-out (test, then validation) rows, public seed",
        rows=[int(r) for r in rows],
        labels=[int(v) for v in yc],
        score="loss(theta_0) - loss(theta_T) on the canary's wrong label",
    )
    return xc, yc


def _record_losses(module: torch.nn.Module, x: np.ndarray, y: np.ndarray, loss: str) -> np.ndarray:
    """Per-record loss ``loss`` (float64) of ``module`` (eval mode) on (x, y)."""
    was = module.training
    module.eval()
    with torch.no_grad():
        out = module(torch.as_tensor(x)).double()
        losses = dpsgd_core._loss_fn(loss, "none")(out, torch.as_tensor(y))
    module.train(was)
    return losses.numpy()


def module_config(
    model: str,
    data,
    *,
    epsilon: float,
    delta: float,
    epochs: int | None = None,
    batch_size: int | None = None,
):
    """(DPSGDConfig, event) of the release protocol for ``model`` on ``data`` at (epsilon, delta):
    the paper's schedule over the declared training size (or the given epochs / batch size) and the
    RDP-calibrated noise multiplier (:func:`dpaudit.mechanisms.dpsgd.mechanism.plan_schedule`)."""
    module_name(model)
    data, _, _ = _data_parts(data)
    reference_size = audit_reference_size(data, len(data.y_train))
    setup = plan_schedule(data, reference_size, epsilon, delta, epochs, batch_size)
    return setup.config(), setup.event
