"""Head canary kinds of the DP-SGD head audits, record and user level: one registry, one shape.

A kind is a chooser ``(target, data, feats, users) -> HeadCanaryChoice`` in :data:`CHOOSERS`, named in
:data:`dpaudit.catalogue.HEAD_CANARIES` (tests/test_catalogue.py checks they agree); ``users`` is G for
a canary user, None for one canary record; ``target`` is prepared up to its canary (``_z``, ``_k``,
``_n_classes``, ``_config``, ``seed``, ``canary``); scores:
:func:`~dpaudit.mechanisms.dpsgd.head_audit.canary_scores`.

**Privacy contract.** A kind's choice is public and goes in ``info`` (audit.json ``canary_info``;
:mod:`dpaudit.audit_outputs` keeps any key read from the data local); the canary goes through the
release's own loop and kernels (:func:`~dpaudit.mechanisms.dpsgd.loop.train_heads`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import DataError
from ...lazy import lazy_import
from ...noise import public_rng

np = lazy_import("numpy")

#: Public tag of the held-out canary record draw (the DP-ELM and DP-MixMin audits use it too).
TAG_CANARY = 0xCA7A


def dead_features(z: np.ndarray) -> np.ndarray:
    """Indices of the input features (columns of ``z``, records in rows) that are zero in every
    training record: weights on them get no data gradient, so a gradient canary there is alone."""
    return np.flatnonzero(np.abs(z).max(axis=0) == 0)


def canary_coordinate(z: np.ndarray) -> tuple[int, str, int]:
    """(j, why, number of dead features): the head weight W[0, j] a max-clip gradient canary
    moves — an input feature that is zero in every training record, so the data never move it."""
    dead = dead_features(z)
    if dead.size:
        return (
            int(dead[0]),
            f"input feature {int(dead[0])} is zero in every training record (data gradients vanish)",
            int(dead.size),
        )
    j = int(np.argmin(np.abs(z).mean(axis=0)))
    return (
        j,
        f"no always-zero feature; fallback: feature {j} with the smallest mean |z| (data gradients do not vanish)",
        0,
    )


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


#: What a max-clip canary user adds (recorded in its ``canary_info``).
_USER_CONTRIBUTION = "every record's gradient is C e_j; averaged and clipped jointly: exactly C e_j"


def max_clip(target, data, feats, users) -> HeadCanaryChoice:
    """A Dirac gradient of norm C on W[0, j], j an input feature zero in every training record
    (:func:`canary_coordinate`): only noise and the canary move it."""
    j, why, n_dead = canary_coordinate(target._z)
    joint = {} if users is None else {"user_contribution": _USER_CONTRIBUTION}
    return HeadCanaryChoice(
        {
            "kind": "max-clip",
            **_unit(users),
            "coordinate": [0, j],
            "why": why,
            "dead_features": n_dead,
            "norm": target._config.clipping_norm,
            **joint,
        },
        coordinate=j,
    )


def _test_records(target, data, feats, users, *, wrong: bool) -> HeadCanaryChoice:
    """Held-out test records (never trained on) of one class, chosen by the public seed, with their
    true label or the next one; a canary user takes G distinct ones (repeated when too few)."""
    rng = public_rng(target.seed, TAG_CANARY)
    y_test = np.asarray(data.y_test)
    if y_test.size == 0:
        raise DataError(
            f"dataset {data.name} has no held-out test records for a {target.canary} canary."
        )
    i = int(rng.integers(len(y_test)))
    y_true = int(y_test[i])
    y_c = (y_true + 1) % target._n_classes if wrong else y_true
    picks, where, repeated = [i], {"test_index": i}, {}
    if users is not None:
        same = np.flatnonzero(y_test == y_true)
        picks += [int(v) for v in rng.permutation(same[same != i])[: users - 1]]
        copies = users - len(picks)
        picks += [picks[m % len(picks)] for m in range(copies)]
        where, repeated = {**_unit(users), "test_indices": picks}, {"repeated_records": copies}
    info = {"kind": target.canary, **where, "true_label": y_true, "label": y_c, **repeated}
    z = feats.transform(np.asarray(data.x_test)[picks]).astype(np.float64)
    return HeadCanaryChoice(info, z=z, y=np.full(len(picks), y_c, dtype=np.int64))


def mislabeled(target, data, feats, users) -> HeadCanaryChoice:
    """Held-out test records relabelled to one wrong class (a user who mislabels, say, every 3 as a 4)."""
    return _test_records(target, data, feats, users, wrong=True)


def natural(target, data, feats, users) -> HeadCanaryChoice:
    """The same held-out records with their true labels."""
    return _test_records(target, data, feats, users, wrong=False)


#: Public tag of the canary's signs and label.
TAG_OOD = 0x00DC


def ood_record(target, data, feats, users) -> HeadCanaryChoice:
    """An out-of-distribution input record chosen from public information only: random signs and a random label, public seed.

    The canary is an input record x_c with every feature +1 or -1 (random signs drawn from the public
    seed, over the dataset's public schema: ``n_features``) and a label drawn from the public seed
    among the ``n_classes`` classes. A canary user (user level) is G copies of it, so its averaged
    gradient is the record's and is clipped jointly to C.

    **Privacy contract.** Nothing of the data is read to choose it: not the training records, not the
    held-out ones (unlike ``mislabeled`` / ``natural``), not which features are zero (unlike
    ``max-clip``); its choice is public and recorded in full in audit.json (``canary_info``: kind, and
    locally the label and the rule). It is a record, not a gradient: every trial inserts it as one
    more training row (user), Poisson-sampled, its per-example gradient computed and clipped by the
    release's own kernel, so it tests the clipping and sampling of the released code, which a
    gradient canary bypasses. It is a valid audit canary because the claim bounds the influence of
    *every* possible record (add/remove adjacency), outliers included: a sound mechanism keeps eps_LB
    at or below the claim. It is a strong one because its features lie far outside the data's range
    (pixels in [0, 1], standardised tabular features): its gradient norm |p - e_y| |[z, 1]| stays
    above C through training, so each time it is sampled it adds the largest contribution clipping
    allows, partly along features the data leave silent (e.g. image borders). Score: the log-probability
    of its label under the released head.
    """
    rng = public_rng(target.seed, TAG_OOD)
    x = rng.choice(np.array([-1.0, 1.0]), size=(1, int(data.n_features)))
    label = int(rng.integers(target._n_classes))
    n = 1 if users is None else users
    z = np.repeat(feats.transform(x).astype(np.float64), n, axis=0)
    info = {
        "kind": "ood-record",
        **_unit(users),
        "label": label,
        "input": f"random signs in {{-1, +1}}^{int(data.n_features)} (public seed {target.seed})",
    }
    return HeadCanaryChoice(info, z=z, y=np.full(n, label, dtype=np.int64))


#: The head canary kinds by name, in :data:`dpaudit.catalogue.HEAD_CANARIES` order.
CHOOSERS = {
    "max-clip": max_clip,
    "mislabeled": mislabeled,
    "natural": natural,
    "ood-record": ood_record,
}


def head_canary(kind: str):
    """The chooser of head canary kind ``kind``."""
    return CHOOSERS[kind]
