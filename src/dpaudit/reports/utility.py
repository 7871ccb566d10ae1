"""Section ``utility``: metrics as mean +/- SD over seeds, privacy-utility curves, and the
non-private reference."""

from __future__ import annotations

import json
from typing import Any

from ..claims import steps_accounted
from ..records import Release
from . import stats
from .inputs import LoadedRelease, Note, canonical_mechanism, dataset_name, num

#: Config keys that may differ between releases on one privacy-utility curve.
EPS_ONLY_KEYS = frozenset(
    "eps epsilon target_epsilon seed seeds noise_multiplier sigma out out_dir ledger json "
    "json_out data_dir reproducible_noise noise_source workers threads device dtype "
    "batch_size_eval progress calibrated_epsilon model_seed timings".split()
)


def _strip_eps(obj: Any) -> Any:
    """``obj`` without the keys that may differ along a privacy-utility curve (recursively)."""
    if isinstance(obj, dict):
        return {k: _strip_eps(v) for k, v in obj.items() if k not in EPS_ONLY_KEYS}
    if isinstance(obj, list):
        return [_strip_eps(v) for v in obj]
    return obj


#: Metrics shown first, in this order (the rest follow alphabetically).
METRIC_ORDER = ("accuracy", "precision_macro", "recall_macro", "f1_macro", "auroc", "auprc")


def _release_eps_key(release: Release) -> float | None:
    t = num(release.target_epsilon)
    e = t if t is not None else num(release.epsilon)
    return None if e is None else float(f"{e:.4g}")


def _curve_key(r: Release) -> str:
    cfg = r.config if isinstance(r.config, dict) else {}
    rest = _strip_eps(cfg)
    ds = r.dataset if isinstance(r.dataset, dict) else {}
    return json.dumps(
        {
            "mechanism": canonical_mechanism(r.mechanism),
            "dataset": dataset_name(r.dataset),
            "profile": ds.get("profile"),
            "partition": r.partition,
            "delta": num(r.delta),
            "adjacency": r.adjacency,
            "sample_rate": num(r.sample_rate),
            "steps": steps_accounted(r),
            "clipping_norm": num(r.clipping_norm),
            "config": rest,
        },
        sort_keys=True,
        default=str,
    )


def ordered_metrics(names) -> list[str]:
    """``names`` once each: :data:`METRIC_ORDER` first, the rest alphabetically."""
    return sorted(
        dict.fromkeys(names),
        key=lambda k: (METRIC_ORDER.index(k) if k in METRIC_ORDER else len(METRIC_ORDER), k),
    )


def _metric_names(rels: list[Release]) -> list[str]:
    return ordered_metrics(
        k for r in rels for k, v in (r.metrics or {}).items() if num(v) is not None
    )


def _metric_stats(rels: list[Release]) -> dict:
    values = {
        k: [v for v in (num((r.metrics or {}).get(k)) for r in rels) if v is not None]
        for k in _metric_names(rels)
    }
    return {k: dict(zip(("mean", "sd", "n"), stats.mean_sd(vs))) for k, vs in values.items()}


def _seeds(rels: list[Release]) -> list:
    return sorted({r.seed for r in rels}, key=str)


def _curve(
    k: dict, by_eps: dict, ref: dict | None, notes: list[Note]
) -> tuple[list[dict], dict | None]:
    """The rows of one privacy-utility curve (one per epsilon) and the curve itself (None with fewer than two epsilons)."""
    rows, points = [], []
    for eps in sorted(by_eps, key=lambda e: (e is None, e or 0.0)):
        rels = by_eps[eps]
        ms, seeds = _metric_stats(rels), _seeds(rels)
        if len(seeds) < len(rels):
            text = f"{rels[0].mechanism} at eps={eps}: {len(rels)} releases but only {len(seeds)} distinct seeds."
            notes.append(Note("info", "utility", text))
        rows.append(_row(rels, k["dataset"], (eps, k["delta"]), ms))
        if eps is not None:
            points.append({"epsilon": eps, "n": len(rels), "metrics": ms})
    if len(points) < 2:
        return rows, None
    return rows, {
        "mechanism": by_eps[next(iter(by_eps))][0].mechanism,
        "dataset": k["dataset"],
        "delta": k["delta"],
        "points": points,
        "reference": ref,
    }


def _row(rels: list[Release], dataset: str, claim: tuple | None, metrics: dict) -> dict:
    """A utility row of ``rels``: a private group's at ``claim`` (epsilon, delta), or (None) the
    non-private reference."""
    epsilon, delta = claim or (None, None)
    return {
        "mechanism": rels[0].mechanism,
        "dataset": dataset,
        "epsilon": epsilon,
        "delta": delta,
        "non_private": claim is None,
        "n": len(rels),
        "seeds": _seeds(rels),
        "metrics": metrics,
    }


def _add_release(r: Release, private: dict, reference: dict) -> None:
    """A private release joins its curve (by epsilon); a non-private one the reference of its mechanism and dataset."""
    if r.non_private:
        key = (canonical_mechanism(r.mechanism), dataset_name(r.dataset))
        reference.setdefault(key, []).append(r)
    else:
        private.setdefault(_curve_key(r), {}).setdefault(_release_eps_key(r), []).append(r)


def utility(releases: list[LoadedRelease], notes: list[Note]) -> dict:
    private: dict[str, dict[float | None, list[Release]]] = {}
    reference: dict[tuple, list[Release]] = {}
    for r in (lr.release for lr in releases):
        _add_release(r, private, reference)
    rows, curves = [], []
    for key, by_eps in private.items():
        k = json.loads(key)
        ref_rels = reference.get((k["mechanism"], k["dataset"]), [])
        curve_rows, curve = _curve(k, by_eps, _metric_stats(ref_rels) if ref_rels else None, notes)
        rows += curve_rows
        curves += [curve] if curve is not None else []
    rows += [_row(rels, ds, None, _metric_stats(rels)) for (_mech, ds), rels in reference.items()]
    _utility_notes(bool(private), bool(reference), rows, notes)
    return {"rows": rows, "curves": curves}


def _utility_notes(private: bool, reference: bool, rows: list[dict], notes: list[Note]) -> None:
    if private and not reference:
        text = "no non-private reference release among the inputs (train one with --non-private)."
        notes.append(Note("info", "utility", text))
    if any(not r["metrics"] for r in rows):
        notes.append(Note("warning", "utility", "some releases record no numeric metrics."))
