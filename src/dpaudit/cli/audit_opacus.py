"""`dpaudit audit opacus SCRIPT.py [OPTIONS] -- ARGS`: the one-run audit of your own Opacus training script
(:mod:`dpaudit.integrations.opacus_script`). Parsing and rendering only."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.text import Text

from ..audit_outputs import shareable_one_run
from ..integrations import opacus_script
from . import options
from .audit_render import render_one_run
from ..progress import phase
from .common import console, emit_json, new_app, new_out, note, out_or_fresh, print_message

_HELP = (
    "One-run audit of your own Opacus training script, run unchanged in this process with ARGS (after `--`): canaries and the "
    "pipeline check hook into PrivacyEngine.make_private; one_run.json (eps_LB, verdict, pipeline findings, the script "
    "accountant's epsilon) goes to --out."
)


def command(
    script: Path = typer.Argument(
        ...,
        metavar="SCRIPT.py",
        help="Your training script; it must call PrivacyEngine.make_private once.",
    ),
    args: Optional[List[str]] = typer.Argument(
        None, metavar="-- ARGS", help="The script's own arguments, after `--`."
    ),
    out: Optional[Path] = options.optional(
        "--out", "Folder of one_run.json (default: the plan's folder, else audits/opacus-SCRIPT)."
    ),
    plan: Optional[Path] = options.optional(
        "--plan", "plan.json of `dpaudit audit plan opacus ...`: its canaries, claim and delta."
    ),
    canaries: Optional[int] = options.optional(
        "--canaries", "Gradient canaries, >= 2 (default 1000; a plan fixes its own)."
    ),
    tensors: Optional[str] = options.optional(
        "--tensors",
        "Comma-separated parameter names holding the canaries (default: all "
        "trainable); pick ones the data moves little.",
    ),
    delta: Optional[float] = options.optional(
        "--delta", "delta of the claim (default 1e-5; a plan fixes its own)."
    ),
    seed: int = typer.Option(0, "--seed", help="Public seed of the canary coordinates."),
    json_out: bool = typer.Option(False, "--json", help="Print the shareable record as JSON."),
) -> None:
    out = _new_out(script, out, plan, json_out)
    phase(f"running {script} (your training script) with canaries")
    # --json: stdout holds the record alone
    with contextlib.redirect_stdout(sys.stderr) if json_out else contextlib.nullcontext():
        result, where = opacus_script.audit_script(
            script,
            args or (),
            out=out,
            plan=plan,
            canaries=canaries,
            tensors=tensors.split(",") if tensors else None,
            delta=delta,
            seed=seed,
            on_warning=lambda line: note(f"warning from {script.name}: {line}"),
        )
    if json_out:
        return emit_json({**shareable_one_run(result.to_dict()), "audit_dir": str(where)})
    render_one_run(result, where)
    b = result.bounds
    console.print(
        f"the script's accountant: eps {b.get('accountant_epsilon', float('nan')):.3f} at delta {b['delta']:g}",
        highlight=False,
    )
    for f in b["findings"]:
        finding = (f"pipeline finding {f['code']}:", "bold red")
        print_message(Text.assemble(finding, f" {f['message']} {f['consequence']}"))
    if b.get("executed"):
        ran = b["executed"]
        console.print(f"the executed steps: eps {ran['epsilon']} ({ran['label']})", highlight=False)
    plain = b.get("no_amplification")
    if plain:
        said = f"eps {plain['epsilon']:.3f} ({plain['label']})"
        console.print(f"without amplification: {said}", highlight=False)
    console.print(f"pipeline: {b.get('certified', 'no findings')}", highlight=False)


def _new_out(script: Path, out, plan, json_out: bool):
    """Before the script runs: an explicit --out holding results is refused; the default folder, when an earlier run
    holds it, becomes a fresh ``-2``, ... (one line); under a plan, its folder (a second run is refused by the plan)."""
    if out is not None:
        return new_out(out)
    if plan is not None:
        return None
    return out_or_fresh(None, Path("audits") / f"opacus-{Path(script).stem}", json_out)


def click_command():
    """The click command of ``dpaudit audit opacus`` (built on first use)."""
    sub = new_app("audit opacus")
    sub.command("opacus", help=_HELP)(command)
    return typer.main.get_command(sub)
