"""The clipped-sum kernel of module models (releases, trial and one-run audits; record and user
units): per-unit gradient norms without per-sample gradients of the whole model.

One forward pass stores every trained layer's input, one backward pass of the summed loss (w.r.t.
the layer outputs only) their output gradients. A layer's gradient for unit u is ``sum_s g_s a_s^T``
over the unit's rows s (records times positions: tokens, or a convolution's output pixels), so per
layer, whichever costs fewer multiply-adds (mixed ghost clipping, Bu et al. 2022): the ghost norm
``||grad_u||^2 = <A_u A_u^T, G_u G_u^T>`` (Li et al. 2022; a user's records are one long sequence,
so the cross terms are exact), or the materialised (p, d) gradient per unit. The clipped sum reuses
what the pass stored (book-keeping, Bu et al. 2023). Unit gradients, norms and clipping are those
of the reference kernels (:func:`~dpaudit.mechanisms.dpsgd.core.per_sample_clipped_sum`,
:func:`~dpaudit.mechanisms.dpsgd.user_level.user_module_clipped_sum`), so the sums agree to float
rounding and the sensitivity C holds (tests/mechanisms/test_ghost_clipping.py). Modules with a trainable parameter outside
``nn.Linear``/``nn.Conv1d``/``nn.Conv2d`` (groups 1, zero padding) go to the reference kernels.
Like every per-sample method (Opacus included), this assumes rows do not interact in the
forward pass (no batch norm), as in :mod:`dpaudit.mechanisms.dpsgd.models`.
"""

from __future__ import annotations

import operator
from functools import reduce

from ...errors import UsageError
from ...lazy import lazy_import
from . import core as dpsgd_core, user_level

np = lazy_import("numpy")
torch = lazy_import("torch")
nn = lazy_import("torch.nn")


def ghost_layers(module: nn.Module) -> dict | None:
    """The layers holding ``module``'s trainable parameters by name, or None when some trainable
    parameter lies outside a layer this kernel covers."""
    layers = {name: layer for name, layer in module.named_modules() if _trained_layer(layer)}
    owned = {
        f"{name}.{own}".lstrip(".")  # the module itself has the name ""
        for name, layer in layers.items()
        for own, p in layer.named_parameters(recurse=False)
        if p.requires_grad
    }
    trained = {name for name, p in module.named_parameters() if p.requires_grad}
    return layers if owned == trained and all(map(_covered, layers.values())) else None


def _trained_layer(layer: nn.Module) -> bool:
    """An ``nn.Linear``, ``nn.Conv1d`` or ``nn.Conv2d`` with a trainable parameter of its own."""
    return isinstance(layer, (nn.Linear, nn.Conv1d, nn.Conv2d)) and any(
        p.requires_grad for p in layer.parameters(recurse=False)
    )


def _covered(layer: nn.Module) -> bool:
    """A layer this kernel covers: ``nn.Linear``, or a convolution of groups 1 and zero padding."""
    return isinstance(layer, nn.Linear) or (
        layer.groups == 1 and not isinstance(layer.padding, str) and layer.padding_mode == "zeros"
    )


def module_clipped_sum(
    module,
    params: dict,
    x: torch.Tensor,
    y: torch.Tensor,
    rows: np.ndarray,
    clipping_norm: float,
    *,
    loss: str = "cross_entropy",
    clip: bool = True,
    seg=None,
    k=None,
    max_chunk: int = 1024,
) -> dict:
    """THE clipped sum of module models: sum over units u of clip((1/k_u) sum_{i in u} grad l_i)
    (joint L2 norm over all trainable parameters, :func:`~dpaudit.mechanisms.dpsgd.core.clip_factors`).
    ``rows``: record indices into (x, y), grouped by unit; ``seg[i]``: the unit of ``rows[i]``, ``k``:
    records per unit (None: record units). ``params``: what the reference kernel evaluates at. Units
    go in groups of at most ``max_chunk`` rows (:func:`~dpaudit.mechanisms.dpsgd.user_level.summed_over_chunks`).
    (x, y) may stay on the CPU: each group's rows are moved to the device of ``params``."""
    if seg is None:
        seg, k = np.arange(rows.size), np.ones(rows.size, dtype=np.int64)
    if ghost_layers(module) is None:
        return user_level.user_module_clipped_sum(
            module,
            params,
            x,
            y,
            rows,
            seg,
            k,
            clipping_norm,
            loss=loss,
            clip=clip,
            max_chunk=max_chunk,
        )
    device = next(iter(params.values())).device

    def part(ua: int, ub: int, r0: int, r1: int) -> dict:
        j, kc = torch.as_tensor(rows[r0:r1]), k[ua:ub]
        return ghost_clipped_sum(
            module,
            x[j].to(device),
            y[j].to(device),
            clipping_norm,
            loss=loss,
            clip=clip,
            seg=None if np.all(kc == 1) else seg[r0:r1] - ua,
            k=kc,
        )

    return user_level.summed_over_chunks(k, max_chunk, part)


def ghost_clipped_sum(
    module: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    clipping_norm: float,
    *,
    loss: str = "cross_entropy",
    clip: bool = True,
    seg=None,
    k=None,
) -> dict | None:
    """Sum over units of clipped unit gradients (see :func:`module_clipped_sum`) for the rows (x, y)
    grouped by unit (``seg``, ``k``; None: record units), by ghost norms or per-layer
    materialised gradients. None when the module's layers are not covered (:func:`ghost_layers`)."""
    layers = ghost_layers(module)
    if layers is None:
        return None
    units = None if seg is None else tuple(torch.as_tensor(v, device=x.device) for v in (seg, k))
    terms = _clip_terms(module, layers, _layer_calls(module, layers, x, y, loss), units)
    sq = sum(t[0] for t in terms.values())
    kt = sq.new_ones(x.shape[0]) if units is None else units[1].to(sq.dtype)
    w = (
        dpsgd_core.clip_factors(sq.sqrt() / kt, clipping_norm) if clip else torch.ones_like(kt)
    ) / kt
    rw = w if units is None else w[units[0]]
    return _with_zeros(module, {name: t[1](w, rw) for name, t in terms.items()})


def _with_zeros(module: nn.Module, sums: dict) -> dict:
    """``sums`` for each trainable parameter of ``module``: zero for a layer the pass never used."""
    return {
        n: sums[n] if n in sums else torch.zeros_like(p)
        for n, p in module.named_parameters()
        if p.requires_grad
    }


def _clip_terms(module: nn.Module, layers: dict, calls_by_layer: dict, units) -> dict:
    """(squared per-unit norms, (w, rw) -> weighted sum) of each trained parameter, by name."""
    terms = {}
    for name, calls in calls_by_layer.items():
        layer, prefix = layers[name], f"{name}." if name else ""
        if layer.weight.requires_grad:
            terms[prefix + "weight"] = _weight_term(layer, calls, units)
        if layer.bias is not None and layer.bias.requires_grad:
            rows = (_rows(layer, grads).sum(1) for _, grads in calls)
            bias = _per_unit(reduce(operator.add, rows), units)
            terms[prefix + "bias"] = (_sq(bias), lambda w, rw, bias=bias: w @ bias)
    return terms


def _use_ghost(rows: int, units: int, t: int, s: int, d: int, p: int) -> bool:
    """Ghost norm (units * s^2 (d + p) multiply-adds for s rows per unit) cheaper than the
    materialised per-record gradients (rows * t * d * p for t positions per record)?"""
    return units * s * s * (d + p) < rows * t * d * p


def _weight_term(layer: nn.Module, calls: list, units) -> tuple:
    """(squared per-unit norms, (w, rw) -> weighted sum) of ``layer``'s weight, whose gradient
    for record i is sum_s g_is a_is^T over its rows; ``w``/``rw``: weights per unit / per record."""
    n, p, d = calls[0][0].shape[0], layer.weight.shape[0], layer.weight[0].numel()
    t = sum(grads.numel() for _, grads in calls) // (n * p)  # positions per record, all calls
    u, kmax = (n, 1) if units is None else (units[1].numel(), int(units[1].max()))
    if _use_ghost(n, u, t, kmax * t, d, p):
        acts = _join([_rows(layer, grads, acts) for acts, grads in calls])
        grads = _join([_rows(layer, grads) for _, grads in calls])
        au, gu = (
            (acts, grads) if units is None else (_by_unit(t, *units, kmax) for t in (acts, grads))
        )
        if au.shape[1] == 1:
            sq = _sq(au) * _sq(gu)
        else:
            sq = (au @ au.mT).mul_(gu @ gu.mT).sum((1, 2)).clamp_(min=0.0)
        return sq, lambda w, rw: (
            (grads * rw[:, None, None]).reshape(-1, p).mT @ acts.reshape(-1, d)
        ).reshape(layer.weight.shape)
    per = _per_unit(
        reduce(operator.add, (_per_record(layer, acts, grads) for acts, grads in calls)), units
    )
    return _sq(per), lambda w, rw: torch.tensordot(w, per, 1).reshape(layer.weight.shape)


def _sq(t: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each t[i] (no squared copy of t: measured ~1.5 ms a step on dp-cnn)."""
    return torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).square()


def _join(parts: list) -> torch.Tensor:
    """Calls' rows side by side along the positions (no copy for a single call)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def _per_unit(per: torch.Tensor, units) -> torch.Tensor:
    """Per-record tensors (n, ...) summed per unit (U, ...)."""
    return (
        per
        if units is None
        else per.new_zeros((units[1].numel(), *per.shape[1:])).index_add_(0, units[0], per)
    )


def _by_unit(r: torch.Tensor, seg: torch.Tensor, k: torch.Tensor, kmax: int) -> torch.Tensor:
    """Rows (n, t, d) of records grouped by unit -> (U, kmax * t, d): a unit's records one after
    another, zero padded (zero rows add nothing to either Gram matrix)."""
    first = torch.cumsum(k, 0) - k
    out = r.new_zeros((k.numel(), kmax, *r.shape[1:]))
    out[seg, torch.arange(r.shape[0], device=r.device) - first[seg]] = r
    return out.reshape(k.numel(), kmax * r.shape[1], r.shape[2])


def _layer_calls(
    module: nn.Module, layers: dict, x: torch.Tensor, y: torch.Tensor, loss: str
) -> dict:
    """Per layer applied: its calls' (input, output gradient) from one forward and one backward
    pass of the summed loss over (x, y), the backward taken w.r.t. the layer outputs only. A layer
    output rewritten in place later (``nn.ReLU(inplace=True)``) would take the gradient of the rewritten
    tensor: the pass is then rerun with those layers returning a copy (the gradient of the layer's own
    output). A layer input rewritten in place after the layer read it is refused (its value is lost)."""
    with torch.enable_grad():
        seen, value = _forward(module, layers, x, y, loss, copied=frozenset())
        rewritten = frozenset(
            n for n, calls in seen.items() for _, _, o, v in calls if o._version != v
        )
        if rewritten:
            seen, value = _forward(module, layers, x, y, loss, copied=rewritten)
        outs = [o for calls in seen.values() for _, _, o, _ in calls]
        grads = iter(torch.autograd.grad(value, outs, allow_unused=True, materialize_grads=True))
    return {n: [(a, next(grads)) for a, _, _, _ in calls] for n, calls in seen.items() if calls}


def _forward(
    module: nn.Module,
    layers: dict,
    x: torch.Tensor,
    y: torch.Tensor,
    loss: str,
    *,
    copied: frozenset,
) -> tuple[dict, object]:
    """One forward pass recording each layer call's (input, its version, output, its version); the
    layers named in ``copied`` hand a copy of their output to the rest of the model. Returns (calls
    by layer, summed loss)."""
    seen: dict = {n: [] for n in layers}

    def hook(name):
        def record(mod, inputs, output):
            seen[name].append((inputs[0].detach(), inputs[0]._version, output, output._version))
            return output.clone() if name in copied else None

        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in layers.items()]
    try:
        value = dpsgd_core._loss_fn(loss, "sum")(module(x), y)
    finally:
        for h in handles:
            h.remove()
    for name, calls in seen.items():
        if any(a._version != v for a, v, _, _ in calls):
            raise UsageError(
                f"model must not modify a layer's input in place (ghost clipping), got {name}'s "
                f"input modified after {name} read it."
            )
    return seen, value


def _rows(layer: nn.Module, grads: torch.Tensor, acts: torch.Tensor | None = None) -> torch.Tensor:
    """Output-gradient rows (n, positions, p) of one call or, given its input activations
    ``acts``, its input rows (n, positions, d): a convolution's input unfolded, so that the
    per-record weight gradient is sum_s g_s a_s^T as for ``nn.Linear``."""
    n = grads.shape[0]
    if isinstance(layer, nn.Linear):
        rows = grads if acts is None else acts
        return rows.reshape(n, -1, rows.shape[-1])
    if acts is None:
        return grads.reshape(n, grads.shape[1], -1).mT
    lift = (lambda v, pad: tuple(v)) if isinstance(layer, nn.Conv2d) else (lambda v, pad: (pad, *v))
    acts = acts if isinstance(layer, nn.Conv2d) else acts.unsqueeze(2)
    return nn.functional.unfold(
        acts,
        lift(layer.kernel_size, 1),
        dilation=lift(layer.dilation, 1),
        padding=lift(layer.padding, 0),
        stride=lift(layer.stride, 1),
    ).mT


def _per_record(
    layer: nn.Module, acts: torch.Tensor, grads: torch.Tensor, block: int = 64
) -> torch.Tensor:
    """One call's per-record weight gradients (n, p, d): a batched product for ``nn.Linear``; for a
    convolution its weight gradient with ``block`` records as groups (no unfolded input). Fixed
    blocks: oneDNN caches a primitive per group count (measured ~2.6 MB each), so the group count
    of a whole Poisson batch would add hundreds of MB over a run. The last block is the batch's
    last ``block`` records (overlapping rows dropped; zero padded only when n < block): no copy."""
    n = grads.shape[0]
    if isinstance(layer, nn.Linear):
        # einsum: measured 2x faster than bmm here
        return torch.einsum("nsp,nsd->npd", _rows(layer, grads), _rows(layer, grads, acts))
    if n < block:  # zero records: zero gradients, dropped below
        acts, grads = (
            torch.cat([t, t.new_zeros((block - n, *t.shape[1:]))]) for t in (acts, grads)
        )
    out = []
    for i in range(0, n, block):
        j = min(i, max(n, block) - block)
        out.append(
            _conv_weight_grads(layer, acts[j : j + block], grads[j : j + block])[i - j : n - j]
        )
    return torch.cat(out)


def _conv_weight_grads(layer: nn.Module, acts: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """Per-record weight gradients (b, p, d) of convolution ``layer`` for b records: a weight
    gradient with the records as groups; with one input channel, a forward convolution of the
    inputs with the output gradients as kernels (equal to float rounding, measured ~30% faster on
    dp-cnn's conv1)."""
    b, p, k = acts.shape[0], layer.weight.shape[0], layer.kernel_size
    if layer.in_channels == 1:
        conv = nn.functional.conv2d if isinstance(layer, nn.Conv2d) else nn.functional.conv1d
        o = conv(
            acts.reshape(1, b, *acts.shape[2:]),
            grads.reshape(b * p, 1, *grads.shape[2:]),
            None,
            layer.dilation,
            layer.padding,
            layer.stride,
            b,
        )
        return o[(..., *(slice(0, s) for s in k))].reshape(b, p, -1)
    wgrad = (
        torch.nn.grad.conv2d_weight if isinstance(layer, nn.Conv2d) else torch.nn.grad.conv1d_weight
    )
    return wgrad(
        acts.reshape(1, -1, *acts.shape[2:]),
        (b * p, *layer.weight.shape[1:]),
        grads.reshape(1, -1, *grads.shape[2:]),
        layer.stride,
        layer.padding,
        layer.dilation,
        groups=b,
    ).reshape(b, p, -1)
