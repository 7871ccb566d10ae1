"""White-box and crafted-final audits of the trainable DP-SGD models ``dp-dense`` and ``dp-cnn``, and
white-box audits of the DP-SGD heads (``dp-rvfl`` family, :func:`head_white_box_run`) (the
statistics: :mod:`dpaudit.audits.white_box`; docs/white_box.md).

Both insert M Dirac gradient canaries at distinct public coordinates of :data:`CANARY_TENSORS`
(for dp-dense the quiet first-layer weights first) through the one DP-SGD loop's canary
interface (:func:`~dpaudit.mechanisms.dpsgd.loop.run_dp_sgd`; a release never passes one). Each
sampled canary's raw gradient is :data:`RAW_GRADIENT_SCALE` C e_j, clipped by the loop's one
clipping rule (:func:`~dpaudit.mechanisms.dpsgd.core.clip_factors`) before it joins the clipped
sum, so a clipping fault shows as a contribution d > 1.

* ``white-box``: every canary is in the dataset and sampled at rate q at every step (private
  generator). :class:`StepObserver` reads, at each step, the other records' clipped sum at each
  canary coordinate (before the canaries are added: what the white-box auditor computes from the
  batch and the parameters) and the privatised sum there (the loop's own noise draw, read through
  the loop's recorder interface, bit for bit what the step uses): y_t = (privatised - others) / C.
* ``crafted-final``: each canary is inserted on a private fair coin, the model trains with plain
  SGD (no momentum, no weight decay: post-processing of the same privatised sums; the claim is
  unchanged) and only the final model is read: x = -(theta_T - theta_0)[j] m0 / (lr C). Only quiet
  coordinates (no training record's gradient touches them) qualify: dp-dense on data with
  always-zero input features.

**Privacy contract / soundness.** Coins and canary sampling come from a generator seeded by the
private noise source; the schedule (q, T, m0), noise multiplier and clipping norm are the claim's.
The observers read the loop's buffers and draw nothing, so the DP noise and data sampling are
those of a release of the same configuration.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...audits import white_box
from ...audits.power_runs import white_box_power
from ...audits.white_box import FinalObservations, StepObservations
from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource
from ...records import write_json_atomic
from ...validation import one_of, positive_int
from . import core as dpsgd_core
from .module_training import DPSGDConfig, train_module_dp_sgd
from .core import head_threads
from .loop import RecordUnits, initial_heads, run_dp_sgd
from .head_audit import HeadTarget
from .one_run_heads import free_coordinates
from .one_run_modules import (
    DiracCanaries,
    coordinate_moves,
    GradientCanaries,
    _quiet_coordinates,
    choose_coordinates,
    module_name,
    module_run_parts,
    trial_config,
)

np = lazy_import("numpy")
torch = lazy_import("torch")

#: Models with a white-box audit, and the tensors that hold their canaries.
CANARY_TENSORS: dict[str, tuple[str, ...]] = {"dense": ("fc1.weight",), "cnn": ("fc1.weight",)}
#: A canary's raw gradient norm in units of C (> 1: the clipping rule must scale it down to C).
RAW_GRADIENT_SCALE = 4.0
#: The plain-SGD learning rate of a crafted-final run whose configuration uses another optimizer.
CRAFTED_FINAL_LR = 0.05
ROLES = ("main", "no-noise", "null")
_TAG_WHITE_BOX = 0x57424F58  # "WBOX": public choice of canary coordinates


class StepObserver(DiracCanaries):
    """Dirac canaries for the loop (``rows``, ``draw``, ``add``) that also observe every step
    (the loop's recorder interface, ``record``): module docstring.

    ``scale``: the raw gradient in units of C (0: the null control, canaries drawn but adding
    nothing). ``included`` (M,): the canaries in the dataset. ``observe=False`` (hidden state):
    canaries only, nothing kept. After the run, ``sampled``,
    ``others`` and ``privatised`` (M, T) hold b_t, the others' clipped sum and the privatised
    sum at each canary coordinate."""

    def __init__(
        self,
        canaries: GradientCanaries,
        names: list[str],
        included: np.ndarray,
        config: DPSGDConfig,
        rng: np.random.Generator,
        scale: float = RAW_GRADIENT_SCALE,
        observe: bool = True,
    ):
        super().__init__(canaries, names, included, config, rng)
        # the loop's buffers are NumPy arrays (heads) or tensors over them (modules): work on the arrays
        self.groups = [(p, ids, flat.numpy()) for p, ids, flat in self.groups]
        self.scale = float(scale)
        # hidden state: nothing kept
        shape = (self.included.size, config.steps) if observe else (self.included.size, 0)
        self.observe = observe
        self.sampled = np.zeros(shape, dtype=bool)
        self.others, self.privatised = np.zeros(shape), np.zeros(shape)
        self.t = -1

    def draw(self) -> np.ndarray:
        self.t += 1
        hit = super().draw()
        if self.observe:
            self.sampled[:, self.t] = hit
        return hit

    def add(self, hit: np.ndarray, sums: list) -> None:
        for p, ids, flat in self.groups:
            view = np.asarray(sums[p]).reshape(-1)  # shares the buffer (C-ordered)
            if self.observe:
                # the other records' clipped sum, before the canaries
                self.others[ids, self.t] = view[flat]
            on = hit[ids]
            k = int(on.sum())
            if k:
                raw = np.full(k, self.scale * self.c, dtype=view.dtype)
                # the one clipping rule, per canary
                view[flat[on]] += raw * dpsgd_core.clip_factors(np.abs(raw), self.c)

    def record(self, t: int, arrays: list) -> None:
        """The privatised sums at the canary coordinates (the loop's recorder interface: read by
        the noisy step after ``sums += noise``, the step's own float additions)."""
        for p, ids, flat in self.groups:
            self.privatised[ids, t - 1] = arrays[p].reshape(-1)[flat]

    def observations(self) -> StepObservations:
        """y_t = (privatised - others) / C and b_t of every canary (in the dataset) at every step."""
        rows = self.included
        return StepObservations(
            (self.privatised[rows] - self.others[rows]) / self.c, self.sampled[rows]
        )


@dataclasses.dataclass(frozen=True)
class WhiteBoxRun:
    """One training run's observations (:class:`StepObservations` or :class:`FinalObservations`) and its description."""

    observations: object
    info: dict


def white_box_run(
    model: str,
    data,
    config: DPSGDConfig,
    *,
    canaries: int,
    noise: NoiseSource,
    seed: int,
    threat_model: str = "white-box",
    role: str = "main",
    progress=None,
) -> WhiteBoxRun:
    """Train ``model`` once with DP-SGD ``config`` on the prepared dataset ``data`` with
    ``canaries`` Dirac canaries observed under ``threat_model`` (module docstring). ``seed``:
    public (initialisation, coordinates); ``noise``: private (DP noise, sampling, canary coins).
    ``role``: ``no-noise`` trains without DP noise (the control that must show leakage), ``null``
    with canaries that add nothing (the control that must show none)."""
    name = _model_name(model)
    one_of("threat_model", threat_model, ("white-box", "crafted-final"))
    one_of("role", role, ROLES)
    m = positive_int("canaries", canaries, 2)
    config = trial_config(config, noise_on=role != "no-noise")
    if threat_model == "crafted-final":
        config = _plain_sgd(config)
    module, x, y, shapes, loss = module_run_parts(name, data, seed)
    quiet = _quiet_coordinates(name, CANARY_TENSORS[name], shapes, x)
    if threat_model == "crafted-final" and quiet.size < m:
        raise UsageError(
            f"canaries for crafted-final must be at most the {quiet.size} coordinates no training record moves "
            f"({model} on {getattr(data, 'name', 'this dataset')}), got {m}."
        )
    white = threat_model == "white-box"
    coords, observer = _observer(
        shapes, CANARY_TENSORS[name], quiet, m, seed, config, noise, role, white
    )
    theta0 = {n: p.detach().double().clone() for n, p in module.named_parameters()}
    steps = train_module_dp_sgd(
        module,
        torch.as_tensor(x),
        torch.as_tensor(y),
        config,
        noise=noise,
        loss=loss,
        progress=progress,
        canary=observer,
        recorder=observer if white else None,
    )
    run = {"model": f"dp-{name}", "dataset": getattr(data, "name", None)}
    info = _run_info(run, coords, observer, config, steps, quiet, threat_model, role, seed)
    if white:
        return WhiteBoxRun(observer.observations(), info)
    moved = coordinate_moves(module, theta0, coords.coords)
    final = moved * config.normalizer / (config.lr * config.clipping_norm)
    return WhiteBoxRun(FinalObservations(final, observer.included, int(steps)), info)


def _observer(shapes, tensors, quiet, m: int, seed: int, config, noise, role: str, white=True):
    """(the canaries' coordinates, their :class:`StepObserver`) of a white-box run: m coordinates
    of ``tensors`` (``quiet`` ones first, public ``seed``), every canary in the dataset (``white``)
    or each on a private fair coin, drawn with the canary sampling from a generator seeded by the
    private ``noise``; the ``null`` role's canaries add nothing."""
    coords = choose_coordinates(shapes, tensors, m, seed, quiet=quiet, tag=_TAG_WHITE_BOX)
    crng = np.random.default_rng(noise.aux_seed())  # private: coins and canary sampling
    included = np.ones(m, dtype=bool) if white else crng.random(m) < 0.5
    scale = 0.0 if role == "null" else RAW_GRADIENT_SCALE
    observer = StepObserver(
        coords, list(shapes), included, config, crng, scale=scale, observe=white
    )
    return coords, observer


def _run_info(run: dict, coords, observer, config, steps, quiet, threat_model, role, seed) -> dict:
    """A white-box run's description: ``run`` (model, dataset), the canaries, the role, the
    training config, the executed steps and the chosen (``quiet``-first) coordinates."""
    return {
        **run,
        "canaries": int(observer.included.size),
        "threat_model": threat_model,
        "role": role,
        "seed": int(seed),
        "dp_sgd": config.to_dict(),
        "steps_executed": int(steps),
        "raw_gradient_scale": observer.scale,
        "quiet_coordinates": int(len(quiet)),
        **coords.describe(),
    }


def head_white_box_run(
    target: HeadTarget,
    *,
    canaries: int,
    noise: NoiseSource,
    seed: int,
    role: str = "main",
    progress=None,
) -> WhiteBoxRun:
    """The ``white-box`` run of a DP-SGD head target (``dp-rvfl`` and its frozen-feature controls,
    record level): the head trained once by the one loop, on the target's public set-up, schedule
    and noise multiplier, with ``canaries`` Dirac canaries on head weights (those on features zero
    in every training record first), every step observed as for the modules. ``seed``: public
    (coordinates); ``noise``: private (DP noise, sampling, canary draws); ``role`` as in
    :func:`white_box_run`."""
    if not isinstance(target, HeadTarget):
        raise UsageError(
            f"target must be a record-level DP-SGD head target, got {type(target).__name__}."
        )
    one_of("role", role, ROLES)
    m = positive_int("canaries", canaries, 2)
    target.prepare()
    cfg = target._config.without_noise() if role == "no-noise" else target._config
    lay = target._layout  # the target's rows (a record canary's row after them, never drawn)
    k, d = lay.k, lay.d
    free = free_coordinates(target._z, k)
    quiet = free[:, 0] * (d + 1) + free[:, 1]
    coords, observer = _observer({"head": (k, d + 1)}, ("head",), quiet, m, seed, cfg, noise, role)
    units = RecordUnits(lay, cfg)
    head = np.array(initial_heads(target._init, 1, k, d), dtype=np.float32, order="C")
    with head_threads():
        steps = run_dp_sgd(
            units, [head], cfg, noise=noise, canary=observer, recorder=observer, progress=progress
        )
    run = {"model": target.model, "dataset": target._dataset_name}
    info = _run_info(run, coords, observer, cfg, steps, quiet, "white-box", role, seed)
    return WhiteBoxRun(observer.observations(), info)


def _model_name(model: str) -> str:
    name = module_name(model)
    if name not in CANARY_TENSORS:
        raise UsageError(
            f"model for a white-box audit must be one of dp-dense, dp-cnn, got {model!r}."
        )
    return name


def _plain_sgd(config: DPSGDConfig) -> DPSGDConfig:
    """``config`` with plain SGD (its own learning rate if it already is plain SGD): the final
    coordinate is then a sum over the steps."""
    if config.optimizer == "sgd" and config.momentum == 0.0:
        return config
    return dataclasses.replace(config, optimizer="sgd", momentum=0.0, lr=CRAFTED_FINAL_LR)


# ---------------------------------------------------------------- the audit with its controls

#: The statistic of each threat model (:mod:`dpaudit.audits.white_box`).
_BOUNDS = {"white-box": white_box.step_bound, "crafted-final": white_box.final_bound}
WHITE_BOX_FILE = "white_box.json"
WHITE_BOX_LOCAL_FILE = "white_box_local.json"
#: Run descriptions kept out of the shareable record (derived from the private training data).
LOCAL_KEYS = ("coordinates", "quiet_coordinates")


@dataclasses.dataclass(frozen=True)
class WhiteBoxAudit:
    """The main bound and the controls' (``no-noise`` must exceed the claim: the canaries are
    seen; ``null`` must not: canaries that add nothing show nothing), with each run's description."""

    bounds: dict
    infos: dict
    command: str | None = None
    power: dict | None = None  # what these canaries can detect (audits.power_runs.white_box_power)

    @property
    def main(self):
        return self.bounds["main"]

    @property
    def violated(self) -> bool:
        return self.main.violation

    def controls_ok(self) -> dict:
        """Per control: True when it behaved as it must (module docstring)."""
        out = {}
        if "no-noise" in self.bounds:
            out["no-noise"] = self.bounds["no-noise"].violation
        if "null" in self.bounds:
            out["null"] = not self.bounds["null"].violation
        return out

    def to_dict(self, *, local: bool = False) -> dict:
        """The record; without ``local``, shareable: the canary coordinates (chosen among input
        features zero in every training record, so derived from the private data) are left out."""
        runs = (
            self.infos
            if local
            else {
                r: {k: v for k, v in i.items() if k not in LOCAL_KEYS}
                for r, i in self.infos.items()
            }
        )
        return {
            "schema": "dpaudit.white-box/1",
            "threat_model": self.main.threat_model,
            "violated": self.violated,
            "epsilon_lb": self.main.to_dict()["epsilon_lb"],
            "claimed_epsilon": self.main.claimed_epsilon,
            "bounds": {r: b.to_dict() for r, b in self.bounds.items()},
            "controls_ok": self.controls_ok(),
            "runs": runs,
            "command": self.command,
            "power": self.power,
        }


def white_box_audit(
    model: str,
    data,
    config: DPSGDConfig,
    claim: dict,
    *,
    canaries: int,
    noise: NoiseSource,
    seed: int,
    threat_model: str = "white-box",
    confidence: float = 0.95,
    controls: bool = True,
    command: str | None = None,
    progress=None,
) -> WhiteBoxAudit:
    """The ``threat_model`` audit of ``model`` (one training run, two more with ``controls``)
    against ``claim`` (``event``, ``delta``, ``accountant``, ``claimed_epsilon`` or None), each
    run's observations turned into its bound by :mod:`dpaudit.audits.white_box`. ``model``:
    dp-dense / dp-cnn trained on ``data`` with ``config``, or a :class:`HeadTarget` (white-box
    only; ``data`` and ``config`` unused: the target's own)."""
    bound = _BOUNDS[one_of("threat_model", threat_model, tuple(_BOUNDS))]
    if isinstance(model, HeadTarget) and threat_model != "white-box":
        raise UsageError(
            f"threat model for a DP-SGD head must be white-box (crafted-final: dp-dense), got {threat_model!r}."
        )
    bounds, infos = {}, {}
    judged = dict(delta=claim["delta"], accountant=claim["accountant"], confidence=confidence)
    judged["claimed_epsilon"] = claim.get("claimed_epsilon")
    for role in ROLES if controls else ("main",):
        shown = None if progress is None else progress(role)
        common = dict(canaries=canaries, noise=noise, seed=seed, role=role, progress=shown)
        if isinstance(model, HeadTarget):
            run = head_white_box_run(model, **common)
        else:
            run = white_box_run(model, data, config, threat_model=threat_model, **common)
        bounds[role] = bound(run.observations, claimed=claim["event"], **judged)
        infos[role] = run.info
    power = white_box_power(claim["event"], canaries, threat_model=threat_model, **judged)
    return WhiteBoxAudit(bounds, infos, command, power.to_dict())


def write_white_box(result: WhiteBoxAudit, out_dir) -> Path:
    """``out_dir/white_box.json`` (shareable: bounds, controls, public configuration) and
    ``white_box_local.json`` beside it (also the data-derived canary coordinates: not for publication)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / WHITE_BOX_LOCAL_FILE, result.to_dict(local=True))
    return write_json_atomic(out / WHITE_BOX_FILE, result.to_dict())
