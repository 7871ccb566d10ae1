"""The DP-SGD release of the DP-RVFL family on the mechanism contract (record and user level).

One :class:`DPSGDMechanism` (``MECHANISM``, the catalogue's entry for the family) serves every model of
:data:`dpaudit.mechanisms.dpsgd.schedule.MODELS` (frozen-feature heads and trainable modules) at either
privacy unit; :func:`dpaudit.releasing.release` runs it. The protocol is the DP-RVFL paper's
(section 3.2, Algorithm 1; :mod:`dpaudit.mechanisms.dpsgd.schedule`), at user level the one of
:mod:`dpaudit.mechanisms.dpsgd.user_level`. Its schedule and sigma come from
:func:`~dpaudit.mechanisms.dpsgd.schedule.plan_schedule`, as the sweeps' budgets and the head audits' do.

**Privacy contract.** A release is (epsilon, delta)-DP for ``SubsampledGaussian(sigma, q, T)``
under add/remove of one record (``privacy_unit`` record) or of one user's records (user) on the
training partition; q, T and the normaliser come from the declared public reference size
(:func:`planned_reference_size`: ``--reference-size``, else the dataset definition's train size;
users: ``--reference-size``), never from the actual count, which a neighbour changes by one:
the run uses the plan's (q, T, m0) whatever the data hold. Sigma is calibrated with the RDP
accountant. Frozen features, projections, initialisation and the split come from public seeds;
validation data are never read. The
skeleton recomputes the claim from the event after training and withholds the release when the
executed steps differ from T or the claim exceeds the target. ``non_private`` trains without
clipping or noise and claims nothing (``epsilon = inf``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from ...audits.targets import prepared
from ...data.users import attach_user_ids, check_user_split, index_users, load_user_ids
from ...errors import DataError, UsageError
from ...lazy import lazy_import
from ...ledger.book import open_ledger
from ...noise import GAUSSIAN_SAMPLER_DESCRIPTION, gaussian_run_tail
from ...requests import DPSGDRequest
from ...validation import one_of
from ..contract import (
    DataInfo,
    MechanismBase,
    ReleasePlan,
    RunOutput,
    check_plan_matches_release,
    data_plan,
    load_requested,
    public_inputs,
)

# The trainers, looked up here at run time (tests substitute them on this module).
from .module_training import resolve_device, train_module_dp_sgd
from .core import (
    HEAD_BLAS_THREADS,
    DPSGDConfig,
    head_outputs,
    head_probabilities,
    optimizer_settings,
)
from .loop import UserSampling, train_heads
from .features import feature_dim
from .head_audit import HeadTarget, head_model, requested_schedule
from .module_audit import ModuleTarget
from .models import module_for
from .one_run_modules import module_run_parts
from .schedule import (
    ACCOUNTANT,
    DEFAULT_DATASET,
    MODEL_NAMES,
    MODELS,
    RECORD_ADJACENCY,
    USER_ADJACENCY,
    _progress_callable,
    classification_metrics,
    epsilon_curve,
    planned_reference_size,
)
from .user_head_audit import UserHeadTarget, with_users

np = lazy_import("numpy")
torch = lazy_import("torch")

USER_SAMPLING = "Poisson over users at sample_rate; min(G, |D_u|) records per sampled user without replacement each step (private)"


class DPSGDMechanism(MechanismBase):
    """The DP-SGD family's mechanism (module docstring). ``user_ids``: in-memory user ids (an
    array per row before splitting, or a ``{"train", "val", "test"}`` mapping for an already
    split dataset) for library callers; a request names a ``.npy`` file instead."""

    name = "dp-sgd"
    request_type = DPSGDRequest

    def __init__(self, user_ids=None) -> None:
        self.user_ids = user_ids

    # ------------------------------------------------------------------ contract
    def validate(self, r: DPSGDRequest) -> DPSGDRequest:
        # never ignore a request for user-level privacy
        if r.privacy_unit == "record" and self.user_ids is not None:
            raise UsageError(
                "privacy_unit must be 'user' when user ids or records_per_user are given, got 'record'."
            )
        r.check()
        one_of("model", r.model, MODEL_NAMES)
        # cuda without a CUDA device: refused before any data are loaded
        resolve_device(r.training.device, supported=MODELS[r.model].family != "head")
        return r

    def load(self, r: DPSGDRequest, prepared=None):
        """The request's dataset, split by users at user level (:meth:`_load_users`)."""
        if r.privacy_unit == "user":
            prepared = self._load_users(r, prepared)
        return super().load(r, prepared)

    def _load_users(self, r: DPSGDRequest, prepared):
        """The dataset split by the request's user ids (a ``.npy`` path, or an array from a
        library audit), else the instance's, else the prepared dataset's own."""
        ids = self.user_ids if r.user_ids is None else r.user_ids
        ids = load_user_ids(Path(ids)) if isinstance(ids, (str, os.PathLike)) else ids
        if ids is None and getattr(prepared, "user_ids", None) is None:
            raise UsageError(
                "user_ids must be given for privacy_unit 'user' (one id per row before splitting), got None."
            )
        if prepared is None:
            data = attach_user_ids(_unsplit_dataset(r), ids)
        elif ids is not None:
            data = attach_user_ids(prepared, ids, split_seed=r.split_seed)
        else:
            data = prepared
        check_user_split(
            data.user_ids["train"], data.user_ids.get("val"), data.user_ids.get("test")
        )
        return data

    def plan(self, r: DPSGDRequest, info: DataInfo) -> ReleasePlan:
        """Public quantities only: the schedule of the unit's declared reference size (never
        ``info.n_train`` / ``info.n_users``, the private counts), sigma, the event.

        Args:
            r: the validated DP-SGD request (model, unit, epsilon, delta, schedule, optimizer).
            info: the dataset's public description (sizes declared, never counted).

        Returns:
            The ReleasePlan: sigma, the SubsampledGaussian event (None when non-private), the steps
            and the training config (``plan.config``) the run and the audit both use.

        Raises:
            UsageError: a setting outside its range or a claim the schedule cannot meet.
            DataError: a user-level request on data without user ids.
        """
        spec = MODELS[r.model]
        user = r.privacy_unit == "user"
        reference_size, adjacency, setup = _unit_schedule(r, info, user)
        sched = setup.schedule
        dp = setup.config(non_private=r.non_private, **optimizer_settings(r.training))
        unit_config = (
            {
                "privacy_unit": "user",
                "records_per_user": int(r.records_per_user),
                "user_sampling": USER_SAMPLING,
            }
            if user
            else {}
        )
        config = {
            "model": r.model,
            "family": spec.family,
            "description": spec.description,
            "dp_sgd": dp.to_dict(),
            "schedule": sched.to_dict(),
            **unit_config,
            "epochs": setup.epochs,
            "batch_size": setup.batch_size,
            **({"batch_size_unit": "users"} if user else {}),
            # A mechanism input (public): q, T and m0 are functions of it alone.
            "reference_size": reference_size,
            "reference_size_from": "request"
            if r.reference_size is not None
            else "dataset definition",
            "calibrated_epsilon": setup.calibrated_epsilon,
            **public_inputs(r, info),
        }
        return data_plan(
            r,
            info,
            mechanism=r.model,
            adjacency=adjacency,
            accountant=ACCOUNTANT,
            event=setup.event,
            target_epsilon=None if r.non_private else float(r.epsilon),
            delta=float(r.delta),
            config=config,
            steps=int(sched.steps),
            privacy_unit="user" if user else "record",
            release_fields={
                "noise_multiplier": setup.noise_multiplier,
                "sample_rate": sched.sample_rate,
                "normalizer": sched.normalizer,
                "clipping_norm": dp.clipping_norm,
                "noise_sampler": "none (non-private)"
                if r.non_private
                else GAUSSIAN_SAMPLER_DESCRIPTION,
            },
            noise_values=None
            if r.non_private
            else _noised_parameters(spec, info, r.seed, steps=int(sched.steps)),
            noise_what=f"{r.model} run",
            compare_accountants=("prv",),
        )

    def plan_of_audit(self, r: DPSGDRequest) -> ReleasePlan:
        """A fresh audit's plan. At user level the audit's users are the request's (``user_ids``), else the
        rows grouped into users of G by the public seed (:func:`~dpaudit.mechanisms.dpsgd.user_head_audit.synthetic_user_ids`),
        and the schedule is built from the declared reference size N0 as a release's is (refused before
        loading without one): the number of users the data hold differs between neighbours and is never
        published."""
        if r.privacy_unit != "user":
            return super().plan_of_audit(r)
        r = self.validate(r)
        ids = self.user_ids if r.user_ids is None else r.user_ids
        data, _ = with_users(_unsplit_dataset(r), ids, r.records_per_user, r.seed)
        return self.plan(r, self.data_info(r, data))

    def plan_of_release(self, r: DPSGDRequest, release) -> ReleasePlan:
        """The release's plan (checked, :func:`~dpaudit.mechanisms.contract.check_plan_matches_release`). A
        user-level release predating recorded reference sizes is replayed from its recorded ``n_users``;
        one that names its user-ids file only in its command line (never parsed) needs ``r.user_ids``.

        Args:
            r: the release's request (:func:`~dpaudit.release_compat.release_request`).
            release: the Release whose plan is rebuilt.

        Returns:
            The plan, equal to the one the release published.

        Raises:
            UsageError: an old user-level release audited without its user-ids file.
            DataError: the rebuilt plan differs from the release's.
        """
        if r.privacy_unit == "user":
            if (
                r.user_ids is None
                and release.request is None
                and "--user-ids" in (release.command or "").split()
            ):
                raise UsageError(
                    "user ids must be given (--user-ids FILE.npy) to audit this release: it predates recorded requests and names "
                    "its user-ids file only in its command line, which is never parsed; got none."
                )
            n_users = (release.config or {}).get("n_users")
            if r.reference_size is None and n_users is not None:
                r = dataclasses.replace(r, reference_size=int(n_users))
        # where the release trained is not part of its plan: an audit trains on its own --device
        plan = self.plan_of_audit(dataclasses.replace(r, device="cpu"))
        check_plan_matches_release(plan, release)
        return plan

    def run(self, plan: ReleasePlan, data, noise, *, progress=None) -> RunOutput:
        """Train on the private data (the unit's trainers of :mod:`dpaudit.mechanisms.dpsgd.module_training` /
        :mod:`dpaudit.mechanisms.dpsgd.user_level`) and evaluate on the test partition.

        Args:
            plan: the plan, executed as it is (``plan.steps`` noisy steps).
            data: the prepared private dataset.
            noise: the private NoiseSource, the only source of the noise.
            progress: an optional progress callback.

        Returns:
            The RunOutput: steps executed, test metrics, weights and public arrays, timings.
        """
        r: DPSGDRequest = plan.request
        spec = MODELS[r.model]
        config = DPSGDConfig.from_dict(plan.config["dp_sgd"])  # schedule, noise, optimizer
        steps = plan.steps
        private = plan.event is not None
        users = None  # the privacy unit: records, or users (the plan's (q, T, m0) whatever their actual number, private)
        if plan.privacy_unit == "user":
            users = UserSampling(index_users(data.user_ids["train"]), int(r.records_per_user))

        # The spent-epsilon curve costs one RDP evaluation: only build it when progress is shown.
        eps_of = (
            epsilon_curve(config.noise_multiplier, config.sample_rate, plan.delta)
            if (private and progress not in (None, False))
            else None
        )
        n_classes = int(data.n_classes)
        binary = n_classes == 2

        def train(params: int, fit):
            """``fit(progress)``, timed. Every step adds N(0, (sigma C)^2) to every trainable parameter
            (empty batches included): public dimensions, so truncated-noise runs are refused first."""
            if private:
                gaussian_run_tail(
                    steps,
                    params,
                    plan.target_epsilon,
                    plan.delta,
                    what=f"{r.model} run ({steps} steps x {params} noised parameters)",
                )
            cb, close = _progress_callable(progress, steps, eps_of)
            t_train = time.perf_counter()
            try:
                out = fit(cb)
            finally:
                close()
            return out, time.perf_counter() - t_train

        save = arrays = None
        if spec.family == "head":
            feats, k, init = head_model(r.model, data.n_features, n_classes, plan.seed)
            t_feat = time.perf_counter()
            z_train = feats.transform(data.x_train, bias_column=True)  # [z, 1]: the head's input
            feature_seconds = time.perf_counter() - t_feat
            params = k * (feats.output_dim + 1)
            model_config = {
                "features": feats.describe(),
                "head_outputs": k,
                "head_init": "U(-1/sqrt(d), 1/sqrt(d)) (torch nn.Linear default)",
                "loss": "sigmoid cross-entropy (K=1)" if k == 1 else "softmax cross-entropy",
                "trainable_parameters": params,
            }
            head, train_seconds = train(
                params,
                lambda cb: train_heads(
                    z_train,
                    data.y_train,
                    n_classes,
                    config,
                    noise=noise,
                    init=init,
                    users=users,
                    progress=cb,
                    binary_logit=binary,
                    z_has_bias_column=True,
                ),
            )
            steps_executed, weight = head.steps_executed, head.weights[0]
            proba = head_probabilities(weight, feats.transform(data.x_test))
            arrays = {"head_weight": weight.astype(np.float32), **_feature_arrays(feats)}
            weights_name = "weights.npz"
            # the head's training (its features: BLAS's own count), on the CPU
            threads = {"blas_threads": HEAD_BLAS_THREADS, "device": "cpu"}
        else:
            module, x_train, y_train, _, loss = module_run_parts(spec.module, data, plan.seed)
            feature_seconds = 0.0
            params = sum(p.numel() for p in module.parameters() if p.requires_grad)
            model_config = {
                "module": repr(module),
                "loss": "BCEWithLogits (K=1)" if binary else "CrossEntropy",
                "trainable_parameters": params,
                "init": "torch defaults from a generator seeded by the public seed",
            }
            device = resolve_device(r.training.device)
            steps_executed, train_seconds = train(
                params,
                lambda cb: train_module_dp_sgd(
                    module,
                    torch.as_tensor(x_train),
                    torch.as_tensor(y_train),
                    config,
                    noise=noise,
                    users=users,
                    loss=loss,
                    progress=cb,
                    device=device,
                ),
            )
            proba = _module_probabilities(module, data.x_test, binary)
            weights_name = "model.pt"
            threads = {"torch_threads": torch.get_num_threads(), "device": device}  # public
            state = module.state_dict()

            def save(out_dir) -> None:
                torch.save(state, Path(out_dir) / weights_name)

        return RunOutput(
            steps_executed=int(steps_executed),
            metrics=classification_metrics(data.y_test, proba),
            arrays=arrays,
            save=save,
            weights_name=weights_name,
            config=model_config,
            timings={"train_seconds": train_seconds, "feature_seconds": feature_seconds, **threads},
            noise_values=int(steps) * int(params),
            noise_what=f"{r.model} run ({steps} steps x {params} noised parameters)",
        )

    def out_dir_tag(self, plan: ReleasePlan) -> str:
        return "-user" if plan.privacy_unit == "user" else ""

    def summary(self, release, ledger=None) -> tuple[dict, list[str]]:
        """What ``dpaudit train MODEL`` prints: the published fields (rounded timings, no hash of the data) with the keyed
        dataset fingerprint the ledger stored (``--json``), and lines with the claim, the schedule and the test metrics."""
        d = release.to_dict()
        keys = (
            "id mechanism adjacency accountant target_epsilon epsilon delta epsilons noise_multiplier"
            " sample_rate steps steps_executed clipping_norm normalizer seed non_private noise_source"
            " metrics timings artefacts command privacy_unit"
        ).split()
        out = {k: d.get(k) for k in keys}
        out["dataset"] = (
            d["dataset"].get("name") if isinstance(d.get("dataset"), dict) else d.get("dataset")
        )
        out["dataset_fingerprint"] = _ledger_fingerprint(d.get("id"), ledger)
        claim = (
            "no privacy claim (non-private)"
            if release.non_private
            else (
                f"epsilon={release.epsilon:.4f} (target {release.target_epsilon:g}), delta={release.delta:g}, {release.accountant}, {release.adjacency}"
            )
        )
        lines = [f"[bold]{out['mechanism']}[/] on {out['dataset']}: {claim}"]
        if not release.non_private:
            lines.append(
                f"  noise_multiplier={release.noise_multiplier:.4f} sample_rate={release.sample_rate:.6f} steps={release.steps_executed}/{release.steps} "
                f"normalizer={release.normalizer}"
            )
        if out["privacy_unit"] == "user":
            lines.append(
                f"  privacy unit: user (schedule for {release.config['reference_size']} training users, records_per_user "
                f"G={release.config['records_per_user']})"
            )
        lines.append(
            "  test "
            + "  ".join(
                f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                for k, v in release.metrics.items()
            )
        )
        lines.append(
            f"  train {release.timings['train_seconds']:g}s, setup {release.timings['setup_seconds']:g}s (rounded as published); "
            f"release id {release.id}"
        )
        return out, lines

    def audit_target(
        self, plan: ReleasePlan, canary: str, *, release=None, user_ids=None, no_noise: bool = False
    ):
        """The audit target of this plan, prepared: a module model's :class:`ModuleTarget`; a head
        model's holds the plan as it is (:meth:`HeadAuditTarget.of_plan`: its sigma, schedule,
        optimizer settings, public seed and dataset) and the ``release``, whose recorded claim, event, accountant, identity, sigma and schedule (for old
        releases they are the truth). ``user_ids``: a user-level audit's (default: the request's
        file; none: a public grouping into users of G). ``no_noise``: the no-noise control.

        Args:
            plan: the plan audited, taken as it is.
            canary: the canary kind.
            release: the Release audited (None: a fresh plan's claim).
            user_ids: a user-level audit's user ids (array or .npy path).
            no_noise: build the no-noise control.

        Returns:
            The prepared AuditTarget.

        Raises:
            UsageError: a non-private head plan (no claim to audit).
        """
        r: DPSGDRequest = plan.request
        if MODELS[r.model].family != "head":
            target = ModuleTarget.of_plan(plan, canary, release=release)
            return prepared(target, no_noise)
        if plan.event is None:
            raise UsageError(
                f"release must be private to be audited, got a non-private {r.model} release."
            )
        if plan.privacy_unit != "user":
            return prepared(HeadTarget.of_plan(plan, canary, release=release), no_noise)
        ids = r.user_ids if user_ids is None else user_ids
        unit = dict(records_per_user=int(r.records_per_user), user_ids=ids)
        return prepared(UserHeadTarget.of_plan(plan, canary, release=release, **unit), no_noise)


MECHANISM = DPSGDMechanism()


def _unsplit_dataset(r: DPSGDRequest):
    """The request's dataset (digits when it names none), before it is split by users."""
    return load_requested(r, r.dataset or DEFAULT_DATASET)


def _ledger_fingerprint(release_id, ledger) -> str | None:
    """The keyed ``dataset_fingerprint`` of a recorded release (HMAC under the ledger's key), read
    from its ledger entry; None when there is no entry or the ledger stores none (old ledgers)."""
    if not release_id:
        return None
    try:
        with open_ledger(ledger, create=False) as led:
            return led.get(str(release_id)).payload.get("dataset_fingerprint")
    except Exception:  # noqa: BLE001 -- an informative field only; the release is already published
        return None


def _feature_arrays(feats) -> dict:
    """The frozen features' public arrays a head release publishes (float32)."""
    arrays = dict(projection=feats.projection, hidden_weight=feats.weight, hidden_bias=feats.bias)
    return {name: a.astype(np.float32) for name, a in arrays.items() if a is not None}


def _module_probabilities(module, x_test, binary: bool):
    """A trained module's class probabilities on the test partition, (n, 2) for a binary logit."""
    module.eval()
    with torch.no_grad():
        out = module(torch.as_tensor(np.asarray(x_test, dtype=np.float32))).double()
    if not binary:
        return torch.softmax(out, dim=1).numpy()
    p1 = torch.sigmoid(out.reshape(-1)).numpy()
    return np.stack([1.0 - p1, p1], axis=1)


def _unit_schedule(r: DPSGDRequest, info: DataInfo, user: bool):
    """(reference size, adjacency, :func:`plan_schedule`'s set-up) of the request's privacy unit:
    the schedule of the unit's declared reference size (users: the request's), never a count."""
    if user and info.n_users is None:
        raise DataError(
            f"dataset {info.name} must be split by users for privacy_unit 'user', got no user ids."
        )
    reference_size = planned_reference_size(
        r.reference_size, None if user else info.reference_size, unit="user" if user else "record"
    )
    adjacency = USER_ADJACENCY if user else RECORD_ADJACENCY
    setup = requested_schedule(r, info, reference_size, adjacency, r.non_private)
    return reference_size, adjacency, setup


def _noised_parameters(spec, info: DataInfo, seed: int, *, steps: int) -> int | None:
    """Noise values the run draws (steps x trainable parameters), from public dimensions, so the
    sampler-tail check refuses a request before anything is reserved. None when a dimension is
    unknown before loading (an image CNN planned from the registry); the run checks again."""
    if spec.family == "head":
        k = head_outputs(info.n_classes, binary_logit=info.n_classes == 2)
        return steps * k * (feature_dim(spec.features, info.n_features) + 1)
    try:
        module = module_for(spec.module, info, seed)
    except UsageError:
        return None
    return steps * sum(p.numel() for p in module.parameters() if p.requires_grad)
