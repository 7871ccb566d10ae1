"""`dpaudit train mixmin`: DP-MixMin mixture weights or the full Figure-1 pipeline. Parsing only.

The options are generated from :class:`~dpaudit.requests.MixMinRequest` as the generic ``train
NAME`` commands' are (:mod:`dpaudit.cli.generic`); what it prints comes from the mechanism
(``DPMixMin.notes`` before the run, ``DPMixMin.summary`` after it). It stays a command of its
own only for the progress spinner and those two hooks, which the generic command reads once the
Protocol declares them (issue 24)."""

from __future__ import annotations

import typer

from .common import console, emit_json, err_console, note
from .generic import _command, _run_parameters, request_from_options, request_parameters


def register(train_app: typer.Typer) -> None:
    from ..requests import MixMinRequest

    def mixmin(**options):
        """DP-MixMin (Algorithms 1 and 2): learn public-data mixture weights privately; optionally the full pipeline."""
        from ..mechanisms.mixmin_pipeline import MECHANISM
        from ..releasing import release as make_release
        from ..releasing import secret_noise_seed

        out, ledger, json_out, seed_file = (options.pop(k) for k in ("out", "ledger", "json_out", "noise_seed_file"))
        request = request_from_options(MixMinRequest, options)  # recorded in both releases; their command is derived from it
        for line in MECHANISM.notes(request):
            note(line)
        with err_console.status("DP-MixMin: preparing") as status, secret_noise_seed(seed_file):
            release = make_release(MECHANISM, request, out_dir=out, ledger_path=ledger, progress=lambda message: status.update(f"DP-MixMin: {message}"))
        if json_out:
            emit_json(release.to_dict())
            return
        for line in MECHANISM.summary(release)[1]:
            console.print(line, soft_wrap=True, highlight=False)
        console.print(f"release written to {out or MECHANISM.default_out_dir(None)}")

    params = request_parameters(MixMinRequest) + _run_parameters("mixmin")
    command = _command(mixmin, params, "mixmin", mixmin.__doc__)
    train_app.command("mixmin", help=command.__doc__)(command)
