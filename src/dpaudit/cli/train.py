"""`dpaudit train MODEL ...`: one sub-app; each mechanism family registers its commands."""

from __future__ import annotations

import importlib

import typer

from .common import new_app

train_app = new_app("Train a DP model, write release.json and record the release in the ledger.")

_TRAIN_MODULES = ("train_rvfl", "train_elm", "train_mixmin")


def register(app: typer.Typer) -> None:
    for name in _TRAIN_MODULES:
        try:
            mod = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:  # a mechanism family not built yet
            if e.name != f"{__package__}.{name}":
                raise
            continue
        mod.register(train_app)
    app.add_typer(train_app, name="train")
