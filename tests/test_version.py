"""The version string in the package equals pyproject.toml's and the installed distribution's."""

import tomllib
from importlib.metadata import version
from pathlib import Path

import dpaudit


def test_version_matches_pyproject_and_metadata():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert dpaudit.__version__ == pyproject["project"]["version"]
    assert dpaudit.__version__ == version("dpaudit")
