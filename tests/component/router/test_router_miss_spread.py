"""At low load `precise` spreads new conversations over the engines: a request no engine holds
goes to the least loaded engine, ties broken by the fewest cached blocks (the KV events' and
the router's predictions), then by a rotating cursor, never by list order. Through the HTTP
front and through the endpoint picker, which asks the same policy."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator

import openai
import orjson
import pytest

from tests.component.router.gateway_emulator import PickerClient
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    requests_by_worker,
    start_engines,
    start_router,
    wait_caught_up,
    wait_ready,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

ENGINES = 4
CONVERSATIONS = 12


def new_prompt(i: int) -> str:
    """A prompt no other shares a page with, each as long as the others (same block count)."""
    return f"Conversation {i:02d} opens here, about nothing any other one said before. " * 6


@pytest.fixture(scope="module")
def four_engines() -> Iterator[list[EngineTwin]]:
    fleet = start_engines(ENGINES, ["--time-scale", "0", "--page-size", "16"])
    yield fleet
    for engine in fleet:
        engine.stop()


@pytest.fixture
async def precise(four_engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    app = await start_router(
        RouterConfig(
            workers=tuple(e.url for e in four_engines),
            policy="precise",
            health_check_interval_seconds=0.5,
            picker_port=0,
        )
    )
    await wait_ready(app, ENGINES)
    await wait_caught_up(app, [e.url for e in four_engines])
    yield app
    await app.stop()


def settled(app: RouterApp) -> bool:
    return all(w.in_flight == 0 for w in app.registry.workers)


def assert_spread(chosen: list[str]) -> None:
    per_engine = Counter(chosen)
    assert len(per_engine) == ENGINES, per_engine  # every engine got some, none was left idle
    assert sorted(per_engine.values()) == [CONVERSATIONS // ENGINES] * ENGINES, per_engine


async def test_sequential_new_conversations_spread_over_the_engines(precise: RouterApp) -> None:
    async with openai.AsyncOpenAI(base_url=precise.base_url + "/v1", api_key="x") as oa:
        for i in range(CONVERSATIONS):
            await oa.completions.create(model=MODEL, prompt=new_prompt(i), max_tokens=1)
            await eventually_async(lambda: settled(precise), what="the request accounted for")
    per_worker = requests_by_worker(precise)
    assert_spread([w for w, n in per_worker.items() for _ in range(int(n))])


async def test_the_picker_spreads_them_alike(precise: RouterApp) -> None:
    assert precise.picker is not None
    gateway = PickerClient(f"127.0.0.1:{precise.picker.port}")
    chosen: list[str] = []
    try:
        for i in range(CONVERSATIONS):
            body = orjson.dumps({"model": MODEL, "prompt": new_prompt(100 + i), "max_tokens": 1})
            result = await gateway.exchange("/v1/completions", body)
            assert result.status == 200
            chosen.append(result.endpoints[0])
            await eventually_async(lambda: settled(precise), what="the request accounted for")
    finally:
        await gateway.close()
    assert_spread(chosen)
