"""`dpaudit train MODEL`: DP-RVFL and its controls (DP-RVFL paper, sections 3-4).

One shared implementation, registered once per model name; all logic lives in
:func:`dpaudit.library.train_and_release`.
"""

from __future__ import annotations

import inspect
from typing import Optional

import typer

from ..catalogue import CATALOGUE, names
from ..lazy import lazy_module
from ..requests import DPSGDRequest
from ..validation import positive_int
from . import options
from .common import console, emit_json, note
from .generic import make_command, request_from_options, request_parameters

# torch and the release path, loaded when a command runs (registering the commands does not).
book = lazy_module("dpaudit.ledger.book")
library = lazy_module("dpaudit.library")
releasing = lazy_module("dpaudit.releasing")

_DATASET_HELP = "Dataset (mnist, cifar10, cardio, heart, digits, breast-cancer). Default: digits (embedded, no files)."


def _summary(release, ledger=None) -> dict:
    """The published fields of ``release`` (rounded timings, no hash of the data) and the keyed
    dataset fingerprint the ledger stored for it (None when the ledger has none)."""
    d = release.to_dict()
    keys = ["id", "mechanism", "adjacency", "accountant", "target_epsilon", "epsilon", "delta", "epsilons", "noise_multiplier",
            "sample_rate", "steps", "steps_executed", "clipping_norm", "normalizer", "seed", "non_private", "noise_source",
            "metrics", "timings", "artefacts", "command", "privacy_unit"]
    out = {k: d.get(k) for k in keys}
    out["dataset"] = d["dataset"].get("name") if isinstance(d.get("dataset"), dict) else d.get("dataset")
    out["dataset_fingerprint"] = _ledger_fingerprint(d.get("id"), ledger)
    return out


def _ledger_fingerprint(release_id, ledger) -> str | None:
    """The keyed ``dataset_fingerprint`` of a recorded release (HMAC under the ledger's key), read
    from its ledger entry; None when there is no entry or the ledger stores none (old ledgers)."""
    if not release_id:
        return None
    try:
        with book.open_ledger(ledger, create=False) as led:
            return led.get(str(release_id)).payload.get("dataset_fingerprint")
    except Exception:  # noqa: BLE001 -- an informative field only; the release is already published
        return None


def _make_command(model: str, description: str):
    def command(
        dataset: Optional[str] = typer.Option(None, "--dataset", help=_DATASET_HELP, show_default=False),
        out: options.OptionalPath = typer.Option(None, "--out", help="Output directory for release.json and weights (default: runs/MODEL-DATASET-seedS-epsE).", show_default=False),
        ledger: options.OptionalPath = options.ledger(),
        noise_source: str = options.noise_source(),
        noise_seed_file: options.OptionalPath = options.noise_seed_file(),
        threads: Optional[int] = typer.Option(None, "--threads", help="Torch intra-op threads (a speed setting; default: torch's choice).", show_default=False),
        privacy_unit: str = typer.Option("record", "--privacy-unit", help="record (default) or user: user-level DP-SGD, adjacency add-remove-user (needs --user-ids, --records-per-user)."),
        json_out: bool = options.json_out(),
        **fields,
    ) -> None:
        if threads is not None:
            import torch

            torch.set_num_threads(positive_int("threads", threads))

        if dataset is None:
            dataset = library.DEFAULT_DATASET
            note(f"no --dataset given: using the embedded '{dataset}' dataset.")
        # Parse into the request (recorded in release.json; the release's command is derived from it).
        # ``fields``: the request's other fields, as generated options (_with_request_options); the
        # noise source and privacy unit stay plain strings, refused by the request's own checks.
        request = request_from_options(DPSGDRequest, {"dataset": dataset, "noise_source": noise_source, "privacy_unit": privacy_unit, **fields},
                                       model=model)
        with releasing.secret_noise_seed(noise_seed_file):
            release = library.release_dpsgd(request, out_dir=out, ledger_path=ledger, progress=True)
        summary = _summary(release, ledger)
        if json_out:
            emit_json(summary)
            return
        m = release.metrics
        claim = "no privacy claim (non-private)" if release.non_private else (
            f"epsilon={release.epsilon:.4f} (target {release.target_epsilon:g}), delta={release.delta:g}, {release.accountant}, {release.adjacency}")
        console.print(f"[bold]{model}[/] on {summary['dataset']}: {claim}")
        if not release.non_private:
            console.print(f"  noise_multiplier={release.noise_multiplier:.4f} sample_rate={release.sample_rate:.6f} steps={release.steps_executed}/{release.steps} normalizer={release.normalizer}")
        if release.privacy_unit == "user":
            console.print(f"  privacy unit: user (schedule for {release.config['reference_size']} training users, records_per_user G={release.config['records_per_user']})")
        console.print("  test " + "  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()))
        console.print(f"  train {release.timings['train_seconds']:g}s, setup {release.timings['setup_seconds']:g}s (rounded as published); "
                      f"release id {release.id}")

    command.__doc__ = f"{description}. Writes release.json + weights and records the release in the ledger."
    return _with_request_options(command)


def _with_request_options(command):
    """``command`` with one generated option (:func:`~dpaudit.cli.generic.request_parameters`) for
    every DPSGDRequest field it does not declare itself, passed to it in ``**fields``."""
    own = [p for p in inspect.signature(command).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in own}
    return make_command(command, own + request_parameters(DPSGDRequest, skip=tuple(taken)), command.__name__, command.__doc__)


def register(train_app: typer.Typer) -> None:
    # Names and descriptions from the torch-free catalogue (the table rvfl.MODELS lists), so that
    # registering the commands does not import torch; the mechanism loads when a command runs.
    for name in names(family=("dp-sgd-head", "dp-sgd-module")):
        description = CATALOGUE[name].description
        train_app.command(name, help=f"{description[:1].upper()}{description[1:]} (DP-RVFL paper protocol).")(_make_command(name, description))
