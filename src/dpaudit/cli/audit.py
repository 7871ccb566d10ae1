"""`dpaudit audit MECHANISM --canary ...`: canary audits with Clopper–Pearson bounds. Parsing only."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

import typer

from . import options
from .common import console, emit_json, note


def _default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def register(app: typer.Typer) -> None:
    from . import generic

    # `dpaudit audit NAME` of catalogue entries without a bespoke target goes to its generic command.
    generic.register_audit(app)
    from ..catalogue import CATALOGUE, names

    # The MECHANISM names from the catalogue (auditable entries; aliases in parentheses).
    mechanisms = ", ".join(n + (f" (alias {', '.join(CATALOGUE[n].aliases)})" if CATALOGUE[n].aliases else "") for n in names(auditable=True))

    @app.command("audit")
    def audit(
        mechanism: str = typer.Argument(..., help=f"{mechanisms}."),
        canary: Optional[str] = typer.Option(None, "--canary", help="natural, max-clip, mislabeled, worst-case (default: the mechanism's strongest).",
                                             show_default=False),
        runs: int = typer.Option(1000, "--runs", help="Trials R (half with the canary, half without)."),
        epsilon: Optional[float] = typer.Option(None, "--eps", help="Claimed epsilon the noise is calibrated for (default 1 for mixmin and gaussian, 2 otherwise).",
                                                show_default=False),
        delta: float = options.delta(),
        task: Optional[str] = typer.Option(None, "--task", help="mixmin task: digits-mix (embedded, default), mnist-mix, heart-mix.", show_default=False),
        target: Optional[str] = typer.Option(None, "--target", help="mixmin target within the task (default: the task's first).", show_default=False),
        dataset: Optional[str] = typer.Option(None, "--dataset", help="Dataset for trained models (default: embedded digits).", show_default=False),
        data_dir: options.OptionalPath = options.data_dir(),
        profile: Optional[str] = options.profile(),
        no_noise: bool = typer.Option(False, "--no-noise", help="Audit the mechanism with its DP noise removed (must find large leakage)."),
        confidence: float = typer.Option(0.95, "--confidence", help="Joint confidence of the FPR and FNR bounds."),
        release: options.OptionalPath = typer.Option(None, "--release", help="Audit the configuration recorded in this release.json (or its folder).",
                                                     show_default=False),
        out: options.OptionalPath = typer.Option(None, "--out", help="Output directory for audit.json and scores.npz (default: audits/MECHANISM-CANARY).",
                                                 show_default=False),
        seed: int = typer.Option(42, "--seed", help="Public seed: model features, canary choice, worlds and SELECT/EVAL split."),
        reproducible_noise: bool = options.reproducible_noise(),
        controls: bool = typer.Option(True, "--controls/--no-controls", help="Also run the no-noise and null controls."),
        control_runs: Optional[int] = typer.Option(None, "--control-runs", help="Trials per control (default: --runs).", show_default=False),
        workers: Optional[int] = typer.Option(None, "--workers", help="Worker processes for the trials (local: default min(2, CPUs); "
                                                                     "dask without --scheduler: a LocalCluster of N workers on 127.0.0.1).",
                                              show_default=False),
        executor: str = typer.Option("local", "--executor", help="local (processes on this machine) or dask (the trial chunks go to a Dask cluster)."),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Address of a running Dask scheduler, e.g. tcp://HOST:8786 (with --executor dask).",
                                                show_default=False),
        chunk_size: Optional[int] = typer.Option(None, "--chunk-size", help="Trials per batched call (speed only).", show_default=False),
        width: int = typer.Option(10, "--width", help="dp-elm hidden width L."),
        epochs: Optional[int] = typer.Option(None, "--epochs", help="Frozen-feature models: epochs (default: the paper's protocol).", show_default=False),
        rho: Optional[float] = typer.Option(None, "--rho", help="mixmin: fraction of private training records used for mixture learning "
                                                                 "(default: the task's training default, 0.5 for digits-mix, 0.1 otherwise).",
                                            show_default=False),
        privacy_unit: str = typer.Option("record", "--privacy-unit", help="record (default) or user: audit user-level DP-SGD (head models) with one whole "
                                                                          "canary user, adjacency add-remove-user (needs --records-per-user)."),
        records_per_user: Optional[int] = typer.Option(None, "--records-per-user", help="G: records of the canary user and records per sampled user "
                                                                                        "and step (--privacy-unit user).", show_default=False),
        user_ids: options.OptionalPath = typer.Option(None, "--user-ids", help="FILE.npy: one user id per row before splitting (--privacy-unit user; "
                                                                              "default: rows grouped into users of G by the public seed).",
                                                      show_default=False),
        broken_noise_factor: float = typer.Option(1.0, "--broken-noise-factor", hidden=True,
                                                  help="gaussian only: divide the noise by this factor, claim unchanged (a broken mechanism)."),
        json_out: bool = options.json_out(),
    ):
        """Empirical privacy audit (Jagielski et al. 2020): eps_LB with Clopper–Pearson bounds, ceiling, ROC, GDP estimate, controls."""
        from ..audits.build import build_target, check_privacy_unit, check_release_unit, target_from_release
        from ..audits.build import DEFAULT_EPSILON
        from ..audits.build import family as family_of
        from ..audits.engine import CONTROLS, run_audit
        from ..sweeps.executors import check_executor_args

        check_executor_args(executor, scheduler, workers)  # before any data is loaded or a cluster is started

        release_id = release_path = None
        if release is not None:
            from ..records import read_release

            if profile is not None:  # the release records the profile its data were prepared with
                from ..errors import UsageError

                raise UsageError(f"profile must not be given with --release (the release records its own), got {profile!r}.")
            rel = read_release(release)
            check_release_unit(rel, privacy_unit, records_per_user)  # the release decides the privacy unit
            release_id, release_path = rel.id, str(Path(release).resolve())
            t = target_from_release(release, canary=canary, data_dir=data_dir, no_noise=no_noise, mechanism=mechanism,
                                    user_ids=user_ids)
        else:
            check_privacy_unit(mechanism, privacy_unit, records_per_user, user_ids)  # before any data is loaded
            t = build_target(mechanism, canary=canary, epsilon=epsilon, delta=delta, task=task, target=target, dataset=dataset,
                             data_dir=data_dir, seed=seed, no_noise=no_noise, width=width, epochs=epochs, rho=rho,
                             broken_noise_factor=broken_noise_factor, privacy_unit=privacy_unit, records_per_user=records_per_user,
                             user_ids=user_ids, profile=profile)
            if not json_out and task is None and dataset is None and mechanism != "gaussian":
                note(f"no --task/--dataset given: auditing {mechanism} on the embedded {t.describe().get('dataset')}.")
        user_level = t.adjacency == "add-remove-user"
        if out is None:
            out = Path("audits") / f"{t.mechanism}-{t.canary}{'-user' if user_level else ''}{'-no-noise' if no_noise else ''}"
        cmd = ["dpaudit", "audit", mechanism, "--canary", t.canary, "--runs", str(runs), "--confidence", repr(confidence), "--seed", str(seed)]
        if release is not None:
            cmd += ["--release", str(release)]
        else:
            eps_used = epsilon if epsilon is not None else DEFAULT_EPSILON.get(family_of(mechanism), 2.0)
            cmd += ["--eps", repr(float(eps_used)), "--delta", repr(delta)]
            for flag, value in (("--task", task), ("--target", target), ("--dataset", dataset), ("--profile", profile), ("--epochs", epochs)):
                if value is not None:
                    cmd += [flag, str(value)]
            if family_of(mechanism) == "dp-elm":
                cmd += ["--width", str(width)]
            if family_of(mechanism) == "dp-mixmin" and rho is not None:
                cmd += ["--rho", repr(rho)]
            if broken_noise_factor != 1.0:
                cmd += ["--broken-noise-factor", repr(broken_noise_factor)]
            if privacy_unit == "user":
                cmd += ["--privacy-unit", "user", "--records-per-user", str(records_per_user)]
        if user_ids is not None:
            cmd += ["--user-ids", str(user_ids)]
        if data_dir is not None:
            cmd += ["--data-dir", str(data_dir)]
        if no_noise:
            cmd.append("--no-noise")
        if not controls:
            cmd.append("--no-controls")
        elif control_runs is not None:
            cmd += ["--control-runs", str(control_runs)]
        if reproducible_noise:
            cmd.append("--reproducible-noise")
        cmd += ["--out", str(out)]
        kwargs = dict(runs=runs, confidence=confidence, seed=seed, controls=CONTROLS if controls else (),
                      control_runs=control_runs, chunk_size=chunk_size, out_dir=out,
                      reproducible_noise=reproducible_noise, progress=True, command=shlex.join(cmd),
                      release_id=release_id, release_path=release_path)
        if executor == "dask":
            # The executor changes where chunks run, never what they compute: same chunks, same noise.
            from ..sweeps.executors import make_executor

            if not json_out:
                note("executor dask: " + (f"scheduler {scheduler}" if scheduler else f"LocalCluster of {workers or _default_workers()} workers on 127.0.0.1"))
            with make_executor("dask", scheduler=scheduler, workers=None if scheduler else (workers or _default_workers())) as ex:
                result = run_audit(t, executor=ex, **kwargs)
        else:
            result = run_audit(t, workers=workers or _default_workers(), **kwargs)
        if json_out:
            d = result.to_dict()
            d["audit_dir"] = str(Path(out))
            emit_json(d)
            return
        _render(result, Path(out))


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def _render(result, out: Path) -> None:
    from rich.table import Table

    table = Table(title=f"audit: {result.mechanism}, canary {result.canary}, {result.runs} trials, {result.confidence:.0%} confidence",
                  caption="GDP est.: Gaussian-DP estimate of epsilon with its interval; an estimate, not a bound.")
    for col in ("run", "eps_LB", "claim", "ceiling", "GDP est.", "AUC", "tp/fp/tn/fn"):
        table.add_column(col, no_wrap=col != "GDP est.")
    rows = [("audit" if result.noise else "audit (no noise)", result)] + [(k, v) for k, v in result.controls.items()]
    for name, r in rows:
        g = r.gdp_estimate
        c = r.counts
        if g.get("saturated"):
            gdp = "saturated (AUC = 1)"
        else:
            lo, hi = g["epsilon_interval"]
            gdp = f"{g['epsilon']:.2f} [{lo:.2f}, {hi:.2f}]"
        table.add_row(name, _fmt(r.epsilon_lower_bound), _fmt(r.claimed_epsilon), _fmt(r.ceiling), gdp, f"{r.auc:.3f}",
                      f"{c['tp']}/{c['fp']}/{c['tn']}/{c['fn']}")
    console.print(table)
    if result.violated:
        console.print(f"[bold red]VIOLATION:[/] eps_LB {result.epsilon_lower_bound:.3f} > claimed {result.claimed_epsilon:.3f}")
    elif result.noise:
        console.print(f"no evidence of a violation: eps_LB {result.epsilon_lower_bound:.3f} <= claimed {_fmt(result.claimed_epsilon)}")
    if result.underpowered:
        console.print(f"[yellow]audit underpowered:[/] the ceiling {result.ceiling:.3f} is below the claim; use more --runs.")
    console.print(f"wrote {out / 'audit.json'} and {out / 'scores.npz'}", soft_wrap=True)
