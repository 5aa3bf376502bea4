"""The router's version comes from package metadata (or the source tree's pyproject.toml),
never from the `tpuserve` command package, which the router must not import."""

from __future__ import annotations

import ast
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.version import DISTRIBUTION, router_version, source_tree_version

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
ROUTER_PACKAGE = ROOT / "router" / "tpuserve_router"


def test_the_version_is_the_installed_distributions() -> None:
    assert router_version() == version(DISTRIBUTION)


def test_a_source_tree_gives_its_pyproject_version() -> None:
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert source_tree_version(ROOT / "pyproject.toml") == expected


@pytest.mark.parametrize(
    "text",
    ["", "[project]\nname = 'other'\nversion = '9.9'\n", "[project]\nname = 'tpuserve'\n", "= x"],
    ids=["empty", "another-project", "no-version", "not-toml"],
)
def test_a_pyproject_that_names_no_tpuserve_version_gives_none(tmp_path: Path, text: str) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(text)
    assert source_tree_version(pyproject) is None
    assert source_tree_version(tmp_path / "missing.toml") is None


def test_the_info_series_carries_the_version() -> None:
    registry = CollectorRegistry()
    app = RouterApp(RouterConfig(policy="round_robin"), registry=registry)
    labels = {"policy": app.policy.name, "version": router_version()}
    assert registry.get_sample_value("tpuserve_router_info", labels) == 1.0


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_router_never_imports_the_command_package() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if m == "tpuserve" or m.startswith("tpuserve.")
        )
        for path in sorted(ROUTER_PACKAGE.rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
