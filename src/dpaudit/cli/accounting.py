"""`dpaudit account`, `dpaudit calibrate`, `dpaudit schedule`."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from ..accounting import accountants, calibration
from ..accounting.adjacency import Adjacency
from ..accounting.events import SubsampledGaussian
from ..accounting.schedule import dp_sgd_schedule
from ..validation import half_open_unit, open_unit, positive_finite, positive_int
from .common import choice_enum, console, emit_json, print_message, print_table


AccountantChoice = choice_enum("AccountantChoice", ("rdp", "prv", "pld", "all"))
CalibrationAccountant = choice_enum("CalibrationAccountant", ("rdp", "prv", "pld"))
AdjacencyChoice = choice_enum("AdjacencyChoice", [a.value for a in Adjacency])


def _result_cells(r: dict) -> tuple:
    """One accountant's cells after its name in the ``account`` table ("skipped": no bound)."""
    if r["epsilon"] is None:
        return ("skipped", "", "", "")
    bounds = ["" if r[k] is None else f"{r[k]:.6f}" for k in ("epsilon_lower", "epsilon_estimate")]
    order = "" if r["optimal_order"] is None else f"{r['optimal_order']:g}"
    return (f"{r['epsilon']:.6f}", *bounds, order)


def register(app: typer.Typer) -> None:
    @app.command()
    def account(
        noise_multiplier: float = typer.Option(..., help="Noise std divided by the clipping norm."),
        sample_rate: float = typer.Option(..., help="Poisson sampling rate q in (0, 1]."),
        steps: int = typer.Option(..., help="Number of DP-SGD steps T."),
        delta: float = typer.Option(1e-5, help="Target delta in (0, 1)."),
        accountant: AccountantChoice = typer.Option(
            AccountantChoice.all, help="Accountant to use."
        ),
        adjacency: AdjacencyChoice = typer.Option(
            AdjacencyChoice.add_remove_record, help="Adjacency the claim is made under."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ):
        """Epsilon of a Poisson-subsampled Gaussian run (DP-SGD) at delta."""
        positive_finite("noise_multiplier", noise_multiplier)
        half_open_unit("sample_rate", sample_rate)
        positive_int("steps", steps)
        open_unit("delta", delta)
        adj = Adjacency.parse(adjacency.value)
        names = [accountant.value]
        if accountant is AccountantChoice.all:
            names = accountants.compared_accountants(adj)
        results, skipped = accountants.compare(
            SubsampledGaussian(noise_multiplier, sample_rate, steps),
            delta=delta,
            adjacency=adj,
            names=names,
        )
        for r in results:
            r.update(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
        if json_out:
            record = dict([r for r in results if r["epsilon"] is not None][0])
            if len(results) > 1:
                record["results"] = results
            if skipped:
                record["skipped"] = skipped
            return emit_json(record)
        heads = ("accountant", "epsilon", "lower", "estimate", "order")
        t = Table(*heads, title=f"epsilon at delta={delta:g} ({adj.value})")
        for r in results:
            t.add_row(r["accountant"], *_result_cells(r))
        print_table(t)
        for name, reason in skipped.items():
            print_message(f"{name} skipped: {reason}")

    @app.command()
    def calibrate(
        eps: float = typer.Option(..., "--eps", help="Target epsilon (> 0)."),
        delta: float = typer.Option(1e-5, help="Target delta in (0, 1)."),
        sample_rate: float = typer.Option(..., help="Poisson sampling rate q in (0, 1]."),
        steps: int = typer.Option(..., help="Number of DP-SGD steps T."),
        accountant: Optional[CalibrationAccountant] = typer.Option(
            None,
            help="Accountant to calibrate with (default: rdp, or pld where rdp does not support the adjacency).",
        ),
        adjacency: AdjacencyChoice = typer.Option(
            AdjacencyChoice.add_remove_record, help="Adjacency the calibrated claim is made under."
        ),
        no_cache: bool = typer.Option(
            False, "--no-cache", help="Ignore the on-disk calibration cache."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ):
        """Smallest noise multiplier whose epsilon does not exceed the target."""
        adj = Adjacency.parse(adjacency.value)
        if accountant is not None:
            name = accountant.value
        else:  # the event checks the sample rate (one line) before rdp is asked
            rdp = accountants.supports("rdp", SubsampledGaussian(1.0, sample_rate, 1), adj)
            name = "rdp" if rdp else "pld"
        c = calibration.calibrate_noise_multiplier(
            target_epsilon=eps,
            delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=name,
            adjacency=adj,
            use_cache=not no_cache,
        )
        if json_out:
            return emit_json({**c.to_dict(), "adjacency": adj.value})
        console.print(
            f"noise_multiplier = [bold]{c.noise_multiplier:.6f}[/]  achieves epsilon = {c.epsilon:.6f} "
            f"<= target {c.target_epsilon:g} at delta = {c.delta:g} ({c.accountant}, {adj.value}, q = {c.sample_rate:g}, "
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
            return emit_json(s.to_dict())
        heads = ("batches_per_epoch", "sample_rate", "steps", "normalizer")
        t = Table(*heads, title=f"DP-SGD schedule for N0={n}, B={batch_size}, E={epochs}")
        t.add_row(str(s.batches_per_epoch), f"{s.sample_rate:.8g}", str(s.steps), str(s.normalizer))
        print_table(t)
