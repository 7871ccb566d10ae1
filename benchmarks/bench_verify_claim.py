"""Cost of dpaudit.claims.verify_claim on DP-RVFL's MNIST schedule (q = 0.005, T = 2000).

Each accountant is measured in a fresh process (cold: imports and the accountant's first
computation included) and then again in the same process (the recomputation cache hit), since
`dpaudit ledger record` now re-checks every release it records and the report checks every
release of a sweep.

    python benchmarks/bench_verify_claim.py
"""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import time
t0 = time.perf_counter()
from dpaudit.accounting import SubsampledGaussian
from dpaudit.claims import verify_claim
from dpaudit.records import Release
ev = SubsampledGaussian(0.9, 0.005, 2000)
rel = Release(mechanism="dp-rvfl", dataset={"name": "mnist"}, adjacency="add-remove-record", accountant=ACC,
              epsilon=10.0, delta=1e-5, guarantee=ev.to_dict(), seed=0, noise_source={}, steps=2000,
              steps_executed=2000, git_commit=None)
t1 = time.perf_counter(); c = verify_claim(rel); t2 = time.perf_counter(); verify_claim(rel); t3 = time.perf_counter()
print(f"{ACC}: status {c.status}, recomputed epsilon {c.recomputed_epsilon:.6f}; imports {t1 - t0:.2f} s, "
      f"first check {t2 - t1:.2f} s, cached check {(t3 - t2) * 1e6:.0f} us")
"""

for acc in ("rdp", "prv", "pld"):
    subprocess.run([sys.executable, "-c", f"ACC = {acc!r}\n" + CHILD], check=True)
