"""Child process for the concurrent budget test (not collected by pytest).

Usage: python budget_racer.py LEDGER OUT_DIR

Builds a small synthetic dataset (the same in every racer), prints "ready" and waits for a line
on stdin (the start barrier, released by the parent once every racer is ready), then runs the
real DP-ELM release path (:func:`dpaudit.releasing.release` of a DPELMRequest, pure
epsilon 1). Its training step (the sufficient statistics) is slowed by 1.5 s and prints
"training" when it starts, so every racer is past the budget check before any has released
anything, and the parent can tell whether a refused racer trained. Prints "released ID" (exit 0)
or "refused NAME: MESSAGE" (exit 3).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from dpaudit.data.base import PreparedDataset
from dpaudit.errors import DPAuditError
from dpaudit.mechanisms.elm import mechanism as dp_elm
from dpaudit.releasing import release
from dpaudit.requests import DPELMRequest


def dataset() -> PreparedDataset:
    rng = np.random.default_rng(0)
    x = rng.random((60, 4)).astype(np.float32)
    y = rng.integers(0, 2, 60).astype(np.int64)
    return PreparedDataset(
        name="race",
        kind="tabular",
        x_train=x[:40],
        y_train=y[:40],
        x_val=x[40:50],
        y_val=y[40:50],
        x_test=x[50:],
        y_test=y[50:],
        n_classes=2,
        split_seed=0,
    )


def main() -> None:
    ledger, out = sys.argv[1], sys.argv[2]
    real = dp_elm.elm_sufficient_statistics

    def slow_statistics(*args, **kwargs):
        print("training", flush=True)
        time.sleep(1.5)
        return real(*args, **kwargs)

    dp_elm.elm_sufficient_statistics = slow_statistics
    data = dataset()
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        rel = release(
            "dp-elm",
            DPELMRequest(dataset="race", width=3, epsilon=1.0),
            prepared=data,
            ledger_path=ledger,
            out_dir=out,
        )
    except DPAuditError as e:
        print(f"refused {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    print(f"released {rel.id}", flush=True)


if __name__ == "__main__":
    main()
