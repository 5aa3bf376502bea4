"""What the router tests against real SGLang engines share: prompts, a second KV-event subscriber,
flushing, and a router in front of real engines.

`EngineEventFeed` subscribes to an engine's KV events beside the router and decodes them with
SGLang's own classes from the pinned wheel (`tests.sglang_kv_events`), so what the router's
index holds is compared with what the engine published, not with tpuserve's own decoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from sglang_tpu.tasks import cancel_and_wait
from sglang_tpu.tokenizer import Tokenizer, load_tokenizer
from tests.component.router.router_fleet import start_router, wait_caught_up, wait_ready
from tests.real_sglang import RealEngine
from tests.sglang_kv_events import sglang_kv_events
from tests.waiting import eventually_async
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

LETTERS = "abcdefghijklmnopqrstuvwxyz"
ROUTER_READY_SECONDS = 60.0
EVENTS_SECONDS = 30.0


def engine_tokenizer(engine: RealEngine) -> Tokenizer:
    """The tokenizer the engines serve with (the router is given the same file)."""
    return load_tokenizer(str(engine.model_path / "tokenizer.json"))


REAL_ENGINE_HEALTH_TIMEOUT_SECONDS = 5.0
"""SGLang 0.5.23's ``/health`` queues a one-token generation and answers after the next
output it sees, checking once a second, so it takes 1 s at best and 2 s or more while a step
of the running batch takes over a second, which a CPU engine on CI's two shared cores does.
With the router's 2-s default, a busy survivor was ejected in one whole CI run of the kill
test (23 requests answered 502/503 after the survivor's ejection)."""


def text_of_tokens(tokenizer: Tokenizer, rng: random.Random, tokens: int) -> str:
    """Random words ending in a newline, at least ``tokens`` tokens long (at most ~10 more)."""
    words: list[str] = []
    text = ""
    while len(tokenizer.encode(text)) < tokens:
        words.extend("".join(rng.choices(LETTERS, k=rng.randint(2, 9))) for _ in range(4))
        text = " ".join(words) + "\n"
    return text


async def router_in_front_of(engines: Sequence[RealEngine]) -> RouterApp:
    """The router with its default policy and KV events, in front of ``engines``, routable and
    subscribed; given the engines' tokenizer so its token ids are theirs."""
    app = await start_router(
        RouterConfig(
            workers=tuple(e.url for e in engines),
            tokenizer=str(engines[0].model_path / "tokenizer.json"),
            health_check_timeout_seconds=REAL_ENGINE_HEALTH_TIMEOUT_SECONDS,
        )
    )
    try:
        await wait_ready(app, len(engines), timeout_seconds=ROUTER_READY_SECONDS)
        await wait_caught_up(app, [e.url for e in engines], timeout_seconds=ROUTER_READY_SECONDS)
    except BaseException:
        await app.stop()
        raise
    return app


class EngineEventFeed:
    """One engine's KV events as a second subscriber sees them, decoded by SGLang's classes.

    ``async with EngineEventFeed(engine) as feed``, then `await feed.synchronise()`: the feed
    flushes the engine until it sees the flush's ``AllBlocksCleared``, so from then on it has
    every event and `held()` is exactly what the engine's cache holds.
    """

    def __init__(self, engine: RealEngine) -> None:
        self.engine = engine
        self.events: list[Any] = []
        self.batches = 0
        self._decoder = msgspec.msgpack.Decoder(sglang_kv_events().KVEventBatch)
        self._context = zmq.asyncio.Context()
        self._task: asyncio.Task[None] | None = None
        self._cleared = asyncio.Event()

    async def __aenter__(self) -> EngineEventFeed:
        socket = self._context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, self.engine.kv_topic.encode())
        socket.connect(self.engine.kv_events_endpoint)
        self._task = asyncio.get_running_loop().create_task(self._read(socket))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await cancel_and_wait([self._task])
        self._context.destroy(linger=0)

    async def _read(self, socket: zmq.asyncio.Socket) -> None:
        try:
            while True:
                topic, _seq, payload = await socket.recv_multipart()
                assert topic == self.engine.kv_topic.encode()
                batch = self._decoder.decode(payload)
                self.batches += 1
                self.events.extend(batch.events)
                if any(type(e).__name__ == "AllBlocksCleared" for e in batch.events):
                    self._cleared.set()
        finally:
            socket.close(linger=0)

    def kinds(self) -> list[str]:
        return [type(event).__name__ for event in self.events]

    async def synchronise(self) -> None:
        """Flush the engine until this feed sees the flush (a subscription joins late)."""

        async def flushed_and_seen() -> bool:
            self._cleared.clear()
            await asyncio.to_thread(self.engine.flush_cache)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cleared.wait(), timeout=1.0)
            return self._cleared.is_set()

        await eventually_async(
            flushed_and_seen,
            what=f"the KV events of {self.engine.name} to reach a second subscriber",
            timeout_seconds=EVENTS_SECONDS,
            interval_seconds=0.2,
            context=self.engine.log_tail,
        )

    def held(self) -> set[int]:
        """The engine's block hashes its events say it holds now."""
        held: set[int] = set()
        for event in self.events:
            kind = type(event).__name__
            if kind == "BlockStored":
                held.update(event.block_hashes)
            elif kind == "BlockRemoved":
                held.difference_update(event.block_hashes)
            elif kind == "AllBlocksCleared":
                held.clear()
        return held
