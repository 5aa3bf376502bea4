"""Fixtures for the chart tests: the real helm binary and a renderer returning parsed objects."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.chart_helpers import Render, find_tool, make_renderer


@pytest.fixture(scope="session")
def helm() -> Path:
    return find_tool("helm")


@pytest.fixture(scope="session")
def render(helm: Path) -> Render:
    return make_renderer(helm)
