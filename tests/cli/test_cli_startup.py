"""Start-up: the light commands never import torch (or the other heavy stacks).

Importing torch alone costs seconds, so `dpaudit --help`, `--version`, `account`, `calibrate`,
`schedule` and `ledger summary` must not load it (nor torchvision, Opacus's package, scikit-learn,
matplotlib, Dask, psycopg): every dpaudit module is imported at the CLI's start-up, and each binds
the heavy stacks with :func:`dpaudit.lazy.lazy_import` (a stand-in outside ``sys.modules``: a name in
``sys.modules`` was imported), and the rdp accountant runs Opacus's analysis file without the ``opacus``
package (:mod:`dpaudit.accounting.opacus_rdp`). The commands that compute nothing numerical must not
even load numpy.

Each command runs in a fresh interpreter (this test process has torch loaded already, by
conftest) through a tiny wrapper that runs the typer app and then reports ``sys.modules``. Not
timed here (timings: benchmarks/bench_cli_startup.py, BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dpaudit.accounting import SubsampledGaussian
from dpaudit.cli import app
from dpaudit.records import Release, write_release

#: Stacks none of the light commands may load.
HEAVY = (
    "torch",
    "torchvision",
    "opacus",
    "sklearn",
    "matplotlib",
    "dask",
    "distributed",
    "psycopg",
    "statsmodels",
)
#: Loaded only by commands that compute numbers.
NUMERIC = ("numpy", "scipy")

MARK = "@@dpaudit-modules@@"
WRAPPER = f"""
import json, sys
from dpaudit.cli import app
try:
    app(args=sys.argv[1:], prog_name="dpaudit")
    code = 0
except SystemExit as e:
    code = e.code or 0
sys.stderr.write("\\n{MARK}" + json.dumps({{"code": code, "modules": sorted(sys.modules)}}) + "\\n")
"""


def _run(args: list[str]) -> tuple[int, set[str], str]:
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert MARK in proc.stderr, proc.stderr[-2000:]
    report = json.loads(proc.stderr.rsplit(MARK, 1)[1])
    return report["code"], set(report["modules"]), proc.stdout


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


NO_NUMBERS = {
    "help": ["--help"],
    "version": ["--version"],
    "schedule": ["schedule", "--n", "60000", "--batch-size", "256", "--epochs", "10"],
}
NUMBERS = {
    "account-rdp": [
        "account",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.01",
        "--steps",
        "100",
        "--accountant",
        "rdp",
        "--json",
    ],
    "account-all": [
        "account",
        "--noise-multiplier",
        "2.0",
        "--sample-rate",
        "1.0",
        "--steps",
        "4",
    ],  # rdp and prv
    "calibrate": ["calibrate", "--eps", "2", "--sample-rate", "0.01", "--steps", "100", "--json"],
}


@pytest.mark.parametrize(
    "args", list({**NO_NUMBERS, **NUMBERS}.values()), ids=list({**NO_NUMBERS, **NUMBERS})
)
def test_light_commands_do_not_import_torch(args):
    code, modules, stdout = _run(args)
    assert code == 0, stdout
    assert stdout.strip()
    loaded = _top(modules)
    assert not loaded & set(HEAVY), (
        f"dpaudit {' '.join(args)} imported {sorted(loaded & set(HEAVY))}"
    )


@pytest.mark.parametrize("args", list(NO_NUMBERS.values()), ids=list(NO_NUMBERS))
def test_commands_without_numbers_do_not_import_numpy(args):
    code, modules, stdout = _run(args)
    assert code == 0, stdout
    loaded = _top(modules)
    assert not loaded & set(NUMERIC), (
        f"dpaudit {' '.join(args)} imported {sorted(loaded & set(NUMERIC))}"
    )


def test_rdp_account_matches_in_process(tmp_path):
    """The number from the torch-free process equals the one computed where opacus is imported."""
    args = [
        "account",
        "--noise-multiplier",
        "1.1",
        "--sample-rate",
        "0.01",
        "--steps",
        "100",
        "--accountant",
        "rdp",
        "--json",
    ]
    code, modules, stdout = _run(args)
    assert code == 0 and "torch" not in _top(modules)
    import opacus.accountants.analysis.rdp  # noqa: F401  (in this process the package is loaded: its own module is used)

    here = CliRunner().invoke(app, args)
    assert here.exit_code == 0, here.output
    assert json.loads(stdout) == json.loads(here.stdout)


def _ledger_of(tmp_path, events, epsilon: float):
    """A ledger with one recorded dp-rvfl release per event (``epsilon`` as each one's claim)."""
    ledger = tmp_path / "ledger.sqlite"
    for i, event in enumerate(events):
        rel = Release(
            mechanism="dp-rvfl",
            dataset={"name": "mnist", "sha256": "cd" * 32},
            adjacency="add-remove-record",
            accountant="rdp",
            epsilon=epsilon,
            delta=1e-5,
            guarantee=event.to_dict(),
            seed=3,
            noise_source={"kind": "os-entropy"},
            partition="train",
            git_commit=None,
        )
        write_release(rel, tmp_path / f"r{i}")
        res = CliRunner().invoke(
            app, ["ledger", "record", str(tmp_path / f"r{i}"), "--ledger", str(ledger)]
        )
        assert res.exit_code == 0, res.output
    return ledger


def test_ledger_summary_does_not_import_torch(tmp_path):
    ledger = _ledger_of(
        tmp_path, (SubsampledGaussian(2.0, 1.0, 4), SubsampledGaussian(3.0, 1.0, 9)), epsilon=1.5
    )
    for extra in ([], ["--json"]):
        code, modules, stdout = _run(["ledger", "summary", "--ledger", str(ledger), *extra])
        assert code == 0, stdout
        assert "mnist" in stdout
        loaded = _top(modules)
        assert not loaded & set(HEAVY), (
            f"dpaudit ledger summary imported {sorted(loaded & set(HEAVY))}"
        )


# ---------------------------------------------------------------- <= 0.5 s start-up
# (timings: benchmarks/bench_cli_startup.py and BENCHMARKS.md; here what makes them possible)

#: What the rdp accountant, `calibrate` and a warm `ledger summary` no longer load.
SLOW_NUMERIC = ("scipy", "prv_accountant", "dp_accounting")


@pytest.mark.parametrize("name", ["account-rdp", "calibrate"])
def test_rdp_commands_do_not_import_scipy(name):
    """Opacus's RDP analysis is computed with numpy alone (accounting/rdp_sgm.py)."""
    code, modules, stdout = _run(NUMBERS[name])
    assert code == 0, stdout
    loaded = _top(modules)
    assert not loaded & set(SLOW_NUMERIC), (
        f"dpaudit {name} imported {sorted(loaded & set(SLOW_NUMERIC))}"
    )


def _ledger_of_two(tmp_path):
    return _ledger_of(
        tmp_path, (SubsampledGaussian(2.0, 0.01, 400), SubsampledGaussian(3.0, 1.0, 9)), epsilon=9.5
    )


def test_warm_ledger_summary_does_not_import_prv_and_reports_the_same(tmp_path, monkeypatch):
    """The first summary computes the prv bounds and keeps them (accounting/result_cache.py); the
    next one reads them without importing prv-accountant (or scipy), and prints the same numbers."""
    ledger = _ledger_of_two(tmp_path)
    monkeypatch.setenv("DPAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    args = ["ledger", "summary", "--ledger", str(ledger), "--json"]
    code, cold_modules, cold = _run(args)
    assert code == 0, cold
    assert "prv_accountant" in _top(cold_modules)  # the cold run computes prv
    code, modules, warm = _run(args)
    assert code == 0, warm
    assert not _top(modules) & set(SLOW_NUMERIC + HEAVY), sorted(
        _top(modules) & set(SLOW_NUMERIC + HEAVY)
    )
    assert json.loads(warm) == json.loads(cold)
    rows = json.loads(warm)["rows"]
    assert rows[0]["epsilon_prv"] is not None and rows[0]["epsilon"] == min(
        rows[0]["epsilon_rdp"], rows[0]["epsilon_prv"]
    )


def _registered(args: list[str]) -> list[str]:
    code = WRAPPER.replace('"modules": sorted(sys.modules)', '"modules": sorted(app._loaded)')
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    return json.loads(proc.stderr.rsplit(MARK, 1)[1])["modules"]


def test_version_registers_no_command_family():
    """The root app registers and converts a command family only when the command line names it."""
    assert _registered(["--version"]) == []
    assert _registered(NO_NUMBERS["schedule"]) == ["accounting"]


def test_every_module_imports_without_a_heavy_stack():
    """Importing all of dpaudit runs none of the heavy stacks (dpaudit's own imports are all eager)."""
    code = (
        "import importlib, pkgutil, sys, dpaudit\nfor m in pkgutil.walk_packages(dpaudit.__path__, 'dpaudit.'):\n"
        "    importlib.import_module(m.name)\nprint(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout.strip().replace("'", '"')))
    assert "dpaudit" in loaded and not loaded & set(HEAVY + NUMERIC + SLOW_NUMERIC), sorted(
        loaded & set(HEAVY + NUMERIC + SLOW_NUMERIC)
    )


def test_lazy_root_lists_what_the_families_register():
    """COMMAND_FAMILIES (the lazy root's table) names every top-level command, in typer's order,
    with the family that registers it; the lazy and the eager app are the same commands."""
    import typer

    import dpaudit.cli as cli

    eager = typer.main.get_command(app)  # registers every family, the eager way
    assert list(eager.commands) == list(cli.COMMAND_FAMILIES)
    assert app.registered_by == cli.COMMAND_FAMILIES
    assert set(cli.FAMILY_ORDER) == set(cli.COMMAND_FAMILIES.values())
    lazy = app.lazy_command()
    assert list(lazy.commands) == list(eager.commands)
    for name in eager.commands:
        assert type(lazy.commands[name]) is type(eager.commands[name])
        assert lazy.commands[name].help == eager.commands[name].help


LAZY_CALL = "import sys\nfrom dpaudit.cli import app\ntry:\n    app(args=sys.argv[1:], prog_name='dpaudit')\nexcept SystemExit as e:\n    print('exit', e.code)"
EAGER_CALL = (
    "import sys, typer\nfrom dpaudit.cli import app\ntry:\n    typer.main.get_command(app)(args=sys.argv[1:], prog_name='dpaudit')\n"
    "except SystemExit as e:\n    print('exit', e.code)"
)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["ledger", "--help"],
        ["ledger", "summary", "--help"],
        ["audit", "noisy-sum", "--help"],
        ["nosuch"],
        ["schedule", "--n", "x"],
    ],
    ids=lambda a: "-".join(a),
)
def test_lazy_app_prints_what_the_eager_app_prints(args):
    env = dict(os.environ, COLUMNS="100")
    lazy, eager = (
        subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        for code in (LAZY_CALL, EAGER_CALL)
    )
    assert (lazy.stdout, lazy.stderr) == (eager.stdout, eager.stderr)
    assert lazy.stdout.strip() or lazy.stderr.strip()


@pytest.mark.parametrize("name", ["schedule", "account-rdp", "calibrate"])
def test_light_commands_convert_options_without_pydantic(name):
    """typer's pydantic adapters are not built for plain options (dpaudit.cli.coercion): the
    import alone is ~0.15 s of these commands' 0.5 s."""
    code, modules, stdout = _run({**NO_NUMBERS, **NUMBERS}[name])
    assert code == 0, stdout
    assert not {"pydantic", "pydantic_core"} & _top(modules), f"dpaudit {name} imported pydantic"


def test_an_audit_loads_no_statsmodels_metrics_or_compiler(tmp_path):
    """`dpaudit audit` computes its statistics with numpy/scipy.special (no statsmodels, no
    scikit-learn metrics) and trains DP-MixMin's public proxies without torch.optim (whose first use
    imports torch._dynamo, ~2 s): measured in BENCHMARKS.md (the MixMin audit)."""
    code, modules, stdout = _run(
        [
            "audit",
            "mixmin",
            "--canary",
            "max-clip",
            "--runs",
            "60",
            "--no-controls",
            "--workers",
            "1",
            "--out",
            str(tmp_path / "a"),
        ]
    )
    assert code == 0, stdout
    # (scikit-learn, and pandas behind it, are loaded here: the embedded digits come from sklearn.datasets)
    forbidden = {"statsmodels", "sklearn.metrics", "torch._dynamo"}
    loaded = _top(modules) | set(modules)
    assert not loaded & forbidden, sorted(loaded & forbidden)


# ---------------------------------------------------------------- no internal import inside a function
# (tests/test_import_graph.py); the library binds the heavy stacks with dpaudit.lazy.lazy_import, so start-up stays light.

#: Commands that print help or refuse their input before anything is computed: torch stays unloaded
#: (the whole request is checked first). dp-elm and noisy-sum validate in their mechanism,
#: imported (mechanisms/registry.py) without running torch.
REFUSED = {
    "train-help": (["train", "dp-rvfl", "--help"], 0),
    "audit-help": (["audit", "--help"], 0),
    "ledger-help": (["ledger", "--help"], 0),
    "eps-not-a-number": (["train", "dp-rvfl", "--eps", "abc"], 2),
    "dp-elm-width": (["train", "dp-elm", "--width", "0"], 2),
    "noisy-sum-eps": (["train", "noisy-sum", "--eps", "-1"], 2),
    "dp-rvfl-eps": (["train", "dp-rvfl", "--eps", "-1"], 2),
    "dp-rvfl-delta": (["train", "dp-cnn", "--delta", "2"], 2),
    "dp-rvfl-user-without-g": (["train", "dp-rvfl", "--privacy-unit", "user"], 2),
    "dp-rvfl-threads": (["train", "dp-rvfl", "--threads", "0"], 2),
}


@pytest.mark.parametrize("args,code", list(REFUSED.values()), ids=list(REFUSED))
def test_help_and_refused_input_do_not_import_torch(args, code):
    got, modules, stdout = _run(args)
    assert got == code, stdout
    assert not _top(modules) & set(HEAVY), (
        f"dpaudit {' '.join(args)} imported {sorted(_top(modules) & set(HEAVY))}"
    )


def test_the_whole_app_builds_without_torch():
    """Every command family registered and converted (the eager path of CliRunner and typer): no heavy stack."""
    code = "import sys, typer\nfrom dpaudit.cli import app\ntyper.main.get_command(app)\nprint(sorted({m.split('.')[0] for m in sys.modules}))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = set(json.loads(proc.stdout.strip().replace("'", '"')))
    assert "dpaudit" in loaded and not loaded & set(HEAVY + NUMERIC), sorted(
        loaded & set(HEAVY + NUMERIC)
    )
