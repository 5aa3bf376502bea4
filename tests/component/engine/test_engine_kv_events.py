"""A pyzmq subscriber rebuilds the engine's cache exactly from its KV events, which are SGLang's.

Checked against `/debug/radix_cache` after traffic that forces eviction, after `/flush_cache`
and after an engine restart on the same endpoints (the sequence number restarts at 0). Every
batch the twin publishes, live or replayed, decodes with SGLang 0.5.23's own `KVEventBatch`
(from the pinned wheel) and replay replies carry 0.5.23's topic frame; with
``TPUSERVE_SIM_KV_EVENTS_WIRE=0.5.19`` the twin speaks the older wire, which SGLang rejects.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable

import aiohttp
import msgspec
import pytest
import zmq

from sglang_tpu.kv_events import (
    END_SEQ,
    END_SEQ_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
    parse_pub_frames,
    parse_replay_reply,
    replay_request,
)
from sglang_tpu.sim.kv_publisher import WIRE_ENV
from tests.component.engine.engine_process import ENTRY, running_engine
from tests.sglang_kv_events import sglang_kv_events
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
            if isinstance(event, BlockStored):  # one event may carry a chain of pages
                parent = event.parent_block_hash
                size = event.block_size
                for i, block in enumerate(event.block_hashes):
                    page = tuple(event.token_ids[i * size : (i + 1) * size])
                    self.blocks[int(block)] = (None if parent is None else int(parent), page)
                    parent = block
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
            "--kv-events-replay-endpoint", replay, "--enable-debug-endpoints"]  # fmt: skip
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


# ---------------------------------------------------------------- SGLang's own decoder


def sglang_decodes(payload: bytes) -> bool:
    decoder = msgspec.msgpack.Decoder(sglang_kv_events().KVEventBatch)
    try:
        decoder.decode(payload)
    except msgspec.ValidationError:
        return False
    return True


def published(sub: zmq.Socket[bytes], url: str, prompt: str) -> list[list[bytes]]:
    """Messages the engine publishes while it serves ``prompt``, all of them: a new SUB misses
    what is published before its subscription reaches the engine, so prompts go until one
    message arrives, and then one more."""

    def poke() -> list[list[bytes]]:
        send(url, [f"{time.monotonic()} {prompt}"])  # new each time: stores every page
        messages = []
        while sub.poll(200):
            messages.append(sub.recv_multipart())
        return messages

    # Until one arrives the subscription may have joined mid-prompt, with only a tail of its
    # batches (a loaded machine's case); once one has, the next prompt's come whole.
    eventually(poke, what="a published KV-event batch", timeout_seconds=DEADLINE_SECONDS)
    return eventually(poke, what="one prompt's batches", timeout_seconds=DEADLINE_SECONDS)


def replayed(replay_endpoint: str, ctx: zmq.Context[zmq.Socket[bytes]]) -> list[list[bytes]]:
    """Every reply a DEALER receives for a replay from 0, end marker included."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    dealer.send_multipart(replay_request(0))
    replies: list[list[bytes]] = []
    try:
        while not replies or parse_replay_reply(replies[-1])[0] != END_SEQ:
            assert dealer.poll(int(DEADLINE_SECONDS * 1000)), "no replay reply"
            replies.append(dealer.recv_multipart())
    finally:
        dealer.close(linger=0)
    return replies


def served_once(
    endpoints: tuple[str, str], topic: str, *extra_args: str
) -> tuple[list[bytes], list[list[bytes]]]:
    """A twin publishing on `endpoints` (`topic` subscribed to) serves a 200-word prompt: the
    payloads it published live, and every reply to a replay from 0."""
    pub, replay = endpoints
    args = ["--time-scale", "0", "--page-size", "16", "--kv-events-endpoint", pub,
            "--kv-events-replay-endpoint", replay, *extra_args]  # fmt: skip
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(pub)
    try:
        with running_engine(args) as engine:
            live = published(sub, engine.url, " ".join(f"word{i}" for i in range(200)))
            history = replayed(replay, ctx)
            assert engine.terminate() == 0
    finally:
        sub.close(linger=0)
        ctx.term()
    return [parse_pub_frames(m)[2] for m in live], history


def test_every_batch_the_twin_sends_is_sglang_0_5_23s(endpoints: tuple[str, str]) -> None:
    payloads, history = served_once(endpoints, "kv", "--kv-events-topic", "kv")
    assert all(map(sglang_decodes, payloads))
    stores = [e for p in payloads for e in decode_batch(p).events if isinstance(e, BlockStored)]
    assert any(len(e.block_hashes) > 1 for e in stores)  # coalesced, as 0.5.23 sends them
    *batches, end = history
    assert end == [b"", b"", END_SEQ_BYTES, b""]
    assert batches
    assert all(len(r) == 4 and r[:2] == [b"", b"kv"] for r in batches)
    assert all(sglang_decodes(r[-1]) for r in batches)


def test_the_legacy_wire_is_what_sglang_rejects(
    endpoints: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(WIRE_ENV, "0.5.19")
    payloads, history = served_once(endpoints, "", "--enable-debug-endpoints")
    assert payloads
    assert not any(map(sglang_decodes, payloads))
    assert all(decode_batch(p) for p in payloads)  # the router still reads them
    *batches, end = history
    assert end == [b"", END_SEQ_BYTES, b""]
    assert batches
    assert all(len(r) == 3 for r in batches)


def test_an_unknown_wire_is_refused_with_the_allowed_values() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ENTRY, "engine", "sim", "--kv-events-endpoint", "tcp://127.0.0.1:*"],
        env={**os.environ, WIRE_ENV: "0.4"}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert f"{WIRE_ENV}: '0.4' is not allowed; allowed: 0.5.23, 0.5.19" in out.stderr
