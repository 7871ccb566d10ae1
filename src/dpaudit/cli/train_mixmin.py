"""`dpaudit train mixmin`: DP-MixMin mixture weights or the full Figure-1 pipeline. Parsing only.

The options are generated from :class:`~dpaudit.requests.MixMinRequest` (as the generic
``train NAME`` commands, :mod:`dpaudit.cli.generic`); only the human summary is DP-MixMin's own:
the weights, the claim, the pipeline's AUCs and the mixture's utility on the private test
partition (console only, never in the release)."""

from __future__ import annotations

import typer
from rich.table import Table

from .common import console, emit_json, err_console, note
from .generic import _command, _run_parameters, request_from_options, request_parameters


def register(train_app: typer.Typer) -> None:
    from ..requests import MixMinRequest

    def mixmin(**options):
        """DP-MixMin (Algorithms 1 and 2): learn public-data mixture weights privately; optionally the full pipeline."""
        from ..mechanisms.mixmin_pipeline import MECHANISM
        from ..mechanisms.mixmin_tasks import resolved_mixture, resolved_rho
        from ..releasing import release as make_release
        from ..releasing import secret_noise_seed

        out, ledger, json_out, seed_file = (options.pop(k) for k in ("out", "ledger", "json_out", "noise_seed_file"))
        request = request_from_options(MixMinRequest, options)  # recorded in both releases; their command is derived from it
        note(f"DP-MixMin {request.stage} on {'proxy predictions ' + request.proxy_predictions if request.proxy_predictions else request.task}: "
             f"eps={request.epsilon:g}, delta={request.delta:g}, rho={resolved_rho(request):g}, C={resolved_mixture(request).clipping_norm:g}")
        with err_console.status("DP-MixMin: preparing") as status, secret_noise_seed(seed_file):
            release = make_release(MECHANISM, request, out_dir=out, ledger_path=ledger, progress=lambda message: status.update(f"DP-MixMin: {message}"))
        if json_out:
            emit_json(release.to_dict())
            return
        _print_summary(request, release)
        console.print(f"release written to {out or MECHANISM.default_out_dir(None)}")

    params = request_parameters(MixMinRequest) + _run_parameters("mixmin")
    command = _command(mixmin, params, "mixmin", mixmin.__doc__)
    train_app.command("mixmin", help=command.__doc__)(command)


def _print_summary(request, release) -> None:
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
    if not request.proxy_predictions and weights:
        _print_test_utility(request, release, list(weights.values()))


def _print_test_utility(request, release, weights) -> None:
    """The mixture's loss on the private TEST partition: console only, never in the release."""
    from ..mechanisms.mixmin_pipeline import utility_on_test_partition

    u = utility_on_test_partition(request.task, release.config.get("target"), weights, loss=release.config.get("loss", "bce"), seed=request.seed,
                                  data_dir=request.data_dir, proxy_mode=request.proxy_mode)
    b = u["best_single_source"]
    console.print(f"utility on the private TEST partition ({u['n']} records; not in the release): mean {u['loss_name']} loss "
                  f"of lambda {u['mixture']:.4f} (lower is better); uniform mixture {u['uniform']:.4f}; "
                  f"best single source {b['source']} {b['loss']:.4f}")
