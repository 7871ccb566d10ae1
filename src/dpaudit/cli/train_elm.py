"""`dpaudit train dp-elm`: a Laplace DP-ELM release (pure epsilon-DP). Parsing only."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from ..records import RELEASE_FILE
from ..validation import positive_int
from . import options
from .common import console, emit_json, note


class SamplerChoice(str, Enum):
    discrete_laplace = "discrete-laplace"
    textbook = "textbook"


class ElmAdjacencyChoice(str, Enum):
    add_remove_record = "add-remove-record"
    replace_record = "replace-record"


class NoiseSourceChoice(str, Enum):
    os_entropy = "os-entropy"
    cryptographic = "cryptographic"


def register(train_app: typer.Typer) -> None:
    @train_app.command("dp-elm")
    def dp_elm(
        width: int = typer.Option(10, "--width", help="Hidden width L (the paper reports 1, 3, 5 and 10)."),
        epsilon: float = options.eps(2.0),
        dataset: str = typer.Option("digits", "--dataset", help="Dataset name (digits, breast-cancer, mnist, cardio, heart, ...)."),
        data_dir: options.OptionalPath = options.data_dir(),
        seed: int = options.seed(),
        split_seed: Optional[int] = typer.Option(None, "--split-seed", help="Seed of the public split (default: the dataset's).", show_default=False),
        profile: Optional[str] = options.profile(),
        sampler: SamplerChoice = typer.Option(SamplerChoice.discrete_laplace, "--sampler",
                                              help="discrete-laplace: exact, certified in finite precision (default). textbook: inverse-CDF doubles, leaky (comparison only)."),
        adjacency: ElmAdjacencyChoice = typer.Option(ElmAdjacencyChoice.add_remove_record, "--adjacency", help="Adjacency the claim is made under (the scale covers both)."),
        reproducible_noise: bool = options.reproducible_noise(),
        noise_source: NoiseSourceChoice = typer.Option(NoiseSourceChoice.os_entropy, "--noise-source",
                                                       help="os-entropy (default) or cryptographic (ChaCha20 keystream); --reproducible-noise overrides."),
        noise_seed_file: options.OptionalPath = options.noise_seed_file(),
        non_private: bool = options.non_private(),
        out: options.OptionalPath = typer.Option(None, "--out", help="Output directory (default: runs/dp-elm-DATASET-L{width}-seed{seed}-eps{eps}).", show_default=False),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Laplace DP-ELM (Ono et al.; DP-RVFL paper section 3.5): noise L(L+2)/eps on H^T H and H^T Y."""
        from ..mechanisms.dp_elm import noise_scale, train_and_release_dp_elm

        if non_private:
            positive_int("width", width)
            note("[yellow]non-private:[/] closed-form ELM without noise; the release makes no privacy claim.")
        else:
            scale = noise_scale(width, epsilon)  # validates width and epsilon before any loading
        if sampler is SamplerChoice.textbook and not non_private:
            note("[yellow]warning:[/] the textbook Laplace sampler leaks through floating-point low bits (Mironov 2012); "
                 "the release is marked certified: false.")
        if not json_out and not non_private:
            note(f"noise scale L(L+2)/eps = {scale:g} on every entry of H^T H and H^T Y (L={width}, eps={epsilon:g})")
        from ..requests import DPELMRequest

        # Parse into the request (recorded in release.json; the release's command is derived from it).
        request = DPELMRequest(dataset=dataset, data_dir=None if data_dir is None else str(data_dir), width=width, epsilon=epsilon, seed=seed,
                               sampler=sampler.value, adjacency=adjacency.value, split_seed=split_seed, profile=profile,
                               non_private=non_private, reproducible_noise=reproducible_noise, noise_source=noise_source.value)
        from ..releasing import secret_noise_seed

        with secret_noise_seed(noise_seed_file):
            release = train_and_release_dp_elm(**request.to_dict(), out_dir=out, ledger_path=ledger)
        cfg = release.config
        summary = {
            "mechanism": release.mechanism,
            "dataset": release.dataset["name"],
            "width": cfg["width"],
            "noise_scale": cfg["noise_scale"],
            "sampler": cfg["sampler"],
            "sampler_certified": None if non_private else cfg["sampler_guarantee"]["certified"],
            "adjacency": release.adjacency,
            "accountant": release.accountant,
            "target_epsilon": release.target_epsilon,
            "epsilon": release.epsilon,
            "delta": release.delta,
            "noise_source": release.noise_source,
            "seed": release.seed,
            "solver": cfg["solver"],
            "metrics": release.metrics,
            "timings": release.timings,
            "release_id": release.id,
            "release": str(Path(release.artefacts["out_dir"]) / RELEASE_FILE),
        }
        if json_out:
            emit_json(summary)
            return
        if non_private:
            console.print(f"[bold]dp-elm[/] on {summary['dataset']}: L={summary['width']}, non-private (no noise, no claim)")
        else:
            console.print(f"[bold]dp-elm[/] on {summary['dataset']}: L={summary['width']}, noise scale {summary['noise_scale']:g}, "
                          f"sampler {summary['sampler']}, epsilon {summary['epsilon']:g} (pure, delta 0, {summary['adjacency']})")
        console.print("  " + ", ".join(f"{k} {v:.4f}" for k, v in release.metrics.items() if isinstance(v, float)))
        console.print(f"  release written to {summary['release']}")

