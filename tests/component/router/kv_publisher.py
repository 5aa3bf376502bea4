"""A KV-event publisher on real ZMQ sockets that loses batches on demand (`Publisher`), the
events an engine sends for a prompt (`stored`, `removed`), and a precise router with one worker
fed by such a publisher (`publishing_router`): what the KV-event tests of the router share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import zmq
import zmq.asyncio

from sglang_tpu.kv_events import (
    END_SEQ_BYTES,
    BlockRemoved,
    EventBatch,
    block_hashes,
    encode_batch,
    page_stores,
    pub_frames,
)
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    sample,
    start_router,
    wait_ready,
)
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

PAGE = 16
PROMPT = "Shared context for precise routing tests, long enough for many pages. " * 12


def decisions(app: RouterApp, outcome: str) -> float:
    labels = {"policy": "precise", "outcome": outcome}
    return sample(app, "tpuserve_router_routing_decisions_total", labels)


def resyncs(app: RouterApp, worker: str, *reasons: str) -> float:
    name = "tpuserve_router_kv_event_resyncs_total"
    return sum(sample(app, name, {"worker": worker, "reason": r}) for r in reasons)


def events(app: RouterApp, worker: str, kind: str) -> float:
    return sample(app, "tpuserve_router_kv_events_total", {"worker": worker, "type": kind})


async def complete(app: RouterApp, prompt: str) -> int:
    """Send a completion; returns the cached tokens the engine reported."""
    async with openai.AsyncOpenAI(base_url=app.base_url + "/v1", api_key="x") as oa:
        result = await oa.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert result.usage is not None
    details = result.usage.prompt_tokens_details
    return (details.cached_tokens or 0) if details else 0


class Publisher:
    """An engine's publishing side on real ZMQ sockets that can lose batches on demand:
    XPUB (to know when the router has subscribed) and an optional replay ROUTER that, like
    the engine's, holds every batch published, delivered or not. Its replay requests are
    counted (``asked``); the first ``unanswered`` get no answer (an engine too busy: the
    router's replay times out), and while ``stalled`` is set none is answered yet."""

    def __init__(
        self, replay: bool, bind: str = "tcp://127.0.0.1:*", replay_send_queue: int = 1000
    ) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.bind(bind)
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay: dict[int, bytes] = {}
        self.router: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.asked = 0
        self.unanswered = 0
        self.stalled: asyncio.Event | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.SNDHWM, replay_send_queue)  # ZMQ's default, as SGLang's
            self.router.bind("tcp://127.0.0.1:*")
            self.replay_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
            self.task = asyncio.ensure_future(self._serve_replay())

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            identity, _, start = await self.router.recv_multipart()
            self.asked += 1
            if self.asked <= self.unanswered:
                continue
            if self.stalled is not None:
                await self.stalled.wait()
            first = int.from_bytes(start, "big")
            for seq in sorted(s for s in self.replay if s >= first):
                await self.router.send_multipart(
                    [identity, b"", seq.to_bytes(8, "big"), self.replay[seq]]
                )
            await self.router.send_multipart([identity, b"", END_SEQ_BYTES, b""])

    async def wait_subscribed(self) -> None:
        assert await self.pub.poll(10_000), "the router never subscribed"
        await self.pub.recv()

    async def publish(self, seq: int, payload: bytes, *, lost: bool = False) -> None:
        self.replay[seq] = payload
        if not lost:
            await self.pub.send_multipart(pub_frames(b"", seq, payload))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.ctx.destroy(linger=0)


def stored(tokens: list[int]) -> bytes:
    """The BlockStored events an engine sends when it caches ``tokens``, page by page."""
    return encode_batch(EventBatch(0.0, [*page_stores(tokens, PAGE)]))


def removed(tokens: list[int], pages: slice) -> bytes:
    hashes = block_hashes(tokens, PAGE)[pages]
    return encode_batch(EventBatch(0.0, [BlockRemoved(hashes)]))


@contextlib.asynccontextmanager
async def publishing_router(
    engine: EngineTwin,
    *,
    replay: bool,
    publisher: Publisher | None = None,
    snapshot: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[RouterApp, Publisher, str]]:
    """A precise router whose one worker, `engine`, has its KV events from a `Publisher` (a
    new one unless given), seeded with a peer's ``snapshot`` if given: the router, the
    publisher and the worker's name; both stopped on the way out."""
    publisher = publisher or Publisher(replay=replay)
    config = RouterConfig(
        policy="precise", kv_events=True, policy_params={"predicted_ttl_seconds": "0"}
    )
    app = await start_router(config)
    if snapshot is not None:
        assert app.seeds is not None
        app.seeds.take(snapshot)
    try:
        async with aiohttp.ClientSession() as session:
            body = {"url": engine.url, "kv_events_endpoint": publisher.endpoint,
                    "kv_replay_endpoint": publisher.replay_endpoint}  # fmt: skip
            async with session.post(app.base_url + "/workers", json=body) as response:
                assert response.status == 200
                name = (await response.json())["worker"]["url"]
        await wait_ready(app, 1)
        await publisher.wait_subscribed()
        yield app, publisher, name
    finally:
        await app.stop()
        await publisher.close()


def blocks_of(app: RouterApp, worker: str) -> int:
    """Blocks the router's index holds for `worker`."""
    assert app.block_index is not None
    return app.block_index.worker_blocks(worker)


async def wait_blocks(app: RouterApp, worker: str, blocks: int, what: str) -> None:
    await eventually_async(lambda: blocks_of(app, worker) == blocks, what=what, timeout_seconds=5)
