"""`dpaudit train mixmin`: DP-MixMin mixture weights or the full Figure-1 pipeline. Parsing only."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from . import options
from .common import console, emit_json, err_console, note


class TaskChoice(str, Enum):
    digits_mix = "digits-mix"
    mnist_mix = "mnist-mix"
    heart_mix = "heart-mix"


class StageChoice(str, Enum):
    mixture = "mixture"
    pipeline = "pipeline"


class UnitChoice(str, Enum):
    record = "record"
    user = "user"


class CompositionChoice(str, Enum):
    parallel = "parallel"
    sequential = "sequential"


class LossChoice(str, Enum):
    bce = "bce"
    nll = "nll"
    mse = "mse"


class PretrainChoice(str, Enum):
    weighted_targets = "weighted-targets"
    source_sampling = "source-sampling"


class ProxyModeChoice(str, Enum):
    joint = "joint"
    per_source = "per-source"


def register(train_app: typer.Typer) -> None:
    @train_app.command("mixmin")
    def mixmin(
        task: TaskChoice = typer.Option(TaskChoice.digits_mix, "--task", help="digits-mix (embedded), mnist-mix or heart-mix (need --data-dir)."),
        target: Optional[str] = typer.Option(None, "--target", help="Private target (digit tasks: digit-3, loops-0689, small-0to4, ink-heavy; heart: cleveland).", show_default=False),
        epsilon: float = options.eps(1.0),
        delta: float = options.delta(),
        rho: Optional[float] = typer.Option(None, "--rho", help="Fraction of the private training records used to learn the mixture (default: 0.5 on the embedded digits-mix, 0.1 otherwise).", show_default=False),
        stage: StageChoice = typer.Option(StageChoice.mixture, "--stage", help="mixture: release lambda. pipeline: also pretrain and DP fine-tune."),
        privacy_unit: UnitChoice = typer.Option(UnitChoice.record, "--privacy-unit", help="record (Algorithm 1) or user (Algorithm 2)."),
        records_per_user: Optional[int] = typer.Option(None, "--records-per-user", help="G: records used per sampled user (built-in tasks group records into users of this size; default 4).", show_default=False),
        proxy_predictions: Optional[Path] = typer.Option(None, "--proxy-predictions", help="FILE.npz with probs (n, k), labels (n,), optional user_ids, source_names.", show_default=False),
        proxy_mode: ProxyModeChoice = typer.Option(ProxyModeChoice.joint, "--proxy-mode", help="joint: one multi-class proxy for all sources; per-source: one proxy each."),
        composition: CompositionChoice = typer.Option(CompositionChoice.parallel, "--composition", help="parallel: disjoint D_mix / D_ft (max). sequential: all data, eps split rho / 1 - rho."),
        pretrain_objective: PretrainChoice = typer.Option(PretrainChoice.weighted_targets, "--pretrain-objective", help="pipeline pretraining: mixture-weighted targets sum_c lambda_c y_c, or sampling sources with probability lambda."),
        loss: LossChoice = typer.Option(LossChoice.bce, "--loss", help="bce (mixture probabilities), nll (mixture densities) or mse."),
        steps: Optional[int] = typer.Option(None, "--steps", help="Mirror-descent steps n (default 200).", show_default=False),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Expected batch size B (q = B / |D_mix|, capped at 1; default 1000).", show_default=False),
        clipping_norm: Optional[float] = typer.Option(None, "--clipping-norm", help="Per-example (per-user) clipping norm C (default: 1 on the embedded digits-mix, 13 otherwise).", show_default=False),
        step_size: Optional[float] = typer.Option(None, "--step-size", help="Mirror-descent step size eta (default 0.5).", show_default=False),
        reference_size: Optional[int] = typer.Option(None, "--reference-size", help="Public size N0 both stages' schedules are built from: training records (default: the task's declared size); with --proxy-predictions (required) the file's records, or users.", show_default=False),
        seed: int = options.seed(),
        reproducible_noise: bool = options.reproducible_noise(),
        noise_source: str = options.noise_source(),
        noise_seed_file: options.OptionalPath = options.noise_seed_file(),
        data_dir: options.OptionalPath = options.data_dir(),
        out: Path = options.out_dir("runs/mixmin"),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """DP-MixMin (Algorithms 1 and 2): learn public-data mixture weights privately; optionally the full pipeline."""
        from ..mechanisms.mixmin_pipeline import MECHANISM
        from ..mechanisms.mixmin_tasks import resolved_mixture, resolved_rho
        from ..releasing import release as make_release
        from ..releasing import secret_noise_seed
        from ..requests import MixMinRequest

        # Parse into the request (recorded in both releases; their command is derived from it).
        # Unset options take the task's public defaults (mixmin_tasks.resolved_mixture).
        request = MixMinRequest(
            task=task.value, target=target, epsilon=epsilon, delta=delta, rho=rho, stage=stage.value, privacy_unit=privacy_unit.value,
            records_per_user=records_per_user, proxy_predictions=None if proxy_predictions is None else str(proxy_predictions),
            proxy_mode=proxy_mode.value, composition=composition.value, pretrain_objective=pretrain_objective.value, loss=loss.value,
            steps=steps, batch_size=batch_size, clipping_norm=clipping_norm, step_size=step_size, reference_size=reference_size, seed=seed,
            reproducible_noise=reproducible_noise, noise_source=noise_source, data_dir=None if data_dir is None else str(data_dir),
        )
        note(f"DP-MixMin {stage.value} on {'proxy predictions ' + str(proxy_predictions) if proxy_predictions else task.value}: eps={epsilon:g}, "
             f"delta={delta:g}, rho={resolved_rho(request):g}, C={resolved_mixture(request).clipping_norm:g}")
        with err_console.status("DP-MixMin: preparing") as status, secret_noise_seed(noise_seed_file):
            release = make_release(MECHANISM, request, out_dir=out, ledger_path=ledger,
                                   progress=lambda message: status.update(f"DP-MixMin: {message}"))
        if json_out:
            emit_json(release.to_dict())
            return
        weights = release.metrics.get("weights", {})
        t = Table(title=f"{release.mechanism}: lambda ({release.dataset.get('name')}, target {release.config.get('target')})")
        t.add_column("source")
        t.add_column("weight", justify="right")
        for name, w in sorted(weights.items(), key=lambda kv: -kv[1]):
            t.add_row(name, f"{w:.4f}")
        console.print(t)
        console.print(f"epsilon={release.epsilon:.4f} (target {release.target_epsilon:g}) delta={release.delta:g} "
                      f"sigma={release.noise_multiplier:.4f} q={release.sample_rate:.4g} steps={release.steps} "
                      f"C={release.clipping_norm:g} adjacency={release.adjacency} partition={release.partition}")
        if "auc" in release.metrics:
            a = release.metrics["auc"]
            console.print(f"test AUC: pretrained {a['pretrained']:.4f}, fine-tuned {a['finetuned']:.4f}; "
                          f"end-to-end ({release.metrics['end_to_end']['composition']}) epsilon "
                          f"{release.metrics['end_to_end']['epsilon']['rdp']:.4f}")
        if not proxy_predictions and weights:
            _print_test_utility(task.value, release, list(weights.values()), seed=seed, data_dir=data_dir, proxy_mode=proxy_mode.value)
        console.print(f"release written to {out}")


def _print_test_utility(task: str, release, weights, **kwargs) -> None:
    """The mixture's loss on the private TEST partition: console only, never in the release."""
    from ..mechanisms.mixmin_pipeline import utility_on_test_partition

    u = utility_on_test_partition(task, release.config.get("target"), weights, loss=release.config.get("loss", "bce"), **kwargs)
    b = u["best_single_source"]
    console.print(f"utility on the private TEST partition ({u['n']} records; not in the release): mean {u['loss_name']} loss "
                  f"of lambda {u['mixture']:.4f} (lower is better); uniform mixture {u['uniform']:.4f}; "
                  f"best single source {b['source']} {b['loss']:.4f}")
