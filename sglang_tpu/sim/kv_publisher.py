"""SGLang's KV-event publisher on real ZMQ sockets: PUB for live batches, ROUTER for replay.

Each call to `publish` sends one batch as ``[topic, seq, payload]`` (`sglang_tpu.kv_events`);
``seq`` starts at 0 for each publisher, so a restarted engine restarts it. The last
``buffer_steps`` payloads are kept for replay. The wire is SGLang 0.5.23's by default
(coalesced tagged-map events, ``[ts, events, attn_dp_rank]`` batches, a topic frame in replay
replies); ``wire=Wire.LEGACY``, or ``TPUSERVE_SIM_KV_EVENTS_WIRE=0.5.19`` in the environment,
speaks the 0.5.6-0.5.19 wire instead (tagged arrays, per-page events, no topic frame).

Unlike SGLang, which binds a concrete host only with ``"bind": true``, the twin always binds
both endpoints: subscribers (the router, tests) connect. `describe` is the ``kv_events``
block SGLang's ``/server_info`` carries for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import zmq
import zmq.asyncio

from sglang_tpu.kv_events import (
    END_SEQ,
    EventBatch,
    KVEvent,
    Wire,
    coalesce,
    encode_batch,
    pub_frames,
    replay_reply,
)
from sglang_tpu.tasks import cancel_and_wait

log = logging.getLogger(__name__)

WIRE_ENV = "TPUSERVE_SIM_KV_EVENTS_WIRE"


def wire_from_env(environ: Mapping[str, str] = os.environ) -> Wire:
    """The wire `WIRE_ENV` asks for (SGLang 0.5.23's when unset)."""
    value = environ.get(WIRE_ENV, "").strip()
    if not value:
        return Wire.CURRENT
    try:
        return Wire(value)
    except ValueError:
        allowed = ", ".join(w.value for w in Wire)
        raise ValueError(f"{WIRE_ENV}: {value!r} is not allowed; allowed: {allowed}") from None


def _tcp_host_port(endpoint: str | None) -> tuple[str, int] | None:
    """(host, port) of a bound ``tcp://HOST:PORT`` endpoint, IPv6 hosts bracketed; None for
    anything else."""
    if not endpoint or not endpoint.startswith("tcp://"):
        return None
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    return host, int(port)


class KVEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        *,
        wire: Wire | None = None,
        dp_rank: int = 0,
    ) -> None:
        self.wire = wire if wire is not None else wire_from_env()
        self.dp_rank = dp_rank
        self.topic = topic
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
        if self.wire is Wire.CURRENT:  # 0.5.23's recorder merges a step's events
            batch = EventBatch(time.time(), coalesce(events), self.dp_rank)
        else:  # these versions sent per-page events and left the rank out
            batch = EventBatch(time.time(), events)
        payload = encode_batch(batch, self.wire)
        seq = self._seq
        self._seq += 1
        # PUB sends never block: past the high-water mark ZMQ drops, as SGLang's does.
        self._pub.send_multipart(pub_frames(self._topic, seq, payload), flags=zmq.NOBLOCK)
        self._buffer.append((seq, payload))

    def describe(self, block_size: int, dp_size: int = 1) -> dict[str, Any] | None:
        """The ``kv_events`` block of SGLang's ``/server_info`` (None without a TCP endpoint),
        as ``describe_kv_events_publisher`` builds it: subscribers dial
        ``tcp://<worker host>:<endpoint_port_base + rank>`` for each of ``dp_size`` ranks (a
        wildcard ``endpoint_host`` means the worker URL's host). With several publishers on
        consecutive ports, one per DP rank, any of them describes the whole range."""
        bound = _tcp_host_port(self.endpoint)
        if bound is None:
            return None
        host, port = bound
        block: dict[str, Any] = {
            "publisher": "zmq",
            "endpoint_host": host,
            "endpoint_port_base": port - self.dp_rank,
            "topic": self.topic,
            "block_size": block_size,
            "dp_size": dp_size,
        }
        replay = _tcp_host_port(self.replay_endpoint)
        if replay is not None:
            block["replay_endpoint_port_base"] = replay[1] - self.dp_rank
        return block

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        sock = self._replay
        topic = self._topic
        wire = self.wire
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                log.warning("ignoring a replay request of %d frames", len(frames))
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await sock.send_multipart(replay_reply(client, topic, seq, payload, wire))
            await sock.send_multipart(replay_reply(client, topic, END_SEQ, b"", wire))

    async def close(self) -> None:
        await cancel_and_wait([self._task])
        self._task = None
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
