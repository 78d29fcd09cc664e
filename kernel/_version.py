"""ctlwire's version, read from the installed distribution's metadata.

The one place the version is written is ``pyproject.toml``; this reads it back
so that ``ctlwire.kernel.__version__`` and ``ctlwire --version`` cannot drift
from what ``pip`` installed.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__: str = version("ctlwire")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"
