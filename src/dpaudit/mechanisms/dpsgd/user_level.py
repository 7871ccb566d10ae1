"""User-level DP-SGD: the privacy unit is a user (all of that user's records), not a record.

Protocol (DP-MixMin paper, appendix A.9, Algorithm 2, transplanted to the DP-SGD engine of the
DP-RVFL paper, section 3.2 / Algorithm 1; McMahan et al. 2018):

1. at each of ``steps`` updates every *user* is included independently with probability
   ``sample_rate`` q (Poisson sampling of users, from the private :class:`~dpaudit.noise.NoiseSource`);
2. for each sampled user u, k_u = min(G, |D_u|) of u's records are drawn *without replacement*
   (fresh each step, private randomness; a user with |D_u| <= G contributes all records and
   consumes no randomness) and the loss gradient is averaged over them (Algorithm 2, lines 7-10):
   g_u = (1 / k_u) sum_{i in S_u} grad l_i;
3. g_u is clipped to L2 norm ``clipping_norm`` C (line 11);
4. N(0, sigma^2 C^2 I) is added to the sum of clipped per-user gradients (lines 13-14);
5. the result is divided by the fixed, public normaliser max(1, floor(q * n_users)) -- the
   expected number of sampled users, never the realised one (line 15 divides by B);
6. Adam updates the parameters, as in record-level DP-SGD.

**Privacy contract.** Under ``add-remove-user`` adjacency (neighbouring datasets differ by all
records D_u of one user) the sum of clipped per-user gradients has L2 sensitivity C whatever
|D_u| is, so ``steps`` runs are the event ``SubsampledGaussian(noise_multiplier, q, steps)`` with q
the *user* sampling rate, and the RDP accountant's (epsilon, delta) is a user-level guarantee.
The number of users n_users is treated as public (as N0 is for record-level DP-SGD, paper 001
section 3.2); frozen features, initialisation and the user split are public randomness.

Users are a units strategy of the one DP-SGD loop (:mod:`dpaudit.mechanisms.dpsgd.loop`): only the
clipped sum differs. So with one record per user (any G >= 1) a run, and with the user split of
:mod:`dpaudit.data.users` a whole release, is bit-identical to record-level DP-SGD on the same
noise stream (users numbered by first appearance, no within-user randomness drawn). Heads stay
closed form; modules use :func:`dpaudit.mechanisms.dpsgd.ghost_clip.module_clipped_sum`, whose reference
and fallback is :func:`user_module_clipped_sum`.
"""

from __future__ import annotations

from ...data.users import UserIndex, index_users
from ...errors import UsageError
from ...lazy import lazy_import
from ...noise import NoiseSource
from . import core as dpsgd_core
from .core import residuals_numpy

np = lazy_import("numpy")
torch = lazy_import("torch")


# ---------------------------------------------------------------- within-user sampling


def sample_user_records(
    users: UserIndex, sampled: np.ndarray, records_per_user: int, noise: NoiseSource
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The records each sampled user contributes this step (Algorithm 2, lines 7-8).

    ``sampled``: ascending user numbers from the Poisson sample. Returns ``(rows, seg, k)``:
    ``rows`` the record indices, grouped by sampled user (in the order of ``sampled``, records
    ascending within a user); ``seg[i]`` the position in ``sampled`` of row i's user; ``k[j] =
    min(G, |D_u|)`` for the j-th sampled user.

    Users with |D_u| > G get a uniformly random G-subset without replacement: one private
    uniform key per record of those users (drawn through ``noise.uniform``, so cryptographic
    sources stay cryptographic), the G smallest keys per user win. Ties between 53-bit keys
    (probability < n^2 2^-53) are broken by record order. Users with |D_u| <= G use all their
    records and draw nothing.
    """
    g = int(records_per_user)
    sampled = np.asarray(sampled, dtype=np.int64)
    counts = users.counts[sampled]
    k = np.minimum(counts, g)
    starts = users.offsets[sampled]
    seg = np.repeat(np.arange(sampled.size, dtype=np.int64), k)
    first = np.cumsum(k) - k
    local = np.arange(int(k.sum()), dtype=np.int64) - first[seg]  # 0..k_u-1 within each user
    big = np.flatnonzero(counts > g)
    if big.size:
        cb = counts[big]
        keys = noise.uniform(int(cb.sum()))
        bseg = np.repeat(np.arange(big.size, dtype=np.int64), cb)
        bstart = np.cumsum(cb) - cb
        # each big user's records in random order, segments in place
        perm = np.lexsort((keys, bseg))
        keep = (np.arange(perm.size) - bstart[bseg]) < g
        chosen = perm[keep] - bstart[bseg[keep]]  # local offsets of the G winners, per user
        chosen_seg = bseg[keep]
        chosen = chosen[np.lexsort((chosen, chosen_seg))]  # ascending within each user
        local[np.isin(seg, big)] = chosen
    rows = users.order[np.repeat(starts, k) + local]
    return rows, seg, k


# ---------------------------------------------------------------- linear heads


#: Largest k_u for which :func:`head_user_norms` uses Gram matrices (G^2 memory per user).
GRAM_MAX_RECORDS = 32


def head_user_norms(
    r: np.ndarray, zr: np.ndarray, zr_norm: np.ndarray, seg: np.ndarray, k: np.ndarray
) -> np.ndarray:
    """||g_u||_F of the averaged per-user head gradients g_u = (1/k_u) sum_i outer(r_i, z1_i), the
    one user-norm kernel of releases and audits (float64 inside, never per-record outer products).

    Singleton users: ||r_i|| ||z1_i|| (rank one, as record-level). Others, with k_u <= GRAM_MAX_RECORDS:
    ||g_u||^2 = (1/k_u^2) sum_{i, j in S_u} (r_i . r_j)(z1_i . z1_j), two batched (U, G, G) products on
    the rows padded per user (about 10x faster than segment sums for small users); larger users: the
    per-user sums R_u^T Z1_u by segment sums (one ``np.add.reduceat`` per logit). At least one
    user has several records: :func:`user_head_clipped_sum` sends all-singleton batches to
    :func:`~dpaudit.mechanisms.dpsgd.core.head_clipped_sum`.
    """
    first = np.cumsum(k) - k
    out = np.empty(k.size, dtype=r.dtype)
    single = k == 1
    fr = first[single]
    out[single] = np.sqrt(np.einsum("ij,ij->i", r[fr], r[fr])) * zr_norm[fr]
    multi = ~single
    mrows, km = multi[seg], k[multi]
    if km.max() <= GRAM_MAX_RECORDS:
        # position of each row's user among the multi-record users
        u = (np.cumsum(multi) - 1)[seg[mrows]]
        pos = (np.arange(r.shape[0]) - first[seg])[mrows]
        zp = np.zeros((km.size, int(km.max()), zr.shape[1]))
        rp = np.zeros((km.size, int(km.max()), r.shape[1]))
        zp[u, pos], rp[u, pos] = zr[mrows], r[mrows]
        sq = np.maximum(
            np.einsum("ugh,ugh->u", zp @ zp.transpose(0, 2, 1), rp @ rp.transpose(0, 2, 1)), 0.0
        )
    else:
        rm, zm = r[mrows].astype(np.float64), zr[mrows].astype(np.float64)
        mstart = np.cumsum(km) - km
        sq = np.zeros(km.size)
        for j in range(rm.shape[1]):  # K logits (1 or n_classes): a loop over logits, not users
            s = np.add.reduceat(rm[:, j : j + 1] * zm, mstart, axis=0)
            sq += np.einsum("md,md->m", s, s)
    out[multi] = (np.sqrt(sq) / km).astype(r.dtype)
    return out


def user_head_clipped_sum(
    w: np.ndarray,
    z1: np.ndarray,
    z1_norm: np.ndarray,
    y: np.ndarray,
    rows: np.ndarray,
    seg: np.ndarray,
    k: np.ndarray,
    clipping_norm: float,
    *,
    binary_logit: bool = False,
    clip: bool = True,
) -> np.ndarray:
    """Sum over sampled users of their clipped, averaged head gradients, in closed form.

    g_u = (1/k_u) sum_{i in S_u} outer(r_i, z1_i); the sum of clip(g_u) is ``(a * R)^T Z1`` over
    the selected rows with a_i = min(1, C / ||g_u||) / k_u for row i of user u: one matrix
    product. Returns (K, d+1). With only singleton users this *is*
    :func:`dpaudit.mechanisms.dpsgd.core.head_clipped_sum` (called directly). The norms: :func:`head_user_norms`.
    """
    if np.all(k == 1):
        return dpsgd_core.head_clipped_sum(
            w,
            z1.take(rows, axis=0),
            z1_norm[rows],
            y[rows],
            clipping_norm,
            binary_logit=binary_logit,
            clip=clip,
        )
    zr = z1.take(rows, axis=0)
    r = residuals_numpy(zr @ w.T, y[rows], binary_logit)
    kd = k.astype(r.dtype)
    if clip:
        norms = head_user_norms(r, zr, z1_norm[rows], seg, k)
        coef = dpsgd_core.clip_factors(np.array(norms), clipping_norm).astype(r.dtype, copy=False)
        weight = coef / kd
    else:
        weight = 1.0 / kd
    r *= weight[seg][:, None]
    return r.T @ zr


def _check_users(users, n: int) -> UserIndex:
    index = users if isinstance(users, UserIndex) else index_users(users)
    if index.n_records != n:
        raise UsageError(
            f"user_ids must hold one id per training record ({n}), got {index.n_records}."
        )
    return index


# ---------------------------------------------------------------- trainable modules


def user_module_clipped_sum(
    module: torch.nn.Module,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    rows: np.ndarray,
    seg: np.ndarray,
    k: np.ndarray,
    clipping_norm: float,
    *,
    loss: str = "cross_entropy",
    clip: bool = True,
    max_chunk: int = 1024,
) -> dict[str, torch.Tensor]:
    """Sum over sampled users of clip((1/k_u) sum_{i in S_u} grad l_i), joint norm over all params:
    ``vmap(grad)`` per-record gradients, summed per user; the reference of
    :func:`dpaudit.mechanisms.dpsgd.ghost_clip.module_clipped_sum` (same units and chunking; a
    bigger user in sub-chunks of ``max_chunk`` rows)."""

    def part(ua: int, ub: int, r0: int, r1: int) -> dict:
        if np.all(k[ua:ub] == 1):
            j = torch.as_tensor(rows[r0:r1])
            return dpsgd_core.per_sample_clipped_sum(
                module, params, x[j], y[j], clipping_norm, loss=loss, clip=clip
            )
        means = _user_means(
            lambda j: dpsgd_core.per_sample_grads(module, params, x[j], y[j], loss),
            rows[r0:r1],
            seg[r0:r1] - ua,
            k[ua:ub],
            max_chunk,
        )
        return dpsgd_core.clipped_sum_of(means, clipping_norm, clip)

    return summed_over_chunks(k, max_chunk, part)


def _user_means(record_grads, rows, users, k, max_chunk: int) -> dict:
    """Each user's mean gradient (U, ...): ``rows`` the records grouped by user, ``users`` their
    users (0..U-1), ``k`` records per user; ``record_grads(j)`` the per-record gradients of records
    ``j``, taken ``max_chunk`` rows at a time."""
    sums = {}
    for s0 in range(0, rows.size, max_chunk):
        grads = record_grads(torch.as_tensor(rows[s0 : s0 + max_chunk]))
        of_user = torch.as_tensor(users[s0 : s0 + max_chunk])
        for n, grad in grads.items():
            if n not in sums:
                sums[n] = torch.zeros((k.size,) + grad.shape[1:], dtype=grad.dtype)
            sums[n].index_add_(0, of_user, grad)
    return {
        n: total / torch.as_tensor(k, dtype=total.dtype).reshape((-1,) + (1,) * (total.dim() - 1))
        for n, total in sums.items()
    }


def summed_over_chunks(k: np.ndarray, max_chunk: int, part) -> dict:
    """The sum, added in order, of ``part(ua, ub, r0, r1)`` (units ua..ub-1, their rows r0..r1-1)
    over consecutive unit ranges of at most ``max_chunk`` rows each (``k[u]`` rows for unit u; a
    unit with more rows comes alone): the memory bound of the module kernels."""
    cumk = np.concatenate([[0], np.cumsum(k)])
    total, ua = None, 0
    while ua < k.size:
        ub = min(
            k.size, max(ua + 1, int(np.searchsorted(cumk, cumk[ua] + max_chunk, side="right")) - 1)
        )
        sums = part(ua, ub, int(cumk[ua]), int(cumk[ub]))
        total = sums if total is None else {n: total[n] + sums[n] for n in total}
        ua = ub
    return total
