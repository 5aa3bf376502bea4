"""One version for every part, from package metadata (or the source tree's pyproject.toml)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import tpuserve
from sglang_tpu import version
from sglang_tpu.version import DISTRIBUTION, source_tree_version, tpuserve_version
from tpuserve_operator.render.context import DEFAULT_ENGINE_IMAGE, DEFAULT_IMAGE
from tpuserve_router.app import create_router_app
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def test_the_version_is_the_installed_distributions() -> None:
    assert tpuserve_version() == importlib.metadata.version(DISTRIBUTION)
    assert tpuserve.__version__ == tpuserve_version()


def test_the_operators_default_images_carry_the_version() -> None:
    assert DEFAULT_IMAGE.endswith(f":{tpuserve_version()}")
    assert DEFAULT_ENGINE_IMAGE.endswith(f":{tpuserve_version()}")


def test_the_routers_info_series_carries_the_version() -> None:
    registry = CollectorRegistry()
    app = create_router_app(RouterConfig(policy="round_robin"), registry=registry)
    labels = {"policy": app.policy.name, "version": tpuserve_version()}
    assert registry.get_sample_value("tpuserve_router_info", labels) == 1.0


def test_without_an_install_the_source_trees_pyproject_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version, "version", not_installed)
    tpuserve_version.cache_clear()
    try:
        expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
        assert tpuserve_version() == expected
    finally:
        tpuserve_version.cache_clear()


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
