"""The trial audit of the trainable DP-SGD models (catalogue family ``dp-sgd-module``).

Each trial trains the release's module once, from the public initialisation, with the plan's DP-SGD
config (schedule, noise, clipping, optimizer: ``plan.config["dp_sgd"]``) on the training partition,
plus the canary when the trial's world includes it (the final-model threat model: the adversary sees
the released weights). ``max-clip``: a Dirac gradient of norm C at one coordinate of the model's
canary tensors (public seed), added to the clipped sum at each step the canary is sampled (its own
Poisson draw at rate q, from a generator seeded by the private source); score: minus that
coordinate's change. ``mislabeled``: one held-out record (test, then validation rows; public choice)
with a public wrong label; score: minus its loss under the trained model.

**Privacy contract / soundness.** The canary is one add/remove unit of the claimed event; the
schedule (q, T, m0) comes from the plan's public reference size, so both worlds run the same
(q, T, m0); every trial draws its noise and batches from the engine's private source."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ...accounting import compute_epsilon
from ...accounting.events import event_from_dict
from ...audits.targets import AuditTarget, load_target_data
from ...catalogue import MODULE_CANARIES
from ...errors import UsageError
from ...lazy import lazy_import
from .core import DPSGDConfig
from .head_audit import recorded_schedule
from .module_training import train_module_dp_sgd
from .one_run_modules import (
    CANARY_TENSORS,
    DiracCanaries,
    _data_parts,
    _input_canaries,
    _record_losses,
    choose_coordinates,
    coordinate_moves,
    module_run_parts,
)

np = lazy_import("numpy")
torch = lazy_import("torch")


@dataclass(kw_only=True)
class ModuleTarget(AuditTarget):
    """A module model's audit target, built from its release plan (:meth:`of_plan`)."""

    model: str
    dataset: str
    config: DPSGDConfig
    claimed_event: object
    claimed_epsilon: float
    delta: float
    seed: int
    canary: str = "mislabeled"
    accountant: str = "rdp"
    adjacency: str = "add-remove-record"
    noise: bool = True
    data_dir: str | None = None
    split_seed: int | None = None
    profile: str | None = None
    expected_identity: dict | None = None
    expected_sha256: str | None = None
    default_chunk_size: int = 4
    prepared: object | None = field(default=None, repr=False)

    @classmethod
    def of_plan(cls, plan, canary: str, *, release=None) -> "ModuleTarget":
        """The target of ``plan`` (record level); a ``release``'s recorded schedule, noise, claim
        and public dataset identity replace the plan's (the truth for old releases).

        Raises:
            UsageError: a user-level plan, a non-private plan or a canary other than
            :data:`MODULE_CANARIES`.
        """
        if plan.privacy_unit != "record" or plan.event is None:
            raise UsageError(
                f"release must be private and record level for a trial audit of "
                f"{plan.mechanism}, got privacy unit {plan.privacy_unit!r}"
                f"{'' if plan.event else ', non-private'}."
            )
        if canary not in MODULE_CANARIES:
            raise UsageError(
                f"canary must be one of {', '.join(MODULE_CANARIES)} for module "
                f"models, got {canary!r}."
            )
        r, ds = plan.request, plan.dataset
        claim = compute_epsilon(
            plan.event, delta=plan.delta, accountant=plan.accountant, adjacency=plan.adjacency
        )
        target = cls(
            model=r.model,
            dataset=plan.data_name,
            seed=plan.seed,
            canary=canary,
            config=DPSGDConfig.from_dict(plan.config["dp_sgd"]),
            claimed_event=plan.event,
            claimed_epsilon=claim.epsilon,
            delta=plan.delta,
            accountant=plan.accountant,
            adjacency=plan.adjacency,
            data_dir=r.data_dir,
            split_seed=ds.get("split_seed", r.split_seed),
            profile=ds.get("profile", r.profile),
        )
        return target if release is None else target._of_release(release)

    def _of_release(self, release) -> "ModuleTarget":
        ds = release.dataset or {}
        clipping_norm = float(release.clipping_norm or 1.0)
        return dataclasses.replace(
            self,
            config=recorded_schedule(self.config, release, clipping_norm=clipping_norm),
            claimed_event=event_from_dict(release.guarantee),
            claimed_epsilon=float(release.epsilon),
            accountant=release.accountant,
            expected_identity=ds,
            expected_sha256=ds.get("sha256"),
        )

    @property
    def mechanism(self) -> str:  # type: ignore[override]
        return self.model

    def prepare(self) -> None:
        """Load the data (checked against the release's identity) and choose the canary, once."""
        if "_canary_info" in self.__dict__:
            return
        data, x_pool, y_pool = _data_parts(load_target_data(self))
        self.prepared, self._canary_info = data, {"kind": self.canary}
        if self.canary == "mislabeled":
            self._xc, self._yc = _input_canaries(
                x_pool, y_pool, 1, self.seed, int(data.n_classes), self._canary_info
            )
            return
        name = self.model.removeprefix("dp-")
        shapes = module_run_parts(name, data, self.seed)[3]
        chosen = choose_coordinates(shapes, CANARY_TENSORS[name], 2, self.seed)  # the first of two
        self._gradient = dataclasses.replace(chosen, coords=chosen.coords[:1])
        self._canary_info.update(self._gradient.describe(), norm=self.config.clipping_norm)

    def private_data(self) -> dict:
        self.prepare()
        return {"dataset": self.prepared.name, "partition": "train"}

    def without_noise(self) -> "ModuleTarget":
        """The no-noise control: the same set-up and claim, a negligible noise multiplier."""
        return dataclasses.replace(self, config=self.config.without_noise(), noise=False)

    def scores(self, canary_in: np.ndarray, noise) -> np.ndarray:
        """One training run per trial (the canary in where ``canary_in``), scored as the module
        docstring says."""
        self.prepare()
        worlds = np.asarray(canary_in, dtype=bool)
        return np.array(
            [self._score(bool(included), noise) for included in worlds], dtype=np.float64
        )

    def _score(self, included: bool, noise) -> float:
        """One training run, the canary in when ``included``: a max-clip canary drawn at each step
        from a generator seeded by the private ``noise`` (scored by its coordinate's move), or the
        mislabeled record appended (scored by minus its loss)."""
        name = self.model.removeprefix("dp-")
        module, x, y, shapes, loss = module_run_parts(name, self.prepared, self.seed)
        canary = None
        if self.canary == "max-clip":
            theta0 = {n: p.detach().double().clone() for n, p in module.named_parameters()}
            rng = np.random.default_rng(noise.aux_seed())  # private: the canary's per-step draws
            one_canary = np.array([included])
            canary = DiracCanaries(self._gradient, list(shapes), one_canary, self.config, rng)
        elif included:
            x, y = np.concatenate([x, self._xc]), np.concatenate([y, self._yc])
        train_module_dp_sgd(module, x, y, self.config, noise=noise, loss=loss, canary=canary)
        if canary is not None:
            return float(coordinate_moves(module, theta0, self._gradient.coords)[0])
        return -float(_record_losses(module, self._xc, self._yc, loss)[0])

    def describe(self) -> dict:
        self.prepare()
        config = {
            "model": self.model,
            "dp_sgd": self.config.to_dict(),
            "seed": self.seed,
            "threat_model": "final-model",
        }
        return dict(
            task=None, dataset=self.prepared.name, config=config, canary_info=self._canary_info
        )
