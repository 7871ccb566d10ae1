"""`dpaudit account`, `dpaudit calibrate`, `dpaudit schedule`."""

from __future__ import annotations

from enum import Enum

import typer
from rich.table import Table

from ..accounting import Adjacency, SubsampledGaussian, calibrate_noise_multiplier, compute_epsilon, dp_sgd_schedule
from ..validation import half_open_unit, open_unit, positive_finite, positive_int
from .common import console, emit_json


class AccountantChoice(str, Enum):
    rdp = "rdp"
    prv = "prv"
    all = "all"


class CalibrationAccountant(str, Enum):
    rdp = "rdp"
    prv = "prv"


class AdjacencyChoice(str, Enum):
    add_remove_record = "add-remove-record"
    replace_record = "replace-record"
    add_remove_user = "add-remove-user"


def register(app: typer.Typer) -> None:
    @app.command()
    def account(
        noise_multiplier: float = typer.Option(..., help="Noise std divided by the clipping norm."),
        sample_rate: float = typer.Option(..., help="Poisson sampling rate q in (0, 1]."),
        steps: int = typer.Option(..., help="Number of DP-SGD steps T."),
        delta: float = typer.Option(1e-5, help="Target delta in (0, 1)."),
        accountant: AccountantChoice = typer.Option(AccountantChoice.all, help="Accountant to use."),
        adjacency: AdjacencyChoice = typer.Option(AdjacencyChoice.add_remove_record, help="Adjacency the claim is made under."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ):
        """Epsilon of a Poisson-subsampled Gaussian run (DP-SGD) at delta."""
        positive_finite("noise_multiplier", noise_multiplier)
        half_open_unit("sample_rate", sample_rate)
        positive_int("steps", steps)
        open_unit("delta", delta)
        event = SubsampledGaussian(noise_multiplier, sample_rate, steps)
        names = ["rdp", "prv"] if accountant is AccountantChoice.all else [accountant.value]
        results = [compute_epsilon(event, delta=delta, accountant=n, adjacency=adjacency.value).to_dict() for n in names]
        for r in results:
            r.update(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
        if json_out:
            emit_json(results[0] if len(results) == 1 else {**results[0], "results": results})
            return
        t = Table(title=f"epsilon at delta={delta:g} ({adjacency.value})")
        for col in ("accountant", "epsilon", "lower", "estimate", "order"):
            t.add_column(col)
        for r in results:
            t.add_row(
                r["accountant"], f"{r['epsilon']:.6f}",
                "" if r["epsilon_lower"] is None else f"{r['epsilon_lower']:.6f}",
                "" if r["epsilon_estimate"] is None else f"{r['epsilon_estimate']:.6f}",
                "" if r["optimal_order"] is None else f"{r['optimal_order']:g}",
            )
        console.print(t)

    @app.command()
    def calibrate(
        eps: float = typer.Option(..., "--eps", help="Target epsilon (> 0)."),
        delta: float = typer.Option(1e-5, help="Target delta in (0, 1)."),
        sample_rate: float = typer.Option(..., help="Poisson sampling rate q in (0, 1]."),
        steps: int = typer.Option(..., help="Number of DP-SGD steps T."),
        accountant: CalibrationAccountant = typer.Option(CalibrationAccountant.rdp, help="Accountant to calibrate with."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Ignore the on-disk calibration cache."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ):
        """Smallest noise multiplier whose epsilon does not exceed the target."""
        c = calibrate_noise_multiplier(
            target_epsilon=eps, delta=delta, sample_rate=sample_rate, steps=steps,
            accountant=accountant.value, use_cache=not no_cache,
        )
        d = c.to_dict()
        d["adjacency"] = Adjacency.ADD_REMOVE_RECORD.value
        if json_out:
            emit_json(d)
            return
        console.print(
            f"noise_multiplier = [bold]{c.noise_multiplier:.6f}[/]  achieves epsilon = {c.epsilon:.6f} "
            f"<= target {c.target_epsilon:g} at delta = {c.delta:g} ({c.accountant}, q = {c.sample_rate:g}, "
            f"T = {c.steps}{', cached' if c.cached else ''})"
        )

    @app.command()
    def schedule(
        n: int = typer.Option(..., "--n", help="Reference training-set size N0."),
        batch_size: int = typer.Option(..., help="Requested expected batch size B."),
        epochs: int = typer.Option(..., help="Epochs E."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ):
        """DP-SGD schedule from public quantities: J = ceil(N0/B), q = 1/J, T = E*J, m0 = floor(q N0)."""
        s = dp_sgd_schedule(n, batch_size, epochs)
        if json_out:
            emit_json(s.to_dict())
            return
        t = Table(title=f"DP-SGD schedule for N0={n}, B={batch_size}, E={epochs}")
        for col in ("batches_per_epoch", "sample_rate", "steps", "normalizer"):
            t.add_column(col)
        t.add_row(str(s.batches_per_epoch), f"{s.sample_rate:.8g}", str(s.steps), str(s.normalizer))
        console.print(t)
