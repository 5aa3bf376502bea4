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


def generated(text: str, ids: list[int], finish: str | None = None) -> bytes:
    """A cumulative ``/generate`` event, as SGLang's: the whole answer so far."""
    meta = {"id": "x", "finish_reason": finish and {"type": finish}, "prompt_tokens": 2,
            "completion_tokens": len(ids)}  # fmt: skip
    event = {"text": text, "output_ids": ids, "meta_info": meta}
    return b"data: " + orjson.dumps(event) + b"\n\n"


SCRIPTS: dict[str, tuple[bytes, bytes, bytes]] = {
    "/v1/completions": (
        event(" a") + event(" b"),
        event(" c") + event(" d")[:20],
        event(" e", "stop") + b"data: [DONE]\n\n",
    ),
    "/generate": (
        generated(" a", [7]) + generated(" a b", [7, 8]),
        generated(" c", [9]) + generated(" c d", [9, 10])[:30],
        generated(" e", [11], "stop") + b"data: [DONE]\n\n",
    ),
}
"""Per route, what the first, second and third engine asked sends."""


class Engines:
    """Three engines sharing one script, by the order requests reach any of them: the first
    sends " a", " b" and dies; the second " c" and half of " d", and dies; the third answers
    " e" and ends (the half event in a read of its own). Each request's body is kept."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        routes = [web.post(path, self.answer) for path in SCRIPTS]
        self.servers = [FakeModelServer(MODEL, routes) for _ in range(3)]

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        step = len(self.bodies)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        script = SCRIPTS[request.path][step - 1]
        if step == 2:  # the whole events, then (a read of its own) the half one
            cut = script.rfind(b"\n\n") + 2
            await resp.write(script[:cut])
            await asyncio.sleep(0.2)
            script = script[cut:]
        await resp.write(script)
        if step == 3:
            await resp.write_eof()
            return resp
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


@pytest.mark.parametrize("path", list(SCRIPTS))
async def test_a_half_event_held_back_is_not_counted_as_sent(
    router: tuple[RouterApp, Engines], path: str
) -> None:
    app, engines = router
    if path == "/generate":
        params = {"max_new_tokens": 20}
        body: dict[str, Any] = {"input_ids": [1, 2], "sampling_params": params, "stream": True}
    else:
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 20, "stream": True}
    events: list[dict[str, Any]] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(app.base_url + path, json=body) as r,
    ):
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: {"):
                events.append(orjson.loads(line[6:]))
    assert not any("error" in e for e in events), events
    if path == "/generate":  # cumulative: the last event is the whole answer
        assert (events[-1]["text"], events[-1]["output_ids"]) == (" a b c e", [7, 8, 9, 11])
        asked = [b["input_ids"] for b in engines.bodies]
        assert asked == [[1, 2], [1, 2, 7, 8], [1, 2, 7, 8, 9]]  # not 10, never sent
    else:
        assert "".join(e["choices"][0]["text"] for e in events) == " a b c e"
        asked = [b["prompt"] for b in engines.bodies]
        assert asked == [PROMPT, PROMPT + " a b", PROMPT + " a b c"]  # not " d", never sent
    labels = {"route": path, "result": "migrated"}
    assert sample(app, "tpuserve_router_stream_migrations_total", labels) == 2
