"""Option factories shared by command families, so every command spells a flag the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..ledger.paths import LEDGER_ENV
from ..data.base import DATA_DIR_ENV
from ..requests import PROFILE_HELP


def eps(default: float = 2.0) -> typer.models.OptionInfo:
    return typer.Option(default, "--eps", help="Target epsilon (> 0).")


def delta(default: float = 1e-5) -> typer.models.OptionInfo:
    return typer.Option(default, "--delta", help="Target delta in (0, 1).")


def seed(default: int = 42) -> typer.models.OptionInfo:
    return typer.Option(default, "--seed", help="Public seed: data split, random features, initialisation.")


def data_dir() -> typer.models.OptionInfo:
    return typer.Option(None, "--data-dir", help=f"Directory with real data (default: ${DATA_DIR_ENV}).", show_default=False)


def out_dir(default: str = "runs") -> typer.models.OptionInfo:
    return typer.Option(Path(default), "--out", help="Output directory for release.json and artefacts.")


def ledger() -> typer.models.OptionInfo:
    return typer.Option(None, "--ledger", help=f"Ledger database (default: ${LEDGER_ENV} or ./.dpaudit/ledger.sqlite).", show_default=False)


def json_out() -> typer.models.OptionInfo:
    return typer.Option(False, "--json", help="Print one JSON object on stdout.")


def reproducible_noise() -> typer.models.OptionInfo:
    return typer.Option(False, "--reproducible-noise", help="Derive DP noise from --seed (marked in the release). Off: fresh OS entropy.")


def noise_seed_file() -> typer.models.OptionInfo:
    return typer.Option(None, "--noise-seed-file", show_default=False,
                        help="Reproducible AND private noise: derive DP noise from the secret seed in FILE (created with 256 "
                             "random bits if absent; keep it private). Never published: release.json says reproducible-secret.")


def noise_source() -> typer.models.OptionInfo:
    return typer.Option("os-entropy", "--noise-source", help="os-entropy (default), cryptographic; --reproducible-noise overrides.")


def profile() -> typer.models.OptionInfo:
    return typer.Option(None, "--profile", help=PROFILE_HELP, show_default=False)


def non_private() -> typer.models.OptionInfo:
    return typer.Option(False, "--non-private", help="Train without clipping or noise (no privacy claim).")


OptionalPath = Optional[Path]
