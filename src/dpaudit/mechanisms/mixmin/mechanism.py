"""The DP-MixMin pipeline of Figure 1 (DP-MixMin paper, sections 4-5, appendices A.3, A.7, A.10).

1. Split the private training records into D_mix (each record, or each user, independently with probability rho, by a keyed PRF of
   its stable id: rule ``keyed-bernoulli-v1``) and D_ft (the rest), along user boundaries when the privacy unit is a user (public
   randomness).
2. Learn lambda with Algorithm 1 / 2 on D_mix (proxies trained on public data only).
3. Pretrain a downstream model on the PUBLIC data with mixture-weighted targets sum_c lambda_c y_c (BCE; shared input space) or by
   sampling sources with probability lambda; keep the checkpoint with the best validation AUC (the paper's selection, A.3.1: on
   the held-out validation split, outside the training partition the guarantee covers).
4. DP fine-tune on D_ft with the DP-SGD engine: the downstream model's last layer (a linear head on its frozen hidden features,
   initialised from the pretrained head) via :func:`dpaudit.mechanisms.dpsgd.loop.train_heads`.

Privacy: with ``composition="parallel"`` the two DP stages touch disjoint records, so the end-to-end guarantee is the max of the
two (parallel composition), each at the full (epsilon, delta). That needs more than disjointness of the realised split: under
add/remove adjacency a neighbouring dataset must change ONE side only, which the keyed per-record (per-user) rule guarantees and a
permutation or fixed-size split does not (adding one record reshuffles it); only the keyed rule is therefore declared to the
ledger as a disjoint partition. With ``"sequential"`` both stages use all private training records, with epsilon split (rho *
epsilon, (1 - rho) * epsilon) and the guarantees add (A.7).

Schedules: both stages' (q, T, m0) and noise are built from the task's declared public size N0
(:data:`~.tasks.REFERENCE_SIZES`, or ``--reference-size``) via :func:`~.tasks.reference_units`, assuming |D_mix| =
round(rho U0) and |D_ft| = N0 - round(rho N0); the run keeps them whatever the actual (private) counts are.

The section 5 baselines are benchmarks/mixmin_experiments.py's (docs/experiments.md)."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ...accounting import (
    SubsampledGaussian,
    calibrate_noise_multiplier,
    compute_epsilon,
    dp_sgd_schedule,
)
from ...accounting.comparisons import comparison_epsilons
from ...accounting.events import Composed, Parallel
from ...audits.targets import prepared
from ...lazy import lazy_import
from ...ledger.book import open_ledger
from ...errors import DataError, UsageError
from ...noise import GAUSSIAN_SAMPLER_DESCRIPTION, NoiseSource, public_rng
from ...progress import stage
from ...records import write_json_atomic
from ...requests import MixMinRequest
from ...validation import one_of, open_unit, positive_finite
from ..contract import (
    DataInfo,
    MechanismBase,
    PartitionDeclaration,
    ReleasePlan,
    RunOutput,
    check_plan_matches_release,
)
from ..dpsgd.module_training import DPSGDConfig
from ..dpsgd.loop import train_heads
from ..dpsgd.mechanism import planned_reference_size
from .solver import MixMinConfig, objective, run_mixmin
from .audit import MixMinTarget
from .tasks import (
    REFERENCE_SIZES,
    SPLIT_RULE,
    STABLE_SPLIT_RULES,
    TASKS,
    MixMinTask,
    MixtureSettings,
    default_mixture,  # noqa: F401
    fit,
    load_proxy_predictions,
    load_task,
    mixture_split,
    new_mlp,
    reference_units,
    resolved_mixture,
    resolved_rho,
    synthetic_user_ids,
    train_proxies,
)
from .tasks import split_partition as split_partition_of

np = lazy_import("numpy")
torch = lazy_import("torch")

COMPOSITIONS = ("parallel", "sequential")
PRETRAIN_OBJECTIVES = ("weighted-targets", "source-sampling")
#: Accountants a DP-MixMin claim can be made under (both are recorded in ``epsilons``).
ACCOUNTANTS = ("rdp", "prv")
_TAG_PRETRAIN = 0x9E7
#: What a split's membership is keyed on, per privacy unit (recorded in the release's ``split``).
SPLIT_KEYS = {"record": "record ids = rows of the task's source data", "user": "user ids"}
#: The noise settings both parts' releases record from their config (:func:`_release_fields`).
RELEASED_SETTINGS = ("noise_multiplier", "sample_rate", "clipping_norm")


@dataclass(frozen=True)
class DownstreamSettings:
    """Downstream model: MLP (hidden units) pretrained on public data, then DP fine-tuned head."""

    hidden: int = 64
    pretrain_checkpoints: tuple[int, ...] = (1, 2, 3)
    pretrain_objective: str = "weighted-targets"
    pretrain_batch_size: int = 128
    finetune_epochs: int = 3
    finetune_batch_size: int = 256
    finetune_clipping_norm: float = 1.0
    finetune_lr: float = 1e-2
    random_search_m: int = 8

    def to_dict(self) -> dict:
        return asdict(self)


def default_downstream(task: MixMinTask) -> DownstreamSettings:
    """Per-task defaults: small data needs more pretraining epochs and smaller fine-tuning batches."""
    return default_downstream_for(task.name, task.image)


def default_downstream_for(name: str | None, image: bool) -> DownstreamSettings:
    """:func:`default_downstream` from the task's public name and kind (what a plan knows)."""
    if name == "mnist-mix":
        return DownstreamSettings()
    if image:
        return DownstreamSettings(
            pretrain_checkpoints=(20, 40, 60), finetune_epochs=10, finetune_batch_size=64
        )
    return DownstreamSettings(
        hidden=16,
        pretrain_checkpoints=(50, 100, 200),
        pretrain_batch_size=64,
        finetune_epochs=20,
        finetune_batch_size=32,
    )


def utility_on_test_partition(request: MixMinRequest, release) -> dict:
    """The mixture's mean loss on the task's private TEST partition, beside two references. For the operator's console only, never
    written into a release (the test records are private and outside the guarantee).
    References: the uniform mixture (what lambda starts from) and the best single source (the best vertex of the simplex). Lower
    is better. Uses the same cached task and proxies (public data only) as the release (of ``request``,
    a built-in task's)."""
    t = load_task(request.task, seed=request.seed, data_dir=request.data_dir)
    tname, y_all = t.target_labels(release.config.get("target"))
    te, loss = t.test_idx, release.config.get("loss", "bce")
    probs = train_proxies(t, mode=request.proxy_mode).predict(t.private_x[te])
    y = np.asarray(y_all[te], dtype=np.float64)
    w = np.asarray(list(release.metrics["weights"].values()), dtype=np.float64)
    singles = [objective(probs, y, np.eye(t.k)[i], loss) for i in range(t.k)]
    best = int(np.argmin(singles))
    return {
        "partition": "test",
        "n": int(len(te)),
        "target": tname,
        "loss_name": loss,
        "mixture": objective(probs, y, w, loss),
        "uniform": objective(probs, y, np.full(t.k, 1.0 / t.k), loss),
        "best_single_source": {"source": t.source_names[best], "loss": float(singles[best])},
    }


def auc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y)
    if len(np.unique(y)) < 2:
        return float("nan")
    return float(roc_auc_score(y, score))


# ---- Downstream model: pretraining on public data, DP fine-tuning of its head


def pretrain(
    task: MixMinTask,
    weights,
    *,
    seed: int,
    settings: DownstreamSettings,
    x_val,
    y_val,
    tag: int = 0,
):
    """Pretrain on public data according to ``weights``; return the best checkpoint on validation.

    ``weighted-targets`` (shared input space only): BCE against sum_c lambda_c y_c (A.3.1).
    ``source-sampling``: each epoch draws N (source, row) pairs, source ~ lambda, row uniform within the source, and trains on
    that source's label. Returns (model, info dict)."""
    one_of("pretrain_objective", settings.pretrain_objective, PRETRAIN_OBJECTIVES)
    w = np.asarray(weights, dtype=np.float64)
    model = new_mlp(task.public_x.shape[1], settings.hidden, 1, seed, _TAG_PRETRAIN, tag)
    best = {"auc": -math.inf, "epoch": None, "state": None}
    val_aucs = {}

    def keep(epoch, m):
        if epoch in settings.pretrain_checkpoints:
            a = auc(y_val, model_scores(m, x_val))  # float32 scores widened: the same ranks
            val_aucs[epoch] = a
            if a > best["auc"] or best["state"] is None:
                best.update(
                    auc=a, epoch=epoch, state={k: v.clone() for k, v in m.state_dict().items()}
                )

    epochs, key = max(settings.pretrain_checkpoints), (seed, _TAG_PRETRAIN, tag)
    objective = settings.pretrain_objective
    if objective == "weighted-targets" and not task.shared_inputs:
        objective = "source-sampling"  # sources with their own inputs cannot share a target
    train = functools.partial(fit, model, loss="bce", batch_size=settings.pretrain_batch_size)
    if objective == "weighted-targets":
        soft_targets = (np.nan_to_num(task.public_y, nan=0.0) @ w).astype(np.float32)[:, None]
        train(task.public_x, soft_targets, epochs=epochs, key=(*key, 1), callback=keep)
    else:
        rng = public_rng(*key, 2)
        n, k = task.public_x.shape[0], task.k
        rows_of = [task.source_rows(i) for i in range(k)]
        for epoch in range(1, epochs + 1):
            src = rng.choice(k, size=n, p=w / w.sum())
            rows = np.array([rows_of[i][rng.integers(len(rows_of[i]))] for i in src])
            x, target = task.public_x[rows], task.public_y[rows, src][:, None]
            train(x, target, epochs=1, key=(*key, 3, epoch))
            keep(epoch, model)
    model.load_state_dict(best["state"])
    model.eval()
    return model, {"selected_epoch": best["epoch"], "val_auc": val_aucs, "objective": objective}


def features(model, x) -> np.ndarray:
    with torch.no_grad():
        return model.features(torch.as_tensor(x, dtype=torch.float32)).double().numpy()


def head_init(model) -> np.ndarray:
    """The pretrained output layer as a (1, h+1) single-logit head (bias last)."""
    w = model.head.weight.detach().double().numpy()
    b = model.head.bias.detach().double().numpy()
    return np.concatenate([w, b[:, None]], axis=1)


def head_scores(model, head_weight: np.ndarray, x) -> np.ndarray:
    w = np.asarray(head_weight, dtype=np.float64)
    return features(model, x) @ w[:, :-1].T.ravel() + w[0, -1]


def model_scores(model, x) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(x, dtype=torch.float32)).double().numpy().ravel()


STAGES = ("mixture", "pipeline")
NAME = "dp-mixmin"  # the mechanism name (MECHANISM is the contract object, below)
FINETUNE_MECHANISM = "dp-mixmin-finetune"
#: The accountant DP-MixMin calibrates and claims under (the others are recorded beside it).
ACCOUNTANT = "rdp"


# ---- The mechanism (dpaudit.mechanisms.contract): plan, run and audit target of a release


@dataclass(eq=False)
class MixMinData:
    """What :meth:`DPMixMin.load` prepares: the private labels, the D_mix / D_ft split and ``info``, the public description the
    plan reads (identity, sources, split, target's name; its count is set by :meth:`DPMixMin.data_info`). ``probs``: the
    proxy predictions (a bring-your-own file's; for a task they are computed in :meth:`DPMixMin.run`, after the budget is
    reserved). ``sha256``: the content digest (local only; the ledger keeps a keyed fingerprint)."""

    info: MixMinInfo
    sha256: str
    labels: np.ndarray
    user_ids: np.ndarray | None
    mix_idx: np.ndarray
    ft_idx: np.ndarray | None = None
    task: MixMinTask | None = None
    probs: np.ndarray | None = None
    y_all: np.ndarray | None = None
    #: the task's source rows (dpaudit.data.rows; local only): the ledger budgets their people
    rows: tuple = ()


@dataclass(frozen=True)
class MixMinInfo(DataInfo):
    """:class:`~dpaudit.mechanisms.contract.DataInfo` plus what DP-MixMin's plan uses: the sources, the split's partitions and
    rule, the target's name, and the task (name, image or not) whose public downstream defaults apply. ``reference_size``: the
    task's declared N0 (:data:`~.tasks.REFERENCE_SIZES`; None for a proxy file); the actual counts are private."""

    source_names: tuple = ()
    partition: str = "train"
    split_partition: str | None = None
    split_rule: str = "all-records"
    target_name: str = ""
    task: str | None = None
    task_image: bool = False
    #: |D_mix| units and |D_ft| records an old release (before reference sizes) recorded and built
    #: its schedules from (:meth:`from_release`); None: from the reference size
    recorded_sizes: tuple[int, int] | None = None

    @classmethod
    def of_identity(cls, ds: dict, n_train: int = 0, **fields) -> "MixMinInfo":
        """The info of dataset identity ``ds`` (public) with DP-MixMin's ``fields``."""
        return cls(
            name=ds.get("name", ""),
            kind=ds.get("kind", ""),
            n_train=n_train,
            n_features=int(ds.get("n_features", 0) or 0),
            n_classes=2,
            split_seed=ds.get("split_seed"),
            identity=dict(ds),
            **fields,
        )

    @classmethod
    def from_release(cls, release) -> "MixMinInfo":
        """The public facts a release records (identity and config, no private data): what an audit of it plans from."""
        ds, cfg = release.dataset or {}, release.config or {}
        split = cfg.get("split") or {}
        # the partition of the keyed split the release records (None: another rule, no disjoint split)
        sp = None
        if split.get("rule") == SPLIT_RULE:
            sp = split_partition_of(float(split["rho"]), int(split["seed"]), release.privacy_unit)
        old = None
        if "reference_size" not in cfg:
            old = (int(cfg["n_mix_units"]), int(cfg.get("n_finetune_records") or 0))
        return cls.of_identity(
            ds,
            reference_size=cfg.get("reference_size"),
            source_names=tuple(cfg.get("source_names") or ()),
            partition=sp + "/mix" if sp else "train",
            split_partition=sp,
            split_rule=split.get("rule", "all-records"),
            target_name=cfg.get("target") or "",
            task=cfg.get("task"),
            task_image=cfg.get("task") in ("digits-mix", "mnist-mix"),
            recorded_sizes=old,
        )


def _proxy_data(request, ledger_path) -> MixMinData:
    """A bring-your-own proxy predictions file: every record is D_mix, named by the keyed fingerprint of its content (a renamed
    copy shares the budget and the cap); its rows (tasks.proxy_row_sets)
    make a shuffled, cut or jittered copy meet the original's cap too."""
    pp = load_proxy_predictions(request.proxy_predictions, loss=request.mixture.loss)
    with open_ledger(ledger_path) as led:
        content_fp = led.fingerprint(pp.sha256)
    # Public identity only (the count is private: q = B / N0 from --reference-size); the content digest stays local.
    dataset = {
        "name": f"proxy-predictions-{content_fp[:12]}",
        "kind": "proxy-predictions",
        "path": str(Path(pp.path).resolve()),
        "k": int(pp.probs.shape[1]),
    }
    if request.privacy_unit == "user" and pp.user_ids is None:
        raise UsageError(
            "user_ids must be in the proxy predictions file for privacy_unit user, got none."
        )
    target_name = request.target or "labels"
    return MixMinData(
        info=MixMinInfo.of_identity(dataset, source_names=pp.source_names, target_name=target_name),
        sha256=pp.sha256,
        labels=pp.labels,
        user_ids=pp.user_ids if request.privacy_unit == "user" else None,
        mix_idx=np.arange(pp.probs.shape[0]),
        probs=pp.probs,
        rows=pp.rows,
    )


def _task_data(request, division: int | None = None) -> MixMinData:
    """A built-in task: its private training labels, (synthetic) users and the D_mix / D_ft split;
    ``division``: the task division an audited release was made on (None: today's)."""
    task = load_task(request.task, seed=request.seed, data_dir=request.data_dir, division=division)
    target_name, y_all = task.target_labels(request.target)
    tr = task.train_idx
    # who the users are is part of the task (its constant key), not of the run's seed
    user_ids = None
    if request.privacy_unit == "user":
        g = resolved_mixture(request).records_per_user
        user_ids = synthetic_user_ids(len(tr), g, task.division_key)
    if request.composition == "sequential" and request.stage == "pipeline":
        mix_idx = ft_idx = np.arange(len(tr))
        split = {}  # every training record in both stages (MixMinInfo's defaults)
    else:
        rho = resolved_rho(request)
        mix_idx, ft_idx = mixture_split(task.train_record_ids, rho, request.seed, user_ids)
        part = split_partition_of(rho, request.seed, request.privacy_unit)
        split = {"partition": part + "/mix", "split_partition": part, "split_rule": SPLIT_RULE}
    info = MixMinInfo.of_identity(
        task.dataset_identity(),
        reference_size=REFERENCE_SIZES[task.name],
        source_names=tuple(task.source_names),
        target_name=target_name,
        task=task.name,
        task_image=bool(task.image),
        **split,
    )
    return MixMinData(
        info=info,
        sha256=task.data_digest(),
        labels=y_all[tr].astype(np.float64),
        user_ids=user_ids,
        mix_idx=mix_idx,
        ft_idx=ft_idx,
        task=task,
        y_all=y_all,
        rows=task.rows,
    )


def _plan_sizes(request, info: MixMinInfo, mixture: MixtureSettings) -> tuple[int, int, dict]:
    """(D_mix units, D_ft records, what the release records): from the declared reference size, never from the
    private counts."""
    # an old release: the sizes it recorded and built its schedules from
    if info.recorded_sizes is not None:
        n_mix, n_ft = info.recorded_sizes
        return n_mix, n_ft, {"n_mix_units": n_mix, "n_finetune_records": n_ft}
    n0 = planned_reference_size(
        request.reference_size, info.reference_size, unit=request.privacy_unit
    )
    given_by = "request" if request.reference_size is not None else "task definition"
    sizes = {"reference_size": n0, "reference_size_from": given_by}
    if info.task is None:
        return n0, 0, sizes
    # G records per user (1 for records: resolved_mixture sets it for users only)
    g, whole = mixture.records_per_user, info.split_rule == "all-records"
    return (*reference_units(n0, resolved_rho(request), records_per_user=g, whole=whole), sizes)


def _common_plan_fields(request, info: MixMinInfo) -> dict:
    """The ReleasePlan fields the whole plan and each of its parts share."""
    return dict(
        request=request,
        dataset=info.identity,
        adjacency=f"add-remove-{request.privacy_unit}",
        accountant=ACCOUNTANT,
        delta=float(request.delta),
        seed=int(request.seed),
        data_name=info.name,
        privacy_unit=request.privacy_unit,
        time_run=False,
        compare_accountants=tuple(a for a in ACCOUNTANTS if a != ACCOUNTANT),
    )


def _refuse_proxy_file() -> None:
    raise DataError(
        "release must record the mixmin task to be rebuilt, got none (bring-your-own proxy predictions cannot be re-run)."
    )


def _check_rebuildable(request, cfg: dict) -> None:
    """A release an audit can rebuild: it records its task, and its D_mix comes from the keyed split
    (another rule would audit other records) unless the pipeline is sequential (D_mix = all)."""
    if request.proxy_predictions is not None or not cfg.get("task"):
        _refuse_proxy_file()
    sequential = request.stage == "pipeline" and request.composition == "sequential"
    if not sequential:
        _require_split_rule((cfg.get("split") or {}).get("rule"), (SPLIT_RULE,))


def _require_split_rule(rule, allowed: tuple) -> None:
    """An audit rebuilds D_mix by the keyed split: a release split by another rule is refused."""
    if rule not in allowed:
        raise DataError(
            f"release's mixture split rule must be {SPLIT_RULE!r} to rebuild its D_mix, got {rule!r}."
        )


class DPMixMin(MechanismBase):
    """DP-MixMin on the mechanism contract (:mod:`dpaudit.mechanisms.contract`; privacy: the module docstring). A multi-release
    plan: ``stage="mixture"`` is one part (lambda on D_mix); ``"pipeline"`` two (lambda, then the head on D_ft) whose combined
    event is reserved once and settled with both releases (``release("mixmin", MixMinRequest(...))``)."""

    name = NAME
    request_type = MixMinRequest
    load_uses_ledger = True  # a proxy file is named by its keyed fingerprint (the ledger's key)

    def validate(self, request: MixMinRequest) -> MixMinRequest:
        """Checked before anything is loaded (UsageError on bad input); the request as given."""
        if not isinstance(request, MixMinRequest):
            raise UsageError(f"request must be a MixMinRequest, got {type(request).__name__}.")
        positive_finite("epsilon", request.epsilon)
        open_unit("delta", request.delta)
        open_unit("rho", resolved_rho(request))
        one_of("stage", request.stage, STAGES)
        one_of("privacy_unit", request.privacy_unit, ("record", "user"))
        one_of("composition", request.composition, COMPOSITIONS)
        if request.proxy_predictions is not None and request.stage == "pipeline":
            raise UsageError(
                "stage must be mixture with --proxy-predictions (the pipeline needs the task's public data), got 'pipeline'."
            )
        if request.privacy_unit == "user" and request.stage == "pipeline":
            raise UsageError(
                "privacy_unit must be record for stage pipeline (the DP-SGD fine-tuning engine clips per record), got 'user'."
            )
        if request.proxy_predictions is None:
            one_of("task", request.task, TASKS)
        planned_reference_size(
            request.reference_size,
            None if request.proxy_predictions else 1,
            unit=request.privacy_unit,
        )
        return request

    def load(self, request: MixMinRequest, ledger_path=None, prepared=None) -> MixMinData:
        """The labels, split and identity (no trained component touches private data here)."""
        request = self.validate(request)
        if prepared is not None:  # its data are a task or a proxy file, never a prepared dataset
            raise UsageError(
                f"prepared must be None for {NAME} (it loads its task or proxy predictions file), got {type(prepared).__name__}."
            )
        if request.proxy_predictions is None:
            return _task_data(request)
        return _proxy_data(request, ledger_path)

    def data_info(self, request: MixMinRequest, data: MixMinData) -> MixMinInfo:
        return replace(data.info, n_train=int(len(data.labels)))

    def plan(self, request: MixMinRequest, info: MixMinInfo) -> ReleasePlan:
        """Public quantities only (the request, the task's public defaults and reference size, k): both stages' calibrated noise
        and events, the combined event reserved, the partitions. Never the private counts |D_mix|, |D_ft| or the number of
        users, so the plan is the same on add/remove-neighbouring data.

        Args:
            request: the DP-MixMin request (task or proxy predictions, stage, epsilon, delta, rho, composition, unit).
            info: the data's public description (:meth:`data_info`): reference size, source names, split rule.

        Returns:
            The ReleasePlan: one part (``stage="mixture"``: lambda, a SubsampledGaussian under add/remove-record or
            add/remove-user adjacency) or two (``"pipeline"``: lambda, then the fine-tuned head), their events combined in
            parallel (the keyed split) or in sequence, each part's config (``mixmin_config``, ``dp_sgd``) the run and the
            audit use.

        Raises:
            UsageError: a setting outside its range, or a claim the schedule cannot meet.
        """
        request = self.validate(request)
        stage, composition, rho = request.stage, request.composition, resolved_rho(request)
        sequential = stage == "pipeline" and composition == "sequential"
        mixture = resolved_mixture(request)
        n_mix, n_ft, sizes = _plan_sizes(request, info, mixture)
        # What the release says about its D_mix / D_ft split (public): its rule and how the stages compose.
        split = {
            "rule": info.split_rule,
            "rho": rho,
            "seed": int(request.seed),
            "unit": request.privacy_unit,
            "composition": composition,
            "stable_under_add_remove": info.split_rule in STABLE_SPLIT_RULES,
            "parallel_composition": info.split_partition is not None,
            "key": SPLIT_KEYS[request.privacy_unit],
        }
        common = _common_plan_fields(request, info)
        shared = {
            "task": info.task,
            "target": info.target_name,
            "stage": stage,
            "rho": rho,
            "composition": composition,
            **sizes,
            "source_names": list(info.source_names),
            "split": split,
        }
        eps = request.epsilon
        eps_mix, eps_ft = (rho * eps, (1 - rho) * eps) if sequential else (eps, eps)
        parts = (_mixture_part(request, info, mixture, n_mix, eps_mix, shared, common),)
        sp = info.split_partition
        event, partition = parts[0].event, sp or info.partition
        if stage == "pipeline":
            ft_partition = "train" if sequential else sp + "/ft"
            parts += (_finetune_part(request, info, n_ft, eps_ft, shared, ft_partition, common),)
            # The budget of the whole plan (both releases), reserved once before any private computation.
            events = tuple(p.event for p in parts)
            event, partition = (Composed(events), "train") if sequential else (Parallel(events), sp)
        # Only the keyed split rule declares D_mix / D_ft as disjoint children (module docstring).
        declarations = ()
        if sp is not None:
            children, why = (sp + "/mix", sp + "/ft"), f"{NAME} (split rule {SPLIT_RULE})"
            declarations = (PartitionDeclaration(info.name, sp, children, why),)
        return ReleasePlan(
            mechanism=NAME,
            partition=partition,
            event=event,
            target_epsilon=float(request.epsilon),
            parts=parts,
            declarations=declarations,
            config={"stage": stage, "composition": composition, "rho": rho},
            **common,
        )

    def run(
        self, plan: ReleasePlan, data: MixMinData, noise: NoiseSource, *, progress=None
    ) -> RunOutput:
        """Execute ``plan``: proxies trained on public data only, Algorithm 1 / 2 on D_mix with the plan's ``mixmin_config``
        (through the one DP-SGD loop), then, for the pipeline, public pretraining and DP fine-tuning on D_ft.

        Args:
            plan: the plan from :meth:`plan` (its budget already reserved by the caller).
            data: the loaded data (:meth:`load`); only D_mix reaches the mixture, only D_ft the fine-tuning.
            noise: the private randomness (Poisson masks, within-user samples, Gaussian noise).
            progress: a stage callback (:func:`dpaudit.progress.stage`), or None.

        Returns:
            A RunOutput with one part per planned release: the weights lambda (``weights.json``; post-processing of the noisy
            sums only), and for the pipeline the fine-tuned head with its AUCs and end-to-end guarantee. Each part executes
            the plan's ``steps``.

        Raises:
            DataError: proxy predictions or user ids that do not fit the data.
        """

        say = functools.partial(stage, progress)  # stage updates (dpaudit.progress.stage)

        started, timings, probs = time.perf_counter(), {}, data.probs
        if data.task is not None:
            say("training proxies on public data")
            # public data only
            probs = train_proxies(data.task, mode=plan.request.proxy_mode).predict(
                data.task.private_x[data.task.train_idx]
            )
            timings["proxies_s"] = time.perf_counter() - started
        t = time.perf_counter()
        say("learning the mixture (Algorithm 1/2)")
        cfg = MixMinConfig(**plan.parts[0].config["mixmin_config"])
        uid = None if data.user_ids is None else data.user_ids[data.mix_idx]
        res = run_mixmin(
            probs[data.mix_idx], data.labels[data.mix_idx], cfg, noise=noise, user_ids=uid
        )
        timings["mixture_s"] = time.perf_counter() - t
        weights = {str(s): float(w) for s, w in zip(data.info.source_names, res.weights)}
        mix_out = RunOutput(
            steps_executed=res.steps_executed, metrics={"weights": weights}, timings=dict(timings)
        )
        if plan.request.stage == "pipeline":
            ft_out = _run_finetune(plan, data, noise, res.weights, mix_out, say)
            ft_out.timings["total_s"] = time.perf_counter() - started
            return RunOutput(steps_executed=ft_out.steps_executed, parts=(mix_out, ft_out))

        def save(folder) -> None:
            write_json_atomic(
                folder / "weights.json",
                {"source_names": list(data.info.source_names), "weights": res.weights.tolist()},
            )

        mix_out = replace(
            mix_out, save=save, weights_name=None, artefact_paths={"weights": "weights.json"}
        )
        return RunOutput(steps_executed=res.steps_executed, parts=(mix_out,))

    def link_releases(self, plan: ReleasePlan, releases: list) -> list:
        """The fine-tuning release names the mixture release it was pretrained from."""
        if len(releases) != 2:
            return releases
        mix, ft = releases
        metrics = {k: (mix.id if k == "mixture_release_id" else v) for k, v in ft.metrics.items()}
        return [mix, replace(ft, metrics=metrics)]

    def after_publish(self, plan: ReleasePlan, releases: list, out_dir) -> None:
        """``pipeline.json`` beside the two releases: both, and the end-to-end guarantee."""
        if len(releases) == 2:
            mix, ft = releases
            pipeline = {"mixture": mix.to_dict(), "finetune": ft.to_dict()}
            pipeline["end_to_end"] = ft.metrics["end_to_end"]
            write_json_atomic(Path(out_dir) / "pipeline.json", pipeline)

    def command_line(self, plan: ReleasePlan, out_dir) -> str:
        """The command recorded: derived from the request at the release folder (a part's parent)."""
        root = Path(out_dir)
        for _ in Path(plan.out_subdir).parts:
            root = root.parent
        return plan.request.command(out=root)

    def default_out_dir(self, plan: ReleasePlan):
        return Path("runs/mixmin")

    def notes(self, request: MixMinRequest) -> list[str]:
        """What ``dpaudit train mixmin`` says before it runs (the resolved public defaults)."""
        on = request.task
        if request.proxy_predictions:
            on = f"proxy predictions {request.proxy_predictions}"
        return [
            f"DP-MixMin {request.stage} on {on}: eps={request.epsilon:g}, delta={request.delta:g}, rho={resolved_rho(request):g}, "
            f"C={resolved_mixture(request).clipping_norm:g}"
        ]

    def summary(self, release, ledger=None) -> tuple[dict, list[str]]:
        """What ``dpaudit train mixmin`` prints: the release record (``--json``), and lines with the weights, the claim, the
        pipeline's AUCs and, for a task, the mixture's utility on the private TEST partition (console only, never in the release).
        """
        weights = release.metrics.get("weights", {})
        lines = [
            f"{release.mechanism}: lambda ({release.dataset.get('name')}, target {release.config.get('target')})"
        ]
        lines += [
            f"  {name:<16} {w:.4f}" for name, w in sorted(weights.items(), key=lambda kv: -kv[1])
        ]
        lines.append(
            f"epsilon={release.epsilon:.4f} (target {release.target_epsilon:g}) delta={release.delta:g} sigma={release.noise_multiplier:.4f} "
            f"q={release.sample_rate:.4g} steps={release.steps} C={release.clipping_norm:g} adjacency={release.adjacency} "
            f"partition={release.partition}"
        )
        if "auc" in release.metrics:
            a, e2e = release.metrics["auc"], release.metrics["end_to_end"]
            lines.append(
                f"test AUC: pretrained {a['pretrained']:.4f}, fine-tuned {a['finetuned']:.4f}; end-to-end ({e2e['composition']}) "
                f"epsilon {e2e['epsilon']['rdp']:.4f}"
            )
        request = MixMinRequest.from_dict(release.request)
        if not request.proxy_predictions and weights:
            u = utility_on_test_partition(request, release)
            b = u["best_single_source"]
            lines.append(
                f"utility on the private TEST partition ({u['n']} records; not in the release): mean {u['loss_name']} loss of lambda "
                f"{u['mixture']:.4f} (lower is better); uniform mixture {u['uniform']:.4f}; best single source {b['source']} {b['loss']:.4f}"
            )
        return release.to_dict(), lines

    def plan_of_release(self, request: MixMinRequest, release) -> ReleasePlan:
        """The plan of a mixture release from its public record (:meth:`MixMinInfo.from_release`), checked against it; a
        release that records no request plans with the resolved settings it recorded (``mixmin_config``).

        Args:
            request: the release's request (recorded, or rebuilt from the command line).
            release: the mixture release record (public: its config, dataset identity, event).

        Returns:
            The ReleasePlan that :meth:`plan` makes from the release's public record, equal to the plan it was made with.

        Raises:
            UsageError: a release whose recorded settings cannot be rebuilt, or whose rebuilt plan differs from the record.
        """
        cfg = release.config or {}
        _check_rebuildable(request, cfg)
        mc = cfg.get("mixmin_config") or {}
        if release.request is None and mc:
            request = replace(
                request,
                steps=int(mc["steps"]),
                batch_size=int(round(float(mc["expected_batch_size"]))),
                clipping_norm=float(mc["clipping_norm"]),
                step_size=float(mc["step_size"]),
                loss=mc.get("loss", request.mixture.loss),
            )
        plan = self.plan(request, MixMinInfo.from_release(release))
        check_plan_matches_release(plan.parts[0], release)
        return plan

    def audit_target(
        self, plan: ReleasePlan, canary: str, *, release=None, user_ids=None, no_noise: bool = False
    ):
        """Algorithm 1 on the task's D_mix (read by the loader of releases, :func:`_task_data`) with the plan's sigma, q, B and steps, claiming
        the plan's mixture event (a ``release``'s own epsilon and accountant; an old release without a recorded reference size:
        its recorded configuration, on its own task division). Refused for proxy predictions, user level, another split rule.

        Args:
            plan: the plan audited (:meth:`plan` or :meth:`plan_of_release`); its ``mixmin_config`` is what trials run.
            canary: the canary kind (:func:`dpaudit.audits.canaries.check_canary`), one added record or a max-clip gradient,
                i.e. an add/remove-record neighbour.
            release: the audited release record, whose own epsilon, accountant and task division are then used; or None.
            user_ids: must be None (a user-level audit of DP-MixMin is not supported).
            no_noise: the noise-free control target (no claim; it must find the leakage).

        Returns:
            A prepared audit target: trials run Algorithm 1 through the release's loop, with and without the canary.

        Raises:
            UsageError: user ids given, or a user-level plan.
            DataError: proxy predictions (cannot be re-run) or a release split by another rule.
        """
        request, mix = plan.request, plan.parts[0]
        if user_ids is not None:
            raise UsageError(
                f"user ids must only be given for a user-level release, got a {NAME} release."
            )
        if request.proxy_predictions is not None:
            _refuse_proxy_file()
        if request.privacy_unit != "record":
            raise UsageError(
                f"release privacy unit must be record for the audit runner, got {request.privacy_unit!r}."
            )
        cfg = MixMinConfig(**mix.config["mixmin_config"])
        claimed = compute_epsilon(
            mix.event, delta=plan.delta, accountant=plan.accountant, adjacency=plan.adjacency
        ).epsilon
        division, accountant = None, plan.accountant
        if release is not None:
            rc = release.config or {}
            _require_split_rule(
                rc.get("split", {}).get("rule", SPLIT_RULE), (SPLIT_RULE, "all-records")
            )
            cfg = cfg if "reference_size" in rc else MixMinConfig(**rc["mixmin_config"])
            claimed, accountant = float(release.epsilon), release.accountant
            division = (release.dataset or {}).get("split_seed")
        # D_mix as the release reads it (the release's loader, on the task division it was made
        # on); the natural and mislabeled canaries come from the private test rows (never in D_mix)
        data = _task_data(request, division)
        task, target_name = data.task, data.info.target_name
        proxies = train_proxies(task, mode=request.proxy_mode)  # public data only
        target = MixMinTarget(
            probs=proxies.predict(task.private_x[task.train_idx])[data.mix_idx],
            labels=data.labels[data.mix_idx],
            config=cfg,
            claimed_epsilon=claimed,
            delta=request.delta,
            canary=canary,
            holdout_probs=proxies.predict(task.private_x[task.test_idx]),
            holdout_labels=np.asarray(data.y_all[task.test_idx], dtype=np.float64),
            seed=request.seed,
            task=f"{request.task}/{target_name}",
            dataset=request.task,
            source_names=data.info.source_names,
            accountant=accountant,
            ledger_scope={
                "dataset": plan.dataset.get("name", request.task),
                "partition": mix.partition,
            },
            info={
                "target": target_name,
                "target_kind": task.target_kinds.get(target_name),
                # no rho for the sequential pipeline: D_mix is every training record
                "rho": None if data.info.split_partition is None else resolved_rho(request),
                "proxy_mode": request.proxy_mode,
                "target_epsilon": request.epsilon,
                "accountant": "rdp",
                "seed": request.seed,
            },
        )
        return prepared(target, no_noise)


def _calibrated(epsilon: float, delta: float, sample_rate: float, steps: int) -> tuple[float, dict]:
    """sigma for (epsilon, delta) under :data:`ACCOUNTANT`, and the calibration a plan publishes."""
    cal = calibrate_noise_multiplier(
        target_epsilon=epsilon,
        delta=delta,
        sample_rate=sample_rate,
        steps=steps,
        accountant=ACCOUNTANT,
    )
    return cal.noise_multiplier, _published_calibration(cal)


def _published_calibration(cal) -> dict:
    """The calibration a plan publishes. Whether its sigma came from the local cache is a fact of
    this machine, not of the request (a second plan would differ), so it is left out; old releases
    that recorded it still load."""
    return {k: v for k, v in cal.to_dict().items() if k != "cached"}


def _mixture_part(
    request,
    info: MixMinInfo,
    mixture: MixtureSettings,
    n_units: int,
    epsilon: float,
    shared: dict,
    common: dict,
) -> ReleasePlan:
    """Stage 1's release plan: lambda on D_mix, sigma calibrated at q = B / |D_mix| (reference)."""
    b = min(mixture.batch_size, n_units)
    sigma, calibration = _calibrated(epsilon, common["delta"], b / n_units, mixture.steps)
    cfg = mixture.config(
        k=len(info.source_names),
        n_units=n_units,
        noise_multiplier=sigma,
        privacy_unit=request.privacy_unit,
    )
    published = ("loss", "step_size", "expected_batch_size", "records_per_user", "k")
    config = {
        **shared,
        **{name: getattr(cfg, name) for name in published},
        "proxy_mode": None if info.task is None else request.proxy_mode,
        "proxies": "bring-your-own predictions file"
        if info.task is None
        else "trained on public data only",
        "mixmin_config": cfg.to_dict(),
        "calibration": calibration,
    }
    # Stage 1 noises the k mixture coordinates at every step (noise tails: dpaudit.noise).
    return ReleasePlan(
        mechanism=NAME,
        partition=info.partition,
        event=cfg.event(),
        target_epsilon=epsilon,
        config=config,
        steps=cfg.steps,
        release_fields=_release_fields(cfg, int(round(cfg.expected_batch_size))),
        noise_values=cfg.steps * cfg.k,
        noise_what=f"mixture ({cfg.steps} steps x {cfg.k} weights)",
        out_subdir="" if request.stage == "mixture" else "mixture",
        **common,
    )


def _release_fields(config, normalizer: int) -> dict:
    """The noise settings a part's release records: sigma, q, C (of a MixMinConfig or a
    DPSGDConfig), the published normaliser and the Gaussian sampler."""
    settings = {name: getattr(config, name) for name in RELEASED_SETTINGS}
    return {**settings, "normalizer": normalizer, "noise_sampler": GAUSSIAN_SAMPLER_DESCRIPTION}


def _finetune_part(
    request, info: MixMinInfo, n_ft: int, epsilon: float, shared: dict, partition: str, common: dict
) -> ReleasePlan:
    """Stage 2's release plan: DP-SGD on the head over D_ft, its schedule from |D_ft| (reference)."""
    objective = one_of("pretrain_objective", request.pretrain_objective, PRETRAIN_OBJECTIVES)
    downstream = replace(
        default_downstream_for(info.task, info.task_image), pretrain_objective=objective
    )
    sched = dp_sgd_schedule(
        n_ft, min(downstream.finetune_batch_size, n_ft), downstream.finetune_epochs
    )
    sigma, calibration = _calibrated(epsilon, common["delta"], sched.sample_rate, sched.steps)
    fcfg = DPSGDConfig(
        sample_rate=sched.sample_rate,
        steps=sched.steps,
        normalizer=sched.normalizer,
        noise_multiplier=sigma,
        clipping_norm=downstream.finetune_clipping_norm,
        lr=downstream.finetune_lr,
    )
    # Stage 2 noises the (1, hidden + 1) head at every step.
    return ReleasePlan(
        mechanism=FINETUNE_MECHANISM,
        partition=partition,
        event=SubsampledGaussian(sigma, sched.sample_rate, sched.steps),
        target_epsilon=epsilon,
        steps=fcfg.steps,
        config={
            **shared,
            "downstream": downstream.to_dict(),
            "dpsgd_config": fcfg.to_dict(),
            "calibration": calibration,
        },
        release_fields=_release_fields(fcfg, fcfg.normalizer),
        noise_values=sched.steps * (downstream.hidden + 1),
        noise_what=f"fine-tuning ({sched.steps} steps x {downstream.hidden + 1} head weights)",
        out_subdir="finetune",
        **common,
    )


def _run_finetune(
    plan: ReleasePlan, data: MixMinData, noise: NoiseSource, weights, mix_out: RunOutput, say
) -> RunOutput:
    """Stage 2 of :meth:`DPMixMin.run`: pretrain on public data with lambda, DP fine-tune the head on
    D_ft. Its part's output; the pretrained AUC is added to the mixture part's metrics."""
    request, ft_plan, task = plan.request, plan.parts[1], data.task
    timings = dict(mix_out.timings)
    d = ft_plan.config["downstream"]
    downstream = DownstreamSettings(
        **{**d, "pretrain_checkpoints": tuple(d["pretrain_checkpoints"])}
    )
    x_ft = task.private_x[task.train_idx][data.ft_idx]
    y_ft = data.labels.astype(np.int64)[data.ft_idx]
    x_val, y_val = task.private_x[task.val_idx], data.y_all[task.val_idx]
    x_te, y_te = task.private_x[task.test_idx], data.y_all[task.test_idx]
    t = time.perf_counter()
    say("pretraining on public data with the mixture")
    model, pinfo = pretrain(
        task, weights, seed=request.seed, settings=downstream, x_val=x_val, y_val=y_val
    )
    timings["pretrain_s"] = time.perf_counter() - t
    auc_pre = auc(y_te, model_scores(model, x_te))
    mix_out.metrics["auc"] = {"pretrained": auc_pre}
    t = time.perf_counter()
    say("DP fine-tuning on D_ft")
    fcfg = DPSGDConfig.from_dict(ft_plan.config["dpsgd_config"])
    z_ft, init = features(model, x_ft).astype(np.float32), head_init(model)
    head = train_heads(z_ft, y_ft, 2, fcfg, noise=noise, init=init, binary_logit=True)
    timings["finetune_s"] = time.perf_counter() - t
    auc_ft = auc(y_te, head_scores(model, head.weights[0], x_te))

    def save_ft(folder) -> None:
        np.save(folder / "head.npy", head.weights[0])
        torch.save(model.state_dict(), folder / "pretrained.pt")

    return RunOutput(
        steps_executed=head.steps_executed,
        metrics={
            "weights": mix_out.metrics["weights"],
            "auc": {"pretrained": auc_pre, "finetuned": auc_ft},
            "pretrain": pinfo,
            "mixture_release_id": None,  # the mixture release's id (link_releases)
            "end_to_end": {
                "composition": request.composition,
                "event": plan.event.to_dict(),
                "epsilon": comparison_epsilons(plan.event, plan.delta, plan.adjacency, ACCOUNTANTS),
                "delta": plan.delta,
            },
            "selection_note": "pretraining checkpoint selected on the validation split (outside the training partition), as in the paper A.3.1",
        },
        timings=timings,
        save=save_ft,
        weights_name=None,
        artefact_paths={
            "head": "head.npy",
            "pretrained": "pretrained.pt",
            "mixture_release": "../mixture/release.json",
        },
    )


MECHANISM = DPMixMin()
