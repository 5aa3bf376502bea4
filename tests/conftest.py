"""Shared pytest configuration: every test carries exactly one of the unit/component/e2e markers."""

from __future__ import annotations

import pytest

SUITE_MARKERS = ("unit", "component", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        found = [m for m in SUITE_MARKERS if item.get_closest_marker(m)]
        if len(found) != 1:
            raise pytest.UsageError(
                f"{item.nodeid} must carry exactly one of the markers {SUITE_MARKERS}, has {found}"
            )
