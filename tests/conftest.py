"""Shared pytest configuration: every test carries exactly one of the unit/component/e2e markers.

`real_sglang` is an additional marker: a test that uses the real-SGLang fixtures
(`tests/real_sglang.py`) must carry it, so `-m "not real_sglang"` deselects every such test.

Under pytest-xdist (`-n 2 --dist loadgroup`, as scripts/test.sh runs the suites) each test gets
an `xdist_group` (`xdist_group` below says which), so what a group shares starts once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import real_sglang, real_sglang_jax
from tests.real_sglang import (
    real_engine,
    real_engine_pool,
    real_engines,
    real_sglang_installation,
)
from tests.real_sglang_jax import real_jax_engine, real_sglang_jax_installation

# fixtures, registered here
__all__ = [
    "real_engine",
    "real_engine_pool",
    "real_engines",
    "real_jax_engine",
    "real_sglang_installation",
    "real_sglang_jax_installation",
]

SUITE_MARKERS = ("unit", "component", "e2e")
# tests/tpu needs a TPU chip: only scripts/tpu-lane.sh runs it (with its own pytest.ini), so
# neither CI nor any -m selection here collects, runs or counts it.
collect_ignore = ["tpu"]


def xdist_group(item: pytest.Item, suite: str) -> str | None:
    """The pytest-xdist group of a test (`--dist loadgroup` runs a group on one worker), or
    None for a test any worker may run on its own.

    - every real-SGLang test: one group, so the session's engine pool (tests/real_sglang.py)
      is started once, on one worker; every real-SGLang-JAX test (opt-in build): another;
    - an e2e test: the group of the control plane it uses (`cluster`, or for the living cluster
      `living_cluster` or `living_cluster_2` by module), so each worker starts one control plane;
    - any other component test: its module, so a module's fixtures (engine twins, routers,
      Prometheus) start once;
    - a unit test: none.
    """
    names = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("real_sglang"):
        return "real_sglang"
    if item.get_closest_marker("real_sglang_jax"):
        return "real_sglang_jax"
    if suite == "e2e":
        if "living_cluster" not in names:
            return "cluster"
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        return "living_cluster_2" if module in SECOND_LIVING_CLUSTER else "living_cluster"
    if suite == "component":
        return item.nodeid.split("::", 1)[0]
    return None


# The groups that take longest, in the order an xdist run starts them (each on a worker of its
# own): the living-cluster modules (mostly waiting on timers: HPA windows, idle periods, drain
# grace), the session cluster's, the real-SGLang engines'. Everything else follows in collection
# order and fills the workers around them (scripts/test.sh passes `--no-loadscope-reorder`, so
# xdist keeps this order instead of sorting groups by their number of tests).
LONGEST_FIRST = ("living_cluster", "living_cluster_2", "cluster", "real_sglang")
SECOND_LIVING_CLUSTER = frozenset({"test_drain.py"})
"""The living-cluster modules that run on a second living cluster (a group of their own): the
chain of waits on one cluster (~570 s) splits in two of ~260 and ~310 s."""


def start_order(item: pytest.Item) -> int:
    mark = item.get_closest_marker("xdist_group")
    group = mark.args[0] if mark is not None else None
    return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if item.get_closest_marker("tpu"):
            raise pytest.UsageError(f"{item.nodeid} needs a TPU: run it with scripts/tpu-lane.sh")
        found = [m for m in SUITE_MARKERS if item.get_closest_marker(m)]
        if len(found) != 1:
            raise pytest.UsageError(
                f"{item.nodeid} must carry exactly one of the markers {SUITE_MARKERS}, has {found}"
            )
        for module, marker in ((real_sglang, "real_sglang"), (real_sglang_jax, "real_sglang_jax")):
            uses_real = set(module.FIXTURE_NAMES) & set(getattr(item, "fixturenames", ()))
            if uses_real and not item.get_closest_marker(marker):
                raise pytest.UsageError(
                    f"{item.nodeid} uses {sorted(uses_real)} and must carry the {marker} marker"
                )
        group = xdist_group(item, found[0]) if grouped else None
        if group is not None and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        items.sort(key=start_order)  # stable: collection order within each rank


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    """On a pytest-xdist worker under `--dist loadgroup`, a grouped test's node id carries its
    group (pytest-xdist appends `@group`; its scheduler groups by that). A pytest that silently
    undoes it (pytest-dev/pytest-xdist#1386) would start the real-SGLang pool on every worker:
    such a test fails instead, before its fixtures start anything."""
    mark = item.get_closest_marker("xdist_group")
    loadgroup = getattr(item.config.option, "loadgroup", False)  # set on xdist workers only
    if mark is not None and loadgroup and "@" not in item.nodeid:
        pytest.fail(
            f"its xdist_group {mark.args[0]!r} did not reach pytest-xdist's scheduler (pytest "
            f"{pytest.__version__}; pytest-dev/pytest-xdist#1386): install the dev extra's pytest "
            "range, or run with TPUSERVE_TEST_WORKERS=0",
            pytrace=False,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and item.get_closest_marker("real_sglang"):
        logs = real_sglang.log_report()
        if logs:
            report.sections.append(("real SGLang engine logs", logs))
