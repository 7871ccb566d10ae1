"""The DP-SGD trainers on the shared core (:mod:`dpaudit.mechanisms.dpsgd_core`): the module loop
:func:`run_dp_sgd`, the module trainers (record or user units) and the one-run head trainer.

**Privacy contract.** Under add/remove-one-unit adjacency the clipped sum has L2 sensitivity
``clipping_norm`` conditional on all earlier outputs, so ``steps`` runs of the loop are the event
``SubsampledGaussian(noise_multiplier, sample_rate, steps)``. This holds for any function that
returns a sum of per-unit contributions each of norm <= ``clipping_norm``: the loop takes that
function as an argument (:func:`run_dp_sgd`), so a per-user (group) gradient function is swapped
in without touching the loop (:func:`train_user_module_dp_sgd`). An empty batch still produces a
noise-only update and counts as one step; the number of executed steps is returned so callers can
check it against the accounted ``steps``. Frozen parts of a model (random features, projections)
must be built from public randomness only.

Linear heads train on :func:`dpaudit.mechanisms.engine.train_heads` (R runs; :func:`train_linear_head`
is its one-run form); modules here: per-unit norms by ghost clipping, joint over all trainable parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import UsageError
from ..lazy import lazy_import
from ..noise import NoiseSource
from ..validation import positive_int
from .dpsgd_core import (  # noqa: F401 - AdamState, adam_update, head_outputs and the config are also read from here (mixmin_tasks, audits)
    AdamState,
    DPSGDConfig,
    NoisyStep,
    Progress,
    adam_update,
    check_head_inputs,
    head_outputs,
    per_sample_clipped_sum,
    poisson_batch,
)
from .engine import train_heads
from .ghost_clip import module_clipped_sum
from .user_level import _check_users, sample_user_records
np = lazy_import("numpy")
torch = lazy_import("torch")

#: Clipped-sum function: ``(params, unit_indices) -> list of tensors shaped like params``; each
#: unit's contribution must have joint L2 norm <= clipping_norm (the sensitivity of the sum).
ClippedSum = Callable[[list, "np.ndarray"], list]
#: Audit hook: ``hook(step, sums)`` may add canary gradients to the clipped sums before the noise.
CanaryHook = Callable[[int, list], None]


def run_dp_sgd(
    params: list[torch.Tensor],
    clipped_sum: ClippedSum,
    n_units: int,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    progress: Progress | None = None,
    canary_hook: CanaryHook | None = None,
) -> int:
    """Algorithm 1, steps 5-8, on ``params`` (updated in place). Returns the executed step count.

    ``clipped_sum(params, idx)`` returns the sum over the sampled units ``idx`` (indices into
    range(n_units)) of their clipped gradients (for ``non_private`` configs: unclipped). It is
    never called for an empty sample; the engine then uses a zero sum (Algorithm 1, step 6).

    The unit is whatever ``clipped_sum`` says it is: a record (the functions in this module) or,
    for user-level DP, a user whose records' summed gradient is clipped as one contribution; the
    sampling (:func:`poisson_batch`), noise, normaliser and Adam (:class:`NoisyStep`) are those
    of the linear-head engine (:mod:`dpaudit.mechanisms.engine`), which runs the same steps and
    draws on many heads at once.

    ``canary_hook(t, sums)`` (audits only, e.g. :mod:`dpaudit.mechanisms.one_run_modules`): called at
    step ``t`` after the clipped sum is written into ``sums`` (one tensor per parameter) and before
    the noise is added, so it may add canary gradients of norm <= ``clipping_norm`` in place. It
    draws from a generator of its own (seeded before training), never from ``noise`` inside the
    loop. Without a hook (every release) the loop and its draws are exactly as before.
    """
    n_units = positive_int("n_units", n_units)
    sanitise = NoisyStep(params, config, noise=noise)  # noise, m0 and Adam: the head engine's step
    steps_done = 0
    report_every = max(1, config.steps // 200)
    for t in range(1, config.steps + 1):
        idx, _ = poisson_batch(noise, 1, n_units, config.sample_rate)
        if idx.size:
            for buf, part in zip(sanitise.sums, clipped_sum(params, idx)):
                buf.copy_(part)
        else:
            for buf in sanitise.sums:
                buf.zero_()  # Algorithm 1, step 6
        if canary_hook is not None:
            canary_hook(t, sanitise.sums)
        sanitise.apply(t)
        steps_done += 1  # Algorithm 1, step 8: one accountant step, empty batches included
        if progress is not None and (steps_done % report_every == 0 or steps_done == config.steps):
            progress(steps_done, config.steps)
    return steps_done


@dataclass(frozen=True)
class HeadResult:
    """A trained linear head: ``weight`` is (K, d+1), the last column the bias."""

    weight: np.ndarray
    steps_executed: int
    binary_logit: bool = False
    config: DPSGDConfig | None = field(default=None, compare=False)


def train_linear_head(
    z: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    init: np.ndarray | None = None,
    progress: Progress | None = None,
    binary_logit: bool = False,
    dtype: torch.dtype | None = None,  # float32
    z_has_bias_column: bool = False,
    users=None,
) -> HeadResult:
    """DP-SGD (Adam) on a linear softmax head over frozen features ``z`` (n, d): one run of the
    head engine :func:`dpaudit.mechanisms.engine.train_heads` -- the engine the audits run.

    Loss: softmax cross-entropy over ``n_classes`` logits; with ``binary_logit=True`` and two
    classes, one logit with sigmoid binary cross-entropy (the paper's K = 1, section 3.5).
    The privacy contract is that of :func:`run_dp_sgd` with one unit per row of ``z``.
    ``init`` (K, d+1) must come from public randomness; zeros when omitted.
    ``z_has_bias_column=True``: ``z`` is already [z, 1] (its last column all ones, e.g. from
    ``FrozenFeatures.transform(..., bias_column=True)``) and is used without a copy.
    ``users``: an :class:`~dpaudit.mechanisms.engine.UserSampling` for user-level DP-SGD; records
    when omitted.
    """
    z, y, k = check_head_inputs(z, y, n_classes, binary_logit)
    d = z.shape[1] - 1 if z_has_bias_column else z.shape[1]
    if init is not None and np.shape(init) != (k, d + 1):
        raise UsageError(f"init must have shape {(k, d + 1)}, got {np.shape(init)}.")
    res = train_heads(z, y, n_classes, config, noise=noise, runs=1, init=init, users=users, binary_logit=binary_logit, dtype=dtype,
                      z_has_bias_column=z_has_bias_column, progress=progress)
    return HeadResult(weight=res.weights[0], steps_executed=res.steps_executed, binary_logit=k == 1, config=config)


def train_module_dp_sgd(
    module: torch.nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    config: DPSGDConfig,
    *,
    noise: NoiseSource,
    loss: str = "cross_entropy",
    progress: Progress | None = None,
    max_chunk: int = 1024,
    units: Callable | None = None,
    canary_hook: CanaryHook | None = None,
) -> int:
    """DP-SGD (Adam) on every trainable parameter of ``module`` (in place). Returns executed steps.

    ``x`` must already have the shape the module expects (e.g. (n, C, H, W)). The module is put in
    training mode (dropout active; each example its own mask). Dropout masks are drawn from a
    generator seeded from the private noise source inside a forked RNG, so global torch RNG
    state is left untouched. Same privacy contract as :func:`run_dp_sgd`.

    Clipped sums: :func:`~dpaudit.mechanisms.ghost_clip.module_clipped_sum`, the one kernel of
    module models (ghost norms; ``torch.func`` per-sample gradients where a layer is not covered).
    ``units``: optional privacy-unit hook (user-level DP-SGD): ``units(record_sum)`` returns
    ``(n_units, unit_sum)``, where ``record_sum(params, rows, seg=None, k=None)`` is this
    function's clipped sum over ``rows`` (grouped into units by ``seg``/``k`` as
    :func:`module_clipped_sum` takes them); the engine then Poisson-samples range(n_units) and
    calls ``unit_sum``.
    ``canary_hook``: one-run audits only (:func:`run_dp_sgd`); None for releases.
    """
    xt = torch.as_tensor(x)
    yt = torch.as_tensor(y)
    if xt.shape[0] != yt.shape[0]:
        raise UsageError(f"x and y must have the same number of rows, got {xt.shape[0]} and {yt.shape[0]}.")
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    # Views of the module's own parameters: Adam updates them in place.
    params = [p.detach() for n, p in module.named_parameters() if p.requires_grad]
    clip = not config.non_private
    module.train()

    def clipped_sum(ps, idx, seg=None, k=None):  # frozen parameters: the module's own, outside the clipped norm
        total = module_clipped_sum(module, dict(zip(names, ps)), xt, yt, idx, config.clipping_norm, loss=loss, clip=clip, seg=seg, k=k, max_chunk=max_chunk)
        return [total[n] for n in names]

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(noise.aux_seed() if hasattr(noise, "aux_seed") else int(noise.numpy.integers(0, 2**63 - 1)))
        n_units, engine_sum = units(clipped_sum) if units is not None else (int(xt.shape[0]), clipped_sum)
        steps = run_dp_sgd(params, engine_sum, n_units, config, noise=noise, progress=progress, canary_hook=canary_hook)
    return steps


def train_user_module_dp_sgd(
    module: torch.nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    users,
    config: DPSGDConfig,
    *,
    records_per_user: int,
    noise: NoiseSource,
    loss: str = "cross_entropy",
    progress: Progress | None = None,
    max_chunk: int = 1024,
) -> int:
    """User-level DP-SGD (Adam) on every trainable parameter of ``module`` (in place).

    Returns executed steps. ``users``: a user id per row of ``x`` (or a ``UserIndex``). Runs
    :func:`train_module_dp_sgd` with users as its units: training mode,
    dropout generator, noise, Adam and clipped-sum kernel are the record-level ones (with every
    sampled user contributing one record, the very same computation). Privacy contract: module docstring.
    """
    g = positive_int("records_per_user", records_per_user)
    xt = torch.as_tensor(x)
    yt = torch.as_tensor(y)
    index = _check_users(users, int(xt.shape[0]))

    def units(record_sum):
        def unit_sum(ps, sampled):
            rows, seg, k = sample_user_records(index, sampled, g, noise)
            return record_sum(ps, rows, seg, k)

        return index.n_users, unit_sum

    return train_module_dp_sgd(module, xt, yt, config, noise=noise, loss=loss, progress=progress, max_chunk=max_chunk, units=units)
