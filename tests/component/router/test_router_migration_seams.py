"""Where a migrated stream's pieces meet (issue 68 item 2): engines on loopback that die at
chosen bytes. The first dies after whole events; the one the stream moved to dies in the middle
of an event, whose bytes the router held back (a continuation's events are passed on whole):
the client never saw them, so the stream moves again, from the events it did see, and reads
as one. Before, the held half event was counted as sent and the stream ended with "the stream
broke inside an event"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.component.router.router_fleet import sample, start_router
from tests.fakes import FakeModelServer
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

MODEL = "seam-model"
PROMPT = "Tell me."


def event(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return b"data: " + orjson.dumps({"id": "x", "choices": [choice]}) + b"\n\n"


class Engines:
    """Three engines sharing one script, by the order requests reach any of them: the first
    sends " a", " b" and dies; the second " c" and half of " d", and dies; the third answers
    " e" and ends. Each request's body is kept."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.servers = [
            FakeModelServer(MODEL, [web.post("/v1/completions", self.complete)]) for _ in range(3)
        ]

    async def complete(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        step = len(self.bodies)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if step == 3:
            await resp.write(event(" e", "stop") + b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        chunk = event(" a") + event(" b") if step == 1 else event(" c") + event(" d")[:20]
        await resp.write(chunk)
        await asyncio.sleep(0.2)  # on the wire before the engine dies
        assert request.transport is not None
        request.transport.abort()
        return resp


@pytest.fixture
async def router() -> AsyncIterator[tuple[RouterApp, Engines]]:
    engines = Engines()
    urls = [await server.start() for server in engines.servers]
    config = RouterConfig(
        workers=tuple(urls), policy="round_robin", health_check_interval_seconds=0.3
    )
    app = await start_router(config, ready_workers=3)
    try:
        yield app, engines
    finally:
        await app.stop()
        for server in engines.servers:
            await server.stop()


async def test_a_half_event_held_back_is_not_counted_as_sent(
    router: tuple[RouterApp, Engines],
) -> None:
    app, engines = router
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 20, "stream": True}
    events: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(app.base_url + "/v1/completions", json=body) as r,
    ):
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: {"):
                events.append(orjson.loads(line[6:]))
    assert not any("error" in e for e in events), events
    assert "".join(e["choices"][0]["text"] for e in events) == " a b c e"
    prompts = [b["prompt"] for b in engines.bodies]
    assert prompts == [PROMPT, PROMPT + " a b", PROMPT + " a b c"]  # not " d", never sent
    labels = {"route": "/v1/completions", "result": "migrated"}
    assert sample(app, "tpuserve_router_stream_migrations_total", labels) == 2
