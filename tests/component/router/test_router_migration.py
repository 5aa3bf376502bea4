"""Streams survive an engine's death (issue 68 item 2): a completion stream whose engine is
killed mid-answer (SIGKILL) continues on another engine from the tokens already sent, on the
HTTP port and in PD mode (a pair's decode killed); the client reads one unbroken stream whose
greedy text and usage equal an uninterrupted run's. What cannot move ends with an error event
saying why (a completion prompt of token ids; a request past ``--migration-limit``), and a
non-streamed answer whose engine dies is answered whole by another. Real engine twins on
loopback. The other routes: `test_router_migration_routes`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

import aiohttp
import orjson
import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tests.component.router.router_fleet import (
    EngineTwin,
    sample,
    start_engines,
    start_router,
    wait_ready,
)
from tests.component.router.test_router_pd import LONG, Fleet
from tests.component.router.test_router_pd import fleet as fleet  # the PD twins, shared
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

pytestmark = pytest.mark.component

TOKENS: Final = 120
KILL_AFTER: Final = 6  # events the client has read when its engine is killed
PROMPT: Final = "Write about the memory hierarchy of a TPU, from HBM down to the registers."


@pytest.fixture(scope="module")
def twins() -> Iterator[list[EngineTwin]]:
    engines = start_engines(3, ["--time-scale", "1"], kv_events=False)
    try:
        yield engines
    finally:
        for engine in engines:
            engine.stop()


@pytest.fixture
async def router(twins: list[EngineTwin]) -> AsyncIterator[RouterApp]:
    for twin in twins:  # a test killed one
        if twin.proc is None or twin.proc.poll() is not None:
            twin.start()
    config = RouterConfig(
        workers=tuple(t.url for t in twins),
        policy="round_robin",
        health_check_interval_seconds=0.3,
        health_failure_threshold=2,
    )
    app = await start_router(config, ready_workers=len(twins))
    yield app
    await app.stop()


def answering(app: RouterApp, twins: list[EngineTwin]) -> EngineTwin:
    busy = {w.name for w in app.registry.workers if w.in_flight}
    (twin,) = [t for t in twins if t.url in busy]
    return twin


async def stream(
    url: str,
    body: dict[str, Any],
    on_event: Callable[[int], None] | None = None,
    path: str = "/v1/completions",
) -> tuple[str, dict[str, Any] | None, list[dict[str, Any]]]:
    """The text, the usage and the events of a streamed answer; ``on_event(n)`` after the
    n-th event."""
    text, usage, events = [], None, []
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + path, json={**body, "stream": True}) as r,
    ):
        assert r.status == 200, await r.read()
        async for line in r.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            events.append(event)
            for choice in event.get("choices") or ():
                text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            if event.get("usage"):
                usage = event["usage"]
            if on_event is not None:
                on_event(len(events))
    return "".join(text), usage, events


def body(prompt: str = PROMPT, tokens: int = TOKENS) -> dict[str, Any]:
    return {
        "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "stream_options": {"include_usage": True},
    }  # fmt: skip


def killer(
    app: RouterApp, twins: list[EngineTwin], killed: list[EngineTwin]
) -> Callable[[int], None]:
    """Kills the engine answering once the client has read `KILL_AFTER` events."""

    def on_event(n: int) -> None:
        if n == KILL_AFTER:
            twin = answering(app, twins)
            killed.append(twin)
            twin.kill()

    return on_event


async def test_a_stream_whose_engine_dies_continues_on_another_with_the_same_text(
    router: RouterApp, twins: list[EngineTwin]
) -> None:
    killed: list[EngineTwin] = []
    text, usage, events = await stream(router.base_url, body(), killer(router, twins, killed))
    assert len(killed) == 1
    survivor = next(t for t in twins if t is not killed[0])
    direct_text, direct_usage, _direct_events = await stream(survivor.url, body())
    assert text == direct_text  # greedy: what the dead engine would have said
    assert usage is not None
    assert direct_usage is not None
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        direct_usage["prompt_tokens"], direct_usage["completion_tokens"],
    )  # fmt: skip
    assert usage["completion_tokens"] == TOKENS
    assert not any("error" in e for e in events)
    assert len({e["id"] for e in events}) == 1  # one stream, one id
    labels = {"route": "/v1/completions", "result": "migrated"}
    assert sample(router, "tpuserve_router_stream_migrations_total", labels) == 1
    workers = {w.name for w in router.registry.workers}
    statuses = {
        (w, s): sample(
            router,
            "tpuserve_router_requests_total",
            {
                "model": next(iter(router.registry.by_model)),
                "worker": w,
                "route": "/v1/completions",
                "status": s,
            },
        )
        for w in workers
        for s in ("200", "stream_error")
    }
    assert sum(statuses.values()) == 1  # the request counted once, on its last engine
    assert statuses[(killed[0].url, "200")] == 0


async def test_past_the_migration_limit_the_stream_ends_with_an_error_saying_so(
    twins: list[EngineTwin],
) -> None:
    for twin in twins:
        if twin.proc is None or twin.proc.poll() is not None:
            twin.start()
    config = RouterConfig(
        workers=tuple(t.url for t in twins), policy="round_robin",
        health_check_interval_seconds=0.3, health_failure_threshold=2, migration_limit=1,
    )  # fmt: skip
    app = await start_router(config, ready_workers=len(twins))
    killed: list[EngineTwin] = []

    def on_event(n: int) -> None:
        if n in (KILL_AFTER, 2 * KILL_AFTER):  # the first engine, then its successor
            twin = answering(app, twins)
            killed.append(twin)
            twin.kill()

    try:
        _text, _usage, events = await stream(app.base_url, body(), on_event)
    finally:
        await app.stop()
    assert len(killed) == 2
    error = events[-1].get("error")
    assert error is not None, events[-1]
    assert "cannot move to another engine" in error["message"]
    assert "--migration-limit" in error["message"]


async def test_a_stream_that_cannot_move_ends_with_an_error_event_saying_why(
    router: RouterApp, twins: list[EngineTwin]
) -> None:
    killed: list[EngineTwin] = []
    ids = list(load_tokenizer().encode(PROMPT))  # its stream carries text, not the ids
    tokens = {"prompt": ids, "max_tokens": TOKENS, "temperature": 0}
    _text, _usage, events = await stream(router.base_url, tokens, killer(router, twins, killed))
    assert len(killed) == 1
    error = events[-1].get("error")
    assert error is not None, events[-1]
    assert (
        "the stream cannot move to another engine: a completion prompt of token ids"
        in (error["message"])
    )
    labels = {"route": "/v1/completions", "result": "not_migrated"}
    assert sample(router, "tpuserve_router_stream_migrations_total", labels) == 1
    labels["result"] = "migrated"
    assert sample(router, "tpuserve_router_stream_migrations_total", labels) == 0


async def test_a_whole_answer_whose_engine_dies_is_answered_by_another(
    router: RouterApp, twins: list[EngineTwin]
) -> None:
    request = {"prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}

    async def kill_when_busy() -> EngineTwin:
        while True:
            busy = [w for w in router.registry.workers if w.in_flight]
            if busy:
                await asyncio.sleep(0.3)  # mid-answer
                twin = answering(router, twins)
                twin.kill()
                return twin
            await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(kill_when_busy())
        async with session.post(router.base_url + "/v1/completions", json=request) as r:
            assert r.status == 200
            answer = await r.json()
        victim = await task
        survivor = next(t for t in twins if t is not victim)
        async with session.post(survivor.url + "/v1/completions", json=request) as r:
            direct = await r.json()
    assert answer["choices"][0]["text"] == direct["choices"][0]["text"]
    assert answer["usage"]["completion_tokens"] == TOKENS


@pytest.fixture
async def pd_router(fleet: Fleet) -> AsyncIterator[RouterApp]:
    for engine in fleet.engines:
        if engine.proc is None or engine.proc.poll() is not None:
            engine.start()
    app = await start_router(fleet.config())
    await wait_ready(app, len(fleet.engines))
    yield app
    await app.stop()


async def test_a_pair_whose_decode_dies_mid_stream_continues_on_a_new_pair(
    fleet: Fleet, pd_router: RouterApp
) -> None:
    killed: list[EngineTwin] = []
    text, usage, events = await stream(
        pd_router.base_url, body(LONG), killer(pd_router, fleet.decode, killed)
    )
    assert len(killed) == 1
    assert killed[0] in fleet.decode
    direct_text, direct_usage, _ = await stream(fleet.colocated.url, body(LONG))
    assert text == direct_text
    assert usage is not None
    assert direct_usage is not None
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        direct_usage["prompt_tokens"], direct_usage["completion_tokens"],
    )  # fmt: skip
    assert not any("error" in e for e in events)
    assert sample(pd_router, "tpuserve_router_pd_requests_total", {"how": "disaggregated"}) == 1
    labels = {"route": "/v1/completions", "result": "migrated"}
    assert sample(pd_router, "tpuserve_router_stream_migrations_total", labels) == 1
