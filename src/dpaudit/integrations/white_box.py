"""White-box step audit of a user's own DP-SGD loop: a plain PyTorch loop recorded with
:class:`~dpaudit.integrations.pipeline.PipelineCheck`, or an Opacus ``DPOptimizer`` (the statistic:
:mod:`dpaudit.audits.white_box`; docs/white_box.md).

``canaries`` Dirac canaries sit at distinct coordinates of the chosen parameter tensors (public
``seed``); all are in the dataset. At every step, on the clipped sum the step's noise is drawn
around: :meth:`LoopWhiteBox.before_noise` reads it at each canary coordinate (the other records'
clipped contribution, which a white-box auditor computes), Poisson-samples each canary at the
claimed rate and, when sampled, adds ``max_grad_norm * e_j`` in place; the loop's own noise is then
added, and :meth:`LoopWhiteBox.after_noise` reads the noisy sum (before any scaling) at the same
coordinates. y_t = (noisy - others) / max_grad_norm.

**What is not changed.** The loop's noise (its generator), clipping, scaling and accounting; the
canary draws come from a separate private NumPy generator (``noise_seed``, None: OS entropy).
**What is not seen.** The loop's per-sample clipping of real records (a Dirac canary is added as its
clipped contribution) and its batch sampler: those are the pipeline check's findings
(:mod:`dpaudit.integrations.pipeline`). What is seen: the noise actually added at every step,
against the noise multiplier and sample rate claimed. ``null=True`` is the null control (canaries
drawn, nothing added: its bound must stay below the claim); a run with the noise removed is the
no-noise control (its bound must exceed it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Iterable

from ..accounting.events import SubsampledGaussian
from ..audits.white_box import StepObservations, WhiteBoxBound, step_bound
from ..errors import UsageError
from ..lazy import lazy_import
from ..validation import half_open_unit, positive_finite, positive_int
from .opacus import add_canaries, canary_sample_rate, chosen_canaries, summed_grad, values_at

np = lazy_import("numpy")
torch = lazy_import("torch")

_TAG = 0x4F505742  # "OPWB": public choice of the canary coordinates


class LoopWhiteBox:
    """M observed Dirac canaries for one run of a DP-SGD loop (module docstring). ``model``: the
    user's module (names matched without Opacus's ``_module.`` prefix); ``tensors``: parameter
    names holding the canaries (default: all trainable). The claim is set by :meth:`declare`."""

    def __init__(
        self,
        model,
        *,
        canaries: int,
        seed: int = 0,
        tensors: Iterable[str] | None = None,
        noise_seed: int | None = None,
        null: bool = False,
    ):
        """Choose the canary coordinates (public) for one run of the loop.

        Args:
            model: the user's module.
            canaries: the number M of canaries (>= 2).
            seed: the public seed of the coordinates.
            tensors: the parameter names holding the canaries (default: all trainable).
            noise_seed: the seed of the private per-step draws (None: OS entropy).
            null: a no-noise control run.

        Raises:
            UsageError: fewer than two canaries, a tensor that is not trainable, or more canaries
                than coordinates.
        """
        m, named, chosen = chosen_canaries(model, tensors, canaries, seed, _TAG)
        self._named, self.trainable = named, list(named)
        self._groups = [(n, ids, flat) for n, ids, flat in chosen.by_tensor()]
        self._rng = np.random.default_rng(noise_seed)  # private: per-step canary draws
        self.m, self.seed, self.coords, self.null = m, int(seed), chosen.coords, bool(null)
        self.sample_rate = self.clipping_norm = self.noise_multiplier = self.steps = None
        self._values, self._sampled, self._pending = [], [], None

    def watch(self, check) -> "LoopWhiteBox":
        """Observe the plain loop recorded by ``check`` (a
        :class:`~dpaudit.integrations.pipeline.PipelineCheck`): the claim is its declared noise
        multiplier, sample rate, clipping norm and steps; its ``clip(..., clipped=)`` and
        ``noise(..., noisy=)`` feed :meth:`before_noise` and :meth:`after_noise`, and its ``record``
        holds this bound.

        Args:
            check: the PipelineCheck of the loop.

        Returns:
            These canaries, watching.

        Raises:
            UsageError: a setting not declared, or canaries already watching ``check``.
        """
        keys = ("noise_multiplier", "sample_rate", "max_grad_norm")
        undeclared = [k for k in keys if check.declared.get(k) is None]
        if undeclared:
            raise UsageError(
                f"{', '.join(undeclared)} must be declared for white-box canaries, got None."
            )
        if check.canaries is not None:
            raise UsageError("white-box canaries must watch a check once, got a second set.")
        self.declare(
            steps=check.history[0][2] if check.history else None,
            **{k: check.declared[k] for k in keys},
        )
        check.canaries = self
        return self

    def declare(
        self,
        *,
        noise_multiplier: float,
        sample_rate: float,
        max_grad_norm: float,
        steps: int | None = None,
    ) -> "LoopWhiteBox":
        """The claim: ``SubsampledGaussian(noise_multiplier, sample_rate, steps)`` with
        sensitivity ``max_grad_norm`` (``steps`` None: the observed steps). Canaries are sampled
        at ``sample_rate`` and weigh ``max_grad_norm``."""
        self.sample_rate = half_open_unit("sample_rate", sample_rate)
        self.clipping_norm = positive_finite("max_grad_norm", max_grad_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.steps = None if steps is None else positive_int("steps", steps)
        return self

    @property
    def observed(self) -> int:
        """Steps observed so far."""
        return len(self._values)

    @property
    def pending(self) -> bool:
        """A clipped sum was read and its noisy sum is still due."""
        return self._pending is not None

    def _tensors(self, given, what: str) -> dict:
        """``given`` by name: a mapping, or a sequence in the order of the trainable parameters."""
        by_name = dict(given) if isinstance(given, Mapping) else dict(zip(self.trainable, given))
        gone = [n for n, _, _ in self._groups if by_name.get(n) is None]
        if gone:
            raise UsageError(
                f"{what} must hold a tensor for each canary parameter ({', '.join(gone)}), got none there."
            )
        return by_name

    def before_noise(self, clipped) -> None:
        """One step: read the clipped sum at the canary coordinates, then add the sampled canaries
        to it in place (``clipped``: name -> tensor, or the trainable parameters' order)."""
        if self.clipping_norm is None:
            raise UsageError("the claim must be declared before the first step, got none.")
        if self._pending is not None:
            raise UsageError(
                "each clipped sum must be followed by its noisy sum (after_noise), got two clipped sums."
            )
        sums = self._tensors(clipped, "clipped")
        hit = self._rng.random(self.m) < self.sample_rate
        weight = 0.0 if self.null else self.clipping_norm
        others = []
        for name, ids, flat in self._groups:
            view = _flat_view(sums[name], "clipped")
            idx = flat.to(view.device)
            others.append(view[idx].double().cpu().numpy())
            on = torch.as_tensor(hit[ids], device=view.device)
            if bool(on.any()):
                add_canaries(view, idx[on], weight)
        self._pending = (hit, others)

    def after_noise(self, noisy) -> None:
        """The same step's noisy sum (clipped sum + the loop's noise, before any scaling)."""
        if self._pending is None:
            raise UsageError(
                "a noisy sum must follow its clipped sum (before_noise), got none before it."
            )
        sums = self._tensors(noisy, "noisy")
        (hit, others), y = self._pending, np.zeros(self.m)
        for (name, ids, flat), before in zip(self._groups, others):
            y[ids] = (values_at(sums[name], flat).double().numpy() - before) / self.clipping_norm
        self._values.append(y)
        self._sampled.append(hit)
        self._pending = None

    def observations(self) -> StepObservations:
        if not self._values:
            raise UsageError(
                "canaries must be attached and trained with before the audit, got no observed step."
            )
        return StepObservations(np.stack(self._values, axis=1), np.stack(self._sampled, axis=1))

    def claim(self) -> SubsampledGaussian:
        """SubsampledGaussian(declared noise multiplier and sample rate, declared or observed steps)."""
        return SubsampledGaussian(
            self.noise_multiplier, self.sample_rate, self.steps or len(self._values)
        )

    def audit(
        self,
        *,
        delta: float,
        confidence: float = 0.95,
        claimed_epsilon: float | None = None,
        accountant: str = "rdp",
    ) -> WhiteBoxBound:
        """eps_LB of the observed steps against :meth:`claim`.

        Args:
            delta: the claim's delta.
            confidence: of the bound (split in three: noise, sensitivity, rate).
            claimed_epsilon: the script's own accountant's, else the claim's by ``accountant``.
            accountant: composes the bound (and the claim when ``claimed_epsilon`` is None).

        Returns:
            The :class:`~dpaudit.audits.white_box.WhiteBoxBound`: with probability >= confidence,
            if every observed step is a Poisson-subsampled Gaussian step, the mechanism's epsilon
            is at least ``epsilon_lb``; ``violation`` when that exceeds the claim.

        Raises:
            UsageError: no step observed, or bad arguments.
        """
        return step_bound(
            self.observations(),
            claimed=self.claim(),
            delta=delta,
            accountant=accountant,
            confidence=confidence,
            claimed_epsilon=claimed_epsilon,
        )


def _flat_view(tensor, what: str):
    """A flat view of ``tensor`` that writes through (a copy would lose the canaries)."""
    if not tensor.is_contiguous():
        raise UsageError(
            f"{what} tensors must be contiguous (the canaries are added in place), got a strided one."
        )
    return tensor.detach().view(-1)


class OpacusWhiteBox(LoopWhiteBox):
    """:class:`LoopWhiteBox` on an Opacus ``DPOptimizer``: inside ``add_noise`` the clipped sum is
    ``p.summed_grad`` and the noisy one ``p.grad`` (before ``scale_grad``); Opacus's own
    ``add_noise`` runs unchanged between them."""

    _optimizer = None

    def attach(
        self, optimizer, *, sample_rate: float | None = None, data_loader=None
    ) -> "OpacusWhiteBox":
        """Hook ``optimizer`` (an Opacus ``DPOptimizer``); the canary rate is ``sample_rate``, else the
        loader's ``sample_rate``, else ``1 / len(data_loader)``: the rate Opacus accounts with. The
        claim is read now: a noise multiplier changed later is what the audit then sees.

        Args:
            optimizer: the DPOptimizer of the run.
            sample_rate: the canary rate (default: the loader's).
            data_loader: the run's data loader.

        Returns:
            These canaries, attached.

        Raises:
            UsageError: not a DPOptimizer, or already attached.
        """
        from opacus.optimizers import DPOptimizer

        if not isinstance(optimizer, DPOptimizer) or self._optimizer is not None:
            raise UsageError(
                f"optimizer must be one Opacus DPOptimizer, attached once, got {type(optimizer).__name__}."
            )
        self.declare(
            noise_multiplier=float(optimizer.noise_multiplier),
            sample_rate=canary_sample_rate(sample_rate, data_loader),
            max_grad_norm=float(optimizer.max_grad_norm),
        )
        original = optimizer.add_noise

        def add_noise():
            self.before_noise({n: summed_grad(self._named[n], n) for n, _, _ in self._groups})
            original()
            self.after_noise({n: self._named[n].grad for n, _, _ in self._groups})

        optimizer.add_noise = add_noise  # instance attribute: pre_step calls self.add_noise()
        self._optimizer = optimizer
        return self
