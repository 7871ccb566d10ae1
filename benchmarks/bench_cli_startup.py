"""Wall time of the light `dpaudit` commands, run through the installed entry point.

Each command runs N times (default 7) as a fresh process of ``.venv/bin/dpaudit``; the table
gives the median wall time, the median CPU time of the child (user + sys: less sensitive to other
load on the machine than wall time) and, for the commands that compute, the median time of the
computation alone, measured in a warm process of the same code (so wall - compute is the start-up:
interpreter, imports, argument parsing, output). Whether torch was imported is checked separately
by tests/cli/test_cli_startup.py.

``--pythonpath DIR`` measures another source tree through the same entry point (the script puts
PYTHONPATH before the editable install), e.g. the code before the change:

    .venv/bin/python benchmarks/bench_cli_startup.py --runs 7
    .venv/bin/python benchmarks/bench_cli_startup.py --runs 7 --pythonpath /tmp/orig/src

Every command runs once untimed first (Python's bytecode cache, the calibration cache and the
ledger's prv-result cache are then as after a first use); the "cold" ledger row gives each run an
empty cache directory. ``--no-bytecode`` keeps an inherited PYTHONDONTWRITEBYTECODE.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DPSGD = [
    "--noise-multiplier",
    "1.1",
    "--sample-rate",
    "0.004266",
    "--steps",
    "2345",
]  # MNIST: B = 256 of 60,000, 10 epochs

# label, argv, compute snippet (timed in a warm process; None: nothing numerical)
COMMANDS = [
    ("--help", ["--help"], None),
    ("--version", ["--version"], None),
    ("schedule", ["schedule", "--n", "60000", "--batch-size", "256", "--epochs", "10"], None),
    (
        "account --accountant rdp",
        ["account", *DPSGD, "--accountant", "rdp"],
        "compute_epsilon(SubsampledGaussian(1.1, 0.004266, 2345), delta=1e-5, accountant='rdp')",
    ),
    (
        "account (all: rdp + prv)",
        ["account", *DPSGD],
        "[compute_epsilon(SubsampledGaussian(1.1, 0.004266, 2345), delta=1e-5, accountant=a) for a in ('rdp', 'prv')]",
    ),
    (
        "calibrate (cached)",
        ["calibrate", "--eps", "2", "--sample-rate", "0.004266", "--steps", "2345"],
        "calibrate_noise_multiplier(target_epsilon=2.0, delta=1e-5, sample_rate=0.004266, steps=2345, accountant='rdp')",
    ),
    (
        "ledger summary (2 releases), warm",
        ["ledger", "summary"],
        None,
    ),  # the ledger of $DPAUDIT_LEDGER; prv answers cached
    (
        "ledger summary (2 releases), cold",
        ["ledger", "summary"],
        None,
    ),  # each run with an empty cache directory
]
#: Rows run with a fresh, empty DPAUDIT_CACHE_DIR each time (nothing remembered from earlier runs).
COLD = {"ledger summary (2 releases), cold"}

# warm-up for the compute timings: loads every module the timed call needs, with another event
# (the one-step RDP curve is cached per (q, sigma))
WARM = (
    "from dpaudit.accounting import SubsampledGaussian, compute_epsilon, calibrate_noise_multiplier\n"
    "compute_epsilon(SubsampledGaussian(3.0, 0.5, 3), delta=1e-5, accountant='rdp')\n"
    "compute_epsilon(SubsampledGaussian(3.0, 0.5, 3), delta=1e-5, accountant='prv')\n"
)

RELEASES = """
import sys
from dpaudit.accounting import SubsampledGaussian
from dpaudit.records import Release, write_release
for i, ev in enumerate((SubsampledGaussian(2.0, 1.0, 4), SubsampledGaussian(3.0, 1.0, 9))):
    rel = Release(mechanism="dp-rvfl", dataset={"name": "mnist", "sha256": "cd" * 32}, adjacency="add-remove-record",
                  accountant="rdp", epsilon=1.5, delta=1e-5, guarantee=ev.to_dict(), seed=3,
                  noise_source={"kind": "os-entropy"}, partition="train", git_commit=None)
    write_release(rel, f"{sys.argv[1]}/r{i}")
"""


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(argv: list[str], env: dict) -> tuple[float, float]:
    cpu0, t0 = _child_cpu(), time.perf_counter()
    proc = subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wall, cpu = time.perf_counter() - t0, _child_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}"
        )
    return wall, cpu


def compute_time(snippet: str, env: dict, runs: int) -> float:
    code = (
        WARM + "import time\nts = []\n"
        f"for _ in range({runs}):\n"
        "    from dpaudit.accounting import accountants as _a\n"
        "    _a._one_step_rdp.cache_clear()  # each run computes its curve, as a fresh process would\n"
        "    try:\n"
        "        from dpaudit.accounting import rdp_sgm as _r\n"
        "        _r._log_binom_matrix.cache_clear(); _r._overflow_counts.cache_clear()  # and its binomial tables\n"
        "    except ImportError:\n"
        "        pass  # code before accounting/rdp_sgm.py\n"
        f"    t = time.perf_counter(); {snippet}; ts.append(time.perf_counter() - t)\n"
        "import statistics; print(statistics.median(ts))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"compute timing failed: {out.stderr.strip()[-500:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="processes per command (median reported)")
    ap.add_argument(
        "--entry",
        default=str(Path(sys.executable).with_name("dpaudit")),
        help="the dpaudit entry point",
    )
    ap.add_argument(
        "--pythonpath", default=None, help="source tree to measure instead of the installed one"
    )
    ap.add_argument(
        "--no-bytecode",
        action="store_true",
        help="keep the environment's PYTHONDONTWRITEBYTECODE (every run compiles dpaudit's sources) instead of "
        "a private bytecode cache, as an installed package has",
    )
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="dpaudit-bench-startup-") as tmp:
        env = dict(
            os.environ,
            COLUMNS="100",
            DPAUDIT_CACHE_DIR=f"{tmp}/cache",
            DPAUDIT_LEDGER=f"{tmp}/ledger.sqlite",
        )
        if not args.no_bytecode:
            # An installed package has its .pyc files; this checkout may run with PYTHONDONTWRITEBYTECODE
            # (then every start compiles dpaudit's modules: ~0.05-0.1 s). A private prefix keeps the
            # source trees untouched; the set-up runs below fill it.
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = f"{tmp}/pycache"
        if args.pythonpath:
            env["PYTHONPATH"] = args.pythonpath
        # the small ledger, written by the code being measured
        subprocess.run([sys.executable, "-c", RELEASES, tmp], env=env, check=True)
        for i in range(2):
            run_once([args.entry, "ledger", "record", f"{tmp}/r{i}"], env)
        run_once(
            [args.entry, *COMMANDS[5][1]], env
        )  # fills the calibration cache: the timed runs read it
        for (
            _,
            argv,
            _,
        ) in COMMANDS:  # one untimed run each: bytecode and caches as after a first use
            run_once([args.entry, *argv], env)

        print(
            f"entry point {args.entry}; source {args.pythonpath or 'installed (editable)'}; {args.runs} runs per command; "
            f"{'PYTHONDONTWRITEBYTECODE as inherited' if args.no_bytecode else 'bytecode cached'}; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start"
        )
        print(
            "| command | argv | wall median (s) | wall min (s) | CPU median (s) | compute in a warm process (s) |"
        )
        print("|---|---|---:|---:|---:|---:|")
        for name, argv, snippet in COMMANDS:
            if name in COLD:
                runs = [
                    run_once([args.entry, *argv], dict(env, DPAUDIT_CACHE_DIR=f"{tmp}/cold{i}"))
                    for i in range(args.runs)
                ]
            else:
                runs = [run_once([args.entry, *argv], env) for _ in range(args.runs)]
            walls, cpus = [w for w, _ in runs], [c for _, c in runs]
            comp = f"{compute_time(snippet, env, 3):.3f}" if snippet else "-"
            print(
                f"| {name} | `dpaudit {' '.join(argv)}` | {statistics.median(walls):.3f} | {min(walls):.3f} | {statistics.median(cpus):.3f} | {comp} |",
                flush=True,
            )
        print(f"load average {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
