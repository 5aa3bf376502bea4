"""A pyzmq subscriber rebuilds the engine's cache exactly from its KV events.

Checked against `/debug/radix_cache` after traffic that forces eviction, after `/flush_cache`
and after an engine restart on the same endpoints (the sequence number restarts at 0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest
import zmq

from sglang_tpu.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
    parse_pub_frames,
    parse_replay_reply,
    replay_request,
)
from tests.component.engine.engine_process import running_engine
from tests.waiting import eventually
from tpuserve.cluster.ports import free_port

pytestmark = pytest.mark.component

DEADLINE_SECONDS = 20.0
Blocks = dict[int, tuple[int | None, tuple[int, ...]]]


class Rebuilder:
    """The subscriber side: applies batches in order; a backwards sequence means the engine
    restarted, so it drops its state and replays the new engine's history from seq 0."""

    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.blocks: Blocks = {}
        self.last_seq: int | None = None
        self.replayed_through: int | None = None  # live copies of replayed batches are skipped
        self.restarts = 0

    def apply(self, payload: bytes) -> None:
        for event in decode_batch(payload).events:
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                self.blocks[int(event.block_hashes[0])] = (
                    None if parent is None else int(parent),
                    tuple(event.token_ids),
                )
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    self.blocks.pop(int(h), None)
            elif isinstance(event, AllBlocksCleared):
                self.blocks.clear()

    def replay(self, start: int) -> int:
        """Apply every buffered batch from `start` on; returns how many arrived."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart(replay_request(start))
        count = 0
        try:
            while True:
                assert dealer.poll(int(DEADLINE_SECONDS * 1000)), "no replay reply"
                seq, payload = parse_replay_reply(dealer.recv_multipart())
                if seq == END_SEQ:
                    self.replayed_through = self.last_seq
                    return count
                self.apply(payload)
                self.last_seq = seq
                count += 1
        finally:
            dealer.close(linger=0)

    def drain(self) -> None:
        while self.sub.poll(0):
            _, seq, payload = parse_pub_frames(self.sub.recv_multipart())
            if self.replayed_through is not None and seq <= self.replayed_through:
                continue
            self.replayed_through = None
            if self.last_seq is not None and seq <= self.last_seq:
                self.restarts += 1
                self.blocks.clear()
                self.last_seq = None
                self.replay(0)  # batches sent before we reconnected
                continue
            if self.last_seq is not None and seq > self.last_seq + 1:
                self.replay(self.last_seq + 1)  # a gap: fetch what we missed
                continue
            self.last_seq = seq
            self.apply(payload)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()


def debug_view(url: str) -> Blocks:
    async def go() -> Blocks:
        async with aiohttp.ClientSession() as s, s.get(url + "/debug/radix_cache") as r:
            body = await r.json()
        return {
            b["block_hash"]: (b["parent_block_hash"], tuple(b["token_ids"])) for b in body["blocks"]
        }

    return asyncio.run(go())


def send(url: str, prompts: list[str], path: str = "/v1/completions") -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            for prompt in prompts:
                async with s.post(url + path, json={"prompt": prompt, "max_tokens": 8}) as r:
                    assert r.status == 200

    asyncio.run(go())


def flush(url: str) -> None:
    async def go() -> None:
        async with aiohttp.ClientSession() as s, s.post(url + "/flush_cache") as r:
            assert r.status == 200

    asyncio.run(go())


def wait_until_rebuilt(sub: Rebuilder, url: str) -> Blocks:
    """The engine's blocks, once the subscriber holds exactly them."""
    views: list[Blocks] = []

    def rebuilt() -> bool:
        sub.sub.poll(100)
        sub.drain()
        views.append(debug_view(url))
        return sub.blocks == views[-1]

    eventually(
        rebuilt,
        what="the subscriber to hold the engine's blocks",
        timeout_seconds=DEADLINE_SECONDS,
        context=lambda: f"subscriber holds {len(sub.blocks)} blocks, engine {len(views[-1])}",
    )
    return views[-1]


def poke_until(sub: Rebuilder, url: str, tag: str, done: Callable[[], bool], what: str) -> None:
    """Send a new prompt (new blocks, so new events) and read the events, until `done`."""
    pokes = 0

    def poked() -> bool:
        nonlocal pokes
        pokes += 1
        send(url, prompts(1, f"{tag} {pokes}"))
        sub.sub.poll(200)
        sub.drain()
        return done()

    eventually(poked, what=what, timeout_seconds=DEADLINE_SECONDS)


@pytest.fixture
def endpoints() -> tuple[str, str]:
    return f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"


def prompts(n: int, tag: str) -> list[str]:
    return [f"{tag} document {i}: " + " ".join(f"w{i}x{j}" for j in range(60)) for i in range(n)]


def test_subscriber_rebuilds_cache_across_eviction_flush_and_restart(
    endpoints: tuple[str, str],
) -> None:
    pub, replay = endpoints
    args = ["--time-scale", "0", "--page-size", "4", "--cache-tokens", "1024",
            "--context-length", "512", "--kv-events-endpoint", pub,
            "--kv-events-replay-endpoint", replay]  # fmt: skip
    sub = Rebuilder(pub, replay)
    try:
        with running_engine(args) as engine:
            send(engine.url, prompts(1, "warmup"))  # a late-joining SUB may miss this
            poke_until(
                sub, engine.url, "hello", lambda: sub.last_seq is not None, "a first live batch"
            )
            sub.blocks = {}  # start over from the replayed history, as a late joiner does
            sub.last_seq = None
            assert sub.replay(0) > 0
            sub.drain()
            wait_until_rebuilt(sub, engine.url)

            send(engine.url, prompts(20, "evict"))  # far more than 1024 tokens: eviction
            view = wait_until_rebuilt(sub, engine.url)
            assert 0 < sum(len(t) for _, t in view.values()) <= 1024

            flush(engine.url)
            assert wait_until_rebuilt(sub, engine.url) == {}
            send(engine.url, prompts(3, "after-flush"))
            assert wait_until_rebuilt(sub, engine.url)
            assert engine.terminate() == 0

        with running_engine(args) as engine:  # same endpoints: sequence restarts at 0
            send(engine.url, prompts(4, "restarted"))
            poke_until(sub, engine.url, "poke", lambda: sub.restarts > 0, "the restart to be seen")
            assert sub.restarts == 1
            view = wait_until_rebuilt(sub, engine.url)
            assert view
            assert engine.terminate() == 0
    finally:
        sub.close()
