"""The operator takes its version (default image tags) from the tpuserve distribution's
metadata, or from the source tree's pyproject.toml when tpuserve is not installed; it never
imports the `tpuserve` command package."""

from __future__ import annotations

import ast
import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from tpuserve_operator import version
from tpuserve_operator.render.context import DEFAULT_ENGINE_IMAGE, DEFAULT_IMAGE

pytestmark = pytest.mark.unit


def test_the_version_is_the_installed_distributions() -> None:
    assert importlib.metadata.version("tpuserve") == version.VERSION
    assert DEFAULT_IMAGE.endswith(f":{version.VERSION}")
    assert DEFAULT_ENGINE_IMAGE.endswith(f":{version.VERSION}")


def test_without_an_install_the_source_trees_pyproject_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with version.PYPROJECT.open("rb") as file:
        expected = tomllib.load(file)["project"]["version"]
    assert version.package_version() == expected


def test_the_operator_never_imports_the_command_package() -> None:
    """Libraries do not import the `tpuserve` command (it imports them)."""
    package = Path(version.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(n == "tpuserve" or n.startswith("tpuserve.") for n in names):
                offenders.append(f"{path.relative_to(package)}:{node.lineno}")
    assert offenders == []
