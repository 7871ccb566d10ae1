"""dpaudit: train differentially private models, account for every release, audit them."""

# Written here rather than read with importlib.metadata (~70 ms at every start-up of the CLI);
# tests/test_version.py keeps it equal to pyproject.toml and to the installed metadata.
__version__ = "0.1.0"
