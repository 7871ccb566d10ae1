"""dpaudit: train differentially private models, account for every release, audit them."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("dpaudit")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.1.0"

__all__ = ["__version__"]
