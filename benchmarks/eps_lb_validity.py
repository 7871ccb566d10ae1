"""Is a published eps_LB a lower bound? False-positive rate and strength of eps_LB figures.

For mechanisms whose true epsilon at the stated delta is known exactly, each seed draws one audit's scores
(``runs`` trials, half canary-in, SELECT/EVAL split by the engine's ``plan_trials``) and computes:

  hull1   the figure of jax_privacy's ``CanaryScoreAuditor.epsilon_clopper_pearson(significance, delta,
          threshold_strategy=Bonferroni())`` (one_sided=True, its default), re-implemented here: thresholds
          are the distinct scores and +inf; only the vertices of the upper convex hull of the empirical
          (FN, TN) curve are searched, and the significance is divided by H, the NUMBER OF HULL VERTICES (a
          data-dependent count); each of FNR, FPR gets a one-sided Clopper-Pearson bound at sig / (2 H);
          eps = max over hull vertices of ln((1 - FNR_hi - delta) / FPR_hi), floored at 0.
  hull2   the same with one_sided=False (also ln((1 - FPR_hi - delta) / FNR_hi) at the same vertices).
  all1    the valid union bound behind hull1: the same formula over ALL M = distinct scores + 1 thresholds,
          each bound at sig / (2 M).
  cpb     dpaudit's ``stats.cp_bonferroni`` (all rules, both directions, per-bound sig / (2 m), m >= n + 2).
  general dpaudit's published eps_LB: ``stats.general_epsilon`` of the SELECT-chosen rule's EVAL counts and
          ``stats.band_bound`` on all trials, split by ``stats.general_split`` (as ``engine.general_bound``).
  band, box  its two halves alone (each at confidence 1 - sig/2).
  cal     (a suggestion, not in src/) the band calibrated exactly: one-sided CP bounds u_k(a*) at EVERY count k,
          with a* the level at which "some threshold's true error rate exceeds u_k(a*)" has probability
          sig_band / 4 for each of the 4 (direction, world) families, found by simulating uniform order
          statistics (distribution-free for continuous scores); calh = at sig/2 next to the box at sig/2 (a
          drop-in for ``band`` in ``general``), calf = at the full sig with no box.

A false positive is a seed whose figure exceeds the mechanism's true epsilon at delta. Every figure here
claims to hold with probability >= 1 - sig = 0.95, so a rate above 0.05 means the figure is not a bound.

    PYTHONPATH=src python benchmarks/eps_lb_validity.py [--parts main,splits,sweep,levels] [--only gauss,rr,...]
        [--seeds 1000] [--quick] [--jax PATH/auditing.py] [--json OUT]

Parts: ``main`` (the table above, CONFIGS), ``splits`` (max(box, band) for other shares of the significance,
with dpaudit's band and the calibrated one), ``sweep`` (hull figures only, configurations chosen to make the hull
division over-claim), ``levels`` (the calibrated per-count level a*). Results: benchmarks/eps_lb_validity.md.

``--jax`` loads jax_privacy's auditing.py from a file (needs dp_accounting importable) and checks hull1/hull2
against ``CanaryScoreAuditor`` on the first seeds of every configuration.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy import special

from dpaudit.audits import stats
from dpaudit.audits.engine import plan_trials

SIG = 0.05
CONF = 1.0 - SIG
HALF = 1.0 - SIG / 2.0
FIGURES = ("hull1", "hull2", "all1", "cpb", "general", "band", "box", "calh", "calf")
PAIRS = (
    ("general", "all1"),
    ("general", "cpb"),
    ("general", "hull1"),
    ("calh", "general"),
    ("calf", "hull1"),
    ("calh", "hull1"),
)


# ------------------------------------------------------------------ mechanisms with an exact (eps, delta)


def rr_p(eps: float) -> float:
    return math.exp(eps) / (1.0 + math.exp(eps))


def sample(kind: str, param: float, w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = w.size
    if kind == "gauss":  # in ~ N(mu, 1), out ~ N(0, 1): mu-GDP
        return rng.normal(size=n) + param * w
    if kind == "null":  # the same law in both worlds: eps = 0
        return rng.normal(size=n)
    if kind in (
        "rr",
        "rrlump",
    ):  # randomized response bit, then a tie-break in [0, 1) independent of the world
        p = rr_p(param)
        bit = rng.random(n) < np.where(w, p, 1.0 - p)
        u = rng.random(n)
        return bit + (
            u if kind == "rr" else np.where(bit, u, 0.0)
        )  # rrlump: all 0-bits tie (a smaller hull)
    if kind == "laplace":  # Laplace(mu, 1) vs Laplace(0, 1): pure mu-DP
        return rng.laplace(size=n) + param * w
    raise ValueError(kind)


def true_epsilon(kind: str, param: float, delta: float) -> float:
    if kind == "gauss":
        return stats.gdp_epsilon(param, delta)
    if kind == "null":
        return 0.0
    if kind in (
        "rr",
        "rrlump",
    ):  # hockey-stick: delta(eps) = p - e^eps (1 - p) for eps below the RR epsilon
        p = rr_p(param)
        return max(0.0, math.log((p - delta) / (1.0 - p)))
    if (
        kind == "laplace"
    ):  # privacy profile of the Laplace mechanism: delta(eps) = 1 - exp((eps - mu) / 2)
        return max(0.0, param + 2.0 * math.log1p(-delta))
    raise ValueError(kind)


# ------------------------------------------------------------------ the jax_privacy-style figures


def cp_hi(k, n: int, a) -> np.ndarray:
    """One-sided Clopper-Pearson upper bound(s) at significance a (1 when k = n)."""
    k = np.asarray(k, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        u = special.betainccinv(k + 1.0, np.maximum(n - k, 1.0), a)
    return np.where(k >= n, 1.0, u)


def fn_tn_curve(s_in: np.ndarray, s_out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(#in below t, #out below t) for t = each distinct score, then +inf (rule: in iff score >= t)."""
    t = np.r_[np.unique(np.r_[s_in, s_out]), np.inf]
    return np.searchsorted(np.sort(s_in), t, side="left"), np.searchsorted(
        np.sort(s_out), t, side="left"
    )


def upper_hull(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the strict upper convex hull of points given in (x, y) order (Andrew's monotone chain;
    collinear and lower points dropped, both ends kept)."""
    xs, ys = x.tolist(), y.tolist()
    h: list[int] = []
    for i in range(len(xs)):
        while len(h) >= 2:
            j, k = h[-2], h[-1]
            if (ys[k] - ys[j]) * (xs[i] - xs[k]) - (ys[i] - ys[k]) * (xs[k] - xs[j]) > 0:
                break
            h.pop()
        h.append(i)
    return np.asarray(h)


def cp_figure(fn, tn, n_pos: int, n_neg: int, a: float, delta: float, two_sided: bool) -> float:
    """max over the given rules of ln((1 - FNR_hi - delta) / FPR_hi) (and the reverse ratio), each bound at a."""
    fnr, fpr = cp_hi(fn, n_pos, a), cp_hi(n_neg - np.asarray(tn), n_neg, a)
    best = 0.0
    for hi_num, hi_den in ((fnr, fpr), (fpr, fnr)) if two_sided else ((fnr, fpr),):
        ok = 1.0 - hi_num > delta
        if ok.any():
            best = max(best, float(np.max(np.log(1.0 - hi_num[ok] - delta) - np.log(hi_den[ok]))))
    return best


def jax_style(s_in, s_out, delta: float) -> dict:
    fn, tn = fn_tn_curve(s_in, s_out)
    hull = upper_hull(fn, tn)
    n_pos, n_neg = s_in.size, s_out.size
    a_hull, a_all = SIG / hull.size / 2.0, SIG / fn.size / 2.0
    return {
        "hull1": cp_figure(fn[hull], tn[hull], n_pos, n_neg, a_hull, delta, False),
        "hull2": cp_figure(fn[hull], tn[hull], n_pos, n_neg, a_hull, delta, True),
        "all1": cp_figure(fn, tn, n_pos, n_neg, a_all, delta, False),
        "H": int(hull.size),
    }


# ------------------------------------------------------------------ the calibrated band (suggestion)

_CAL: dict = {}


def calibrated_level(n: int, alpha_event: float, sims: int, seed: int = 12345) -> float:
    """a* with P(exists k < n: U_(k+1) > u_k(a*)) = alpha_event for n uniform draws (U_(j): j-th smallest),
    i.e. the alpha_event quantile of min_k P(Beta(k+1, n-k) > U_(k+1)) (Monte Carlo, ``sims`` draws)."""
    if (n, sims) not in _CAL:
        rng = np.random.default_rng([seed, n])
        k = np.arange(n, dtype=float)
        chunk = max(1, 2_000_000 // n)
        mins = [
            special.betaincc(
                k + 1.0, n - k, np.sort(rng.random((min(chunk, sims - i), n)), axis=1)
            ).min(axis=1)
            for i in range(0, sims, chunk)
        ]
        _CAL[(n, sims)] = np.concatenate(mins)
    return float(np.quantile(_CAL[(n, sims)], alpha_event))


def calibrated_band(
    s: np.ndarray, w: np.ndarray, delta: float, sig_band: float, sims: int
) -> float:
    n_pos, n_neg = int(w.sum()), int((~w).sum())
    u_pos = cp_hi(np.arange(n_pos + 1), n_pos, calibrated_level(n_pos, sig_band / 4.0, sims))
    u_neg = cp_hi(np.arange(n_neg + 1), n_neg, calibrated_level(n_neg, sig_band / 4.0, sims))
    _, tp_ge, fp_ge, _ = stats.rule_counts(s, w)
    best = 0.0
    for tp, fp in ((tp_ge, fp_ge), (n_pos - tp_ge, n_neg - fp_ge)):
        best = max(
            best, float(np.max(stats.epsilon_from_rates(u_neg[fp], u_pos[n_pos - tp], delta)))
        )
    return best


# ------------------------------------------------------------------ one audit


def dpaudit_figures(s, w, sel, delta: float) -> dict:
    thr = stats.select_threshold(s[sel], w[sel], delta=delta, confidence=CONF)
    tp, fp, tn, fn = stats.confusion(s[~sel], w[~sel], thr.threshold, thr.direction)
    counts = {"tp": tp, "fp": fp, "tn": tn, "fn": fn}
    box_conf, band_conf = stats.general_split(
        int(w.sum()), int((~w).sum()), CONF
    )  # as engine.general_bound
    band = stats.band_bound(s, w, delta=delta, confidence=band_conf)
    return {
        "general": stats.general_epsilon(counts, band, delta=delta, confidence=CONF),
        "band": band["epsilon_lower_bound"],
        "box": stats.epsilon_lower_bound(**counts, delta=delta, confidence=box_conf).epsilon,
        "cpb": stats.cp_bonferroni(s, w, delta=delta, confidence=CONF)["epsilon_lower_bound"],
        "events": band["events"],
    }


def run_config(
    idx: int, kind: str, param: float, runs: int, delta: float, seeds: int, sims: int, jax=None
) -> dict:
    truth = true_epsilon(kind, param, delta)
    vals = {f: np.empty(seeds) for f in FIGURES}
    hulls, checked, events = np.empty(seeds), 0, 0
    t0 = time.process_time()
    for seed in range(seeds):
        plan = plan_trials(runs, seed=seed)
        w, sel = plan.world, plan.select
        s = sample(kind, param, w, np.random.default_rng([idx, seed]))
        r = jax_style(s[w], s[~w], delta)
        r.update(dpaudit_figures(s, w, sel, delta))
        r["calh"] = max(r["box"], calibrated_band(s, w, delta, SIG / 2.0, sims))
        r["calf"] = calibrated_band(s, w, delta, SIG, sims)
        for f in FIGURES:
            vals[f][seed] = r[f]
        hulls[seed], events = r["H"], r["events"]
        if jax is not None and seed < 5:
            aud = jax.CanaryScoreAuditor(s[w], s[~w])
            for f, one in (("hull1", True), ("hull2", False)):
                ref = aud.epsilon_clopper_pearson(
                    SIG, delta, one, threshold_strategy=jax.Bonferroni()
                )
                assert abs(ref - r[f]) < 1e-9, (kind, param, runs, seed, f, ref, r[f])
            assert len(aud._fn_counts) == r["H"]
            checked += 1
    out = {
        "mechanism": kind,
        "param": param,
        "runs": runs,
        "delta": delta,
        "true_epsilon": truth,
        "seeds": seeds,
        "mean_hull_vertices": float(hulls.mean()),
        "band_events": int(events),
        "jax_checked_seeds": checked,
        "cpu_s": round(time.process_time() - t0, 1),
    }
    out["share_of_seeds"] = {
        f"{x}>={y}": float(np.mean(vals[x] >= vals[y] - 1e-12)) for x, y in PAIRS
    }
    for f in FIGURES:
        k = int(np.sum(vals[f] > truth + 1e-9))
        out[f] = {
            "mean": float(vals[f].mean()),
            "false_positives": k,
            "rate": k / seeds,
            "rate_lower95": 0.0 if k == 0 else float(special.betaincinv(k, seeds - k + 1.0, SIG)),
        }
    return out


CONFIGS = (
    [("gauss", mu, runs, 1e-5) for mu in (0.5, 1.0, 2.0, 3.0) for runs in (200, 1000, 2000)]
    + [("rr", 1.0, runs, 0.0) for runs in (200, 1000, 2000)]
    + [
        ("rr", 1.0, 2000, 1e-5),
        ("rr", 0.5, 2000, 0.0),
        ("rr", 2.0, 2000, 0.0),
        ("rr", 3.0, 2000, 0.0),
        ("rr", 5.0, 2000, 0.0),
        ("rrlump", 4.0, 2000, 0.0),
    ]
    + [("laplace", 1.0, runs, 0.0) for runs in (200, 2000)]
    + [("null", 0.0, runs, 1e-5) for runs in (200, 1000, 2000)]
)


SPLIT_CONFIGS = [
    ("gauss", 1.0, 1000, 1e-5),
    ("gauss", 1.0, 2000, 1e-5),
    ("gauss", 2.0, 2000, 1e-5),
    ("rr", 1.0, 2000, 0.0),
]
BAND_SHARES = (
    0.0,
    0.25,
    0.5,
    0.75,
    0.9,
    1.0,
)  # share of the significance given to the band (0: box only, 1: band only)


def split_row(
    idx: int, kind: str, param: float, runs: int, delta: float, seeds: int, sims: int
) -> dict:
    """Mean and false positives of max(box at 1 - (1 - f) sig, band at 1 - f sig) for each band share f, with
    dpaudit's band (``band``) and with the calibrated band (``cal``)."""
    truth = true_epsilon(kind, param, delta)
    vals = np.zeros((2, len(BAND_SHARES), seeds))
    for seed in range(seeds):
        plan = plan_trials(runs, seed=seed)
        w, sel = plan.world, plan.select
        s = sample(kind, param, w, np.random.default_rng([idx, seed]))
        thr = stats.select_threshold(s[sel], w[sel], delta=delta, confidence=CONF)
        tp, fp, tn, fn = stats.confusion(s[~sel], w[~sel], thr.threshold, thr.direction)
        for j, f in enumerate(BAND_SHARES):
            box = (
                0.0
                if f == 1.0
                else stats.epsilon_lower_bound(
                    tp=tp, fp=fp, tn=tn, fn=fn, delta=delta, confidence=1.0 - (1.0 - f) * SIG
                ).epsilon
            )
            band = (
                0.0
                if f == 0.0
                else stats.band_bound(s, w, delta=delta, confidence=1.0 - f * SIG)[
                    "epsilon_lower_bound"
                ]
            )
            cal = 0.0 if f == 0.0 else calibrated_band(s, w, delta, f * SIG, sims)
            vals[0, j, seed], vals[1, j, seed] = max(box, band), max(box, cal)
    return {
        "mechanism": kind,
        "param": param,
        "runs": runs,
        "delta": delta,
        "seeds": seeds,
        **{
            name: {
                str(f): {
                    "mean": float(vals[i, j].mean()),
                    "false_positives": int(np.sum(vals[i, j] > truth + 1e-9)),
                }
                for j, f in enumerate(BAND_SHARES)
            }
            for i, name in enumerate(("band", "cal"))
        },
    }


HULL_SWEEP = (
    [("rrlump", e, n) for e in (3.0, 4.0, 5.0, 6.0) for n in (300, 1000, 3000)]
    + [("rr", 3.0, 3000), ("rr", 5.0, 3000)]
    + [("rrlump", 5.0, 10000), ("rrlump", 6.0, 10000)]
)


def hull_sweep_row(idx: int, kind: str, param: float, per_world: int, seeds: int) -> dict:
    """hull1 / hull2 / all1 only (cheap): balanced worlds of ``per_world`` trials each, delta = 0."""
    truth = true_epsilon(kind, param, 0.0)
    fps, hs = {"hull1": 0, "hull2": 0, "all1": 0}, []
    for seed in range(seeds):
        w = np.r_[np.ones(per_world, bool), np.zeros(per_world, bool)]
        s = sample(kind, param, w, np.random.default_rng([1000 + idx, seed]))
        r = jax_style(s[w], s[~w], 0.0)
        hs.append(r["H"])
        for f in fps:
            fps[f] += int(r[f] > truth + 1e-9)
    return {
        "mechanism": kind,
        "param": param,
        "per_world": per_world,
        "seeds": seeds,
        "mean_hull_vertices": float(np.mean(hs)),
        **{
            f: {
                "false_positives": k,
                "rate": k / seeds,
                "rate_upper95": float(special.betainccinv(k + 1.0, seeds - k, SIG))
                if k < seeds
                else 1.0,
            }
            for f, k in fps.items()
        },
    }


def load_jax(path: str):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("jax_privacy_auditing", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument(
        "--sims", type=int, default=20000, help="Monte Carlo draws calibrating the 'cal' band"
    )
    ap.add_argument("--split-seeds", type=int, default=300)
    ap.add_argument("--sweep-seeds", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="30 seeds, 2000 draws (smoke test)")
    ap.add_argument("--parts", default="main,splits,sweep,levels")
    ap.add_argument("--only", default="", help="comma-separated mechanism kinds of the main table")
    ap.add_argument(
        "--jax", default="", help="path of jax_privacy/auditing.py to cross-check hull1/hull2"
    )
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.quick:
        a.seeds, a.sims, a.split_seeds, a.sweep_seeds = 30, 2000, 10, 30
    jax = load_jax(a.jax) if a.jax else None
    kinds = set(a.only.split(",")) if a.only else None
    parts = set(a.parts.split(","))
    out: dict = {"significance": SIG, "seeds": a.seeds, "sims": a.sims}
    if "main" in parts:
        out["main"] = []
        print("rate of false positives / mean of each figure")
        print("| mechanism | runs | delta | true eps | H | " + " | ".join(FIGURES) + " |")
        print("|---" * (5 + len(FIGURES)) + "|")
        for idx, (kind, param, runs, delta) in enumerate(CONFIGS):
            if kinds and kind not in kinds:
                continue
            r = run_config(idx, kind, param, runs, delta, a.seeds, a.sims, jax)
            out["main"].append(r)
            cells = [f"{r[f]['rate']:.3f} / {r[f]['mean']:.3f}" for f in FIGURES]
            print(
                f"| {kind} {param:g} | {runs} | {delta:g} | {r['true_epsilon']:.3f} | {r['mean_hull_vertices']:.1f} | "
                + " | ".join(cells)
                + f" |  ({r['cpu_s']} s, {r['band_events']} band events)",
                flush=True,
            )
    if "splits" in parts:
        out["splits"] = []
        print(
            "\nmean (false positives) of max(box, band) by the band's share f of the significance: dpaudit band / calibrated band"
        )
        print("| mechanism | runs | " + " | ".join(f"f={f:g}" for f in BAND_SHARES) + " |")
        print("|---" * (2 + len(BAND_SHARES)) + "|")
        for kind, param, runs, delta in SPLIT_CONFIGS:
            r = split_row(
                CONFIGS.index((kind, param, runs, delta)),
                kind,
                param,
                runs,
                delta,
                a.split_seeds,
                a.sims,
            )
            out["splits"].append(r)
            print(
                f"| {kind} {param:g} | {runs} | "
                + " | ".join(
                    f"{r['band'][k]['mean']:.3f} ({r['band'][k]['false_positives']}) / {r['cal'][k]['mean']:.3f} "
                    f"({r['cal'][k]['false_positives']})"
                    for k in r["band"]
                )
                + " |",
                flush=True,
            )
    if "sweep" in parts:
        out["sweep"] = []
        print("\nhull sweep (delta 0): false-positive rate (one-sided 95 % upper bound)")
        print("| mechanism | per world | H | hull1 | hull2 | all1 |")
        print("|---|---|---|---|---|---|")
        for idx, (kind, param, per_world) in enumerate(HULL_SWEEP):
            r = hull_sweep_row(idx, kind, param, per_world, a.sweep_seeds)
            out["sweep"].append(r)
            print(
                f"| {kind} {param:g} | {per_world} | {r['mean_hull_vertices']:.1f} | "
                + " | ".join(
                    f"{r[f]['rate']:.4f} ({r[f]['rate_upper95']:.4f})"
                    for f in ("hull1", "hull2", "all1")
                )
                + " |",
                flush=True,
            )
    if "levels" in parts:
        out["levels"] = []
        print(
            "\ncalibrated per-count level a* (simultaneous over all counts of one world and direction) vs Bonferroni"
        )
        print("| trials per world | family share | a* | Bonferroni share / (n + 1) |")
        print("|---|---|---|---|")
        for n in (100, 500, 1000):
            for share in (SIG / 8.0, SIG / 4.0):
                lv = calibrated_level(n, share, a.sims)
                out["levels"].append({"n": n, "alpha_event": share, "a_star": lv})
                print(f"| {n} | {share:g} | {lv:.3g} | {share / (n + 1):.3g} |", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
