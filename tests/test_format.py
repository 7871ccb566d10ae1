"""Every Python file in the repository is as the pinned formatter writes it, and the package has no
undefined name or unused import (pyproject's [tool.ruff])."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_python_file_is_formatted():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_has_no_undefined_name_or_unused_import():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--output-format", "concise", "src"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
