"""Option factories shared by command families, so every command spells a flag the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..ledger.paths import LEDGER_ENV


def eps(default: float = 2.0) -> typer.models.OptionInfo:
    return typer.Option(default, "--eps", help="Target epsilon (> 0).")


def delta(default: float = 1e-5) -> typer.models.OptionInfo:
    return typer.Option(default, "--delta", help="Target delta in (0, 1).")


def optional(flag: str, help: str) -> typer.models.OptionInfo:
    """An option that is None unless given (its help shows no default)."""
    return typer.Option(None, flag, help=help, show_default=False)


def required(flag: str, help: str) -> typer.models.OptionInfo:
    """An option that must be given."""
    return typer.Option(..., flag, help=help)


def ledger() -> typer.models.OptionInfo:
    return optional(
        "--ledger", f"Ledger database (default: ${LEDGER_ENV} or ./.dpaudit/ledger.sqlite)."
    )


def json_out() -> typer.models.OptionInfo:
    return typer.Option(False, "--json", help="Print one JSON object on stdout.")


def noise_seed_file() -> typer.models.OptionInfo:
    return optional(
        "--noise-seed-file",
        "Reproducible AND private noise: each release draws its own use of the "
        "secret seed in FILE (created with 256 random bits if absent; keep it private; "
        "uses are recorded there, never repeated). Never published: release.json says "
        "reproducible-secret.",
    )


OptionalPath = Optional[Path]
