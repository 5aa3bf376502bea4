"""Every mode runs the one request pipeline (`tpuserve_router.pipeline.stages`): a request's walk,
recorded by the profiler (`walk`), runs admission, selection, the relay and the one ledger
in that order on the HTTP port (whole and streamed), on a prefill/decode pair, and through
the endpoint picker (no relay: its gateway relays); none of them skips the ledger."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

from tests.component.router.gateway_emulator import PickerClient
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    sample,
    start_router,
    wait_ready,
)
from tests.component.router.test_router_pd import LONG, Fleet, how
from tests.component.router.test_router_pd import fleet as fleet  # the PD twins, shared
from tests.component.router.walk import Walk, walked
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.pipeline.stages import STAGES

pytestmark = pytest.mark.component

STAGE_OF = {
    "Pipeline.admit": "admit",
    "Pipeline.admit_now": "admit",
    "Selector.select": "select",
    "Selector.select_single": "select",
    "SingleRelay.relay": "relay",
    "PairRelay.relay": "relay",
    "Ledger.close": "account",
}
"""The functions that run each stage, by qualified name (the walk records them)."""
ANSWERED = {"route": "/v1/completions", "status": "200"}


def test_the_recorded_functions_are_the_stages() -> None:
    assert set(STAGE_OF.values()) == set(STAGES)


@pytest.fixture
async def colocated(engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    config = RouterConfig(
        workers=tuple(e.url for e in engines),
        policy="cache_aware",
        health_check_interval_seconds=0.5,
        picker_port=0,
    )
    app = await start_router(config, ready_workers=len(engines))
    yield app
    await app.stop()


def answered(app: RouterApp) -> float:
    return sum(
        sample(app, "tpuserve_router_requests_total", {**ANSWERED, "model": MODEL, "worker": w})
        for w in (worker.name for worker in app.registry.workers)
    )


async def post(app: RouterApp, body: dict[str, object]) -> Walk:
    async with aiohttp.ClientSession() as session:
        with walked(STAGE_OF) as walk:
            async with session.post(app.base_url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.read()
                await r.read()
    return walk


@pytest.mark.parametrize("stream", [False, True])
async def test_the_http_port_walks_the_stages_in_order(colocated: RouterApp, stream: bool) -> None:
    before = answered(colocated)
    walk = await post(colocated, {"model": MODEL, "prompt": "pipeline", "stream": stream})
    assert walk.stages == ["admit", "select", "relay", "account"], walk.top()
    assert answered(colocated) == before + 1
    assert colocated.pipeline.in_flight == 0


async def test_the_picker_walks_the_same_stages_but_the_relay(colocated: RouterApp) -> None:
    assert colocated.picker is not None
    client = PickerClient(f"127.0.0.1:{colocated.picker.port}")
    before = answered(colocated)
    try:
        with walked(STAGE_OF) as walk:
            exchange = await client.exchange(
                "/v1/completions", orjson.dumps({"model": MODEL, "prompt": "picked"})
            )
    finally:
        await client.close()
    assert exchange.status == 200
    assert walk.stages == ["admit", "select", "account"], walk.top()
    assert "front/forwarding.py" not in walk.entries  # the HTTP port's front and relay
    assert answered(colocated) == before + 1
    assert colocated.pipeline.in_flight == 0


async def test_a_pair_walks_the_stages_in_order(fleet: Fleet) -> None:
    app = await start_router(fleet.config())
    try:
        await wait_ready(app, len(fleet.engines))
        walk = await post(app, {"prompt": LONG, "max_tokens": 4})
        assert how(app, "disaggregated") == 1
        assert walk.stages == ["admit", "select", "relay", "account"], walk.top()
        assert app.pipeline.in_flight == 0
    finally:
        await app.stop()
