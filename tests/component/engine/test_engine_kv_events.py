"""A pyzmq subscriber rebuilds the engine's cache exactly from its KV events.

Checked against `/debug/radix_cache` after traffic that forces eviction, after `/flush_cache`
and after an engine restart on the same endpoints (the sequence number restarts at 0).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import zmq
from engine_process import free_port, running_engine

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
    deadline = time.monotonic() + DEADLINE_SECONDS
    view = debug_view(url)
    while time.monotonic() < deadline:
        sub.sub.poll(100)
        sub.drain()
        view = debug_view(url)
        if sub.blocks == view:
            return view
    raise AssertionError(f"subscriber holds {len(sub.blocks)} blocks, engine {len(view)}")


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
            deadline = time.monotonic() + DEADLINE_SECONDS
            hellos = 0
            while sub.last_seq is None and time.monotonic() < deadline:
                hellos += 1
                send(engine.url, prompts(1, f"hello {hellos}"))
                sub.sub.poll(200)
                sub.drain()
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
            deadline = time.monotonic() + DEADLINE_SECONDS
            pokes = 0
            while sub.restarts == 0 and time.monotonic() < deadline:
                pokes += 1  # a new prompt each time, so every poke stores new blocks
                send(engine.url, prompts(1, f"poke {pokes}"))
                sub.sub.poll(200)
                sub.drain()
            assert sub.restarts == 1
            view = wait_until_rebuilt(sub, engine.url)
            assert view
            assert engine.terminate() == 0
    finally:
        sub.close()
