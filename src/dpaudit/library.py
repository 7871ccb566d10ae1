"""Library shortcuts: a release from keyword fields instead of a Request object.

Each builds the mechanism's :class:`~dpaudit.requests.Request` and calls the one release path,
:func:`dpaudit.releasing.release` (``release(name, request)`` is the general entry point); nothing
here decides anything a release records.
"""

from __future__ import annotations

import os

from .mechanisms.dp_elm import MECHANISM as ELM
from .mechanisms.dpsgd_release import DEFAULT_DATASET, DPSGDMechanism
from .mechanisms.dpsgd_release import MECHANISM as DPSGD
from .records import Release
from .releasing import release
from .requests import DPELMRequest, DPSGDRequest


def train_and_release(model: str, *, prepared=None, user_ids=None, out_dir: str | os.PathLike | None = None,
                      ledger_path: str | os.PathLike | None = None, record: bool = True, progress=True, **fields) -> Release:
    """Train ``model`` with the paper's DP-SGD protocol, check, publish: ``releasing.release`` of
    the :class:`~dpaudit.requests.DPSGDRequest` of ``fields`` (dataset, epsilon, delta, seed,
    epochs, privacy_unit, records_per_user, reference_size, ...; its defaults otherwise).

    ``prepared``: an already loaded :class:`~dpaudit.data.base.PreparedDataset` (the request then
    names it). ``user_ids``: a ``.npy`` path (recorded in the request: it is public) or ids in
    memory (an array per row before splitting, or a ``{"train", "val", "test"}`` mapping; a
    release made from them must be audited with ``--user-ids``). ``progress``: True for a rich
    bar on stderr, False/None for silence, or a callable ``(steps_done, steps_total,
    epsilon_spent)``. ``record=False`` writes release.json but skips the ledger (tests only; the
    preflight budget check still runs for private releases).
    """
    path = os.fspath(user_ids) if isinstance(user_ids, (str, os.PathLike)) else None
    fields.update({k: float(fields[k]) for k in ("epsilon", "delta") if isinstance(fields.get(k), int) and not isinstance(fields[k], bool)})
    if fields.get("data_dir") is not None:
        fields["data_dir"] = os.fspath(fields["data_dir"])
    if prepared is not None or fields.get("dataset") is None:
        fields["dataset"] = prepared.name if prepared is not None else DEFAULT_DATASET
    mech = DPSGD if path is not None or user_ids is None else DPSGDMechanism(user_ids=user_ids)
    return release(mech, DPSGDRequest(model=model, user_ids=path, **fields), out_dir=out_dir, ledger_path=ledger_path, record=record,
                   progress=progress, prepared=prepared)


def train_and_release_dp_elm(*, out_dir: str | os.PathLike | None = None, ledger_path: str | os.PathLike | None = None, record: bool = True,
                             prepared=None, **fields) -> Release:
    """Release a Laplace DP-ELM of the :class:`~dpaudit.requests.DPELMRequest` ``fields`` and publish
    it: :func:`dpaudit.releasing.release` of :data:`~dpaudit.mechanisms.dp_elm.MECHANISM` (budget checked before the private
    statistics are touched, claim recomputed from the event after the fit).

    ``prepared`` may hold an already loaded PreparedDataset (its name is the request's dataset).
    ``record=False`` skips the ledger (tests only; the preflight still runs). ``non_private=True``
    fits the closed-form ELM without noise and makes no claim (``epsilon = inf``; the ledger then
    treats the dataset's budget as spent without bound)."""
    casts = {"width": int, "epsilon": float, "seed": int, "non_private": bool, "reproducible_noise": bool, "data_dir": os.fspath}
    fields = {k: v if v is None or k not in casts else casts[k](v) for k, v in fields.items()}
    if prepared is not None:
        fields["dataset"] = prepared.name
    return release(ELM, DPELMRequest(**fields), out_dir=out_dir, ledger_path=ledger_path, record=record, prepared=prepared)
