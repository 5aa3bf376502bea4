"""SGLang's KV-event publisher on real ZMQ sockets: PUB for live batches, ROUTER for replay.

Each call to `publish` sends one batch as ``[topic, seq, payload]`` (`sglang_tpu.kv_events`);
``seq`` starts at 0 for each publisher, so a restarted engine restarts it. The last
``buffer_steps`` payloads are kept for replay. Unlike SGLang, which binds only for wildcard
addresses, the twin always binds both endpoints: subscribers (the router, tests) connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

import zmq
import zmq.asyncio

from sglang_tpu.kv_events import END_SEQ_BYTES, EventBatch, KVEvent, encode_batch, pub_frames

log = logging.getLogger(__name__)


class KVEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
    ) -> None:
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._replay is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    def publish(self, events: list[KVEvent]) -> None:
        payload = encode_batch(EventBatch(ts=time.time(), events=events))
        seq = self._seq
        self._seq += 1
        # PUB sends never block: past the high-water mark ZMQ drops, as SGLang's does.
        self._pub.send_multipart(pub_frames(self._topic, seq, payload), flags=zmq.NOBLOCK)
        self._buffer.append((seq, payload))

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                log.warning("ignoring a replay request of %d frames", len(frames))
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await sock.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
            await sock.send_multipart((client, b"", END_SEQ_BYTES, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
