"""DP-MixMin's audit targets pinned: what each describes (audit.json's config and canary), the
records it names and its scores on fixed noise, for a plan (parallel and sequential pipelines), a
release and an old release on the former task division, as the code before a restructuring of
the target's set-up built them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpaudit.mechanisms.mixmin.mechanism import MECHANISM
from dpaudit.noise import NoiseSource
from dpaudit.records import read_release
from dpaudit.release_compat import release_request
from dpaudit.releasing import release
from dpaudit.requests import MixMinRequest

GOLDEN = Path(__file__).with_name("mixmin_audit_target_golden.json")
OLD = Path(__file__).parents[1] / "audits" / "old_releases" / "mixmin.json"
_MIX = dict(task="digits-mix", target="loops-0689", epsilon=1.0, rho=0.3, steps=5)


def _plan(request):
    return MECHANISM.plan(request, MECHANISM.data_info(request, MECHANISM.load(request)))


def _pinned(target) -> dict:
    scores = target.scores(np.arange(6) % 2 == 0, NoiseSource("reproducible", seed=3))
    described = json.loads(json.dumps(target.describe(), default=str))
    return {
        "describe": described,
        "private_data": target.private_data(),
        "claim": [target.claimed_epsilon, target.accountant, target.delta],
        "scores": [float(v).hex() for v in scores],
    }


def _from_plan(canary: str, no_noise: bool = False, **settings) -> dict:
    plan = _plan(MixMinRequest(**_MIX, **settings))
    return _pinned(MECHANISM.audit_target(plan, canary, no_noise=no_noise))


def _from_release(tmp: Path) -> dict:
    request = MixMinRequest(**_MIX)
    rel = release("mixmin", request, out_dir=tmp / "rel", record=False)
    return _pinned(MECHANISM.audit_target(_plan(request), "natural", release=rel))


def _from_old_release() -> dict:
    rel = read_release(OLD)
    return _pinned(MECHANISM.audit_target(_plan(release_request(rel)), "max-clip", release=rel))


CASES = {
    "mixture max-clip": lambda tmp: _from_plan("max-clip"),
    "pipeline natural": lambda tmp: _from_plan("natural", stage="pipeline"),
    "sequential mislabeled no-noise": lambda tmp: _from_plan(
        "mislabeled", True, stage="pipeline", composition="sequential"
    ),
    "release natural": _from_release,
    "old release max-clip": lambda tmp: _from_old_release(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_audit_target_is_unchanged(name, tmp_path):
    assert CASES[name](tmp_path) == json.loads(GOLDEN.read_text())[name]


if __name__ == "__main__":  # write the golden file from the code on PYTHONPATH
    import tempfile

    torch.set_num_threads(1)  # as the test session runs (tests/conftest.py): the same float sums
    with tempfile.TemporaryDirectory() as tmp:
        out = {name: CASES[name](Path(tmp) / str(i)) for i, name in enumerate(CASES)}
    target = Path(sys.argv[1] if len(sys.argv) > 1 else GOLDEN)
    target.write_text(json.dumps(out, indent=1) + "\n")
