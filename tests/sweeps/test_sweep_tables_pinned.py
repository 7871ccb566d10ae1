"""The sweep tables (JSON, Markdown and HTML) of a fixed set of records are pinned byte for byte:
Table 3, Table 5 and Table 9 slice rows (published, not run, run under a profile), cells, both
Holm families and win/tie/loss. The digests were computed with the code before the tables module
was shortened."""

import hashlib
import json
import random

from dpaudit.sweeps.tables import render_html, render_markdown, sweep_tables

MODELS = ("dp-rvfl", "dp-elm-sgd", "logistic-raw", "dp-cnn", "dp-attention", "dp-elm-L3", "zzz")
DATASETS = ("mnist", "cifar10", "cardio", "heart", "digits")
DIGESTS = {
    "json": "c5cbe07a14301541c11dd6c1aebb199b13ef9ceabc4c54d90021a5bdbc9dedbd",
    "md": "cbfd7ba6e2ea962f1be1c5dd075d311b95bf42616a9cb358bae3d0769edd1be3",
    "html": "e6a9ca133af76d523e5bbf27b02e511bf63eb0a44fb73b2d9750d7a7d322a92f",
}


def _records() -> list[dict]:
    """Records of every model, dataset, profile and budget, 0-2 seeds each, some accuracies NaN."""
    rng, out = random.Random(3), []
    for model in MODELS:
        for dataset in DATASETS:
            for profile in (None, "authors"):
                for epsilon in (2.0, 1.0, None):
                    for seed in range(rng.randint(0, 2)):
                        acc = rng.random() if rng.random() > 0.1 else float("nan")
                        metrics = {"accuracy": acc, "f1_macro": rng.random()}
                        record = dict(model=model, dataset=dataset, epsilon=epsilon, seed=40 + seed)
                        out.append(
                            {
                                **record,
                                "metrics": metrics,
                                **({"profile": profile} if profile else {}),
                            }
                        )
    return out


def test_sweep_tables_of_fixed_records_are_unchanged():
    tables = sweep_tables(_records(), name="pinned")
    texts = {
        "json": json.dumps(tables, default=str),
        "md": render_markdown(tables),
        "html": render_html(tables),
    }
    got = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in texts.items()}
    assert got == DIGESTS
