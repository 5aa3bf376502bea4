"""The tpuserve release the operator belongs to, from the installed distribution's metadata.

Run from a source tree with no install, it is read from the tree's pyproject.toml instead.
"""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

DISTRIBUTION = "tpuserve"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def package_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        with PYPROJECT.open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])


VERSION = package_version()
