"""White-box step audit of an Opacus training run (the statistic: :mod:`dpaudit.audits.white_box`;
docs/white_box.md).

``canaries`` Dirac canaries sit at distinct coordinates of the chosen parameter tensors (public
``seed``); all are in the dataset. At every logical step, inside ``DPOptimizer.add_noise``: the
clipped sum ``p.summed_grad`` at each canary coordinate is read (the other records' clipped
contribution, which a white-box auditor computes), each canary is Poisson-sampled at the rate
Opacus accounts with and, when sampled, adds ``max_grad_norm * e_j``; Opacus's own ``add_noise``
then runs unchanged, and its noisy sum ``p.grad`` (before ``scale_grad``) is read at the same
coordinates. y_t = (noisy - others) / max_grad_norm.

**What is not changed.** Opacus's noise (its generator), clipping, scaling, accountant hook and
noise multiplier; the canary draws come from a separate private NumPy generator (``noise_seed``,
None: OS entropy). **What is not seen.** Opacus's per-sample clipping of real records (a Dirac
canary is added as its clipped contribution) and its batch sampler: those are the pipeline
check's findings (:mod:`dpaudit.integrations.pipeline`). What is seen: the noise actually added
at every step, against the noise multiplier and sample rate claimed.
"""

from __future__ import annotations

from typing import Iterable

from ..accounting.events import SubsampledGaussian
from ..audits.white_box import StepObservations, WhiteBoxBound, step_bound
from ..errors import UsageError
from ..lazy import lazy_import
from ..mechanisms.one_run_modules import choose_coordinates
from ..validation import positive_int
from .opacus import _plain_name
np = lazy_import("numpy")
torch = lazy_import("torch")

_TAG = 0x4F505742  # "OPWB": public choice of the canary coordinates


class OpacusWhiteBox:
    """M observed Dirac canaries for one Opacus run (module docstring). ``model``: the user's
    module (names matched without Opacus's ``_module.`` prefix); ``tensors``: parameter names
    holding the canaries (default: all trainable)."""

    def __init__(self, model, *, canaries: int, seed: int = 0, tensors: Iterable[str] | None = None, noise_seed: int | None = None):
        m = positive_int("canaries", canaries, 2)
        named = {_plain_name(n): p for n, p in model.named_parameters() if p.requires_grad}
        names = list(named) if tensors is None else [str(t) for t in tensors]
        missing = [n for n in names if n not in named]
        if missing or not names:
            raise UsageError(f"tensors must name trainable parameters of the model ({', '.join(named)}), got {missing or names!r}.")
        chosen = choose_coordinates({n: tuple(named[n].shape) for n in names}, tuple(names), m, int(seed), tag=_TAG)
        self._groups = [(named[n], ids, flat) for n, ids, flat in chosen.by_tensor()]
        self._rng = np.random.default_rng(noise_seed)  # private: per-step canary draws
        self.m, self.seed, self.coords = m, int(seed), chosen.coords
        self.sample_rate = self.clipping_norm = self.noise_multiplier = None
        self._values, self._sampled, self._optimizer = [], [], None

    def attach(self, optimizer, *, sample_rate: float | None = None, data_loader=None) -> "OpacusWhiteBox":
        """Hook ``optimizer`` (an Opacus ``DPOptimizer``); the canary rate is ``sample_rate``, else the
        loader's ``sample_rate``, else ``1 / len(data_loader)``: the rate Opacus accounts with. The
        claim is read now: a noise multiplier changed later is what the audit then sees."""
        from opacus.optimizers import DPOptimizer

        if not isinstance(optimizer, DPOptimizer) or self._optimizer is not None:
            raise UsageError(f"optimizer must be one Opacus DPOptimizer, attached once, got {type(optimizer).__name__}.")
        if sample_rate is None and data_loader is None:
            raise UsageError("sample_rate or data_loader must be given, got neither.")
        q = float(sample_rate if sample_rate is not None else getattr(data_loader, "sample_rate", None) or 1.0 / len(data_loader))
        if not 0.0 < q <= 1.0:
            raise UsageError(f"sample_rate must be in (0, 1], got {q!r}.")
        self.sample_rate, self.clipping_norm, self.noise_multiplier = q, float(optimizer.max_grad_norm), float(optimizer.noise_multiplier)
        original = optimizer.add_noise

        def add_noise():
            others = self._inject()
            original()
            self._observe(others)

        optimizer.add_noise = add_noise  # instance attribute: pre_step calls self.add_noise()
        self._optimizer = optimizer
        return self

    def _inject(self) -> list:
        hit = self._rng.random(self.m) < self.sample_rate
        self._sampled.append(hit)
        others = []
        for p, ids, flat in self._groups:
            sg = p.summed_grad
            if sg is None:
                raise UsageError("parameter must have a clipped gradient sum (p.summed_grad) at each step, got None.")
            idx = flat.to(sg.device)
            others.append(sg.view(-1)[idx].double().cpu().numpy())
            on = torch.as_tensor(hit[ids], device=sg.device)
            if bool(on.any()):
                sg.view(-1).index_add_(0, idx[on], torch.full((int(on.sum()),), self.clipping_norm, dtype=sg.dtype, device=sg.device))
        return others

    def _observe(self, others: list) -> None:
        y = np.zeros(self.m)
        for (p, ids, flat), before in zip(self._groups, others):
            y[ids] = (p.grad.reshape(-1)[flat.to(p.grad.device)].double().cpu().numpy() - before) / self.clipping_norm
        self._values.append(y)

    def observations(self) -> StepObservations:
        if not self._values:
            raise UsageError("canaries must be attached and trained with before the audit, got no observed step.")
        return StepObservations(np.stack(self._values, axis=1), np.stack(self._sampled, axis=1))

    def claim(self) -> SubsampledGaussian:
        """SubsampledGaussian(noise multiplier and sample rate at attach, observed steps)."""
        return SubsampledGaussian(self.noise_multiplier, self.sample_rate, len(self._values))

    def audit(self, *, delta: float, confidence: float = 0.95, claimed_epsilon: float | None = None,
              accountant: str = "rdp") -> WhiteBoxBound:
        """eps_LB of the observed steps against :meth:`claim` (``claimed_epsilon``: the script's own
        accountant's, else the claim's by ``accountant``)."""
        return step_bound(self.observations(), claimed=self.claim(), delta=delta, accountant=accountant, confidence=confidence,
                          claimed_epsilon=claimed_epsilon)
