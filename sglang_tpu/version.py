"""The tpuserve release every part reports (router info series, operator image tags, the CLI).

It is the installed ``tpuserve`` distribution's version, read from package metadata, so the
libraries (router, operator) never import the `tpuserve` command for it. In a source tree that
is not installed, the version comes from the tree's ``pyproject.toml``.
"""

from __future__ import annotations

import functools
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Final

DISTRIBUTION: Final = "tpuserve"
UNKNOWN_VERSION: Final = "0+unknown"
"""The version when neither metadata nor a ``pyproject.toml`` names one."""

_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@functools.cache
def tpuserve_version() -> str:
    """The ``tpuserve`` distribution's version (see the module docstring for the fallback)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return source_tree_version(_PYPROJECT) or UNKNOWN_VERSION


def source_tree_version(pyproject: Path) -> str | None:
    """``project.version`` of ``pyproject`` when it describes the ``tpuserve`` distribution."""
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if not isinstance(project, dict) or project.get("name") != DISTRIBUTION:
        return None
    found = project.get("version")
    return found if isinstance(found, str) else None
