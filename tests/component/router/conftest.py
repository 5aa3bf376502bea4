"""Shared fixtures: engine twins started once per module, a router per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.component.router.kv_publisher import PAGE
from tests.component.router.router_fleet import EngineTwin, start_engines, start_router
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig


@pytest.fixture(scope="module")
def engines() -> Iterator[list[EngineTwin]]:
    """Three engine twins at --time-scale 0 with KV events, shared by a module's tests."""
    fleet = start_engines(3, ["--time-scale", "0"])
    yield fleet
    for engine in fleet:
        engine.stop()


@pytest.fixture
async def router(engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    """A cache_aware router in front of the module's engines, ready to serve."""
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        policy="cache_aware",
        health_check_interval_seconds=0.5,
    )
    app = await start_router(config, ready_workers=len(engines))
    yield app
    await app.stop()


@pytest.fixture(scope="module")
def plain_engine() -> Iterator[EngineTwin]:
    """An engine twin that publishes no KV events of its own (a `Publisher` stands in)."""
    # a pool of 131,072 pages: the stream of a worker added with its endpoint is bounded by
    # it too (issue 68), and the longest replay here is 80,000 pages
    engine = EngineTwin(
        ["--time-scale", "0", "--page-size", str(PAGE), "--cache-tokens", str(PAGE << 17)],
        kv_events=False,
    )
    engine.start()
    yield engine
    engine.stop()
