"""`dpaudit train MODEL ...`: one sub-app; each mechanism family registers its commands, and every
catalogue entry without one gets the generic command of :mod:`dpaudit.cli.generic`."""

from __future__ import annotations

import typer

from . import generic
from .common import new_app

train_app = new_app("Train a DP model, write release.json and record the release in the ledger.")


def register(app: typer.Typer) -> None:
    # Every catalogue entry: `train NAME` built from its Request's fields (cli/generic.py).
    generic.register_train(train_app)
    app.add_typer(train_app, name="train")
