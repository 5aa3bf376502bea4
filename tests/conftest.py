"""Shared pytest configuration: every test carries exactly one of the unit/component/e2e markers.

`real_sglang` is an additional marker: a test that uses the real-SGLang fixtures
(`tests/real_sglang.py`) must carry it, so `-m "not real_sglang"` deselects every such test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import real_sglang
from tests.real_sglang import real_engine, real_engines, real_sglang_installation

__all__ = ["real_engine", "real_engines", "real_sglang_installation"]  # fixtures, registered here

SUITE_MARKERS = ("unit", "component", "e2e")
# tests/tpu needs a TPU chip: only scripts/tpu-lane.sh runs it (with its own pytest.ini), so
# neither CI nor any -m selection here collects, runs or counts it.
collect_ignore = ["tpu"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("tpu"):
            raise pytest.UsageError(f"{item.nodeid} needs a TPU: run it with scripts/tpu-lane.sh")
        found = [m for m in SUITE_MARKERS if item.get_closest_marker(m)]
        if len(found) != 1:
            raise pytest.UsageError(
                f"{item.nodeid} must carry exactly one of the markers {SUITE_MARKERS}, has {found}"
            )
        uses_real = set(real_sglang.FIXTURE_NAMES) & set(getattr(item, "fixturenames", ()))
        if uses_real and not item.get_closest_marker("real_sglang"):
            raise pytest.UsageError(
                f"{item.nodeid} uses {sorted(uses_real)} and must carry the real_sglang marker"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and item.get_closest_marker("real_sglang"):
        logs = real_sglang.log_report()
        if logs:
            report.sections.append(("real SGLang engine logs", logs))
