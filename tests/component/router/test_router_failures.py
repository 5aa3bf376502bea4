"""Failures and load: in-flight counts return to exactly zero on every path, a killed worker
costs no non-streaming request, is ejected and comes back, and imbalance spreads a prefix."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import aiohttp
import openai
import orjson
import pytest

from sglang_tpu.tasks import cancel_and_wait
from tests.component.engine.engine_process import running_requests
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    requests_by_worker,
    sample,
    start_engines,
    start_router,
    wait_ready,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

PREFIX = "A long shared system prompt about TPU serving and prefix caches. " * 10


@pytest.fixture(scope="module")
def slow_engines() -> Iterator[list[EngineTwin]]:
    """Engines on the real clock: one decode step takes about 16 ms."""
    fleet = start_engines(3, ["--time-scale", "1"], kv_events=False)
    yield fleet
    for engine in fleet:
        engine.stop()


@pytest.fixture
async def slow_router(slow_engines: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    for engine in slow_engines:  # a previous test may have killed one
        if engine.proc is None or engine.proc.poll() is not None:
            engine.start()
    app = await start_router(
        RouterConfig(
            workers=tuple(e.url for e in slow_engines),
            policy="least_load",
            health_check_interval_seconds=0.3,
            health_failure_threshold=2,
            first_byte_timeout_seconds=5,
            # Streams do not move here: these tests hold the broken-stream path (a chat
            # stream now moves by default; test_router_migration_routes.py tests that).
            migration_limit=0,
        )
    )
    await wait_ready(app, len(slow_engines))
    yield app
    await app.stop()


def client(app: RouterApp) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key="unused", max_retries=0)


async def stream_text(oa: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> str:
    stream = await oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        stream=True,
    )
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def cancel_mid_stream(oa: openai.AsyncOpenAI, prompt: str, max_tokens: int) -> None:
    """Start a stream, wait for its first chunk, then go away (cancel) while it runs."""
    first_chunk = asyncio.Event()

    async def consume() -> None:
        stream = await oa.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
        )
        async for _ in stream:
            first_chunk.set()

    task = asyncio.ensure_future(consume())
    waiter = asyncio.ensure_future(first_chunk.wait())
    await asyncio.wait({task, waiter}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done():
        task.result()  # the stream failed or ended before it could be cancelled: say why
        raise AssertionError("the stream ended before it could be cancelled mid-way")
    assert first_chunk.is_set(), "no first chunk within 10 s"
    await cancel_and_wait([task])


def all_idle(app: RouterApp) -> bool:
    return all(w.in_flight == 0 for w in app.registry.workers)


async def test_in_flight_returns_to_zero_after_every_kind_of_ending(
    slow_engines: list[EngineTwin],
) -> None:
    dead = "http://127.0.0.1:9"  # nothing listens: connect errors, retried elsewhere
    app = await start_router(
        RouterConfig(
            workers=(*(e.url for e in slow_engines), dead),
            policy="round_robin",
            health_check_interval_seconds=0,  # keep the dead worker "healthy": errors happen
            first_byte_timeout_seconds=0.4,
            request_timeout_seconds=1.0,
            outlier_consecutive_failures=1000,
            outlier_min_requests=1000,
        )
    )
    try:
        await wait_ready(app, 3)
        async with client(app) as oa:

            async def ok() -> None:
                await oa.completions.create(model=MODEL, prompt=PREFIX, max_tokens=3)

            async def rejected() -> None:
                with contextlib.suppress(openai.BadRequestError):
                    await oa.completions.create(model=MODEL, prompt="x", max_tokens=-5)

            async def first_byte_timeout() -> None:  # retried, so the last try answers
                with pytest.raises(openai.APIStatusError) as err:
                    await oa.completions.create(model=MODEL, prompt=PREFIX, max_tokens=60)
                assert err.value.status_code in (502, 504)  # 502 if the last try was dead

            async def stream_timeout() -> None:
                with pytest.raises(openai.APIError):
                    await stream_text(oa, PREFIX, 200)

            async def cancelled() -> None:
                await cancel_mid_stream(oa, PREFIX, 200)

            jobs = [ok() for _ in range(12)] + [rejected() for _ in range(4)]
            jobs += [first_byte_timeout() for _ in range(2)] + [stream_timeout() for _ in range(2)]
            jobs += [cancelled() for _ in range(3)]
            await asyncio.gather(*jobs)
        await eventually_async(
            lambda: all_idle(app), what="in-flight counts to return to zero", timeout_seconds=10
        )
        assert [w.in_flight for w in app.registry.workers] == [0, 0, 0, 0]
        for worker in app.registry.workers:
            assert sample(app, "tpuserve_router_in_flight_requests", {"worker": worker.name}) == 0
        assert sample(app, "tpuserve_router_upstream_errors_total",
                      {"worker": dead, "reason": "connect_error"}) > 0  # fmt: skip
        timeouts = sum(
            sample(app, "tpuserve_router_requests_total", {
                "model": MODEL, "worker": w.name, "route": "/v1/completions", "status": status})
            for w in app.registry.workers for status in ("502", "504")
        )  # fmt: skip
        assert timeouts == 2
    finally:
        await app.stop()


async def test_killing_a_worker_under_load_fails_no_plain_request(
    slow_router: RouterApp, slow_engines: list[EngineTwin]
) -> None:
    victim = slow_engines[0]
    worker = slow_router.registry.get(victim.url)
    assert worker is not None
    async with client(slow_router) as oa:
        streams = [asyncio.ensure_future(stream_text(oa, f"{i} " + PREFIX, 300)) for i in range(3)]
        await eventually_async(
            lambda: worker.in_flight > 0, what="a stream on the victim", timeout_seconds=5
        )

        async def plain(i: int) -> str:
            result = await oa.completions.create(model=MODEL, prompt=f"{i} {PREFIX}", max_tokens=15)
            return result.choices[0].text

        plain_jobs = [asyncio.ensure_future(plain(i)) for i in range(30)]
        await eventually_async(  # its stream and at least one plain request
            lambda: worker.in_flight >= 2, what="plain requests on the victim", timeout_seconds=5
        )
        victim.kill()
        texts = await asyncio.gather(*plain_jobs)  # any failure raises here
        assert all(texts)
        outcomes = await asyncio.gather(*streams, return_exceptions=True)
    broken = [o for o in outcomes if isinstance(o, Exception)]
    assert len(broken) == 1, outcomes
    assert isinstance(broken[0], openai.APIError)
    assert "stream broke" in str(broken[0])
    assert sample(slow_router, "tpuserve_router_upstream_errors_total",
                  {"worker": victim.url, "reason": "stream_broken"}) == 1  # fmt: skip
    await eventually_async(
        lambda: not worker.healthy, what="the dead worker to be ejected", timeout_seconds=5
    )
    await eventually_async(
        lambda: all_idle(slow_router), what="in-flight counts to return to zero", timeout_seconds=5
    )
    victim.start()
    await eventually_async(
        lambda: worker.healthy, what="re-admission within 5 s of coming back", timeout_seconds=5
    )
    async with client(slow_router) as oa:
        for i in range(3):
            await oa.completions.create(model=MODEL, prompt=f"after {i}", max_tokens=1)


async def test_imbalance_beyond_the_thresholds_spreads_a_hot_prefix(
    slow_engines: list[EngineTwin],
) -> None:
    app = await start_router(
        RouterConfig(
            workers=tuple(e.url for e in slow_engines),
            policy="cache_aware",
            policy_params={"balance_abs_threshold": "2", "balance_rel_threshold": "1.5"},
        )
    )
    try:
        await wait_ready(app, 3)
        async with client(app) as oa:
            await oa.completions.create(model=MODEL, prompt=PREFIX + "warm", max_tokens=1)
            jobs = [stream_text(oa, PREFIX + f"q{i}", 80) for i in range(12)]
            await asyncio.gather(*jobs)
        counts = requests_by_worker(app, "/v1/chat/completions")
        assert len(counts) >= 2, counts
        assert sample(app, "tpuserve_router_routing_decisions_total",
                      {"policy": "cache_aware", "outcome": "balanced_away"}) > 0  # fmt: skip
        assert all_idle(app)
    finally:
        await app.stop()


async def running_on(engines: list[EngineTwin]) -> int:
    """Requests the engines are running, together."""
    async with aiohttp.ClientSession() as session:
        return sum([await running_requests(session, engine.url) for engine in engines])


async def all_stopped(engines: list[EngineTwin]) -> bool:
    return await running_on(engines) == 0


async def test_a_client_disconnect_cancels_the_upstream_request(
    slow_router: RouterApp, slow_engines: list[EngineTwin]
) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}],
                "max_tokens": 2000, "stream": True}  # fmt: skip
        response = await session.post(slow_router.base_url + "/v1/chat/completions", json=body)
        assert response.status == 200
        await response.content.readline()  # the stream has started
        response.close()  # the client goes away mid-stream

    await eventually_async(
        lambda: all_idle(slow_router), what="the router to drop the request", timeout_seconds=5
    )

    idle: bool = await eventually_async(
        lambda: all_stopped(slow_engines),
        what="the engine to stop generating for the gone client",
        timeout_seconds=5,
    )
    assert idle
    worker = next(iter(requests_by_worker(slow_router, "/v1/chat/completions")))
    labels = {"model": MODEL, "worker": worker, "route": "/v1/chat/completions", "status": "499"}
    assert sample(slow_router, "tpuserve_router_requests_total", labels) == 1


async def test_a_client_leaving_a_plain_request_has_the_engine_abort_it(
    slow_router: RouterApp, slow_engines: list[EngineTwin]
) -> None:
    body = orjson.dumps({"model": MODEL, "prompt": "go on", "max_tokens": 2000})
    _, writer = await asyncio.open_connection("127.0.0.1", slow_router.port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )

    await eventually_async(lambda: running_on(slow_engines), what="the engine generating")
    writer.close()  # the client goes away before the answer

    await eventually_async(
        lambda: all_stopped(slow_engines), what="the engine to stop generating", timeout_seconds=5
    )
    aborted = sum(
        sample(slow_router, "tpuserve_router_upstream_aborts_total",
               {"worker": e.url, "reason": "client_gone"})
        for e in slow_engines
    )  # fmt: skip
    assert aborted == 1  # the router asked: the engine did not wait for its next check
