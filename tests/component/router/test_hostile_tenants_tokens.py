"""A key's ``tokens_per_minute`` holds against a hostile tenant (issue 47).

A real router with API keys fronts one engine twin; a key limited to 200 tokens a minute tries
to take more through the official ``openai`` client: by hanging up on streams, by sending
requests at once, and by negative or absurd ``max_tokens``. Whatever it does, the tokens it
takes — counted by the engine (every prefilled and decoded token, aborted requests' too) and
by the router's ``tpuserve_router_tenant_tokens_total`` — stay within 200 for every minute the
attempt spans, and the router's counters never go down.

No assertion reads the clock as a result: the bound is 200 × the number of minutes the attempt
took (one, unless the machine is very slow), which holds however long it takes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.component.engine.engine_process import running_requests
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    start_engines,
    start_router,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig
from tpuserve_router.tenancy.auth import digest_of, key_id

pytestmark = pytest.mark.component
log = logging.getLogger(__name__)

LIMIT = 200  # tokens a minute
KEY = "sk-hostile-0123456789abcdef"
PROMPT = "Tell me everything about tensor processing units, their memory and their " * 3


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineTwin]:
    """One twin at half its modelled speed, so a stream is still running when it is left."""
    (twin,) = start_engines(1, ["--time-scale", "0.5"])
    yield twin
    twin.stop()


@pytest.fixture
async def router(engine: EngineTwin, tmp_path: Path) -> AsyncIterator[RouterApp]:
    """A router counting prompt tokens exactly (``precise`` tokenizes as the engine does),
    with one key of `LIMIT` tokens a minute."""
    keys = tmp_path / "keys.json"
    entry = {"key": KEY, "tenant": "hostile", "tokens_per_minute": LIMIT}
    keys.write_bytes(orjson.dumps({"keys": [entry]}))
    config = RouterConfig(
        workers=(engine.url,), policy="precise", health_check_interval_seconds=0.5,
        api_keys_file=str(keys),
    )  # fmt: skip
    app = await start_router(config, ready_workers=1)
    yield app
    await app.stop()


def client(app: RouterApp) -> openai.AsyncOpenAI:
    """The tenant's client; it does not retry a 429 (it would wait out the minute)."""
    return openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key=KEY, max_retries=0)


async def engine_tokens(engine: EngineTwin) -> float:
    """Every token the engine prefilled or decoded (``sglang:realtime_tokens_total``)."""
    async with aiohttp.ClientSession() as session, session.get(engine.url + "/metrics") as r:
        text = await r.text()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sglang:realtime_tokens_total"
    )


def tenant_tokens(app: RouterApp) -> float:
    registry = app.metrics.registry
    return sum(
        registry.get_sample_value(
            "tpuserve_router_tenant_tokens_total",
            {"key": key_id(digest_of(KEY.encode())), "kind": kind},
        )
        or 0.0
        for kind in ("prompt", "completion")
    )


class Ledger:
    """What the tenant took, from the engine's and the router's counts, and the router's
    counter read after every step (it must never go down)."""

    def __init__(self, app: RouterApp, engine: EngineTwin) -> None:
        self.app = app
        self.engine = engine
        self.readings: list[float] = []

    async def __aenter__(self) -> Ledger:
        self.started = time.monotonic()
        self.engine_before = await engine_tokens(self.engine)
        self.read()
        return self

    def read(self) -> None:
        self.readings.append(tenant_tokens(self.app))

    async def settled(self) -> None:
        """Wait until nothing of the tenant's runs, on the router or the engine."""

        async def idle() -> bool:
            async with aiohttp.ClientSession() as session:
                busy = await running_requests(session, self.engine.url)
            return not busy and self.app.pipeline.in_flight == 0

        await eventually_async(idle, what="the tenant's requests ended")
        self.read()

    async def __aexit__(self, *exc: object) -> None:
        if exc[0] is not None:
            return
        await self.settled()
        minutes = math.ceil((time.monotonic() - self.started) / 60)
        taken_on_engine = await engine_tokens(self.engine) - self.engine_before
        log.info(
            "tokens taken by a %d/min key in %d minute(s): %.0f on the engine, %.0f counted "
            "by the router; its counter read %d times, never lower: %s",
            LIMIT, minutes, taken_on_engine, self.readings[-1], len(self.readings),
            self.readings == sorted(self.readings),
        )  # fmt: skip
        assert 0 < taken_on_engine <= LIMIT * minutes
        assert 0 < self.readings[-1] <= LIMIT * minutes
        assert self.readings == sorted(self.readings), self.readings  # never went down


async def attempt(ledger: Ledger, request: Callable[[], Awaitable[Any]]) -> str:
    """One request; "ok", or why it was refused. The router's counter is read after it."""
    try:
        await request()
        result = "ok"
    except openai.RateLimitError:
        result = "429"
    except openai.BadRequestError as err:
        result = f"400 {err.body['param'] if isinstance(err.body, dict) else err.body}"
    await ledger.settled()
    return result


async def test_hanging_up_on_streams_takes_no_more_than_the_limit(
    router: RouterApp, engine: EngineTwin
) -> None:
    async with client(router) as oa, Ledger(router, engine) as ledger:

        async def leave_a_stream() -> None:
            stream = await oa.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                max_tokens=100, stream=True,
            )  # fmt: skip
            async for _ in stream:
                break
            await stream.close()

        results = [await attempt(ledger, leave_a_stream) for _ in range(12)]
    assert results[0] == "ok"
    assert "429" in results


async def test_requests_sent_at_once_take_no_more_than_the_limit(
    router: RouterApp, engine: EngineTwin
) -> None:
    async with client(router) as oa, Ledger(router, engine) as ledger:

        async def complete() -> str:
            try:
                await oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20)
            except openai.RateLimitError:
                return "429"
            return "ok"

        first = await asyncio.gather(*(complete() for _ in range(12)))
        await ledger.settled()
        again = await asyncio.gather(*(complete() for _ in range(12)))
    assert "ok" in first
    assert "429" in first
    assert "429" in again


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": -(10**15)}, "max_tokens"),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 10**15}, "max_tokens"),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2.5}, "max_tokens"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": -5},
         "max_completion_tokens"),
        ("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": -(10**15)}},
         "sampling_params.max_new_tokens"),
    ],
)  # fmt: skip
async def test_negative_or_absurd_max_tokens_are_refused_and_refill_nothing(
    router: RouterApp, engine: EngineTwin, path: str, body: dict[str, Any], param: str
) -> None:
    refusals = []
    async with client(router) as oa, Ledger(router, engine) as ledger:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(
                    router.base_url + path,
                    json={"model": MODEL, **body},
                    headers={"Authorization": f"Bearer {KEY}"},
                ) as answer:
                    refusals.append((answer.status, await answer.json()))
                ledger.read()

        async def complete() -> Any:
            return await oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=50)

        results = await asyncio.gather(*(attempt(ledger, complete) for _ in range(12)))
    assert "ok" in results
    assert "429" in results
    for status, refusal in refusals:  # refused by the router, naming the field
        assert status == 400
        assert refusal["error"]["param"] == param
        assert refusal["error"]["message"].startswith(f"{param}: ")
