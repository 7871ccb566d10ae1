"""Releases of DP-ELM, noisy-sum and the DP-MixMin pipeline, and a DP-ELM audit's scores, pinned
bit for bit: the golden digests were written by the code before a restructuring of these
mechanisms, which must not change any released array or score."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpaudit.mechanisms.elm.mechanism import ElmTarget
from dpaudit.noise import NoiseSource
from dpaudit.releasing import release
from dpaudit.requests import DPELMRequest, GaussianRequest, MixMinRequest, NoisySumRequest

GOLDEN = Path(__file__).with_name("release_equivalence_golden.json")


def _digest(folder: Path) -> dict:
    """sha256 of each array file a release wrote (the arrays, not the record's timings)."""
    files = sorted(p for p in folder.rglob("*") if p.suffix in (".npz", ".npy", ".pt", ".json"))
    out = {}
    for p in files:
        if p.suffix == ".npz":
            with np.load(p) as z:
                out[str(p.relative_to(folder))] = {k: _sha(z[k]) for k in sorted(z.files)}
        elif p.suffix == ".npy":
            out[str(p.relative_to(folder))] = _sha(np.load(p))
        elif p.suffix == ".pt":
            state = torch.load(p, weights_only=True)
            out[str(p.relative_to(folder))] = {k: _sha(v.numpy()) for k, v in sorted(state.items())}
        elif p.name == "weights.json":
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _sha(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _elm(tmp: Path, sampler: str) -> dict:
    request = DPELMRequest(width=5, epsilon=2.0, sampler=sampler, reproducible_noise=True)
    r = release("dp-elm", request, out_dir=tmp / sampler, record=False)
    return {"arrays": _digest(tmp / sampler), "metrics": r.metrics, "epsilon": r.epsilon}


def _noisy_sum(tmp: Path) -> dict:
    request = NoisySumRequest(dataset="digits", epsilon=1.0, reproducible_noise=True)
    r = release("noisy-sum", request, out_dir=tmp / "sum", record=False)
    return {"arrays": _digest(tmp / "sum"), "metrics": r.metrics, "epsilon": r.epsilon}


def _mixmin_pipeline(tmp: Path, objective: str = "weighted-targets") -> dict:
    request = MixMinRequest(
        task="digits-mix", target="loops-0689", epsilon=1.0, rho=0.3, steps=20, stage="pipeline"
    )
    settings = {"reproducible_noise": True, "pretrain_objective": objective}
    request = MixMinRequest(**{**request.to_dict(), **settings})
    parts = release("mixmin", request, out_dir=tmp / "mix", record=False)
    parts = parts if isinstance(parts, (list, tuple)) else [parts]
    # the link to the mixture release names its random id: left out
    metrics = [{k: v for k, v in p.metrics.items() if k != "mixture_release_id"} for p in parts]
    return {"arrays": _digest(tmp / "mix"), "metrics": metrics}


def _elm_scores(canary: str, adjacency: str) -> list:
    target = ElmTarget(width=3, epsilon=1.0, canary=canary, adjacency=adjacency, seed=5)
    scores = target.scores(np.arange(6) % 2 == 0, NoiseSource("reproducible", seed=11))
    return [float(v).hex() for v in scores]


def _gaussian_scores(name: str) -> list:
    """The audit target a Gaussian / noisy-sum plan builds, scored on fixed noise."""
    from dpaudit.mechanisms.contract import DataInfo
    from dpaudit.mechanisms.simple import gaussian, noisy_sum

    if name == "gaussian":
        mechanism, request = gaussian.MECHANISM, GaussianRequest(broken_noise_factor=2.0)
        info = mechanism.data_info(request, None)
    else:
        mechanism, request = noisy_sum.MECHANISM, NoisySumRequest(dataset="digits", epsilon=1.0)
        info = DataInfo("digits", "tabular", 0, 5, 2, reference_size=50)
    target = mechanism.audit_target(mechanism.plan(request, info), "max-clip")
    scores = target.scores(np.arange(6) % 2 == 0, NoiseSource("reproducible", seed=3))
    return [float(v).hex() for v in scores]


CASES = {
    "dp-elm discrete": lambda tmp: _elm(tmp, "discrete-laplace"),
    "dp-elm textbook": lambda tmp: _elm(tmp, "textbook"),
    "noisy-sum": _noisy_sum,
    "dp-mixmin pipeline": _mixmin_pipeline,
    "dp-mixmin pipeline source-sampling": lambda tmp: _mixmin_pipeline(tmp, "source-sampling"),
    "dp-elm audit worst-case": lambda tmp: _elm_scores("worst-case", "add-remove-record"),
    "dp-elm audit mislabeled replace": lambda tmp: _elm_scores("mislabeled", "replace-record"),
    "gaussian audit": lambda tmp: _gaussian_scores("gaussian"),
    "noisy-sum audit": lambda tmp: _gaussian_scores("noisy-sum"),
}


def _canonical(value):
    return json.loads(json.dumps(value, sort_keys=True, default=str))


@pytest.mark.parametrize("name", sorted(CASES))
def test_release_is_bit_identical_to_the_golden(name, tmp_path):
    assert _canonical(CASES[name](tmp_path)) == json.loads(GOLDEN.read_text())[name]


if __name__ == "__main__":  # write the golden file from the code on PYTHONPATH
    import tempfile

    torch.set_num_threads(1)  # as the test session runs (tests/conftest.py): the same float sums
    with tempfile.TemporaryDirectory() as tmp:
        out = {name: _canonical(CASES[name](Path(tmp) / str(i))) for i, name in enumerate(CASES)}
    target = Path(sys.argv[1] if len(sys.argv) > 1 else GOLDEN)
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
