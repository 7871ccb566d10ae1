"""The module trainer on the one DP-SGD loop (:func:`dpaudit.mechanisms.dpsgd.loop.run_dp_sgd`; heads:
:func:`dpaudit.mechanisms.dpsgd.loop.train_heads`): record or user units, per-unit norms by ghost
clipping, joint over all trainable parameters. Privacy contract: :mod:`dpaudit.mechanisms.dpsgd.loop`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import platform

from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource
from ...requests import DEVICES
from ...validation import one_of, positive_int
from .core import DPSGDConfig, Progress  # DPSGDConfig is also read from here (releases, audits)
from .loop import SumUnits, UserSampling, run_dp_sgd
from .ghost_clip import ghost_layers, module_clipped_sum
from .user_level import _check_users, sample_user_records

np = lazy_import("numpy")
torch = lazy_import("torch")


def resolve_device(name: str, *, supported: bool = True) -> str:
    """The torch device a run uses for ``--device name``: ``cpu``; ``cuda``; ``auto``, cuda when
    torch finds a CUDA device, else cpu. ``supported=False``: a run that only runs on the CPU
    (head models, white-box and trial audits), where ``auto`` is cpu.

    Raises:
        UsageError: ``name`` is none of :data:`DEVICES`, or ``cuda`` where it is not supported or
        torch finds no CUDA device (checked before any data are loaded).
    """
    one_of("device", name, DEVICES)
    if name == "cpu" or (name == "auto" and not supported):
        return "cpu"
    available = bool(torch.cuda.is_available())
    if name == "cuda" and not (supported and available):
        where = (
            "on this machine (torch finds no CUDA device)"
            if supported
            else "for this run (it runs on the CPU only)"
        )
        raise UsageError(f"device must be cpu or auto {where}, got 'cuda'.")
    return "cuda" if available else "cpu"


#: glibc ``mallopt`` parameter (malloc.h: M_MMAP_THRESHOLD, M_TRIM_THRESHOLD) -> (value while a
#: module trains, value restored after: glibc's documented default, 128 KiB, for both).
_HEAP_SETTINGS = {-3: (32 << 20, 128 << 10), -1: (64 << 20, 128 << 10)}


@functools.cache
def _glibc():
    """The C library when it is glibc (its ``mallopt``), else None."""
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    return ctypes.CDLL(None) if glibc else None


@contextlib.contextmanager
def keep_freed_tensor_memory():
    """While the block runs, glibc keeps freed tensor memory for reuse (speed only, never privacy):
    blocks up to 32 MB from the heap, up to 64 MB of free heap kept, the ceilings of glibc's own
    adaptive thresholds. A module's DP-SGD step frees and re-allocates MBs of activations and
    per-record gradients; handed back to the OS they return as fresh zero-filled pages (MNIST
    dp-cnn, batch 256: about 105 -> 83 ms CPU a step, BENCHMARKS.md section 2). Nothing where libc
    is not glibc. Blocks that overlap (threads) restore when the first leaves: speed only.

    Restored: glibc's documented starting values (128 KiB each, mallopt(3)). glibc cannot report
    its current values, and once ``mallopt`` set one it stops adapting them, for good; these are
    the lowest its adaptive thresholds take, so after training the process keeps no more freed
    memory than glibc's own heap would, as at its start. A process that tuned these thresholds
    itself (``mallopt``, ``GLIBC_TUNABLES``) gets these values back, not its own."""
    libc = _glibc()
    settings = _HEAP_SETTINGS if libc is not None else {}
    for param, (training, _) in settings.items():
        libc.mallopt(param, training)
    try:
        yield
    finally:
        for param, (_, restored) in settings.items():
            libc.mallopt(param, restored)


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
    device: str = "cpu",
) -> int:
    """DP-SGD on every trainable parameter of ``module`` (in place), one run of the loop
    :func:`~dpaudit.mechanisms.dpsgd.loop.run_dp_sgd`. Returns executed steps.

    ``x`` must already have the shape the module expects (e.g. (n, C, H, W)). The module is put in
    training mode (dropout active; each example its own mask). Dropout masks are drawn from a
    generator seeded from the private noise source inside a forked RNG, so global torch RNG
    state is left untouched.

    Clipped sums: :func:`~dpaudit.mechanisms.dpsgd.ghost_clip.module_clipped_sum`. ``users``: a
    :class:`~dpaudit.mechanisms.dpsgd.loop.UserSampling` for user-level DP-SGD (each sampled user's
    records one unit of the same kernel), records when omitted. ``canary``, ``recorder``: audits only (the loop's canary and recorder
    interfaces; the white-box observer, :mod:`~dpaudit.mechanisms.dpsgd.white_box_target`).

    ``device`` (a torch device, :func:`resolve_device`): the module, the clipped-sum kernel and the
    optimizer state live there, each step's batch is moved there, and the noise (drawn on the CPU
    by ``noise``) is moved there once per step (:class:`~dpaudit.mechanisms.dpsgd.core.NoisyStep`);
    the module is back on the CPU when this returns. The device changes no draw from ``noise``.
    """
    xt = torch.as_tensor(x)
    yt = torch.as_tensor(y)
    if xt.shape[0] != yt.shape[0]:
        raise UsageError(
            f"x and y must have the same number of rows, got {xt.shape[0]} and {yt.shape[0]}."
        )
    device = torch.device(device)
    if device.type != "cpu" and ghost_layers(module) is None:
        raise UsageError(
            f"device must be cpu for a model with trainable layers ghost clipping "
            f"does not cover, got {device}."
        )
    heap = keep_freed_tensor_memory() if device.type == "cpu" else contextlib.nullcontext()
    loop_options = dict(progress=progress, canary=canary, recorder=recorder)
    module.to(device)
    try:
        units, params = _module_units(module, xt, yt, config, noise, users, loss, max_chunk)
        cuda = [params[0].device] if params and params[0].device.type == "cuda" else []
        with heap, torch.random.fork_rng(devices=cuda):  # dropout masks: seeded below, RNGs kept
            torch.manual_seed(noise.aux_seed())
            return run_dp_sgd(units, params, config, noise=noise, **loop_options)
    finally:
        module.to("cpu")


def _module_units(module, xt, yt, config, noise, users, loss: str, max_chunk: int):
    """(the units of a module's run, records or users, with their clipped-sum kernel; the trainable
    parameters, views the optimizer updates in place) of a module already on its device, put in
    training mode. Frozen parameters stay the module's own, outside the clipped norm."""
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    params = [p.detach() for n, p in module.named_parameters() if p.requires_grad]
    options = dict(loss=loss, clip=not config.non_private, max_chunk=max_chunk)
    module.train()

    def clipped_sum(ps, idx, seg=None, k=None):
        at = dict(zip(names, ps))
        total = module_clipped_sum(
            module, at, xt, yt, idx, config.clipping_norm, seg=seg, k=k, **options
        )
        return [total[n] for n in names]

    if users is None:
        return SumUnits(clipped_sum, int(xt.shape[0])), params
    g = positive_int("records_per_user", users.records_per_user)
    index = _check_users(users.index, int(xt.shape[0]))

    def user_sum(ps, sampled):
        return clipped_sum(ps, *sample_user_records(index, sampled, g, noise))

    return SumUnits(user_sum, index.n_users), params
