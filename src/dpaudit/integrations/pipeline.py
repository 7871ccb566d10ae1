"""Check the DP-SGD pipeline, not only the model: what a run executed against what its accountant assumed.

The privacy bugs users hit are mismatches between how batches are drawn or normalised and what the
accountant assumes (Opacus #80 / #571; jax_privacy #272), not wrong formulas. :class:`PipelineCheck`
records a run through the same hooks as :class:`~dpaudit.integrations.opacus.OpacusCanaries` (the
``DPOptimizer``'s ``clip_and_accumulate`` and ``add_noise``, its data loader, the ``PrivacyEngine``'s
accountant history) or through three calls a plain PyTorch loop makes (:meth:`PipelineCheck.clip`,
:meth:`~PipelineCheck.noise`, :meth:`~PipelineCheck.step`), and :meth:`PipelineCheck.findings` lists each
mismatch as a :class:`Finding` (code, message, consequence):

- ``not-poisson``: the loader's sampler is not Poisson (Opacus's ``UniformWithReplacementSampler``) while
  the accountant assumes Poisson subsampling;
- ``fixed-batch-size``: the realised logical batch sizes repeat one value far more often than Poisson
  sampling allows (the message gives a union bound on that chance under Poisson at the claimed rate);
- ``size-derived-normaliser``: gradients are divided by ``int(N q)`` of the private size N, and adding or
  removing one record would change that divisor (the run is then no longer one fixed mechanism);
- ``noise-steps``: noise additions != accounted steps (an update without noise, noise not accounted);
- ``accumulation``: one noise addition covered several backward passes (the rate q is per batch);
- ``changed-noise`` / ``changed-clipping``: the noise multiplier or clipping norm changed mid-run;
- ``accountant-history``: the accountant's (noise multiplier, sample rate, steps) history differs from
  the executed one.

A run with a finding is never certified at the accountant's epsilon: :meth:`PipelineCheck.record`
is what goes in one_run.json (``findings`` and ``certified: "not certified: pipeline findings"``), and for
non-Poisson batches it adds the epsilon of :meth:`~PipelineCheck.no_amplification_event` beside the Poisson
figure, itself labelled not certified (a shuffled loader is checked only from the outside).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..accounting.accountants import compute_epsilon
from ..accounting.events import SubsampledGaussian
from ..errors import UsageError
from ..lazy import lazy_import
np = lazy_import("numpy")
stats = lazy_import("scipy.stats")

#: Below this chance under Poisson sampling, repeated batch sizes are reported as fixed-size batches.
FIXED_SIZE_P = 1e-6
NOT_CERTIFIED = "not certified: pipeline findings"
_POISSON_SAMPLERS = ("UniformWithReplacementSampler", "DistributedUniformWithReplacementSampler")


@dataclass(frozen=True)
class Finding:
    """One mismatch between the executed pipeline and its accounting."""

    code: str
    message: str
    consequence: str

    def to_dict(self) -> dict:
        return asdict(self)


def fixed_size_chance(sizes, *, n: int, q: float) -> float:
    """Union bound on the chance, under Poisson sampling at rate ``q`` from ``n`` records, that as many of
    the logical batches as observed share their most common size: sum_b P[Bin(T, p_b) >= k], with
    p_b = P[Bin(n, q) = b], T batches and k the count of the modal size (capped at 1)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    k = int(np.bincount(sizes).max())
    p_b = stats.binom.pmf(np.arange(n + 1), n, q)
    return float(min(1.0, stats.binom.sf(k - 1, len(sizes), p_b).sum()))


def _normaliser_moves(normaliser: float, n: int, q: float) -> bool:
    """The divisor is int(n q) and one record more or fewer changes it."""
    return normaliser == int(n * q) and {int((n - 1) * q), int((n + 1) * q)} != {normaliser}


class PipelineCheck:
    """Records a DP-SGD run and reports its mismatches (module docstring).

    Opacus: ``PipelineCheck().attach(optimizer, data_loader=loader, accountant=privacy_engine.accountant)``
    after ``make_private``. Plain loop: ``PipelineCheck(noise_multiplier=, sample_rate=, steps=,
    max_grad_norm=, dataset_size=, data_loader=)`` states what the accountant assumes (Poisson sampling,
    ``steps`` compositions); per batch call ``clip(batch_size, max_grad_norm, normaliser=)`` (the divisor of
    the clipped sum, None for a sum), per noise addition ``noise(noise_multiplier, max_grad_norm)``, per
    parameter update ``step()``.
    """

    def __init__(self, *, noise_multiplier: float | None = None, sample_rate: float | None = None, steps: int | None = None,
                 max_grad_norm: float | None = None, dataset_size: int | None = None, data_loader=None):
        self.sample_rate, self.dataset_size, self.data_loader = sample_rate, dataset_size, data_loader
        self.history = None if steps is None else [(noise_multiplier, sample_rate, int(steps))]
        self.max_grad_norm = max_grad_norm
        self.batches: list[tuple] = []  # (records, normaliser, clipping norm, backward passes) per clip call since the last noise
        self.noised: list[dict] = []  # per noise addition: noise multiplier, clipping norm, records, clip calls, backward passes
        self.updates = 0
        self.unnoised_updates = 0
        self._accountant, self._mark = None, 0  # noise additions at the previous update

    # ------------------------------------------------------------------ plain loop
    def clip(self, batch_size: int, max_grad_norm: float, *, normaliser: float | None = None, passes: int = 1) -> None:
        """One batch of ``batch_size`` records clipped at ``max_grad_norm`` (``passes`` backward passes)."""
        self.batches.append((int(batch_size), normaliser, float(max_grad_norm), int(passes)))

    def noise(self, noise_multiplier: float, max_grad_norm: float) -> None:
        """One noise addition of std ``noise_multiplier * max_grad_norm`` to the clipped sum."""
        b = self.batches
        self.noised.append({"noise_multiplier": float(noise_multiplier), "max_grad_norm": float(max_grad_norm),
                            "records": sum(x[0] for x in b), "clips": len(b), "passes": sum(x[3] for x in b),
                            "normaliser": next((x[1] for x in b if x[1] is not None), None)})
        self.batches = []

    def step(self) -> None:
        """One parameter update (what the accountant counts as a step); it consumes the clipped batches."""
        self.updates, self.batches = self.updates + 1, []
        self.unnoised_updates += len(self.noised) == self._mark
        self._mark = len(self.noised)

    # ------------------------------------------------------------------ Opacus
    def attach(self, optimizer, *, data_loader, accountant=None) -> "PipelineCheck":
        """Record ``optimizer`` (a ``DPOptimizer``) through its ``clip_and_accumulate`` and ``add_noise``;
        ``accountant``: the ``PrivacyEngine``'s (its history is compared with the executed steps)."""
        self.data_loader, self._accountant = data_loader, accountant
        self.dataset_size = len(data_loader.dataset)
        self.sample_rate = getattr(data_loader, "sample_rate", None) or 1.0 / len(data_loader)
        clip, noise = optimizer.clip_and_accumulate, optimizer.add_noise
        mean = optimizer.loss_reduction == "mean"

        def clip_and_accumulate():
            g = optimizer.grad_samples[0]
            self.clip(len(g), optimizer.max_grad_norm, normaliser=optimizer.expected_batch_size if mean else None,
                      passes=optimizer.accumulated_iterations)
            clip()

        def add_noise():
            self.noise(optimizer.noise_multiplier, optimizer.max_grad_norm)
            self.step()  # Opacus updates exactly when it adds noise (pre_step)
            noise()

        optimizer.clip_and_accumulate, optimizer.add_noise = clip_and_accumulate, add_noise
        return self

    # ------------------------------------------------------------------ the findings
    def _claimed_history(self) -> list:
        if self._accountant is not None:
            return [tuple(h) for h in self._accountant.history]
        return self.history or []

    def findings(self) -> tuple[Finding, ...]:
        """Every mismatch found so far (module docstring)."""
        return tuple(self._sampler_findings() + self._normaliser_findings() + self._step_findings() + self._setting_findings())

    def _sampler_findings(self) -> list[Finding]:
        out, q = [], self.sample_rate
        loader = self.data_loader
        name = type(getattr(loader, "batch_sampler", None)).__name__
        if loader is not None and name not in _POISSON_SAMPLERS:
            out.append(Finding("not-poisson", f"the data loader draws batches with {name}, not Poisson sampling, while the accountant "
                                              f"assumes Poisson sampling at q = {q:.6g}.",
                               "the Poisson amplification in the accounted epsilon does not apply; see no_amplification_event."))
        sizes = [x["records"] for x in self.noised]
        if len(sizes) >= 3 and q is not None and self.dataset_size:
            p = fixed_size_chance(sizes, n=int(self.dataset_size), q=float(q))
            if p < FIXED_SIZE_P:
                k = int(np.bincount(sizes).max())
                out.append(Finding("fixed-batch-size", f"{k} of {len(sizes)} logical batches have {int(np.bincount(sizes).argmax())} "
                                                       f"records; under Poisson sampling at q = {q:.6g} of {self.dataset_size} records "
                                                       f"that chance is at most {p:.3g}" + (" (below float range)." if p == 0 else "."),
                                   "batches are not Poisson-sampled: the accounted epsilon is not certified."))
        return out

    def _normaliser_findings(self) -> list[Finding]:
        norms = {x["normaliser"] for x in self.noised} - {None}
        n, q = self.dataset_size, self.sample_rate
        if not n or q is None or not any(_normaliser_moves(b, int(n), float(q)) for b in norms):
            return []
        return [Finding("size-derived-normaliser", f"gradients are divided by {sorted(norms)} = int(N q) of the private size N = {n}; "
                                                   f"with one record added or removed that divisor changes.",
                        "neighbouring datasets run different mechanisms (Opacus #571): the accounted epsilon is not certified; "
                        "divide by a public constant or use loss_reduction='sum'.")]

    def _step_findings(self) -> list[Finding]:
        out = []
        accounted = sum(int(h[2]) for h in self._claimed_history())
        if self._claimed_history() and accounted != len(self.noised):
            out.append(Finding("noise-steps", f"{len(self.noised)} noise additions but {accounted} accounted steps.",
                               "the accounted composition is not the executed one."))
        if self.unnoised_updates:
            out.append(Finding("noise-steps", f"{self.unnoised_updates} of {self.updates} parameter updates had no noise added since "
                                              f"the previous one.", "those updates release clipped gradients without noise: no DP."))
        multi = [x["passes"] for x in self.noised if x["passes"] > 1]
        if multi:
            out.append(Finding("accumulation", f"{len(multi)} noise additions covered up to {max(multi)} backward passes each.",
                               f"each noise addition covers several batches of rate q = {self.sample_rate}: the per-step rate is "
                               f"larger than the accounted one."))
        return out

    def _setting_findings(self) -> list[Finding]:
        out = []
        for key, code in (("noise_multiplier", "changed-noise"), ("max_grad_norm", "changed-clipping")):
            seen = sorted({x[key] for x in self.noised})
            if len(seen) > 1:
                out.append(Finding(code, f"{key} took the values {seen} during the run.",
                                   "the accountant must compose each setting's steps; a single-setting claim is not certified."))
        executed = self._executed_history()
        claimed = self._merged(self._claimed_history())
        if self._accountant is not None and executed != claimed:
            out.append(Finding("accountant-history", f"the accountant's history {claimed} differs from the executed {executed}.",
                               "the accounted epsilon is not the executed run's."))
        return out

    def _executed_history(self) -> list:
        return self._merged([(x["noise_multiplier"], self.sample_rate, 1) for x in self.noised])

    @staticmethod
    def _merged(history) -> list:
        out: list = []
        for s, q, t in history:
            key = (round(float(s), 12), round(float(q), 12))
            if out and out[-1][:2] == key:
                out[-1] = (*key, out[-1][2] + int(t))
            else:
                out.append((*key, int(t)))
        return out

    # ------------------------------------------------------------------ honest figures
    def epochs(self) -> int:
        """Passes over the data: ceil(records processed / N)."""
        if not self.dataset_size:
            raise UsageError("dataset_size must be known (attach a data loader or pass it), got None.")
        return max(1, math.ceil(sum(x["records"] for x in self.noised) / int(self.dataset_size)))

    def no_amplification_event(self) -> SubsampledGaussian:
        """Sound without amplification for batches where each record is in at most one batch per epoch
        (shuffled fixed-size batches; sum of clipped gradients, add/remove of one record leaving the
        others' batches unchanged): the Gaussian mechanism of the smallest executed noise multiplier
        composed over :meth:`epochs`."""
        sigma = min(x["noise_multiplier"] for x in self.noised)
        return SubsampledGaussian(sigma, 1.0, self.epochs())

    def record(self, delta: float, *, accountant: str = "rdp") -> dict:
        """What goes in the audit record: ``findings`` (and the attached accountant's epsilon); with any, ``certified`` = NOT_CERTIFIED and, for
        non-Poisson batches, the no-amplification epsilon beside the claimed Poisson one."""
        found = self.findings()
        out: dict = {"findings": [f.to_dict() for f in found]}
        if self._accountant is not None and self._accountant.history:  # the epsilon the training script itself reports
            out["accountant_epsilon"] = float(self._accountant.get_epsilon(delta))
        if not found:
            return out
        out["certified"] = NOT_CERTIFIED
        if {"not-poisson", "fixed-batch-size"} & {f.code for f in found}:
            ev = self.no_amplification_event()
            out["no_amplification"] = {"event": ev.to_dict(), "epsilon": float(compute_epsilon(ev, delta=delta, accountant=accountant).epsilon),
                                       "label": "upper bound without amplification (each record once per epoch); not certified"}
        return out
