"""`dpaudit sweep` through CliRunner: run, resume, --plan, --table, errors, exit codes."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dpaudit.cli import app

SPEC = """
name = "cli"
runner = "selftest"
models = ["mean", "median"]
datasets = ["synthetic"]
epsilons = [1.0, 2.0]
seeds = [1, 2]
[settings]
reproducible_noise = true
n = 100
"""


def _runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 always separates stderr
        return CliRunner()


def test_sweep_spec_runs_resumes_and_prints_one_json_object(tmp_path):
    spec = tmp_path / "grid.toml"
    spec.write_text(SPEC)
    r = _runner()
    res = r.invoke(
        app, ["sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "1", "--json"]
    )
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert (d["name"], d["tasks"], d["done"], d["ran"]) == ("cli", 8, 8, 8)
    assert d["executor"] == {"executor": "local", "workers": 1, "threads_per_worker": 1}
    assert (tmp_path / "out" / "cli" / "tables.md").exists() and (
        tmp_path / "out" / "cli" / "tables.json"
    ).exists()
    again = r.invoke(
        app, ["sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "1", "--json"]
    )
    d2 = json.loads(again.stdout)
    assert again.exit_code == 0 and (d2["ran"], d2["skipped_finished"]) == (0, 8)
    plan = r.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "out"), "--plan", "--json"])
    assert plan.exit_code == 0 and json.loads(plan.stdout)["done"] == 8
    table = r.invoke(app, ["sweep", "--table", "--store", str(tmp_path / "out" / "cli"), "--json"])
    t = json.loads(table.stdout)
    assert table.exit_code == 0 and t["sweep"] == "cli" and t["tasks_with_results"] == 8
    assert t["contrast_family_size"] == 2 and all(c["n"] == 2 for c in t["contrasts"])
    md = r.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "out"), "--table"])
    assert md.exit_code == 0 and "## Paired contrasts (2 in the Holm family)" in md.stdout
    assert (
        "| synthetic | 2 | accuracy | mean − median | 2 |" in md.stdout
    )  # tables are not re-wrapped


def test_slices_and_failures_set_the_exit_code(tmp_path):
    spec = tmp_path / "grid.toml"
    spec.write_text(SPEC.replace("n = 100", "n = 100\nfail_seeds = [2]"))
    r = _runner()
    res = r.invoke(
        app, ["sweep", str(spec), "--out", str(tmp_path), "--workers", "1", "--eps", "2", "--json"]
    )
    d = json.loads(res.stdout)
    assert res.exit_code == 1 and (d["tasks"], d["done"], d["failed"]) == (4, 2, 2)
    assert all(f["seed"] == 2 and f["epsilon"] == 2.0 for f in d["failures"])
    res2 = r.invoke(
        app, ["sweep", str(spec), "--out", str(tmp_path), "--workers", "1", "--eps", "2", "--json"]
    )
    assert (
        res2.exit_code == 0 and json.loads(res2.stdout)["ran"] == 0
    )  # failed tasks wait for --retry-failed
    res3 = r.invoke(
        app,
        [
            "sweep",
            str(spec),
            "--out",
            str(tmp_path),
            "--workers",
            "1",
            "--eps",
            "2",
            "--retry-failed",
            "--json",
        ],
    )
    assert res3.exit_code == 1 and json.loads(res3.stdout)["ran"] == 2


def test_usage_errors_are_one_line_and_exit_2(tmp_path):
    r = _runner()
    spec = tmp_path / "grid.toml"
    spec.write_text(SPEC)
    cases = [
        (["sweep"], "SPEC.toml or --builtin"),
        (["sweep", str(spec), "--builtin", "selftest"], "not both"),
        (["sweep", "--builtin", "nope"], "builtin must be one of"),
        (["sweep", str(spec), "--scheduler", "tcp://127.0.0.1:1"], "executor must be dask"),
        (["sweep", str(spec), "--workers", "0"], "workers must be an integer >= 1"),
        (["sweep", str(tmp_path / "absent.toml")], "sweep spec not found"),
        (["sweep", "--table", "--store", str(tmp_path / "nowhere")], "sweep store not found"),
    ]
    for args, fragment in cases:
        res = r.invoke(app, args)
        assert res.exit_code == 2, (args, res.stdout, res.stderr)
        assert fragment in res.stderr and res.stderr.count("\n") == 1 and res.stdout == ""
