"""One-run audit of a model trained with Opacus's ``PrivacyEngine`` (Steinke, Nasr & Jagielski 2023); usage in
docs/one_run.md (library, ``dpaudit audit opacus SCRIPT.py``, plans).

How it works (the hook: docs/one_run.md). ``canaries`` Dirac gradient canaries sit at distinct
coordinates of the chosen parameter tensors (uniformly from the public ``seed``), each included with
probability 1/2 (private coin); at every logical step each included canary is Poisson-sampled at the
rate Opacus accounts with and, when sampled, ``max_grad_norm * e_j`` is added to ``p.summed_grad``
before Opacus's own ``add_noise``: one extra add/remove unit of sensitivity ``max_grad_norm``.

**The claim is the declared run.** :meth:`OpacusCanaries.claim` is built from the settings the optimizer
had at ``attach`` (what ``make_private`` set); the settings are read again at every step (the canary uses
that step's clipping norm) and a step run at others is a finding of :meth:`OpacusCanaries.audit`, whose
record is then not certified (with a :class:`~dpaudit.integrations.pipeline.PipelineCheck`, so are the
check's findings, the script accountant's epsilon above the claim among them).

**What is not changed.** Opacus's noise (``optimizer.generator`` or the global torch generator;
the canary draws come from a separate NumPy generator), its noise multiplier, clipping, scaling
and its accountant hook (``step_hook``) are untouched. The canary coins and draws come from
``noise_seed`` (None: OS entropy, not reproducible) and are private: publish only the scores and
the result of the analysis, never :attr:`OpacusCanaries.included` before the audit is done.

**Pre-registered** (:meth:`OpacusCanaries.from_plan`): canaries, coordinates and coins from the signed,
registered plan; ``attach`` refuses an optimizer less private than the planned claim and records the run in
the ledger before training; :meth:`audit` tests the planned claim and records its result's digest.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Iterable

from ..accounting.events import SubsampledGaussian, event_from_dict
from ..audit_outputs import shareable_one_run
from ..audit_plans import OPACUS, PlanRun, open_plan
from ..audits.one_run import OneRunResult, OneRunScores, one_run_bounds, plan_coins, write_one_run
from ..audits.power_runs import one_run_power_of
from ..errors import UsageError
from ..lazy import lazy_import
from ..mechanisms.dpsgd.one_run_modules import choose_coordinates
from ..validation import half_open_unit, positive_int
from .pipeline import NOT_CERTIFIED, Finding, ParamsOutsideDP, canary_params, optimizer_settings
from .pipeline import setting_findings
from .pipeline import plain_name as _plain_name

np = lazy_import("numpy")
torch = lazy_import("torch")

_TAG = 0x4F504143  # "OPAC": public choice of the canary coordinates
_TOL = 1e-12  # float rounding of a planned noise multiplier or sample rate


def values_at(param, flat):
    """The values of ``param`` at the flat coordinates ``flat``, on the CPU."""
    return param.detach().reshape(-1)[flat.to(param.device)].cpu()


def chosen_canaries(model, tensors, canaries, seed: int, tag: int) -> tuple:
    """``(m, trainable parameters by plain name, the chosen coordinates)``: ``canaries`` (m >= 2)
    distinct coordinates of ``model``'s parameters ``tensors`` (default all trainable), uniformly
    from the public ``seed`` (UsageError: fewer than two, more than the tensors hold)."""
    m = positive_int("canaries", canaries, 2)  # one-run bounds need two canaries or more
    named, names = canary_params(model, tensors)
    total = int(sum(named[n].numel() for n in names))
    if m > total:
        raise UsageError(
            f"canaries must be at most {total} (coordinates of {', '.join(names)}), got {m}."
        )
    shapes = {n: tuple(named[n].shape) for n in names}
    return m, named, choose_coordinates(shapes, tuple(names), m, int(seed), tag=tag)


def add_canaries(flat_view, idx, weight: float) -> None:
    """Add ``weight`` in place at the flat positions ``idx`` of ``flat_view`` (the sampled canaries)."""
    unit = torch.full((len(idx),), weight, dtype=flat_view.dtype, device=flat_view.device)
    flat_view.index_add_(0, idx, unit)


def canary_sample_rate(sample_rate: float | None, data_loader) -> float:
    """The rate each step samples a canary at: ``sample_rate``, else the loader's (Opacus's
    ``DPDataLoader``), else ``1 / len(data_loader)`` (UsageError outside (0, 1])."""
    if sample_rate is None:
        if data_loader is None:
            raise UsageError("sample_rate or data_loader must be given, got neither.")
        sample_rate = getattr(data_loader, "sample_rate", None) or 1.0 / len(data_loader)
    return half_open_unit("sample_rate", sample_rate)


def summed_grad(param, name: str):
    """``param``'s clipped gradient sum this step, which Opacus sets before adding noise (UsageError
    when it is missing)."""
    if getattr(param, "summed_grad", None) is None:
        raise UsageError(
            f"parameter {name!r} must have a clipped gradient sum (p.summed_grad) at each step, got None."
        )
    return param.summed_grad


def _optimizer_noise(optimizer, params: dict) -> tuple[float, float]:
    """``(clipping norm, noise multiplier)`` the optimizer declares, once checked, and every
    canary tensor (``params``) among its parameters (UsageError)."""
    norm = optimizer.max_grad_norm
    if not isinstance(norm, (int, float)) or not norm > 0:
        raise UsageError(f"optimizer.max_grad_norm must be one positive number, got {norm!r}.")
    optimised = {id(p) for p in optimizer.params}
    outside = [n for n, p in params.items() if id(p) not in optimised]
    if outside:
        raise UsageError(
            f"tensors must be optimised by the DPOptimizer, got {outside[0]!r} outside its parameters."
        )
    sigma = optimizer.noise_multiplier
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not sigma >= 0:
        raise UsageError(f"optimizer.noise_multiplier must be one number >= 0, got {sigma!r}.")
    return float(norm), float(sigma)


def opacus_plan_run(
    plan, *, canaries: int | None = None, tensors: Iterable[str] | None = None
) -> PlanRun:
    """The checked :class:`~dpaudit.audit_plans.PlanRun` of an Opacus plan (:func:`~dpaudit.audit_plans.open_plan`);
    ``canaries`` / ``tensors``, when given, must be the plan's."""
    run = open_plan(plan)
    p = run.plan
    if p.get("mechanism") != OPACUS:
        raise UsageError(
            f"plan must be an Opacus plan (`dpaudit audit plan opacus ...`), got a plan for {p.get('mechanism')!r}."
        )
    for flag, given, planned in (
        ("canaries", canaries, p["audit"]["canaries"]),
        ("tensors", None if tensors is None else list(tensors), p["request"]["tensors"]),
    ):
        if given is not None and given != planned:
            raise UsageError(
                f"{flag} must be the planned {planned!r} (plan {p['id'][:12]} fixes it), got {given!r}."
            )
    return run


class OpacusCanaries:
    """m gradient canaries for one Opacus training run (module docstring).

    ``model``: the user's module (before or after ``make_private``; names are matched without
    Opacus's ``_module.`` prefix). ``canaries``: m. ``seed``: public seed of the coordinates.
    ``tensors``: parameter names holding the canaries (default: all trainable parameters); pick
    coordinates the data moves little (e.g. first-layer weights on always-blank image borders) for
    power -- the choice never affects soundness. ``noise_seed``: seed of the private canary
    generator (tests / reproducible audits only; None draws OS entropy). ``coins``: the m inclusion
    coins (private; default: drawn from that generator; a plan's: :meth:`from_plan`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        canaries: int,
        seed: int = 0,
        tensors: Iterable[str] | None = None,
        noise_seed: int | None = None,
        coins=None,
    ):
        """Choose the canary coordinates (public) and the inclusion coins (private).

        Args:
            model: the user's module.
            canaries: the number m of canaries (>= 2).
            seed: the public seed of the coordinates.
            tensors: the parameter names holding the canaries (default: all trainable).
            noise_seed: the seed of the private canary generator (None: OS entropy).
            coins: the m private inclusion coins (default: drawn).

        Raises:
            UsageError: fewer than two canaries, a tensor that is not trainable, or more canaries
                than coordinates.
        """
        m, named, chosen = chosen_canaries(model, tensors, canaries, seed, _TAG)
        self.tensors, self.coords, self.seed = chosen.tensors, chosen.coords, int(seed)
        self._rng = np.random.default_rng(noise_seed)  # private: coins and per-step draws
        self.included = (
            self._rng.random(m) < 0.5 if coins is None else np.asarray(coins, dtype=bool).reshape(m)
        )
        # parameter name -> (canary ids, coordinates)
        self._groups = {n: (ids, flat) for n, ids, flat in chosen.by_tensor()}
        self._theta0 = {n: values_at(named[n], flat) for n, (_, flat) in self._groups.items()}
        self._params = {n: named[n] for n in self._groups}
        self._model = model
        # the model's parameters the DP optimizer does not process (set by attach)
        self._outside = None
        self.sample_rate = self.clipping_norm = self.noise_multiplier = None  # set by attach
        self.steps = 0
        self.executed: list[dict] = []  # per step: the settings the optimizer ran it with
        self._declared: dict = {}
        self.sampled = np.zeros(m, dtype=np.int64)  # private: how often each canary was added
        self._optimizer = None
        self.id = uuid.uuid4().hex  # this run's id (its plan's run and result entries)
        self._plan = None

    @classmethod
    def from_plan(
        cls,
        model: torch.nn.Module,
        plan,
        *,
        canaries: int | None = None,
        tensors: Iterable[str] | None = None,
        noise_seed: int | None = None,
    ) -> "OpacusCanaries":
        """The canaries a pre-registered plan fixes (module docstring): ``plan`` is plan.json (or
        its folder) with plan.local.json beside it, or its checked :func:`opacus_plan_run`; ``canaries`` /
        ``tensors``, when given, must be the plan's (a run other than the planned one is refused).

        Args:
            model: the user's module.
            plan: plan.json, its folder, or a checked PlanRun.
            canaries: the planned number of canaries, if given.
            tensors: the planned tensors, if given.
            noise_seed: the seed of the private per-step draws.

        Returns:
            The planned canaries.

        Raises:
            UsageError: not an Opacus plan, or canaries / tensors other than the plan's.
        """
        run = plan
        if not isinstance(plan, PlanRun):
            run = opacus_plan_run(plan, canaries=canaries, tensors=tensors)
        m, names = run.plan["audit"]["canaries"], run.plan["request"]["tensors"]
        planned = cls(
            model,
            canaries=m,
            seed=run.seeds["public"],
            tensors=names,
            noise_seed=noise_seed,
            coins=plan_coins(run.seeds["coins"], m),
        )
        planned._plan = run
        return planned

    @property
    def m(self) -> int:
        return len(self.coords)

    # ------------------------------------------------------------------ the hook
    def attach(
        self, optimizer, *, sample_rate: float | None = None, data_loader=None
    ) -> "OpacusCanaries":
        """Inject the canaries into ``optimizer`` (an Opacus ``DPOptimizer``). The per-step canary
        sample rate: ``sample_rate``, else ``data_loader.sample_rate`` (Opacus's ``DPDataLoader``),
        else ``1 / len(data_loader)`` -- the rate ``PrivacyEngine`` accounts with.

        Args:
            optimizer: the DPOptimizer of the run.
            sample_rate: the per-step canary sample rate, in (0, 1].
            data_loader: the run's data loader (for the default rate).

        Returns:
            These canaries, attached.

        Raises:
            UsageError: not a DPOptimizer, a second attach, canaries already on the optimizer, no
                rate, invalid optimizer settings, canary tensors it does not optimise, or (with a
                plan) an optimizer less private than the planned claim.
        """
        self._check_attachable(optimizer)
        q = canary_sample_rate(sample_rate, data_loader)
        norm, sigma = _optimizer_noise(optimizer, self._params)
        self.sample_rate, self.clipping_norm, self.noise_multiplier = q, norm, sigma
        if self._plan is not None:
            self._start_planned_run()
        self._loader, self._declared = data_loader, optimizer_settings(optimizer, data_loader, q)
        self._outside = ParamsOutsideDP(self._model, optimizer)
        original = optimizer.add_noise  # the bound method: Opacus's noise, unchanged

        def add_noise():
            self._outside.at_dp_step()
            self._inject(optimizer_settings(optimizer, self._loader, self.sample_rate))
            original()

        optimizer.add_noise = add_noise  # instance attribute: pre_step calls self.add_noise()
        optimizer.dpaudit_canaries = self
        self._optimizer = optimizer
        return self

    def _check_attachable(self, optimizer) -> None:
        """``optimizer`` is an Opacus DPOptimizer without canaries, and these canaries are not
        attached yet (UsageError)."""
        from opacus.optimizers import DPOptimizer

        if not isinstance(optimizer, DPOptimizer):
            raise UsageError(
                f"optimizer must be an Opacus DPOptimizer (from PrivacyEngine.make_private), got {type(optimizer).__name__}."
            )
        if self._optimizer is not None:
            raise UsageError("canaries must be attached to one optimizer, got a second attach().")
        # a second set may reuse the coordinates: twice the sensitivity
        if getattr(optimizer, "dpaudit_canaries", None) is not None:
            raise UsageError(
                "optimizer must carry one set of canaries, got one with canaries attached (by `dpaudit audit opacus`?)."
            )

    def _start_planned_run(self) -> None:
        """The optimizer is at least as private as the planned claim (noise multiplier not below it,
        sample rate not above it: the claim holds for this run), else refused; then the run goes in the
        ledger, before training."""
        event, plan_id = self._planned_event(), self._plan.plan["id"][:12]
        sigma, q = event.noise_multiplier, event.sample_rate
        for flag, rule, want, ok in (
            ("noise_multiplier", "at least", sigma, self.noise_multiplier >= sigma * (1 - _TOL)),
            ("sample_rate", "at most", q, self.sample_rate <= q * (1 + _TOL)),
        ):
            if not ok:
                raise UsageError(
                    f"{flag} must be {rule} the planned {want!r} (plan {plan_id}), got {getattr(self, flag)!r}."
                )
        self._plan.started(self.id)

    def _planned_event(self) -> SubsampledGaussian:
        return event_from_dict(self._plan.plan["claim"]["event"])

    def detach(self) -> None:
        """Remove the hook (the optimizer's own ``add_noise`` again)."""
        if self._optimizer is not None:
            del self._optimizer.add_noise, self._optimizer.dpaudit_canaries
            self._optimizer = None

    def _inject(self, now: dict) -> None:
        """One step's canaries at the settings this step runs (``now``, read from the optimizer): each
        included canary Poisson-sampled at the claimed rate, added as ``max_grad_norm * e_j`` with this
        step's clipping norm (this step's sensitivity)."""
        self.executed.append(now)
        active = self.included & (self._rng.random(self.m) < self.sample_rate)
        self.sampled += active
        self.steps += 1
        norm = float(now["max_grad_norm"])
        for n, (ids, flat) in self._groups.items():
            sampled_here = active[ids]
            if not sampled_here.any():
                continue
            summed = summed_grad(self._params[n], n)
            add_canaries(summed.view(-1), flat[torch.as_tensor(sampled_here)], norm)

    # ------------------------------------------------------------------ after training
    def scores(self, model: torch.nn.Module | None = None):
        """:class:`~dpaudit.audits.one_run.OneRunScores` of the trained model (default: the
        parameters seen at construction): ``-(theta_T - theta_0)[j]``.

        Args:
            model: the trained model to score (None: the parameters seen at construction).

        Returns:
            The OneRunScores of every canary, with its public description.
        """
        if model is None:
            params = self._params
        else:
            named = {_plain_name(n): p for n, p in model.named_parameters()}
            missing = [n for n in self._groups if n not in named]
            if missing:
                raise UsageError(f"model must have the canary tensors, got none named {missing!r}.")
            params = {n: named[n] for n in self._groups}
        s = np.zeros(self.m)
        for n, (ids, flat) in self._groups.items():
            s[ids] = -(values_at(params[n], flat) - self._theta0[n]).double().numpy()
        return OneRunScores(
            scores=s, included=self.included.copy(), kind="gradient", info=self.describe()
        )

    def claim(self):
        """The event Opacus's run claims: SubsampledGaussian(noise multiplier, sample rate, steps
        seen by the hook).

        Returns:
            The claimed SubsampledGaussian event.

        Raises:
            UsageError: the canaries were never attached.
        """
        if self._optimizer is None and self.sample_rate is None:
            raise UsageError(
                "canaries must be attached and trained with before claim(), got no attached optimizer."
            )
        return SubsampledGaussian(self.noise_multiplier, self.sample_rate, max(1, self.steps))

    def describe(self) -> dict:
        """Public description (no coins, no per-canary draws)."""
        return {
            "integration": "opacus",
            "canaries": self.m,
            "seed": self.seed,
            "tensors": list(self.tensors),
            "coordinates": [[n, i] for n, i in self.coords],
            "sample_rate": self.sample_rate,
            "max_grad_norm": self.clipping_norm,
            "noise_multiplier": self.noise_multiplier,
            "steps": self.steps,
            "score": "-(theta_T - theta_0)[j]",
            "injection": "max_grad_norm * e_j added to p.summed_grad before DPOptimizer.add_noise, each included canary "
            "Poisson-sampled per step at sample_rate",
        }

    def audit(
        self,
        model: torch.nn.Module | None = None,
        *,
        out=None,
        delta: float | None = None,
        confidence: float | None = None,
        pipeline=None,
    ) -> OneRunResult:
        """The one-run analysis of the trained ``model`` (:meth:`scores`) against :meth:`claim` at
        ``delta`` (confidence default 0.95), written as one_run.json (shareable) under ``out`` when
        given. Under a plan: the planned claim, statistic and confidence (``delta`` / ``confidence``
        must not be given), written under ``out`` or the plan's folder, its digest recorded under the
        plan; a run of more than the planned steps is refused (its ``run`` entry stays in the ledger, without result).
        ``pipeline``: a :class:`~dpaudit.integrations.pipeline.PipelineCheck` of the run (its ``record`` joins the bounds).

        Args:
            model: the trained model (default: the one given at construction).
            out: the folder for one_run.json (None: not written, unless planned).
            delta: the delta of the claim (not with a plan).
            confidence: the confidence of the bounds (not with a plan).
            pipeline: the PipelineCheck of the run, if any.

        Returns:
            The one-run result; not certified when the canaries or the pipeline found a problem.

        Raises:
            UsageError: invalid arguments, or a planned run of more than the planned steps.
        """
        t0 = time.perf_counter()
        bounds = self._bounds(model, delta, confidence)
        own = self.findings(model)
        if pipeline is not None:
            claim, claimed = self._audited_claim(), bounds["claimed_epsilon"]
            record = pipeline.record(
                bounds["delta"], claim=claim, claimed_epsilon=claimed, extra=own
            )
            bounds.update(record)
        elif own:
            bounds.update({"findings": [f.to_dict() for f in own], "certified": NOT_CERTIFIED})
        result = OneRunResult(
            bounds=bounds,
            mechanism=OPACUS,
            id=self.id,
            plan=self._plan and self._plan.reveal,
            timings={"analysis_s": time.perf_counter() - t0},
            power=one_run_power_of(bounds),
        )
        if out is not None or self._plan is not None:
            write_one_run(result, out if out is not None else Path(self._plan.path).parent)
        if self._plan is not None:
            self._plan.finished(self.id, shareable_one_run(result.to_dict()))
        return result

    def findings(self, model: torch.nn.Module | None = None) -> list:
        """What the canaries alone see against their claim: steps run at settings other than the
        declared ones (read at every step), parameters of the model changed outside the DP optimizer's
        steps (no clipping, no noise), and a scored ``model`` whose canary coordinates are not the
        DP-trained ones.

        Args:
            model: the scored model, if any.

        Returns:
            The findings (:class:`~dpaudit.integrations.pipeline.Finding`), empty when none.
        """
        out = setting_findings(self._declared, self.executed)
        out += self._outside.findings() if self._outside is not None else []
        named = {} if model is None else {_plain_name(n): p for n, p in model.named_parameters()}
        moved = [
            n
            for n, (_, flat) in self._groups.items()
            if n in named
            and named[n] is not self._params[n]
            and not torch.equal(values_at(named[n], flat), values_at(self._params[n], flat))
        ]
        if moved:
            seen = (
                f"the scored model's {', '.join(moved)} differ from the DP-trained values at the canary "
                f"coordinates."
            )
            why = "the audited model is not the DP-trained one: not certified."
            out.append(Finding("changed-after-training", seen, why))
        return out

    def _audited_claim(self):
        return self._planned_event() if self._plan is not None else self.claim()

    def _bounds(self, model, delta, confidence) -> dict:
        if self._plan is None:
            confidence = 0.95 if confidence is None else confidence
            return one_run_bounds(
                self.scores(model), delta=delta, confidence=confidence, claim=self.claim()
            )
        p, ev = self._plan.plan, self._planned_event()
        if delta is not None or confidence is not None:
            raise UsageError(
                f"delta and confidence must not be given under a plan (plan {p['id'][:12]} fixes them), got {delta!r}, {confidence!r}."
            )
        if self.sample_rate is None:
            raise UsageError(
                "canaries must be attached to the optimizer (which records the run under the plan) before audit(), got no attach()."
            )
        if self.steps > ev.steps:
            raise UsageError(
                f"steps must be at most the planned {ev.steps} (plan {p['id'][:12]}), got {self.steps}."
            )
        c = p["claim"]
        return one_run_bounds(
            self.scores(model),
            delta=c["delta"],
            confidence=p["audit"]["confidence"],
            claim=ev,
            accountant=c["accountant"],
            adjacency=c["adjacency"],
        )
