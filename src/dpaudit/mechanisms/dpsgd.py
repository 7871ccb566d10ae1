"""The DP-SGD trainers on the one loop (:func:`dpaudit.mechanisms.engine.run_dp_sgd`): the module
trainer (record or user units, per-unit norms by ghost clipping, joint over all trainable
parameters) and the one-run head trainer. Privacy contract: :mod:`dpaudit.mechanisms.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import UsageError
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
from .engine import SumUnits, UserSampling, run_dp_sgd, train_heads
from .ghost_clip import module_clipped_sum
from .user_level import _check_users, sample_user_records


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
    dtype: torch.dtype = torch.float32,
    z_has_bias_column: bool = False,
    users=None,
) -> HeadResult:
    """DP-SGD (Adam) on a linear softmax head over frozen features ``z`` (n, d): one run of the
    head engine :func:`dpaudit.mechanisms.engine.train_heads` -- the engine the audits run.

    Loss: softmax cross-entropy over ``n_classes`` logits; with ``binary_logit=True`` and two
    classes, one logit with sigmoid binary cross-entropy (the paper's K = 1, section 3.5).
    Privacy contract: :mod:`dpaudit.mechanisms.engine`, one unit per row of ``z``.
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
    users: UserSampling | None = None,
    loss: str = "cross_entropy",
    progress: Progress | None = None,
    max_chunk: int = 1024,
    canary=None,
) -> int:
    """DP-SGD on every trainable parameter of ``module`` (in place), one run of the loop
    :func:`~dpaudit.mechanisms.engine.run_dp_sgd`. Returns executed steps.

    ``x`` must already have the shape the module expects (e.g. (n, C, H, W)). The module is put in
    training mode (dropout active; each example its own mask). Dropout masks are drawn from a
    generator seeded from the private noise source inside a forked RNG, so global torch RNG
    state is left untouched.

    Clipped sums: :func:`~dpaudit.mechanisms.ghost_clip.module_clipped_sum`, the one kernel of
    module models (ghost norms; ``torch.func`` per-sample gradients where a layer is not covered).
    ``users``: a :class:`~dpaudit.mechanisms.engine.UserSampling` (``index``: a user id per row or
    a ``UserIndex``) for user-level DP-SGD, records when omitted: the loop Poisson-samples users
    and each sampled user's min(G, |D_u|) records form one unit of the same kernel (with one
    record per user, the very same computation as records). ``canary``: one-run audits only
    (:class:`~dpaudit.mechanisms.one_run_modules.DiracCanaries`); None for releases.
    """
    xt = torch.as_tensor(x)
    yt = torch.as_tensor(y)
    if xt.shape[0] != yt.shape[0]:
        raise UsageError(f"x and y must have the same number of rows, got {xt.shape[0]} and {yt.shape[0]}.")
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    # Views of the module's own parameters: the optimizer updates them in place.
    params = [p.detach() for n, p in module.named_parameters() if p.requires_grad]
    clip = not config.non_private
    module.train()

    def clipped_sum(ps, idx, seg=None, k=None):  # frozen parameters: the module's own, outside the clipped norm
        total = module_clipped_sum(module, dict(zip(names, ps)), xt, yt, idx, config.clipping_norm, loss=loss, clip=clip, seg=seg, k=k, max_chunk=max_chunk)
        return [total[n] for n in names]

    units = SumUnits(clipped_sum, int(xt.shape[0]))
    if users is not None:
        g = positive_int("records_per_user", users.records_per_user)
        index = _check_users(users.index, int(xt.shape[0]))

        def user_sum(ps, sampled):
            return clipped_sum(ps, *sample_user_records(index, sampled, g, noise))

        units = SumUnits(user_sum, index.n_users)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(noise.aux_seed() if hasattr(noise, "aux_seed") else int(noise.numpy.integers(0, 2**63 - 1)))
        return run_dp_sgd(units, params, config, noise=noise, progress=progress, canary=canary)
