"""Every number the accounting package gives over a grid of events, accountants and adjacencies.

Run as a script (``python tests/accounting/accounting_grid.py full|quick|small``) it prints the
values as JSON: floats as ``float.hex`` (bit for bit), refusals as their one-line message. Run once
with another checkout's ``src`` on PYTHONPATH and once with this one's, the two outputs must be
equal. tests/accounting/test_accounting_grid.py compares the small grid (seconds) with the values
stored in tests/accounting/data/accounting_grid_small.json, computed by the code before the
accounting package was split by analysis (commit fc1e126).
"""

from __future__ import annotations

import itertools
import json
import math
import sys

from dpaudit.accounting import (
    Composed,
    Parallel,
    PureEpsilon,
    SearchRange,
    SubsampledGaussian,
    calibrate,
    calibrate_noise_multiplier,
    compute_delta,
    compute_epsilon,
    rdp_sgm,
)
from dpaudit.accounting import accountants as acc_module
from dpaudit.errors import DPAuditError

ADJACENCIES = ("add-remove-record", "replace-record", "add-remove-user")


def _value(x):
    """A float bit for bit, anything else as JSON has it."""
    if isinstance(x, float):
        return x.hex()
    if isinstance(x, dict):
        return {k: _value(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_value(v) for v in x]
    return x


def _answer(call):
    try:
        result = call()
    except DPAuditError as e:
        return f"{type(e).__name__}: {e}"
    return _value(result.to_dict() if hasattr(result, "to_dict") else result)


def _events(full: bool) -> dict:
    sigmas, rates = (
        ((0.5, 1.1, 3.0), (0.001, 0.01, 0.25, 1.0)) if full else ((0.8, 2.0), (0.01, 1.0))
    )
    steps = (0, 1, 100, 2000) if full else (0, 50)
    leaves = {
        f"sg({s},{q},{t})": SubsampledGaussian(s, q, t)
        for s, q, t in itertools.product(sigmas, rates, steps)
    }
    sg, sg2, pure = (
        SubsampledGaussian(1.1, 0.01, 300),
        SubsampledGaussian(0.9, 0.05, 40),
        PureEpsilon(0.5, 3),
    )
    trees = {
        "pure(0.5,3)": pure,
        "pure(2.0,1)": PureEpsilon(2.0),
        "pure(0.3,0)": PureEpsilon(0.3, 0),
        "composed(sg,sg)": Composed((sg, sg)),
        "composed(sg,pure)": Composed((sg, pure)),
        "composed(pure,pure)": Composed((pure, PureEpsilon(0.5, 2), PureEpsilon(0.1))),
        "parallel(sg,composed(sg,sg2))": Parallel((sg, Composed((sg, sg2)))),
        "parallel(pure,composed(pure,pure))": Parallel(
            (pure, Composed((PureEpsilon(0.7), PureEpsilon(0.2, 4))))
        ),
        "composed(parallel(sg,sg2),sg)": Composed((Parallel((sg, sg2)), sg)),
        "composed()": Composed(()),
        "parallel()": Parallel(()),
        "unsampled-composed": Composed(
            (SubsampledGaussian(4.0, 1.0, 10), SubsampledGaussian(4.0, 1.0, 5))
        ),
        "too-many-branches": Composed(tuple(Parallel((sg, sg2, pure)) for _ in range(8))),
        "prv-too-long": SubsampledGaussian(1.0, 0.001, 200_000),
        "mystery": Composed((sg, "not an event")),
    }
    return {**leaves, **trees}


def _epsilons(events: dict, full: bool) -> dict:
    out = {}
    for (name, event), adj in itertools.product(events.items(), ADJACENCIES):
        for acc in ("rdp", "prv", "pld", "pure"):
            heavy = (
                isinstance(event, SubsampledGaussian)
                and event.steps >= 2000
                and acc in ("prv", "pld")
            )
            if (
                acc == "prv"
                and not full
                and isinstance(event, SubsampledGaussian)
                and event.steps > 0
            ):
                continue  # prv is slow: the quick grid keeps its composed cases only
            for delta in (1e-5, 1e-8) if full and not heavy else (1e-5,):
                key = f"epsilon {acc} {adj} {delta!r} {name}"
                out[key] = _answer(
                    lambda: compute_epsilon(event, delta=delta, accountant=acc, adjacency=adj)
                )
            for epsilon in (0.5, 3.0) if acc != "prv" and not heavy else ():
                key = f"delta {acc} {adj} {epsilon!r} {name}"
                out[key] = _answer(
                    lambda: compute_delta(event, epsilon=epsilon, accountant=acc, adjacency=adj)
                )
            out[f"support {acc} {adj} {name}"] = acc_module.support_error(acc, event, adj)
        out[f"supporting {adj} {name}"] = list(acc_module.accountants_supporting(event, adj))
    return out


def _calibrations(full: bool) -> dict:
    out = {}
    grid = [
        (1.0, 0.01, 300, "rdp", "add-remove-record"),
        (2.0, 0.01, 300, "pld", "replace-record"),
        (8.0, 1.0, 10, "rdp", "replace-record"),
        (0.5, 0.1, 50, "pld", "add-remove-user"),
        (3.0, 0.01, 300, "rdp", "replace-record"),
    ]
    if full:
        grid += [
            (1.0, 0.01, 300, "prv", "add-remove-record"),
            (3.0, 0.004, 5000, "rdp", "add-remove-user"),
            (0.2, 0.5, 3, "pld", "add-remove-record"),
            (50.0, 0.25, 120, "prv", "add-remove-record"),
        ]
    for target, q, steps, acc, adj in grid:
        out[f"calibrate_noise_multiplier {target} {q} {steps} {acc} {adj}"] = _answer(
            lambda: calibrate_noise_multiplier(
                target_epsilon=target,
                delta=1e-5,
                sample_rate=q,
                steps=steps,
                accountant=acc,
                adjacency=adj,
                use_cache=False,
            )
        )
    for target in (0.5, 2.0):
        out[f"calibrate laplace {target}"] = _answer(
            lambda: calibrate(
                lambda b: PureEpsilon(1.0 / b, 4),
                "pure",
                target_epsilon=target,
                delta=1e-5,
                search=SearchRange(lo=0.01, hi=100.0),
                parameter_name="laplace scale",
            )
        )
    return out


def _curves(full: bool) -> dict:
    orders = [1.5, 2.0, 3.5, 8.0, 32.0, 100.0, 1024.0, 2048.0] if full else [1.5, 2.0, 8.0, 64.0]
    out = {}
    for q, sigma in itertools.product(
        (1e-4, 0.01, 0.3) if full else (0.01,), (0.6, 1.1, 5.0) if full else (1.1,)
    ):
        out[f"compute_rdp {q} {sigma}"] = [
            _value(float(v))
            for v in rdp_sgm.compute_rdp(q=q, noise_multiplier=sigma, steps=7, orders=orders)
        ]
    curve = acc_module.rdp_curve([SubsampledGaussian(1.1, 0.01, 100), PureEpsilon(0.2, 2)])
    out["rdp_curve"] = [_value(float(v)) for v in curve]
    out["rdp_to_epsilon"] = _value([float(v) for v in acc_module.rdp_to_epsilon(curve, 1e-5)])
    return out


def _comparisons() -> dict:
    sg = SubsampledGaussian(1.1, 0.05, 200)
    out = {}
    for adj in ("add-remove-record", "replace-record"):
        a = acc_module.Adjacency.parse(adj)
        names = acc_module.compared_accountants(a)
        out[f"compare {adj}"] = _answer(
            lambda: acc_module.compare(sg, delta=1e-5, adjacency=a, names=names)
        )
    return out


def small_grid() -> dict:
    """A grid of seconds: every accountant's epsilon, delta, refusals and calibration."""
    sg, sg2, pure = (
        SubsampledGaussian(1.1, 0.01, 300),
        SubsampledGaussian(0.9, 0.05, 40),
        PureEpsilon(0.5, 3),
    )
    events = {
        "sg": sg,
        "sg-unsampled": SubsampledGaussian(4.0, 1.0, 10),
        "sg-0": SubsampledGaussian(0.8, 0.01, 0),
        "pure": pure,
        "composed": Composed((sg, pure, sg)),
        "parallel": Parallel((sg, Composed((sg, sg2)))),
        "mystery": Composed((sg, "not an event")),
        "prv-too-long": SubsampledGaussian(1.0, 0.001, 200_000),
        "too-many-branches": Composed(tuple(Parallel((sg, sg2, pure)) for _ in range(8))),
    }
    out = {}
    for (name, event), adj in itertools.product(events.items(), ADJACENCIES):
        for acc in ("rdp", "prv", "pld", "pure"):
            out[f"support {acc} {adj} {name}"] = acc_module.support_error(acc, event, adj)
        for acc, delta, epsilon in (("rdp", 1e-5, 1.0), ("pure", 1e-5, 3.0)):
            out[f"epsilon {acc} {adj} {name}"] = _answer(
                lambda: compute_epsilon(event, delta=delta, accountant=acc, adjacency=adj)
            )
            out[f"delta {acc} {adj} {name}"] = _answer(
                lambda: compute_delta(event, epsilon=epsilon, accountant=acc, adjacency=adj)
            )
    for name, adj in (
        ("sg", "replace-record"),
        ("parallel", "add-remove-record"),
        ("sg-unsampled", "replace-record"),
    ):
        out[f"epsilon pld {adj} {name}"] = _answer(
            lambda: compute_epsilon(events[name], delta=1e-5, accountant="pld", adjacency=adj)
        )
        out[f"delta pld {adj} {name}"] = _answer(
            lambda: compute_delta(events[name], epsilon=1.0, accountant="pld", adjacency=adj)
        )
    out["epsilon prv composed"] = _answer(
        lambda: compute_epsilon(events["composed"], delta=1e-5, accountant="prv")
    )
    for target, q, steps, acc, adj in (
        (1.0, 0.01, 300, "rdp", "add-remove-record"),
        (8.0, 1.0, 10, "rdp", "replace-record"),
        (4.0, 1.0, 5, "pld", "replace-record"),
    ):
        out[f"calibrate_noise_multiplier {target} {acc} {adj}"] = _answer(
            lambda: calibrate_noise_multiplier(
                target_epsilon=target,
                delta=1e-5,
                sample_rate=q,
                steps=steps,
                accountant=acc,
                adjacency=adj,
                use_cache=False,
            )
        )
    out["calibrate laplace"] = _answer(
        lambda: calibrate(
            lambda b: PureEpsilon(1.0 / b, 4),
            "pure",
            target_epsilon=0.5,
            delta=1e-5,
            search=SearchRange(lo=0.01, hi=100.0),
        )
    )
    curve = rdp_sgm.compute_rdp(
        q=1e-4, noise_multiplier=0.6, steps=7, orders=[1.5, 3.5, 8.0, 100.0, 2048.0]
    )
    out["compute_rdp"] = [_value(float(v)) for v in curve]
    return out


def grid(full: bool) -> dict:
    """``{case: value}`` of every computation of the grid (``full``: the large one)."""
    out = {**_epsilons(_events(full), full), **_calibrations(full), **_curves(full)}
    if full:
        out.update(_comparisons())
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


if __name__ == "__main__":
    size = sys.argv[1] if len(sys.argv) > 1 else "small"
    json.dump(
        small_grid() if size == "small" else grid(size == "full"),
        sys.stdout,
        indent=0,
        sort_keys=True,
    )
