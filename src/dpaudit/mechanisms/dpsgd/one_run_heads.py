"""One-run audits of the DP-SGD heads (``dp-rvfl`` and the other frozen-feature head models;
docs/one_run.md: the method). The head is trained ONCE with the release's protocol
(:func:`dpaudit.mechanisms.dpsgd.loop.train_heads`, R = 1, the release's schedule and noise multiplier).

``gradient``: canary i is C e_(k_i, j_i) on a head weight whose data gradient is zero (j_i an input
feature zero in every training record, :func:`free_coordinates`). When m exceeds the free
coordinates, all-zero feature columns are appended for the canaries only: their weights multiply a
zero input, so the outputs on real data are unchanged (initial value 0, public). Adam is
coordinate-wise, so canary i's weight moves only with its own noise and its own sampled gradient.
Score: -(W_T - W_0)[k_i, j_i]. ``input-mislabeled``: held-out test records with a public wrong
label, one more record unit each; score: the wrong label's log-prob gain from W_0 to W_T.

**Privacy contract / soundness.** The inclusion coins and every per-step canary draw come from the
private ``noise`` source and are never published (``included`` is returned to the analysis only);
the scores are computed from the released head and the public initialisation; coordinates,
records and labels are public (``seed``). Each canary is one add/remove unit of sensitivity C of
the claimed ``SubsampledGaussian(sigma, q, T)``, so the one-run analysis bounds that claim.
"""

from __future__ import annotations

import math

from ...audits.one_run import OneRunScores
from ...audits.targets import load_target_data
from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource, public_rng
from ...validation import one_of, positive_int
from .loop import CanaryHook, UserSampling, train_heads
from .features import build_features
from .head_audit import HeadAuditTarget, class_log_probs, dead_features
from .schedule import MODELS
from .user_head_audit import UserHeadTarget

np = lazy_import("numpy")

HEAD_ONE_RUN_KINDS = ("gradient", "input-mislabeled")
_TAG_COORDS = 0x31484344  # public order of the free canary coordinates
_TAG_RECORDS = 0x31484352  # public choice of the mislabeled test records and their labels
#: The schedule and noise a one-run audit's description records.
_SCHEDULE_KEYS = ("sample_rate", "steps", "normalizer", "clipping_norm", "noise_multiplier")


def free_coordinates(z: np.ndarray, k: int) -> np.ndarray:
    """(P, 2) head coordinates (row, feature) whose data gradient is zero: every output row of
    every input feature that is zero in all training records of ``z``."""
    dead = dead_features(z)
    return np.array([(r, j) for j in dead for r in range(k)], dtype=np.int64).reshape(-1, 2)


def with_zero_features(
    z: np.ndarray, init: np.ndarray, extra: int
) -> tuple[np.ndarray, np.ndarray]:
    """``z`` (n, d) with ``extra`` all-zero feature columns appended, and the head ``init``
    (K, d+1) widened to match (zero initial weights on the new features; bias stays last). The
    new weights multiply a zero input: outputs on the real data are unchanged."""
    if extra == 0:
        return z, init
    z2 = np.concatenate([z, np.zeros((z.shape[0], extra), dtype=z.dtype)], axis=1)
    return z2, np.concatenate(
        [init[:, :-1], np.zeros((init.shape[0], extra), dtype=init.dtype), init[:, -1:]], axis=1
    )


def _log_softmax_rows(w: np.ndarray, zc: np.ndarray) -> np.ndarray:
    """Log-probabilities (m, n_classes) of records ``zc`` (m, d) under one head ``w`` (K, d+1)."""
    return class_log_probs(zc @ w[:, :-1].T + w[:, -1])


def heads_one_run(
    target: HeadAuditTarget,
    *,
    canaries: int,
    noise: NoiseSource,
    seed: int,
    kind: str = "gradient",
    noise_on: bool = True,
    coins=None,
    progress=None,
):
    """Train ``target``'s head once with ``canaries`` independent canaries; returns
    :class:`~dpaudit.audits.one_run.OneRunScores`. ``coins``: a pre-registered audit's inclusion
    coins (:func:`dpaudit.audits.one_run.plan_coins`), else drawn from ``noise``. ``noise_on=False``
    (or a no-noise target): the no-noise control. ``progress(done, total)``: training steps."""
    user_level = isinstance(target, UserHeadTarget)
    m = _checked_canaries(target, canaries, kind, user_level)
    target.prepare()
    cfg = target._config if noise_on and target.noise else target._config.without_noise()
    # The coins: each canary in w.p. 1/2, independently (private, or committed by a plan and revealed after the run).
    included = np.asarray(noise.poisson_mask(m, 0.5) if coins is None else coins, dtype=bool)
    info = {
        "model": target.model,
        "dataset": getattr(target, "_dataset_name", None),
        "n_train": int(target._z.shape[0]),
        "reference_size": (getattr(target, "_info", None) or {}).get("reference_size"),
        "canaries": m,
        "unit": "user" if user_level else "record",
        **{key: getattr(cfg, key) for key in _SCHEDULE_KEYS},
        "noise": bool(noise_on and target.noise),
        "seed": int(seed),
    }
    if kind == "gradient":
        z, init, canary, score = _gradient_canaries(target, cfg, included, seed, info)
    else:
        z, init, canary, score = _record_canaries(target, included, seed, info)
    # at user level each (gradient) canary is one more user, exactly C e_j
    users = UserSampling(target._users, target.records_per_user) if user_level else None
    res = train_heads(
        z,
        target._y,
        target._n_classes,
        cfg,
        noise=noise,
        runs=1,
        init=init,
        users=users,
        canary=canary,
        binary_logit=target._binary,
        progress=progress,
    )
    return OneRunScores(scores=score(res.weights[0]), included=included, kind=kind, info=info)


def _checked_canaries(target, canaries: int, kind: str, user_level: bool) -> int:
    """The number of canaries of a one-run audit of ``target`` (refused: not a head target, a
    kind other than gradient at user level, fewer than 2 canaries)."""
    if not isinstance(target, HeadAuditTarget):
        raise UsageError(
            f"target must be a HeadTarget or UserHeadTarget (a DP-SGD head model), got {type(target).__name__}."
        )
    m = positive_int("canaries", canaries, 2)
    one_of("kind", kind, HEAD_ONE_RUN_KINDS)
    if user_level and kind != "gradient":
        raise UsageError(
            f"one-run kind for a user-level audit must be gradient (each canary is a user whose clipped "
            f"contribution is C e_j), got {kind!r}."
        )
    return m


def _gradient_canaries(target, cfg, included: np.ndarray, seed: int, info: dict):
    """Dirac gradient canaries of norm C at head weights whose data gradient is zero: (features,
    initial head, the canaries' hook, their scores from the trained head)."""
    from scipy import sparse

    m, k, c = included.size, target._k, cfg.clipping_norm
    free = free_coordinates(target._z, k)
    extra = max(0, math.ceil((m - len(free)) / k))
    z, init = with_zero_features(target._z, target._init, extra)
    d = target._z.shape[1]
    added = np.array([(r, d + e) for e in range(extra) for r in range(k)], dtype=np.int64).reshape(
        -1, 2
    )
    pool = np.concatenate([free, added])
    # public, distinct
    coords = pool[np.sort(public_rng(seed, _TAG_COORDS).permutation(len(pool))[:m])]
    d1 = z.shape[1] + 1
    grads = sparse.csr_matrix(
        (np.full(m, c), (np.arange(m), coords[:, 0] * d1 + coords[:, 1])), shape=(m, k * d1)
    )
    start = np.asarray(init, dtype=np.float64)[coords[:, 0], coords[:, 1]]
    info.update(
        canary="dirac gradient of norm C at head weights whose data gradient is zero",
        free_coordinates=int(len(free)),
        extra_zero_features=int(extra),
        coordinates=coords.tolist(),
        score="-(W_T - W_0)[k, j]",
    )
    hook = CanaryHook(included=included[None, :], gradient=grads)
    return z, init, hook, lambda head: -(head[coords[:, 0], coords[:, 1]] - start)


def _record_canaries(target, included: np.ndarray, seed: int, info: dict):
    """Held-out test records with a wrong label, one more record unit each: (features, initial
    head, the canaries' hook, their scores from the trained head)."""
    m = included.size
    data = load_target_data(target)
    n_test = len(data.y_test)
    if m > n_test:
        raise UsageError(
            f"canaries must be at most {n_test} (held-out test records) for input-mislabeled, got {m}."
        )
    rng = public_rng(seed, _TAG_RECORDS)
    idx = np.sort(rng.choice(n_test, size=m, replace=False))
    y_true = np.asarray(data.y_test)[idx].astype(np.int64)
    n_classes = target._n_classes
    y_wrong = (y_true + 1 + rng.integers(0, n_classes - 1, size=m)) % n_classes
    # the target's public features
    feats = build_features(MODELS[target.model].features, data.n_features, target.seed)
    zc = np.asarray(feats.transform(np.asarray(data.x_test)[idx]), dtype=np.float64)
    rows = np.arange(m)
    before = _log_softmax_rows(np.asarray(target._init, dtype=np.float64), zc)[rows, y_wrong]
    info.update(
        canary="held-out test record with a wrong label, one more record unit",
        test_indices=idx.tolist(),
        true_labels=y_true.tolist(),
        labels=y_wrong.tolist(),
        score="log p(wrong label | W_T) - log p(wrong label | W_0)",
    )
    hook = CanaryHook(included=included[None, :], z=zc, y=y_wrong)
    return (
        target._z,
        target._init,
        hook,
        lambda head: _log_softmax_rows(head, zc)[rows, y_wrong] - before,
    )
