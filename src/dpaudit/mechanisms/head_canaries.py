"""Head canary kinds of the DP-SGD head audits, record and user level: one registry, one shape.

A kind is a chooser ``(target, data, feats, users) -> HeadCanaryChoice`` registered by name in
:data:`dpaudit.catalogue.HEAD_CANARIES` ("module:function", loaded on first use); ``users`` is G for
a canary user, None for one canary record; ``target`` is prepared up to its canary (``_z``, ``_k``,
``_n_classes``, ``_config``, ``seed``, ``canary``). A kind moves one head weight by a gradient of
norm C (``coordinate``), or is input records trained on like any record (``z``, ``y``); scores:
:func:`~dpaudit.mechanisms.head_audit.canary_scores`.

**Privacy contract.** A kind's choice is public and goes in ``info`` (audit.json ``canary_info``;
:mod:`dpaudit.audit_outputs` keeps any key read from the data local); the canary goes through the
release's own loop and kernels (:func:`~dpaudit.mechanisms.engine.train_heads`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DataError
from ..lazy import lazy_import
from ..noise import public_rng
from .head_audit import canary_coordinate
np = lazy_import("numpy")

#: Public tag of the held-out canary record draw (the DP-ELM and DP-MixMin audits use it too).
TAG_CANARY = 0xCA7A


@dataclass(frozen=True, eq=False)
class HeadCanaryChoice:
    """A canary kind's choice: a gradient of norm C on W[0, ``coordinate``], or input records with
    features ``z`` (n, d) and labels ``y`` (n,); ``info``: its audit.json ``canary_info``."""

    info: dict
    coordinate: int | None = None
    z: np.ndarray | None = None
    y: np.ndarray | None = None


def _unit(users) -> dict:
    return {} if users is None else {"unit": "user", "records": users}


def max_clip(target, data, feats, users) -> HeadCanaryChoice:
    """A Dirac gradient of norm C on W[0, j], j an input feature zero in every training record
    (:func:`~dpaudit.mechanisms.head_audit.canary_coordinate`): only noise and the canary move it."""
    j, why, n_dead = canary_coordinate(target._z)
    joint = {} if users is None else {"user_contribution": "every record's gradient is C e_j; averaged and clipped jointly: exactly C e_j"}
    return HeadCanaryChoice({"kind": "max-clip", **_unit(users), "coordinate": [0, j], "why": why, "dead_features": n_dead,
                             "norm": target._config.clipping_norm, **joint}, coordinate=j)


def _test_records(target, data, feats, users, *, wrong: bool) -> HeadCanaryChoice:
    """Held-out test records (never trained on) of one class, chosen by the public seed, with their
    true label or the next one; a canary user takes G distinct ones (repeated when too few)."""
    rng = public_rng(target.seed, TAG_CANARY)
    y_test = np.asarray(data.y_test)
    if y_test.size == 0:
        raise DataError(f"dataset {data.name} has no held-out test records for a {target.canary} canary.")
    i = int(rng.integers(len(y_test)))
    y_true = int(y_test[i])
    y_c = (y_true + 1) % target._n_classes if wrong else y_true
    if users is None:
        picks, info = [i], {"kind": target.canary, "test_index": i, "true_label": y_true, "label": y_c}
    else:
        same = np.flatnonzero(y_test == y_true)
        picks = [i] + [int(v) for v in rng.permutation(same[same != i])[: users - 1]]
        copies = users - len(picks)
        picks += [picks[m % len(picks)] for m in range(copies)]
        info = {"kind": target.canary, **_unit(users), "test_indices": picks, "true_label": y_true, "label": y_c, "repeated_records": copies}
    z = feats.transform(np.asarray(data.x_test)[picks]).astype(np.float64)
    return HeadCanaryChoice(info, z=z, y=np.full(len(picks), y_c, dtype=np.int64))


def mislabeled(target, data, feats, users) -> HeadCanaryChoice:
    """Held-out test records relabelled to one wrong class (a user who mislabels, say, every 3 as a 4)."""
    return _test_records(target, data, feats, users, wrong=True)


def natural(target, data, feats, users) -> HeadCanaryChoice:
    """The same held-out records with their true labels."""
    return _test_records(target, data, feats, users, wrong=False)
