"""The published records of DP-MixMin (mixture stage, parallel and sequential pipelines), DP-ELM
and noisy-sum pinned key for key and in key order: release.json, pipeline.json and the local
record, as the code before a restructuring of these mechanisms wrote them. Only what differs
between two identical runs is left out (ids, times, the folder, the commit)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from dpaudit.releasing import release
from dpaudit.requests import DPELMRequest, MixMinRequest, NoisySumRequest

GOLDEN = Path(__file__).with_name("release_record_layout_golden.json")
#: Fields that differ between two runs of the same request.
VOLATILE = {
    "id",
    "release_id",
    "created_at",
    "git_commit",
    "dpaudit_version",
    "timings",
    "mixture_release_id",
}
_MIX = dict(task="digits-mix", target="loops-0689", epsilon=1.0, steps=20, reproducible_noise=True)


def _scrubbed(value, folder: str):
    """``value`` without its volatile fields, the run's folder written as ``OUT``."""
    if isinstance(value, dict):
        return {k: _scrubbed(v, folder) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_scrubbed(v, folder) for v in value]
    return value.replace(folder, "OUT") if isinstance(value, str) else value


def _records(name: str, request, out: Path) -> dict:
    release(name, request, out_dir=out, record=False)
    files = sorted(p for p in out.rglob("*.json"))
    return {str(p.relative_to(out)): _scrubbed(json.loads(p.read_text()), str(out)) for p in files}


CASES = {
    "dp-mixmin mixture": ("mixmin", MixMinRequest(**_MIX, rho=0.3)),
    "dp-mixmin pipeline": ("mixmin", MixMinRequest(**_MIX, rho=0.3, stage="pipeline")),
    "dp-mixmin sequential": (
        "mixmin",
        MixMinRequest(**_MIX, stage="pipeline", composition="sequential"),
    ),
    "dp-elm discrete": ("dp-elm", DPELMRequest(width=3, epsilon=2.0, reproducible_noise=True)),
    "dp-elm non-private": ("dp-elm", DPELMRequest(width=3, non_private=True)),
    "noisy-sum": ("noisy-sum", NoisySumRequest(dataset="digits", reproducible_noise=True)),
}


def _case(name: str, tmp: Path) -> str:
    """The scrubbed records as JSON text: key order is part of what is compared."""
    return json.dumps(_records(*CASES[name], tmp / "out"), indent=1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_published_records_keep_their_fields_values_and_key_order(name, tmp_path):
    golden = json.loads(GOLDEN.read_text())[name]
    assert _case(name, tmp_path) == json.dumps(golden, indent=1)


if __name__ == "__main__":  # write the golden file from the code on PYTHONPATH
    import tempfile

    torch.set_num_threads(1)  # as the test session runs (tests/conftest.py): the same float sums
    with tempfile.TemporaryDirectory() as tmp:
        out = {n: json.loads(_case(n, Path(tmp) / str(i))) for i, n in enumerate(CASES)}
    target = Path(sys.argv[1] if len(sys.argv) > 1 else GOLDEN)
    target.write_text(json.dumps(out, indent=1) + "\n")
