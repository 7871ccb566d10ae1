"""`dpaudit mixmin ...`: DP-MixMin helpers (the rho planner of appendix A.2). Parsing only."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from ..mechanisms.mixmin.plan import plan_rho
from . import options
from .common import console, emit_json, print_table, new_app

mixmin_app = new_app(
    "DP-MixMin helpers: plan the mixture-learning fraction rho (paper appendix A.2)."
)


def register(app: typer.Typer) -> None:
    @mixmin_app.command("plan")
    def plan(
        n: int = options.required("--n", "N: number of private training records (or users)."),
        k: int = options.required("--k", "Number of public sources."),
        epsilon: float = options.eps(1.0),
        delta: float = options.delta(),
        alpha: float = options.required(
            "--alpha", "Target excess error alpha of the mixture objective."
        ),
        rho: Optional[float] = options.optional(
            "--rho", "Also report the alpha the guideline predicts at this rho."
        ),
        json_out: bool = options.json_out(),
    ):
        """Statistics- and privacy-limited mixing sizes and the rho needed for excess error alpha (eq. 4-7)."""
        p = plan_rho(n=n, k=k, epsilon=epsilon, delta=delta, alpha=alpha, rho=rho)
        if json_out:
            return emit_json(p.to_dict())
        t = Table(
            title=f"rho plan: N={n}, k={k}, eps={epsilon:g}, delta={delta:g}, alpha={alpha:g}"
        )
        t.add_column("quantity")
        t.add_column("value", justify="right")
        t.add_row("statistics-limited size 4/alpha^2", f"{p.statistics_limited_size:,.1f}")
        privacy_limited = "privacy-limited size 2 sqrt(k ln(1/delta))/(eps alpha)"
        t.add_row(privacy_limited, f"{p.privacy_limited_size:,.1f}")
        t.add_row("required size", f"{p.required_size:,.1f}")
        t.add_row("regime", p.regime)
        t.add_row("epsilon crossover", f"{p.epsilon_crossover:.4f}")
        t.add_row("rho needed", f"{p.rho:.4f}" + ("" if p.feasible else " (> 1: not enough data)"))
        if p.rho_given is not None:
            t.add_row(f"alpha at rho={p.rho_given:g}", f"{p.alpha_at_rho_given:.4f}")
        print_table(t)
        console.print(
            "A guideline from the DP-SCO rate with constants dropped (paper A.2), not a guarantee."
        )

    app.add_typer(mixmin_app, name="mixmin")
