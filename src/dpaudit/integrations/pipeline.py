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
- ``non-uniform-sampler``: the loader draws records with unequal weights (a ``WeightedRandomSampler``): the
  most-weighted record is in a batch far more often than the one accounted rate q;
- ``fixed-batch-size``: the realised logical batch sizes repeat one value far more often than Poisson
  sampling allows (the message gives a union bound on that chance under Poisson at the claimed rate);
- ``size-derived-normaliser``: gradients are divided by ``int(N q)`` of the private size N, and adding or
  removing one record would change that divisor (the run is then no longer one fixed mechanism);
- ``noise-steps``: noise additions != accounted steps (an update without noise, noise not accounted);
- ``accumulation``: one noise addition covered several backward passes (the rate q is per batch);
- ``changed-noise`` / ``changed-clipping`` / ``changed-sample-rate`` / ``changed-batch-size``: a step ran a
  noise multiplier, clipping norm, sampler rate or expected batch size other than the declared one (what
  ``make_private`` set, read when attached; a plain loop's constructor values), read at every step;
- ``sample-rate``: the realised batch sizes do not fit Poisson sampling at the claimed rate;
- ``not-from-loader``: the optimizer's batches are not the ones the attached loader drew;
- ``not-poisson-records``: the per-record inclusion counts of the drawn batches do not fit Poisson sampling
  (e.g. shuffled epochs cut into binomial-sized batches: every record once per epoch);
- ``non-private-update``: the DP-optimised parameters changed outside a DP step
  (``original_optimizer.step()``, a second optimizer, a manual edit);
- ``changed-after-training``: they changed after the last DP step (non-private fine-tuning before the audit);
- ``too-little-noise``: the noise an update actually carried (its gradient minus the clipped sum, measured at
  every update) is too small for the declared noise multiplier (per update, and pooled over all updates);
- ``unclipped-parameters``: parameters of the model (``attach(module=)``) changed while the DP optimizer did
  not process them (a layer left out of it, trained by another optimizer or by hand): no clipping, no noise;
- ``accountant-history``: the accountant's (noise multiplier, sample rate, steps) history differs from
  the executed one;
- ``accountant-epsilon``: the script's own accountant reports more than the claimed epsilon (beyond rounding).

A run with a finding is never certified at the accountant's epsilon: :meth:`PipelineCheck.record`
is what goes in one_run.json (``findings`` and ``certified: "not certified: pipeline findings"``), and for
non-Poisson batches it adds the epsilon of :meth:`~PipelineCheck.no_amplification_event` beside the Poisson
figure, itself labelled not certified (a shuffled loader is checked only from the outside).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..accounting.accountants import compute_epsilon
from ..accounting.events import Composed, SubsampledGaussian
from ..errors import DPAuditError, UsageError
from ..lazy import lazy_import

np = lazy_import("numpy")
stats = lazy_import("scipy.stats")
torch = lazy_import("torch")

#: Below this chance under Poisson sampling, repeated batch sizes are reported as fixed-size batches.
FIXED_SIZE_P = 1e-6
NOT_CERTIFIED = "not certified: pipeline findings"
_TOL = 1e-12  # float rounding of a setting read back from the optimizer
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


def inclusion_count_test(counts, *, steps: int, q: float) -> tuple[float, int]:
    """(chance, cell) under Poisson sampling, where each of N records is in each of ``steps`` batches
    independently with probability ``q``: the number of records drawn exactly b times is then exactly
    Bin(N, P[Bin(steps, q) = b]). Cells b = 0 .. B-1 and "B or more" (B fixed by ``steps``, q and N
    alone), a two-sided test per cell, Bonferroni over the cells; ``cell``: the most extreme one."""
    counts = np.asarray(counts, dtype=np.int64)
    n = counts.size
    tail = stats.binom.sf(np.arange(steps + 1) - 1, steps, q)  # P[Bin(steps, q) >= b]
    # later cells: expected empty
    top = int(np.argmax(tail * n < 1e-09)) if (tail * n < 1e-09).any() else steps
    p = np.append(stats.binom.pmf(np.arange(top), steps, q), tail[top])
    below = np.bincount(np.minimum(counts, top), minlength=top + 1)[:top]
    seen = np.append(below, int((counts >= top).sum()))
    two = 2 * np.minimum(stats.binom.cdf(seen, n, p), stats.binom.sf(seen - 1, n, p))
    cell = int(np.argmin(two))
    return float(min(1.0, two[cell] * (top + 1))), cell


def _normaliser_moves(normaliser: float, n: int, q: float) -> bool:
    """The divisor is int(n q) and one record more or fewer changes it."""
    return normaliser == int(n * q) and {int((n - 1) * q), int((n + 1) * q)} != {normaliser}


#: The per-step settings checked against the declared ones, with the code of a step that differs.
SETTINGS = (
    ("noise_multiplier", "changed-noise"),
    ("max_grad_norm", "changed-clipping"),
    ("sample_rate", "changed-sample-rate"),
    ("expected_batch_size", "changed-batch-size"),
)


def _same_setting(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=_TOL, abs_tol=0.0)
    return a == b


def setting_findings(declared: dict, steps: list) -> list[Finding]:
    """One finding per setting (:data:`SETTINGS`) some step ran at a value other than ``declared``'s
    (a missing declared value: the first step's). The claim is the declared event, so such a run is
    not certified."""
    out = []
    for key, code in SETTINGS:
        want, off = _off_setting(key, declared, steps)
        if off:
            seen = sorted(
                {float(v) if isinstance(v, (int, float)) else repr(v) for v in off}, key=str
            )
            ran = f"{len(off)} of {len(steps)} steps ran {key} {seen[:5]}, declared {want}."
            out.append(Finding(code, ran, _NOT_THE_EXECUTED_RUN))
    return out


#: Why a run whose steps ran at other settings than the declared ones is not certified.
_NOT_THE_EXECUTED_RUN = (
    "the claimed event is not the executed run: its epsilon is not certified "
    "(the executed composition's is recorded beside it)."
)


def _off_setting(key: str, declared: dict, steps: list) -> tuple:
    """(the declared value of ``key``, the step values that differ from it)."""
    values = [s[key] for s in steps if s.get(key) is not None]
    want = declared.get(key) if declared.get(key) is not None else (values[0] if values else None)
    return want, [v for v in values if not _same_setting(v, want)]


def sampler_rate(loader, fallback):
    """The rate ``loader``'s Poisson sampler draws with now (Opacus's ``batch_sampler.sample_rate``),
    else ``fallback``."""
    q = getattr(getattr(loader, "batch_sampler", None), "sample_rate", None)
    return float(q) if isinstance(q, (int, float)) and not isinstance(q, bool) else fallback


def optimizer_settings(optimizer, loader, fallback_rate) -> dict:
    """The settings a ``DPOptimizer`` runs its next noise addition with (read at every step, not once)."""
    return {
        "noise_multiplier": optimizer.noise_multiplier,
        "max_grad_norm": optimizer.max_grad_norm,
        "sample_rate": sampler_rate(loader, fallback_rate),
        "expected_batch_size": getattr(optimizer, "expected_batch_size", None),
    }


def _record_draws(loader) -> dict | None:
    """Make ``loader``'s batch sampler record what it draws (per-record counts, batch sizes); None
    when it has none. Its class becomes a same-named subclass whose ``__iter__`` records each batch
    and yields it unchanged."""
    bs = getattr(loader, "batch_sampler", None)
    n = len(getattr(loader, "dataset", ()) or ())
    if bs is None or not n:
        return None
    drawn = {"counts": np.zeros(n, dtype=np.int64), "sizes": [], "readable": True}
    base = type(bs)

    def __iter__(self):
        for batch in base.__iter__(self):
            _note_draw(drawn, batch)
            yield batch

    try:
        bs.__class__ = type(
            base.__name__, (base,), {"__iter__": __iter__, "__module__": base.__module__}
        )
    except TypeError:  # a built-in or slotted sampler: its draws are not recorded
        return None
    return drawn


def _note_draw(drawn: dict, batch) -> None:
    drawn["sizes"].append(len(batch))
    try:
        idx = np.asarray(batch, dtype=np.int64).reshape(-1)
        np.add.at(drawn["counts"], idx, 1)
    except (TypeError, ValueError, IndexError):
        drawn["readable"] = False  # keys that are not record positions: counts unknown


def trained_from_draws(trained, drawn) -> bool:
    """Each trained logical batch (its record count) is one drawn batch or several consecutive ones,
    in drawing order; drawn batches never trained (a peek, an evaluation pass) may lie between."""
    j = 0
    for records in trained:
        j = _next_match(int(records), drawn, j)
        if j < 0:
            return False
    return True


def _next_match(records: int, drawn, start: int) -> int:
    """The position after the first run of consecutive drawn batches from ``start`` on whose sizes sum
    to ``records`` (-1: none)."""
    for j in range(start, len(drawn)):
        total, k = drawn[j], j + 1
        while total < records and k < len(drawn):
            total, k = total + drawn[k], k + 1
        if total == records:
            return k
    return -1


def _too_little_noise(seen: str, sigma, chance: str) -> Finding:
    return Finding(
        "too-little-noise",
        f"{seen} x the clipping norm, below the declared noise multiplier {sigma:g} ({chance}).",
        "the noise actually added is not the accounted one: no certified epsilon.",
    )


def record_weights(loader):
    """The per-record weights ``loader`` draws with (a ``WeightedRandomSampler``'s, directly or inside its
    batch sampler) and whether it draws with replacement; None when it has none."""
    inner = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    for s in (inner, getattr(loader, "sampler", None)):
        w = getattr(s, "weights", None)
        if w is not None:
            replacement = bool(getattr(s, "replacement", True))
            return np.asarray(torch.as_tensor(w, dtype=torch.float64)), replacement
    return None


def weight_findings(loader, q) -> list[Finding]:
    """Records drawn with unequal weights: each batch of B draws (with replacement) holds the record of
    weight w with chance 1 - (1 - w / sum)^B, so the most-weighted record's per-step rate exceeds the
    mean one and no single rate q describes the run (a rate derived from ``len(loader)`` least of all)."""
    found = record_weights(loader)
    if found is None or q is None:
        return []
    w, replacement = found
    if w.size == 0 or not w.sum() > 0 or w.max() <= w.min():
        return []
    size = (
        getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        or getattr(loader, "batch_size", None)
        or 1
    )
    top = w.max() / w.sum()
    rate = 1 - (1 - top) ** int(size) if replacement else min(1.0, int(size) * top)
    seen = (
        f"the loader draws records with unequal weights (max / mean {w.max() / w.mean():.4g}): the "
        f"most-weighted record is in a batch of {int(size)} with chance {rate:.4g} per step against the "
        f"accounted q = {q:.6g}."
    )
    why = (
        "records are not sampled at one rate q: the accounted epsilon does not hold for the most-weighted "
        "records; not certified."
    )
    return [Finding("non-uniform-sampler", seen, why)]


class ParamsOutsideDP:
    """The parameters of ``module`` the DP optimizer does not process (not among ``optimizer.params`` at a DP
    step: left out of it, or frozen): a fingerprint of each is kept (:func:`fingerprint`: no copy, so a
    frozen backbone costs no memory, one read of it per step) and compared at every DP step and at the end.
    A change is an update without clipping and noise."""

    def __init__(self, module, optimizer):
        self._optimizer = optimizer
        self._named = list(module.named_parameters())
        self._kept: dict = {}  # id -> (name, fingerprint) of each parameter outside the DP step
        self.changed: list[str] = []
        self._keep_outside()

    def _keep_outside(self) -> None:
        dp = {id(p) for p in self._optimizer.params}
        for name, p in self._named:
            if id(p) in dp:
                self._kept.pop(id(p), None)
            elif id(p) not in self._kept:
                self._kept[id(p)] = (name, fingerprint(p))

    def _compare(self) -> None:
        by_id = {id(p): p for _, p in self._named}
        for key, (name, seen) in list(self._kept.items()):
            now = fingerprint(by_id[key])
            if now != seen:
                self.changed += [name] if name not in self.changed else []
                self._kept[key] = (name, now)

    def at_dp_step(self) -> None:
        """Before a DP step: compare, then keep the parameters now outside it."""
        self._compare()
        self._keep_outside()

    def findings(self) -> list[Finding]:
        self._compare()
        if not self.changed:
            return []
        names = ", ".join(plain_name(n) for n in self.changed[:8]) + (
            " ..." if len(self.changed) > 8 else ""
        )
        seen = (
            f"{len(self.changed)} parameters of the model changed outside the DP optimizer's steps "
            f"({names})."
        )
        why = "their updates used gradients without per-sample clipping and noise: no DP, not certified."
        return [Finding("unclipped-parameters", seen, why)]


def fingerprint(param) -> tuple:
    """Shape, sum, sum of squares and a cosine-weighted sum of ``param``'s values in float64: equal for
    equal values; any update a training step makes changes it (a change keeping all three is measure
    zero); compared as exact bits, NaN equal to NaN."""
    v = param.detach().reshape(-1).double()
    w = torch.cos(torch.arange(v.numel(), dtype=torch.float64, device=v.device))
    return tuple(param.shape), *(float(x).hex() for x in (v.sum(), v.square().sum(), (v * w).sum()))


_WRAP_PREFIX = "_module."  # GradSampleModule (and DPDDP) wrap the user's module under _module


def plain_name(name: str) -> str:
    """A parameter's name without Opacus's wrapping prefixes."""
    while name.startswith(_WRAP_PREFIX):
        name = name[len(_WRAP_PREFIX) :]
    return name


def canary_params(model, tensors) -> tuple[dict, list[str]]:
    """``(trainable parameters by plain name, the names of those that hold canaries)``: the names
    in ``tensors``, default all; refused (UsageError) when one is not a trainable parameter."""
    named = {plain_name(n): p for n, p in model.named_parameters() if p.requires_grad}
    names = list(named) if tensors is None else [str(t) for t in tensors]
    missing = [n for n in names if n not in named]
    if missing or not names:
        raise UsageError(
            f"tensors must name trainable parameters of the model ({', '.join(named)}), "
            f"got {missing or names!r}."
        )
    return named, names


class PipelineCheck:
    """Records a DP-SGD run and reports its mismatches (module docstring).

    Opacus: ``PipelineCheck().attach(optimizer, data_loader=loader, accountant=privacy_engine.accountant)``
    after ``make_private``. Plain loop: ``PipelineCheck(noise_multiplier=, sample_rate=, steps=,
    max_grad_norm=, dataset_size=, data_loader=)`` states what the accountant assumes (Poisson sampling,
    ``steps`` compositions); per batch call ``clip(batch_size, max_grad_norm, normaliser=)`` (the divisor of
    the clipped sum, None for a sum), per noise addition ``noise(noise_multiplier, max_grad_norm)``, per
    parameter update ``step()``. White-box step audit of the same loop: ``LoopWhiteBox(model,
    canaries=M).watch(check)`` once (:mod:`dpaudit.integrations.white_box`), then ``clip(...,
    clipped=sums)`` on the clipped sum the noise is drawn around and ``noise(..., noisy=sums)`` on
    the noisy one.
    """

    def __init__(
        self,
        *,
        noise_multiplier: float | None = None,
        sample_rate: float | None = None,
        steps: int | None = None,
        max_grad_norm: float | None = None,
        dataset_size: int | None = None,
        data_loader=None,
    ):
        """A check of a plain loop with its declared settings (all None for Opacus: :meth:`attach`).

        Args:
        noise_multiplier: the declared noise multiplier (a plain loop's).
        sample_rate: the declared Poisson sample rate.
        steps: the declared number of steps.
        max_grad_norm: the declared clipping norm.
        dataset_size: the number of training records.
        data_loader: the loader whose draws are checked.
        """
        self.sample_rate = sample_rate
        self.dataset_size = dataset_size
        self.data_loader = data_loader
        self.history = None if steps is None else [(noise_multiplier, sample_rate, int(steps))]
        self.max_grad_norm = max_grad_norm
        self.declared = {
            "noise_multiplier": noise_multiplier,
            "max_grad_norm": max_grad_norm,
            "sample_rate": sample_rate,
        }
        # (records, normaliser, clipping norm, backward passes) per clip call since the last noise
        self.batches: list[tuple] = []
        # per noise addition: its settings, records, clip calls, backward passes
        self.noised: list[dict] = []
        self.updates = 0
        self.unnoised_updates = 0
        self._accountant, self._mark = None, 0  # noise additions at the previous update
        self._drawn = None  # what the attached loader's sampler drew
        self._sampler_name = None  # the attached loader's batch sampler class (Opacus swaps it)
        self._params: list = []  # the DP-optimised parameters
        self._after_dp: list = []  # their values after the last DP step
        self.outside_updates, self.direct_steps = 0, 0
        # per DP update: (squared norm of the noise it carries, coordinates, clipping norm)
        self.noise_sums: list[tuple] = []
        self._dp_step_open = False
        self._outside = None  # the module's parameters the DP optimizer does not process
        self.canaries = None  # a plain loop's white-box canaries (LoopWhiteBox.watch)

    # ------------------------------------------------------------------ plain loop
    def clip(
        self,
        batch_size: int,
        max_grad_norm: float,
        *,
        normaliser: float | None = None,
        passes: int = 1,
        clipped=None,
    ) -> None:
        """One batch of ``batch_size`` records clipped at ``max_grad_norm`` (``passes`` backward passes);
        ``clipped``: the clipped sum the next noise is drawn around (white-box canaries join it in place).

        Args:
            batch_size: the records of the batch.
            max_grad_norm: the clipping norm applied.
            normaliser: the divisor of the clipped sum (None: a sum).
            passes: backward passes behind the batch.
            clipped: the clipped sum, for white-box canaries.

        Raises:
            UsageError: ``clipped`` given while no white-box canaries watch this check.
        """
        self.batches.append((int(batch_size), normaliser, float(max_grad_norm), int(passes)))
        if clipped is not None:
            self._white_box().before_noise(clipped)

    def _white_box(self):
        if self.canaries is None:
            raise UsageError(
                "white-box canaries must watch this check (LoopWhiteBox.watch) before sums are passed, got none."
            )
        return self.canaries

    def noise(
        self,
        noise_multiplier: float,
        max_grad_norm: float,
        *,
        sample_rate: float | None = None,
        expected_batch_size: float | None = None,
        noisy=None,
    ) -> None:
        """One noise addition of std ``noise_multiplier * max_grad_norm`` to the clipped sum
        (``sample_rate``: the rate its batch was drawn at, default the declared one; ``noisy``: the
        noisy sum, before any scaling, when ``clip`` was given the clipped one).

        Args:
            noise_multiplier: the noise multiplier of this addition.
            max_grad_norm: the clipping norm it is scaled by.
            sample_rate: the rate its batch was drawn at.
            expected_batch_size: the expected batch size, if any.
            noisy: the noisy sum, for white-box canaries.

        Raises:
            UsageError: ``noisy`` missing after ``clip`` was given the clipped sum.
        """
        if noisy is not None or (self.canaries is not None and self.canaries.pending):
            if noisy is None:
                raise UsageError(
                    "noisy must be given when clip was given the clipped sum, got None."
                )
            self._white_box().after_noise(noisy)
        b = self.batches
        self.noised.append(
            {
                "noise_multiplier": float(noise_multiplier),
                "max_grad_norm": float(max_grad_norm),
                "sample_rate": self.sample_rate if sample_rate is None else float(sample_rate),
                "expected_batch_size": expected_batch_size,
                "records": sum(x[0] for x in b),
                "clips": len(b),
                "passes": sum(x[3] for x in b),
                "normaliser": next((x[1] for x in b if x[1] is not None), None),
            }
        )
        self.batches = []

    def step(self) -> None:
        """One parameter update (what the accountant counts as a step); it consumes the clipped batches."""
        self.updates, self.batches = self.updates + 1, []
        self.unnoised_updates += len(self.noised) == self._mark
        self._mark = len(self.noised)

    # ------------------------------------------------------------------ Opacus
    def attach(self, optimizer, *, data_loader, accountant=None, module=None) -> "PipelineCheck":
        """Record ``optimizer`` (a ``DPOptimizer``) through its ``clip_and_accumulate``, ``add_noise``
        and ``original_optimizer.step``: the settings ``make_private`` gave it are the declared ones,
        each step's are read when it adds noise, the noise each update carries is measured and the
        parameters are compared between DP steps; ``data_loader``'s sampler records its draws;
        ``accountant``: the ``PrivacyEngine``'s (its history is compared with the executed steps);
        ``module``: the trained model, whose parameters outside the DP optimizer must not change.

        Args:
            optimizer: the DPOptimizer of the run.
            data_loader: its data loader.
            accountant: the PrivacyEngine's accountant, if any.
            module: the trained model, if any.

        Returns:
            This check, recording.
        """
        self.data_loader, self._accountant = data_loader, accountant
        self.dataset_size = len(data_loader.dataset)
        self.sample_rate = getattr(data_loader, "sample_rate", None) or 1.0 / len(data_loader)
        self._sampler_name = type(getattr(data_loader, "batch_sampler", None)).__name__
        self.declared = optimizer_settings(optimizer, data_loader, self.sample_rate)
        self._drawn = _record_draws(data_loader)
        self._params = list(optimizer.params)
        self._snapshot()
        self._outside = None if module is None else ParamsOutsideDP(module, optimizer)
        self._wrap(optimizer)
        return self

    def _wrap(self, optimizer) -> None:
        clip = optimizer.clip_and_accumulate
        noise = optimizer.add_noise
        inner = optimizer.original_optimizer
        original_step = inner.step
        mean = optimizer.loss_reduction == "mean"

        def clip_and_accumulate():
            self._compare_params()
            g = optimizer.grad_samples[0]
            self.clip(
                len(g),
                optimizer.max_grad_norm,
                normaliser=optimizer.expected_batch_size if mean else None,
                passes=optimizer.accumulated_iterations,
            )
            clip()

        def add_noise():
            if self._outside is not None:
                self._outside.at_dp_step()
            # the settings this step runs with, read now: a change is a finding
            self.noise(**optimizer_settings(optimizer, self.data_loader, self.sample_rate))
            self.step()  # Opacus updates exactly when it adds noise (pre_step)
            self._dp_step_open = True
            noise()

        def step(*args, **kwargs):  # every update, from DPOptimizer.step or called directly
            private, self._dp_step_open = self._dp_step_open, False
            self.direct_steps += not private
            if private:
                self._measure_noise(optimizer, mean)
            out = original_step(*args, **kwargs)
            if private:
                self._snapshot()
            return out

        optimizer.clip_and_accumulate = clip_and_accumulate
        optimizer.add_noise = add_noise
        inner.step = step

    def _measure_noise(self, optimizer, mean: bool) -> None:
        """The noise this update carries: p.grad (Opacus's mean scaling undone) minus the clipped sum
        p.summed_grad it was drawn around, summed in squares over all coordinates. Under noise of std
        sigma C that sum over (sigma C)^2 is chi^2 with one degree per coordinate."""
        scale = (
            float(optimizer.expected_batch_size * optimizer.accumulated_iterations) if mean else 1.0
        )
        pairs = [
            (p.grad.detach().double().reshape(-1), p.summed_grad.detach().double().reshape(-1))
            for p in self._params
            if p.grad is not None and getattr(p, "summed_grad", None) is not None
        ]
        if pairs:
            sq = sum(float((g * scale - s).square().sum()) for g, s in pairs)
            self.noise_sums.append(
                (sq, sum(g.numel() for g, _ in pairs), float(optimizer.max_grad_norm))
            )

    def _snapshot(self) -> None:
        self._after_dp = [p.detach().clone() for p in self._params]

    def _params_moved(self) -> bool:
        return any(not torch.equal(p.detach(), s) for p, s in zip(self._params, self._after_dp))

    def _compare_params(self) -> None:
        """Before a DP step: the parameters must be those the previous DP step (or make_private) left."""
        if self._params_moved():
            self.outside_updates += 1
            self._snapshot()  # one finding per change, not one per later step

    # ------------------------------------------------------------------ the findings
    def _claimed_history(self) -> list:
        if self._accountant is not None:
            return [tuple(h) for h in self._accountant.history]
        return self.history or []

    def findings(self) -> tuple[Finding, ...]:
        """Every mismatch found so far (module docstring); the parameters are compared with the last
        DP step's now.

        Returns:
            The findings (:class:`Finding`), empty for a run that matches its accounting.
        """
        return tuple(
            self._sampler_findings()
            + self._draw_findings()
            + self._normaliser_findings()
            + self._step_findings()
            + self._update_findings()
            + self._setting_findings()
        )

    def _sampler_findings(self) -> list[Finding]:
        out, q = [], self.sample_rate
        loader = self.data_loader
        name = self._sampler_name or type(getattr(loader, "batch_sampler", None)).__name__
        if loader is not None and name not in _POISSON_SAMPLERS:
            seen = (
                f"the data loader draws batches with {name}, not Poisson sampling, while the accountant "
                f"assumes Poisson sampling at q = {q:.6g}."
            )
            why = "the Poisson amplification in the accounted epsilon does not apply; see no_amplification_event."
            out.append(Finding("not-poisson", seen, why))
        sizes = [x["records"] for x in self.noised]
        if len(sizes) >= 3 and q is not None and self.dataset_size:
            p = fixed_size_chance(sizes, n=int(self.dataset_size), q=float(q))
            if p < FIXED_SIZE_P:
                k = int(np.bincount(sizes).max())
                seen = (
                    f"{k} of {len(sizes)} logical batches have {int(np.bincount(sizes).argmax())} "
                    f"records; under Poisson sampling at q = {q:.6g} of {self.dataset_size} records "
                    f"that chance is at most {p:.3g}" + (" (below float range)." if p == 0 else ".")
                )
                why = "batches are not Poisson-sampled: the accounted epsilon is not certified."
                out.append(Finding("fixed-batch-size", seen, why))
        return out + self._rate_findings(sizes) + weight_findings(loader, q)

    def _rate_findings(self, sizes) -> list[Finding]:
        """The records drawn over T steps are Bin(N T, q) under Poisson sampling at q: a two-sided test."""
        n, q = self.dataset_size, self.sample_rate
        if not sizes or q is None or not n or q >= 1:
            return []
        total, trials = int(sum(sizes)), int(n) * len(sizes)
        p = min(
            1.0, 2 * min(stats.binom.cdf(total, trials, q), stats.binom.sf(total - 1, trials, q))
        )
        if p >= FIXED_SIZE_P:
            return []
        seen = (
            f"{total} records in {len(sizes)} batches of {n} records: {total / trials:.6g} per record and "
            f"step against the claimed q = {q:.6g} (two-sided chance under Poisson sampling {p:.3g})."
        )
        why = "batches are not drawn at the accounted rate: the accounted epsilon is not certified."
        return [Finding("sample-rate", seen, why)]

    def _draw_findings(self) -> list[Finding]:
        """The loader's draws against what was trained: the same batches, and per-record counts that
        fit Poisson sampling."""
        d = self._drawn
        if d is None or not self.noised:
            return []
        trained = [x["records"] for x in self.noised]
        if not trained_from_draws(trained, d["sizes"]):
            seen = (
                f"the {len(trained)} noised batches ({sum(trained)} records) are not batches the attached "
                f"loader drew ({len(d['sizes'])} batches, {sum(d['sizes'])} records)."
            )
            why = "the batches trained were drawn elsewhere: their sampling is unchecked and not certified."
            return [Finding("not-from-loader", seen, why)]
        return self._inclusion_findings(d) if self._counts_testable(d) else []

    def _counts_testable(self, d: dict) -> bool:
        """Record positions were read, over two draws or more, at a rate below 1, from one whole dataset
        (a distributed sampler draws one rank's shard: the other records count 0 there)."""
        q = self.sample_rate
        return (
            d["readable"]
            and len(d["sizes"]) >= 2
            and q is not None
            and q < 1
            and getattr(self.data_loader.batch_sampler, "num_replicas", 1) == 1
        )

    def _inclusion_findings(self, d: dict) -> list[Finding]:
        steps, q = len(d["sizes"]), float(self.sample_rate)
        p, b = inclusion_count_test(d["counts"], steps=steps, q=q)
        if p >= FIXED_SIZE_P:
            return []
        k = int((d["counts"] == b).sum())
        want = len(d["counts"]) * float(stats.binom.pmf(b, steps, q))
        seen = (
            f"{k} of {len(d['counts'])} records were drawn {b} times in {steps} batches where Poisson "
            f"sampling at q = {q:.6g} expects {want:.1f} (chance of counts this far off at most {p:.3g})."
        )
        why = (
            "records are not included independently per step (e.g. shuffled epochs): the Poisson "
            "amplification in the accounted epsilon does not apply; see no_amplification_event."
        )
        return [Finding("not-poisson-records", seen, why)]

    def _noise_findings(self) -> list[Finding]:
        """Updates whose measured noise is too small for the declared noise multiplier: a one-sided chi^2
        test per update (Bonferroni over the updates), then one over all updates pooled (the sum of
        their squared noise over (sigma C)^2 is chi^2 with one degree per coordinate and update)."""
        sigma = self.declared.get("noise_multiplier")
        if not self.noise_sums or not isinstance(sigma, (int, float)) or not sigma > 0:
            return []
        level = FIXED_SIZE_P / len(self.noise_sums)
        low = [
            (sq, d, c)
            for sq, d, c in self.noise_sums
            if stats.chi2.cdf(sq / (float(sigma) * c) ** 2, d) < level
        ]
        if low:
            measured = min(math.sqrt(sq / d) / c for sq, d, c in low)
            seen = f"{len(low)} of {len(self.noise_sums)} updates carried noise of std down to {measured:.4g}"
            return [_too_little_noise(seen, sigma, f"each chance below {level:.3g}")]
        return self._pooled_noise_findings(sigma)

    def _pooled_noise_findings(self, sigma: float) -> list[Finding]:
        """All updates pooled: their squared noise over (sigma C)^2 summed is chi^2 with one degree
        per coordinate and update; too little of it is a finding."""
        pooled = sum(sq / c**2 for sq, _, c in self.noise_sums)
        dims = sum(d for _, d, _ in self.noise_sums)
        chance = float(stats.chi2.cdf(pooled / float(sigma) ** 2, dims))
        if chance >= FIXED_SIZE_P:
            return []
        seen = (
            f"the {len(self.noise_sums)} updates together carried noise of std "
            f"{math.sqrt(pooled / dims):.4g}"
        )
        return [_too_little_noise(seen, sigma, f"chance under the declared noise {chance:.3g}")]

    def _update_findings(self) -> list[Finding]:
        out = self._noise_findings() + (
            self._outside.findings() if self._outside is not None else []
        )
        if self.outside_updates:
            seen = (
                f"the DP-optimised parameters changed {self.outside_updates} times outside a DP step "
                f"({self.direct_steps} calls of original_optimizer.step without clipping and noise)."
            )
            why = "those updates used gradients without clipping and noise: no DP, not certified."
            out.append(Finding("non-private-update", seen, why))
        # moved since the last DP step, or since attach when none ran
        if self._params and self._params_moved():
            seen = (
                "the DP-optimised parameters changed after the last DP step, or without any "
                "(e.g. non-private fine-tuning, another optimizer)."
            )
            why = "the audited model is not the DP-trained one: not certified."
            out.append(Finding("changed-after-training", seen, why))
        return out

    def _normaliser_findings(self) -> list[Finding]:
        norms = {x["normaliser"] for x in self.noised} - {None}
        n, q = self.dataset_size, self.sample_rate
        if not n or q is None or not any(_normaliser_moves(b, int(n), float(q)) for b in norms):
            return []
        seen = (
            f"gradients are divided by {sorted(norms)} = int(N q) of the private size N = {n}; "
            f"with one record added or removed that divisor changes."
        )
        why = (
            "neighbouring datasets run different mechanisms (Opacus #571): the accounted epsilon is not certified; "
            "divide by a public constant or use loss_reduction='sum'."
        )
        return [Finding("size-derived-normaliser", seen, why)]

    def _step_findings(self) -> list[Finding]:
        out = []
        accounted = sum(int(h[2]) for h in self._claimed_history())
        if self._claimed_history() and accounted != len(self.noised):
            seen = f"{len(self.noised)} noise additions but {accounted} accounted steps."
            why = "the accounted composition is not the executed one."
            out.append(Finding("noise-steps", seen, why))
        if self.unnoised_updates:
            seen = (
                f"{self.unnoised_updates} of {self.updates} parameter updates had no noise added since "
                f"the previous one."
            )
            why = "those updates release clipped gradients without noise: no DP."
            out.append(Finding("noise-steps", seen, why))
        multi = [x["passes"] for x in self.noised if x["passes"] > 1]
        if multi:
            seen = f"{len(multi)} noise additions covered up to {max(multi)} backward passes each."
            why = (
                f"each noise addition covers several batches of rate q = {self.sample_rate}: the per-step rate is "
                f"larger than the accounted one."
            )
            out.append(Finding("accumulation", seen, why))
        return out

    def _setting_findings(self) -> list[Finding]:
        out = setting_findings(self.declared, self.noised)
        executed = self._executed_history()
        claimed = self._merged(self._claimed_history())
        if self._accountant is not None and executed != claimed:
            seen = f"the accountant's history {claimed} differs from the executed {executed}."
            why = "the accounted epsilon is not the executed run's."
            out.append(Finding("accountant-history", seen, why))
        return out

    def _executed_history(self) -> list:
        return self._merged([(x["noise_multiplier"], x["sample_rate"], 1) for x in self.noised])

    def executed_event(self):
        """The composition the run executed: one SubsampledGaussian per run of equal (noise
        multiplier, sample rate).

        Returns:
            The executed event (a Composed one when the settings changed).
        """
        parts = [SubsampledGaussian(s, q, t) for s, q, t in self._executed_history()]
        return parts[0] if len(parts) == 1 else Composed(tuple(parts))

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
        """Passes over the data: ceil(records processed / N).

        Returns:
            The number of passes, at least 1.

        Raises:
            UsageError: the dataset size is unknown.
        """
        if not self.dataset_size:
            raise UsageError(
                "dataset_size must be known (attach a data loader or pass it), got None."
            )
        return max(1, math.ceil(sum(x["records"] for x in self.noised) / int(self.dataset_size)))

    def no_amplification_event(self) -> SubsampledGaussian:
        """Sound without amplification for batches where each record is in at most one batch per epoch
        (shuffled fixed-size batches; sum of clipped gradients, add/remove of one record leaving the
        others' batches unchanged): the Gaussian mechanism of the smallest executed noise multiplier
        composed over :meth:`epochs`.

        Returns:
            ``SubsampledGaussian(sigma_min, 1, epochs)``.
        """
        sigma = min(x["noise_multiplier"] for x in self.noised)
        return SubsampledGaussian(sigma, 1.0, self.epochs())

    def record(
        self,
        delta: float,
        *,
        accountant: str = "rdp",
        claim=None,
        claimed_epsilon: float | None = None,
        extra=(),
    ) -> dict:
        """What goes in the audit record: ``findings`` (and the attached accountant's epsilon); with
        any, ``certified`` = NOT_CERTIFIED, the executed composition's epsilon when a step's settings or
        the accountant disagree with the claim, and for non-Poisson batches the no-amplification
        epsilon beside the claimed Poisson one. ``claim`` / ``claimed_epsilon``: the audited claim,
        which the script's accountant must not exceed; ``extra``: findings made elsewhere (the
        canaries'), kept when their code is not already found here. With white-box canaries that
        observed a step, ``white_box`` holds their bound, and a bound above the claim is a finding.

        Args:
            delta: the delta of the epsilons recorded.
            accountant: the accountant of those epsilons.
            claim: the audited claim's event, if any.
            claimed_epsilon: its epsilon, if any.
            extra: findings made elsewhere.

        Returns:
            The fields for the audit record: ``findings``, and the others described above.
        """
        acc_eps = self._accountant_epsilon(delta)
        bound = self._white_box_bound(delta, accountant, claimed_epsilon)
        found = list(self.findings()) + self._epsilon_findings(
            acc_eps, claim, claimed_epsilon, delta
        )
        known = {g.code for g in found}
        found += [f for f in extra if f.code not in known] + _white_box_findings(bound)
        out: dict = {"findings": [f.to_dict() for f in found]}
        if acc_eps is not None:  # the epsilon the training script itself reports
            out["accountant_epsilon"] = acc_eps
        if bound is not None:
            out["white_box"] = {**bound.to_dict(), "null_control": self.canaries.null}
        if not found:
            return out
        out["certified"] = NOT_CERTIFIED
        return {**out, **self._figures({f.code for f in found}, delta, accountant)}

    def _white_box_bound(self, delta: float, accountant: str, claimed_epsilon: float | None):
        """The white-box canaries' bound, once they observed a step (else None)."""
        if self.canaries is None or not self.canaries.observed:
            return None
        return self.canaries.audit(
            delta=delta, accountant=accountant, claimed_epsilon=claimed_epsilon
        )

    def _figures(self, codes: set, delta: float, accountant: str) -> dict:
        """The epsilons recorded beside the claim: the executed composition's when the settings or the
        accountant disagree with it, the no-amplification bound for non-Poisson batches."""
        figures = (
            ("executed", _EXECUTED_CODES, self.executed_event, _EXECUTED_LABEL),
            ("no_amplification", _NON_POISSON_CODES, self.no_amplification_event, _BOUND_LABEL),
        )
        out: dict = {}
        for key, codes_of, event_of, label in figures:
            if codes & codes_of and self.noised:
                ev = event_of()
                epsilon = _epsilon_or_none(ev, delta, accountant)
                out[key] = {"event": ev.to_dict(), "epsilon": epsilon, "label": label}
        return out

    def _accountant_epsilon(self, delta: float) -> float | None:
        if self._accountant is None or not self._accountant.history:
            return None
        return float(self._accountant.get_epsilon(delta))

    def _epsilon_findings(self, acc_eps, claim, claimed_epsilon, delta) -> list[Finding]:
        """The script's accountant must not report more than the claim: the claimed epsilon, or that
        accountant's own figure for the claimed event (its formula and grid), whichever is larger, up
        to float rounding."""
        if acc_eps is None or claimed_epsilon is None:
            return []
        same = _same_accountant_epsilon(self._accountant, claim, delta)
        ref = max(float(claimed_epsilon), same if same is not None else float(claimed_epsilon))
        if acc_eps <= ref * (1 + _EPS_ROUNDING) + _EPS_ROUNDING:
            return []
        seen = (
            f"the script's accountant reports eps {acc_eps:.6g} while the audited claim is eps "
            f"{float(claimed_epsilon):.6g} at delta {delta:g}."
        )
        why = "the claim understates what the run spent: not certified."
        return [Finding("accountant-epsilon", seen, why)]


def _white_box_findings(bound) -> list[Finding]:
    if bound is None or not bound.violation:
        return []
    seen = (
        f"the white-box canaries bound the executed mechanism's epsilon below by {bound.epsilon_lb:.4g} "
        f"(noise multiplier at most {bound.noise_upper:.4g}, canary weight at least "
        f"{bound.sensitivity_lower:.4g} C), above the claimed {bound.claimed_epsilon:.4g}."
    )
    why = "the steps carry less noise (or more sensitivity) than claimed: the claim is falsified."
    return [Finding("white-box-epsilon", seen, why)]


_EXECUTED_CODES = frozenset(
    {code for _, code in SETTINGS} | {"accountant-history", "accountant-epsilon"}
)
_NON_POISSON_CODES = frozenset({"not-poisson", "fixed-batch-size", "not-poisson-records"})
_EPS_ROUNDING = 1e-6
_EXECUTED_LABEL = "the composition the steps executed (settings read at every step); not certified"
_BOUND_LABEL = "upper bound without amplification (each record once per epoch); not certified"


def _epsilon_or_none(event, delta: float, accountant: str) -> float | None:
    try:
        return float(compute_epsilon(event, delta=delta, accountant=accountant).epsilon)
    except DPAuditError:  # a setting the accountant does not cover (noise multiplier 0)
        return None


def _same_accountant_epsilon(acc, claim, delta: float) -> float | None:
    """A fresh accountant of ``acc``'s class given only the claimed event's history (None: not a
    Poisson-Gaussian claim, or an accountant class that cannot be rebuilt)."""
    if not isinstance(claim, SubsampledGaussian):
        return None
    try:
        fresh = type(acc)()
        fresh.history = [
            (float(claim.noise_multiplier), float(claim.sample_rate), int(claim.steps))
        ]
        return float(fresh.get_epsilon(delta))
    except Exception:  # noqa: BLE001 -- a user's accountant class: the claimed epsilon alone is the reference
        return None
