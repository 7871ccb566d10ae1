"""The common tail of every training command: noise source, budget pre-check, publish.

Order matters (DESIGN.md, "check, then commit; fail closed"): :func:`preflight` refuses an
over-cap release *before* any training runs; :func:`publish` writes ``release.json`` and then
records the release in the ledger in one transaction.
"""

from __future__ import annotations

import os
from pathlib import Path

from .accounting.events import Event
from .noise import NoiseSource
from .records import Release, write_release


def make_noise_source(*, seed: int, reproducible_noise: bool = False, noise_source: str = "os-entropy") -> NoiseSource:
    """DP noise generator: secret by default; derived from ``seed`` only on explicit request."""
    if reproducible_noise:
        return NoiseSource("reproducible", seed=seed)
    return NoiseSource(noise_source)


def preflight(
    *,
    dataset: str,
    partition: str,
    event: Event,
    adjacency: str,
    ledger_path: str | os.PathLike | None = None,
) -> None:
    """Raise :class:`~dpaudit.errors.BudgetExceededError` if the planned release would exceed a cap."""
    from .accounting.ledger import open_ledger

    with open_ledger(ledger_path) as ledger:
        ledger.preflight(dataset=dataset, partition=partition, event=event, adjacency=adjacency)


def publish(release: Release, out_dir: str | os.PathLike, *, ledger_path: str | os.PathLike | None = None, record: bool = True) -> Path:
    """Write ``release.json`` under ``out_dir`` and append the release to the ledger."""
    path = write_release(release, out_dir)
    if record:
        from .accounting.ledger import open_ledger

        with open_ledger(ledger_path) as ledger:
            ledger.record(release, artefact_path=str(Path(out_dir).resolve()))
    return path
