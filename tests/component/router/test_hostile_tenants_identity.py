"""A hostile tenant cannot stop other clients' requests through request ids (issue 47).

SGLang 0.5.23 aborts every request whose id starts with the one it is asked to abort (the engine
twin copies that rule). Here a real router fronts one engine twin on a slowed clock; 16 victims
ask it for long completions through the official ``openai`` client, half with a ``rid`` of their
own. Meanwhile another client sends requests carrying rids of every kind — an id the router
gave one of its earlier answers and prefixes of it, ``""``, ``null``, short prefixes, the
victims' own rids and prefixes of them — and hangs up on each, so the router aborts each on the
engine. Every victim still gets its whole answer, with its own rid back, and the engine aborted
the hostile client's requests and nothing else. A request the engine does abort answers
``finish_reason: "abort"``, as SGLang's does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
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
    sample,
    start_engines,
    start_router,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

VICTIMS = 16
VICTIM_TOKENS = 1000
ROUTER_ID = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineTwin]:
    """One twin at half its modelled speed: 16 requests of 1,000 tokens run for seconds."""
    (twin,) = start_engines(1, ["--time-scale", "0.5"])
    yield twin
    twin.stop()


@pytest.fixture
async def router(engine: EngineTwin) -> AsyncIterator[RouterApp]:
    config = RouterConfig(
        workers=(engine.url,), policy="round_robin", health_check_interval_seconds=0.5
    )
    app = await start_router(config, ready_workers=1)
    yield app
    await app.stop()


def client(app: RouterApp) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key="unused", max_retries=0)


async def aborted_on_engine(engine: EngineTwin) -> float:
    """``sglang:num_aborted_requests_total`` of the twin."""
    async with aiohttp.ClientSession() as session, session.get(engine.url + "/metrics") as r:
        text = await r.text()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sglang:num_aborted_requests_total"
    )


async def engine_running(engine: EngineTwin) -> int:
    async with aiohttp.ClientSession() as session:
        return await running_requests(session, engine.url)


def victim_rid(i: int) -> str | None:
    """Even victims name their requests; odd ones leave it to the router."""
    return f"victim-{i}" if i % 2 == 0 else None


async def victim(oa: openai.AsyncOpenAI, i: int) -> Any:
    rid = victim_rid(i)
    return await oa.completions.create(
        model=MODEL,
        prompt=f"victim {i} asks for a long story",
        max_tokens=VICTIM_TOKENS,
        extra_body={"rid": rid} if rid is not None else None,
    )


async def hang_up_on_a_stream(oa: openai.AsyncOpenAI, rid: str | None) -> None:
    """A streamed request with ``rid`` (None: JSON null), left after its first chunk."""
    stream = await oa.completions.create(
        model=MODEL,
        prompt="the hostile tenant's request",
        max_tokens=VICTIM_TOKENS,
        stream=True,
        extra_body={"rid": rid},
    )
    async for _ in stream:
        break
    await stream.close()


def dispatched(app: RouterApp) -> float:
    """Requests the router has sent to the engine so far: those in flight plus those
    answered. Unlike the in-flight count alone, a victim finishing does not lower it (on a
    busy machine the victims can end while the hostile client is still at work).

    In flight means the router's own: ``Worker.in_flight`` also holds what the load polls
    saw on the engine beyond them (``peer_in_flight``), and an aborted stream the engine
    has not yet let go counts there (a poll sees 17 running for the router's 16). Counted
    in, it made ``sent`` one too high, and the next request's dispatch looked like none
    when the engine let the aborted one go (a run on a loaded machine: 'sent on 0 (from
    31)' with the request in flight)."""
    worker = app.registry.workers[0]
    answered = sum(
        s.value
        for family in app.metrics.registry.collect()
        if family.name == "tpuserve_router_requests"
        for s in family.samples
        if s.name.endswith("_total") and s.labels["worker"] == worker.name
    )
    return worker.in_flight - worker.peer_in_flight + answered


async def hang_up_on_a_plain_request(app: RouterApp, rid: str) -> None:
    """A non-streamed ``/generate`` with ``rid``, left once the router has sent it on."""
    sent = dispatched(app)
    body = orjson.dumps(
        {"text": "the hostile tenant's plain request", "rid": rid,
         "sampling_params": {"max_new_tokens": VICTIM_TOKENS}}
    )  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", app.port)
    writer.write(
        b"POST /generate HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )
    answer = asyncio.ensure_future(reader.read(512))
    loop = asyncio.get_running_loop()
    began = loop.time()

    def where() -> str:  # what the router had done with it, should it never go on
        worker = app.registry.workers[0]
        phases = sorted(str(getattr(conn, "phase", "?")) for conn in app.book.open)
        return (
            f"rid {rid!r} after {loop.time() - began:.1f} s of loop time: sent on "
            f"{dispatched(app) - sent:g} (from {sent:g}); worker {worker!r} (polled beyond the "
            f"router's own {worker.peer_in_flight}); router in flight "
            f"{app.pipeline.in_flight}; connections open {len(app.book.open)} (phases "
            f"{phases}), idle {len(app.book.waiting)}, buffered {app.book.buffers.used} bytes"
        )

    try:  # an answer before the request went on (the router refused it) fails here, shown
        await eventually_async(
            lambda: dispatched(app) > sent or answer.done(),
            what="the hostile request sent on",
            context=where,
        )
        assert not answer.done(), f"the router answered instead: {answer.result()!r}"
    finally:
        answer.cancel()
        writer.close()


def client_gone(app: RouterApp) -> float:
    return sample(
        app,
        "tpuserve_router_upstream_aborts_total",
        {"worker": app.registry.workers[0].name, "reason": "client_gone"},
    )


async def aborted_by_the_router(app: RouterApp, count: int) -> None:
    def done() -> bool:
        return client_gone(app) == count

    await eventually_async(done, what=f"{count} aborts sent by the router")


async def test_victims_finish_in_full_while_another_client_aborts_with_every_kind_of_rid(
    router: RouterApp, engine: EngineTwin
) -> None:
    async with client(router) as oa:
        learned = (await oa.completions.create(model=MODEL, prompt="probe", max_tokens=1)).id
        aborted_before = await aborted_on_engine(engine)
        victims = [asyncio.ensure_future(victim(oa, i)) for i in range(VICTIMS)]
        try:

            async def all_running() -> bool:
                return await engine_running(engine) >= VICTIMS

            await eventually_async(all_running, what="the victims running on the engine")
            streamed = [
                learned, learned[:16], learned[:8], learned[:1], "", None,
                "victim", "victim-1", "victim-0", "v", "0", "a", "f",
            ]  # fmt: skip
            plain = [learned[:4], "victim-", "victim-2", ""]
            for n, rid in enumerate(streamed):
                await hang_up_on_a_stream(oa, rid)
                await aborted_by_the_router(router, n + 1)
            for n, rid in enumerate(plain, start=len(streamed)):
                await hang_up_on_a_plain_request(router, rid)
                await aborted_by_the_router(router, n + 1)
            answers = await asyncio.gather(*victims)
        finally:  # a failure above leaves no victim behind to end in a later test
            for task in victims:
                task.cancel()
            await asyncio.gather(*victims, return_exceptions=True)

    for i, answer in enumerate(answers):
        (choice,) = answer.choices
        assert answer.usage is not None
        assert (choice.finish_reason, answer.usage.completion_tokens) == ("length", VICTIM_TOKENS)
        rid = victim_rid(i)
        if rid is not None:
            assert answer.id == rid  # its own id, back in its answer
        else:
            assert ROUTER_ID.match(answer.id)
            assert answer.id != learned
    hostile = len(streamed) + len(plain)
    assert client_gone(router) == hostile

    async def hostile_aborted() -> float | None:
        aborted = await aborted_on_engine(engine) - aborted_before
        return aborted if aborted >= hostile else None

    assert await eventually_async(hostile_aborted, what="the hostile requests aborted") == hostile
    assert await engine_running(engine) == 0


async def test_a_request_the_engine_aborts_answers_abort(
    router: RouterApp, engine: EngineTwin
) -> None:
    """Through the router: a streamed chat and a streamed ``/generate`` aborted on the engine
    (by the id the router named them with) end as SGLang ends them."""
    async with client(router) as oa, aiohttp.ClientSession() as session:
        stream = await oa.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=VICTIM_TOKENS,
            stream=True,
        )
        first = await anext(aiter(stream))
        assert ROUTER_ID.match(first.id)  # the client gave no rid: the router's id
        async with session.post(engine.url + "/abort_request", json={"rid": first.id}) as r:
            assert r.status == 200
        reasons = [c.choices[0].finish_reason async for c in stream if c.choices]
        assert [r for r in reasons if r] == ["abort"]

        body = {"text": "another long story", "stream": True,
                "sampling_params": {"max_new_tokens": VICTIM_TOKENS}}  # fmt: skip
        async with session.post(router.base_url + "/generate", json=body) as answer:
            line = await answer.content.readline()
            assert line.startswith(b"data: ")
            rid = orjson.loads(line[6:])["meta_info"]["id"]
            async with session.post(engine.url + "/abort_request", json={"rid": rid}) as r:
                assert r.status == 200
            events = [
                orjson.loads(raw.strip()[6:])
                for raw in (await answer.read()).split(b"\n\n")
                if raw.strip().startswith(b"data: {")
            ]
    assert events[-1]["meta_info"]["finish_reason"] == {
        "type": "abort", "message": "Aborted", "status_code": None, "err_type": None,
    }  # fmt: skip
    assert events[-1]["meta_info"]["completion_tokens"] < VICTIM_TOKENS
