"""The module trainer on the one DP-SGD loop (:func:`dpaudit.mechanisms.engine.run_dp_sgd`; heads:
:func:`dpaudit.mechanisms.engine.train_heads`): record or user units, per-unit norms by ghost
clipping, joint over all trainable parameters. Privacy contract: :mod:`dpaudit.mechanisms.engine`.
"""

from __future__ import annotations


from ..errors import UsageError
from ..lazy import lazy_import
from ..noise import NoiseSource
from ..validation import positive_int
from .dpsgd_core import DPSGDConfig, Progress  # DPSGDConfig is also read from here (releases, audits)
from .engine import SumUnits, UserSampling, run_dp_sgd
from .ghost_clip import module_clipped_sum
from .user_level import _check_users, sample_user_records
np = lazy_import("numpy")
torch = lazy_import("torch")


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
    recorder=None,
) -> int:
    """DP-SGD on every trainable parameter of ``module`` (in place), one run of the loop
    :func:`~dpaudit.mechanisms.engine.run_dp_sgd`. Returns executed steps.

    ``x`` must already have the shape the module expects (e.g. (n, C, H, W)). The module is put in
    training mode (dropout active; each example its own mask). Dropout masks are drawn from a
    generator seeded from the private noise source inside a forked RNG, so global torch RNG
    state is left untouched.

    Clipped sums: :func:`~dpaudit.mechanisms.ghost_clip.module_clipped_sum`. ``users``: a
    :class:`~dpaudit.mechanisms.engine.UserSampling` for user-level DP-SGD (each sampled user's
    records one unit of the same kernel), records when omitted. ``canary``, ``recorder``: audits only (the loop's canary and recorder
    interfaces; the white-box observer, :mod:`~dpaudit.mechanisms.white_box_target`).
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
        return run_dp_sgd(units, params, config, noise=noise, progress=progress, canary=canary, recorder=recorder)
