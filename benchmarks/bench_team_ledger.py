"""Team ledger benchmark: `ledger summary` on a 500-release ledger on SQLite and on
PostgreSQL, and releases per second recorded by 8 concurrent writer processes.

Usage:
    DPAUDIT_TEST_POSTGRES=postgresql://USER:PW@127.0.0.1:PORT/DB \\
        python benchmarks/bench_team_ledger.py [--releases 500] [--writers 8] [--per-writer 25]

Each benchmark ledger lives in a fresh schema (PostgreSQL) or a temporary file (SQLite) and is
removed afterwards. Every release is signed (a registered Ed25519 key), as on a team ledger.
A writer's release = one reservation (budget check + entry, one transaction) and one settlement
(release recorded + reservation closed, one transaction), exactly what a training run does.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dpaudit.accounting import SubsampledGaussian
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger
from dpaudit.records import Release

KEY = sg.SigningKey("bench", Path("bench.key"), Ed25519PrivateKey.from_private_bytes(b"\x07" * 32))


def release(i: int, dataset: str = "bench") -> Release:
    ev = SubsampledGaussian(
        noise_multiplier=1.0 + (i % 5) * 0.1, sample_rate=0.01, steps=100 + i % 7
    )
    return Release(
        mechanism="bench",
        dataset={"name": dataset, "sha256": "ab" * 32},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee=ev.to_dict(),
        seed=i,
        noise_source={"kind": "bench"},
        git_commit=None,
        partition="train",
        noise_multiplier=ev.noise_multiplier,
        sample_rate=ev.sample_rate,
        steps=ev.steps,
    )


def fill(target, n: int) -> float:
    t0 = time.perf_counter()
    with open_ledger(target, signing_key=KEY) as led:
        led.register_key()
        for i in range(n):
            led.record(release(i))
    return time.perf_counter() - t0


def time_reads(target, repeats: int = 3) -> dict:
    """The storage side of a summary on a fresh Ledger object: read every row, check the hash
    chain and every Ed25519 signature (what each command does before composing), and verify()."""
    intact, verify = [], []
    for _ in range(repeats):
        with open_ledger(target, signing_key=None) as led:
            t0 = time.perf_counter()
            led._intact_entries()
            intact.append(time.perf_counter() - t0)
        with open_ledger(target, signing_key=None) as led:
            t0 = time.perf_counter()
            assert led.verify().ok
            verify.append(time.perf_counter() - t0)
    return {
        "read_chain_signatures_s_median": statistics.median(intact),
        "verify_s_median": statistics.median(verify),
    }


def time_summary(target, repeats: int = 3, cli_runs: int = 3) -> dict:
    inproc = []
    for _ in range(repeats):
        with open_ledger(target, signing_key=None) as led:
            t0 = time.perf_counter()
            rows = led.summary()
            inproc.append(time.perf_counter() - t0)
    if cli_runs == 0:
        return {
            "releases": rows[0]["releases_subtree"],
            "summary_s_first": inproc[0],
            "summary_s_median": statistics.median(inproc),
        }
    cli = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(cli_runs):
        t0 = time.perf_counter()
        r = subprocess.run(
            [
                str(Path(sys.executable).parent / "dpaudit"),
                "ledger",
                "summary",
                "--json",
                "--ledger",
                str(target),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        cli.append(time.perf_counter() - t0)
        assert r.returncode == 0, r.stderr[-500:]
    return {
        "releases": rows[0]["releases_subtree"],
        "summary_s_first": inproc[0],
        "summary_s_median": statistics.median(inproc),
        "cli_summary_s_median": statistics.median(cli),
    }


def _writer(target: str, wid: int, count: int, start, out) -> None:
    from dpaudit.accounting import PureEpsilon

    with open_ledger(target, signing_key=KEY) as led:
        start.wait()
        t0 = time.perf_counter()
        for i in range(count):
            rel = release(10_000 * (wid + 1) + i)
            rid = led.reserve(
                dataset="bench",
                partition="train",
                event=PureEpsilon(0.001),
                adjacency="add-remove-record",
                data_digest="ab" * 32,
                mechanism="bench",
            )
            led.settle(rid, [rel])
        out.put((wid, time.perf_counter() - t0))


def concurrent_writers(target: str, writers: int, per_writer: int) -> dict:
    with open_ledger(target, signing_key=KEY) as led:
        before = len(led.entries(kind="release"))
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(str(target), w, per_writer, start, out))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    time.sleep(3.0)  # let every writer import and connect before the start signal
    t0 = time.perf_counter()
    start.set()
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    with open_ledger(target, signing_key=None) as led:
        after = len(led.entries(kind="release"))
        ok = led.verify().ok
    n = after - before
    return {
        "writers": writers,
        "releases": n,
        "wall_s": wall,
        "releases_per_s": n / wall,
        "verify_ok": ok,
        "ledger_releases_before": before,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--releases", type=int, default=500)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--per-writer", type=int, default=25)
    ap.add_argument(
        "--cli-runs", type=int, default=3, help="cold `dpaudit ledger summary` runs (0: skip)"
    )
    ap.add_argument("--no-writers", action="store_true")
    a = ap.parse_args()
    pg = os.environ.get("DPAUDIT_TEST_POSTGRES")
    if not pg:
        sys.exit("set DPAUDIT_TEST_POSTGRES to a PostgreSQL URL (e.g. from tests/pg_cluster.py)")
    results = {}
    tmp = Path(tempfile.mkdtemp())
    schemas = []
    try:
        for backend in ("sqlite", "postgresql"):
            if backend == "sqlite":
                target = tmp / "bench.sqlite"
            else:
                schema = f"bench_{uuid.uuid4().hex[:8]}"
                schemas.append(schema)
                target = pg + ("&" if "?" in pg else "?") + f"schema={schema}"
            fill_s = fill(target, a.releases)
            res = {
                "fill_s": fill_s,
                **time_reads(target),
                **time_summary(target, cli_runs=a.cli_runs),
            }
            # 8 writers on a fresh small ledger of the same backend.
            if a.no_writers:
                results[backend] = res
                print(backend, json.dumps(res), flush=True)
                continue
            if backend == "sqlite":
                wtarget = tmp / "writers.sqlite"
            else:
                schema = f"bench_{uuid.uuid4().hex[:8]}"
                schemas.append(schema)
                wtarget = pg + ("&" if "?" in pg else "?") + f"schema={schema}"
            fill(wtarget, 0)
            res["writers"] = concurrent_writers(wtarget, a.writers, a.per_writer)
            results[backend] = res
            print(backend, json.dumps(res), flush=True)
    finally:
        import shutil

        import psycopg

        shutil.rmtree(tmp, ignore_errors=True)
        with psycopg.connect(pg, autocommit=True) as c:
            for s in schemas:
                c.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
