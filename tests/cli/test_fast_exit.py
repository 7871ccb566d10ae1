"""The `dpaudit` entry point skips the interpreter's teardown after torch or NumPy ran (dpaudit.cli.main), but never
the exit handlers, the buffered output or the exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import dpaudit

SRC = str(Path(dpaudit.__file__).resolve().parents[1])

SCRIPT = """
import atexit, sys
import {stack}
from pathlib import Path
marker = Path(sys.argv[1])
atexit.register(lambda: marker.write_text("handler ran"))
sys.stdout.write("buffered, no newline")
class Teardown:
    def __del__(self):
        sys.stderr.write("interpreter teardown ran")
kept = Teardown()  # collected only by the interpreter's teardown
from dpaudit.cli import main
sys.argv = ["dpaudit", *sys.argv[2:]]
main()
"""


def _run(tmp_path, *argv, stack="torch"):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    marker = tmp_path / "marker.txt"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(stack=stack), str(marker), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return done, marker


@pytest.mark.parametrize("stack", ["torch", "numpy"])  # a module's run, a head's run (no torch)
def test_after_torch_or_numpy_the_exit_handlers_output_and_code_survive(tmp_path, stack):
    done, marker = _run(tmp_path, "--version", stack=stack)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.startswith("buffered, no newline")
        and f"dpaudit {dpaudit.__version__}" in done.stdout
    )
    assert marker.read_text() == "handler ran"
    assert (
        "interpreter teardown ran" not in done.stderr
    )  # the ~0.65 s of torch's finalisers were skipped


def test_a_refused_argument_keeps_its_exit_code(tmp_path):
    done, marker = _run(tmp_path, "train", "dp-rvfl", "--eps", "-1")
    assert done.returncode == 2, done.stderr
    assert "--eps" in done.stderr
    assert marker.read_text() == "handler ran"
