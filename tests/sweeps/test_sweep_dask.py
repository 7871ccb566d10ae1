"""Dask executor on a real LocalCluster (127.0.0.1, 2 worker processes, 1 thread each).

Checks: a small grid's results are identical to the local executor's (same seeds,
reproducible noise), and killing a worker mid-sweep loses no finished task and the sweep
completes.
"""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("distributed")

from dpaudit.sweeps import DaskExecutor, load_records, open_store, parse_spec, run_sweep  # noqa: E402

SPEC = """
name = "dk"
runner = "selftest"
models = ["mean", "median"]
datasets = ["synthetic"]
epsilons = [0.5, 2.0]
seeds = [42, 43, 44]
[settings]
reproducible_noise = true
n = 300
sleep = 0.2
"""


@pytest.fixture(scope="module")
def cluster():
    with DaskExecutor(workers=2, threads_per_worker=1) as ex:
        yield ex


def _results(folder):
    _, recs = load_records(folder)
    return {(r["model"], r["epsilon"], r["seed"]): r["metrics"] for r in recs}


def test_local_cluster_is_loopback_only_and_small(cluster):
    info = cluster.describe()
    assert info["local_cluster"] and info["workers"] == 2
    assert info["scheduler"].startswith("tcp://127.0.0.1:")
    assert all(a.startswith("tcp://127.0.0.1:") for a in cluster.client.scheduler_info()["workers"])
    # the scheduler's HTTP server (health/metrics routes) listens on loopback too
    http = cluster._cluster.scheduler.http_server
    hosts = {
        sock.getsockname()[0] for sock in http._sockets.values()
    }  # tornado's listening sockets
    assert hosts == {"127.0.0.1"}


def test_dask_results_equal_local_results(cluster, tmp_path):
    spec = parse_spec(SPEC.replace("sleep = 0.2", "sleep = 0.0"))
    run_sweep(spec, out=tmp_path / "local")
    s = run_sweep(spec, out=tmp_path / "dask", executor=cluster)
    assert (s.done, s.failed) == (12, 0)
    local, dask = _results(tmp_path / "local" / "dk"), _results(tmp_path / "dask" / "dk")
    assert len(local) == 12 and dask == local
    with open_store(tmp_path / "dask" / "dk", create=False) as st:
        workers = {r.worker for r in st.rows()}
    assert len(workers) >= 1 and all(":" in w for w in workers)


def test_killing_a_worker_mid_sweep_loses_no_finished_task(cluster, tmp_path):
    spec = parse_spec(SPEC)
    snapshot = {}
    killed = []

    def kill_one_worker_after_two(task, outcome):
        done_now = {r.key: (r.result, r.finished_at) for r in _done_rows(tmp_path)}
        if len(done_now) >= 2 and not killed:
            snapshot.update(done_now)
            pids = cluster.client.run(os.getpid)  # worker address -> pid
            addr, pid = sorted(pids.items())[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(addr)

    s = run_sweep(spec, out=tmp_path, executor=cluster, on_outcome=kill_one_worker_after_two)
    assert killed, "the test must really kill a worker"
    assert (s.done, s.failed, s.pending) == (12, 0, 0)
    after = {r.key: (r.result, r.finished_at) for r in _done_rows(tmp_path)}
    for key, value in snapshot.items():  # every task finished before the kill is kept as it was
        assert after[key] == value
    # and the results are still the reproducible ones
    ref = tmp_path / "ref"
    run_sweep(spec, out=ref)
    assert _results(tmp_path / "dk") == _results(ref / "dk")


def _done_rows(tmp_path):
    with open_store(tmp_path / "dk", create=False) as st:
        return st.rows(status="done")


def test_map_chunks_with_shared_data_on_dask(cluster):
    import operator

    table = {f"k{i}": i * i for i in range(6)}
    assert cluster.map_chunks(operator.getitem, ["k5", "k0", "k3"], shared=table) == [25, 0, 9]
    assert cluster.map_chunks(abs, [-1, -2, 3]) == [1, 2, 3]


def _exit_worker(item):
    os._exit(3)  # the worker process dies on every attempt


def test_a_task_that_always_kills_its_worker_is_reported_not_hung(cluster):
    def set_allowed(n, dask_scheduler=None):
        old, dask_scheduler.allowed_failures = dask_scheduler.allowed_failures, n
        return old

    before = cluster.client.run_on_scheduler(set_allowed, 0)  # give up after the first death
    try:
        (out,) = list(cluster.imap_unordered(_exit_worker, [1]))
    finally:
        cluster.client.run_on_scheduler(set_allowed, before)
    assert not out.ok and "KilledWorker" in out.error


def test_audit_trials_on_dask_equal_the_built_in_pool(cluster, tmp_path):
    """The same audit chunks on the cluster: identical scores (reproducible noise), same eps_LB."""
    import numpy as np

    from dpaudit.audits.engine import run_audit
    from dpaudit.audits.gaussian import GaussianTarget

    t = GaussianTarget.for_epsilon(1.0, 1e-5)
    kw = dict(runs=400, seed=3, chunk_size=50, controls=("null",), reproducible_noise=True)
    a = run_audit(t, workers=1, out_dir=tmp_path / "a", **kw)
    b = run_audit(t, executor=cluster, out_dir=tmp_path / "b", **kw)
    sa, sb = np.load(tmp_path / "a" / "scores.npz"), np.load(tmp_path / "b" / "scores.npz")
    assert np.array_equal(sa["main_score"], sb["main_score"]) and np.array_equal(
        sa["null_score"], sb["null_score"]
    )
    assert a.epsilon_lower_bound == b.epsilon_lower_bound
    assert b.timings["executor"]["executor"] == "dask" and a.timings["executor"] == "built-in"


def test_audit_cli_runs_on_a_dask_local_cluster(tmp_path):
    """`dpaudit audit ... --executor dask --workers 2` starts a loopback LocalCluster and gives the
    same audit as the local executor."""
    import json

    from typer.testing import CliRunner

    from dpaudit.cli import app

    runner = CliRunner()
    base = [
        "audit",
        "gaussian",
        "--runs",
        "200",
        "--reproducible-noise",
        "--no-controls",
        "--json",
        "--chunk-size",
        "50",
    ]
    loc = runner.invoke(
        app, base + ["--out", str(tmp_path / "local"), "--executor", "local", "--workers", "1"]
    )
    dk = runner.invoke(
        app, base + ["--out", str(tmp_path / "dask"), "--executor", "dask", "--workers", "2"]
    )
    assert loc.exit_code == 0, loc.output
    assert dk.exit_code == 0, dk.output
    a, b = json.loads(loc.stdout), json.loads(dk.stdout)
    assert a["counts"] == b["counts"] and a["epsilon_lower_bound"] == b["epsilon_lower_bound"]
    assert (
        b["timings"]["executor"]["executor"] == "dask" and b["timings"]["executor"]["local_cluster"]
    )
    assert b["timings"]["executor"]["scheduler"].startswith("tcp://127.0.0.1:")
