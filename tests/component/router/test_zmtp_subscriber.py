"""`ZmtpSubscriber` against libzmq's own PUB socket (pyzmq) on loopback.

The router reads engines' KV events with it instead of a libzmq SUB socket, so it must do
what libzmq's SUB does with a real publisher: subscribe, receive multipart messages in order,
answer heartbeats (a PUB with ZMQ_HEARTBEAT_* drops a peer that does not), and come back
after the publisher restarts; and a peer that is not a publisher must not get it stuck.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import zmq
import zmq.asyncio

from tests.waiting import eventually_async
from tpuserve.cluster.ports import free_port
from tpuserve_router.kv.zmtp import SubscriberGroup, ZmtpSubscriber

pytestmark = pytest.mark.component

WAIT_SECONDS = 10.0


class Record:
    def __init__(self) -> None:
        self.connected = 0
        self.disconnected = 0
        self.messages: list[list[bytes]] = []
        self.subscriber: ZmtpSubscriber | None = None

    async def on_connected(self) -> None:
        self.connected += 1

    async def on_disconnected(self) -> None:
        self.disconnected += 1

    def on_messages(self) -> None:
        assert self.subscriber is not None
        while self.subscriber.pending:
            self.messages.append(self.subscriber.pending.popleft())


@asynccontextmanager
async def subscribed(port: int, prefix: bytes = b"") -> AsyncIterator[Record]:
    record = Record()
    group = SubscriberGroup(0.005)
    record.subscriber = ZmtpSubscriber(
        "127.0.0.1", port, prefix, group, record.on_connected, record.on_disconnected,
        record.on_messages, 100, "test",
    )  # fmt: skip
    record.subscriber.start()
    try:
        yield record
    finally:
        await record.subscriber.close()
        group.close()


def publisher(
    ctx: zmq.asyncio.Context, port: int, heartbeat_ms: int = 0, heartbeat_timeout_ms: int = 0
) -> zmq.asyncio.Socket:
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    if heartbeat_ms:
        pub.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        pub.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_timeout_ms or 3 * heartbeat_ms)
    pub.bind(f"tcp://127.0.0.1:{port}")
    return pub


async def restarted(ctx: zmq.asyncio.Context, port: int) -> zmq.asyncio.Socket:
    """A new publisher on ``port``: libzmq closes the old one's listener on its I/O thread,
    a moment after ``close``, so binding again may find the port still taken."""

    def bound() -> zmq.asyncio.Socket | None:
        try:
            return publisher(ctx, port)
        except zmq.ZMQError as err:
            if err.errno != zmq.EADDRINUSE:
                raise
            return None

    pub = None

    def rebound() -> bool:
        nonlocal pub
        pub = bound()
        return pub is not None

    await eventually_async(rebound, what=f"port {port} bound again", timeout_seconds=WAIT_SECONDS)
    assert pub is not None
    return pub


async def publish_until(
    pub: zmq.asyncio.Socket, frames: list[bytes], arrived: Callable[[], bool]
) -> None:
    """Send ``frames`` until ``arrived`` (a PUB drops what it sends before the subscription)."""

    async def sent_and_arrived() -> bool:
        await pub.send_multipart(frames)
        await asyncio.sleep(0.02)
        return arrived()

    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while not await sent_and_arrived():
        assert asyncio.get_running_loop().time() < deadline, f"{frames} never arrived"


async def test_multipart_messages_arrive_whole_and_in_order_with_the_prefix_only() -> None:
    ctx = zmq.asyncio.Context()
    port = free_port()
    try:
        pub = publisher(ctx, port)
        async with subscribed(port, prefix=b"kv") as record:
            await publish_until(pub, [b"kv", b"first"], lambda: bool(record.messages))
            for i in range(50):
                await pub.send_multipart([b"other", b"%d" % i])
                await pub.send_multipart([b"kv-0", b"%d" % i, b"x" * (i * 100)])
            await eventually_async(
                lambda: len(record.messages) >= 51, what="50 more messages",
                timeout_seconds=WAIT_SECONDS,
            )  # fmt: skip
            after = record.messages[[m[1] for m in record.messages].index(b"first") + 1 :]
            assert after == [[b"kv-0", b"%d" % i, b"x" * (i * 100)] for i in range(50)]
            assert record.connected == 1
    finally:
        ctx.destroy(linger=0)


async def test_heartbeats_are_answered_so_the_publisher_keeps_us() -> None:
    ctx = zmq.asyncio.Context()
    port = free_port()
    try:
        # A PING every 50 ms, each to be answered within 1 s. SGLang's publisher sets no
        # heartbeats; a publisher that does drops a subscriber that leaves one unanswered. The
        # second of grace is for the event loop of a test process on a busy machine (a 150 ms
        # grace failed there); the subscriber that stalls longer is dropped and reconnects
        # (test_a_restarted_publisher_is_reconnected), catching up by replay.
        pub = publisher(ctx, port, heartbeat_ms=50, heartbeat_timeout_ms=1000)
        async with subscribed(port) as record:
            await publish_until(pub, [b"", b"before"], lambda: bool(record.messages))
            await asyncio.sleep(3.0)  # 60 PINGs; unanswered, the PUB drops us after 1 s
            record.messages.clear()
            await publish_until(pub, [b"", b"after"], lambda: bool(record.messages))
            assert (record.connected, record.disconnected) == (1, 0)
    finally:
        ctx.destroy(linger=0)


async def test_a_restarted_publisher_is_reconnected() -> None:
    ctx = zmq.asyncio.Context()
    port = free_port()
    try:
        pub = publisher(ctx, port)
        async with subscribed(port) as record:
            await publish_until(pub, [b"", b"one"], lambda: bool(record.messages))
            pub.close(linger=0)
            await eventually_async(
                lambda: record.disconnected == 1, what="the loss seen",
                timeout_seconds=WAIT_SECONDS,
            )  # fmt: skip
            pub = await restarted(ctx, port)
            record.messages.clear()
            await publish_until(pub, [b"", b"two"], lambda: bool(record.messages))
            assert record.messages[-1] == [b"", b"two"]
            assert record.connected == 2
    finally:
        ctx.destroy(linger=0)


async def test_a_peer_that_is_not_a_publisher_gets_no_connection() -> None:
    answered = 0

    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        answered += 1
        writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".ljust(64, b" "))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with subscribed(port) as record:
            await eventually_async(
                lambda: answered >= 2, what="a retry after the refused handshake",
                timeout_seconds=WAIT_SECONDS,
            )  # fmt: skip
            assert (record.connected, record.messages) == (0, [])
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_lost_while_it_is_being_handled_is_not_read_again() -> None:
    # The catch-up on connect can take seconds; a publisher lost meanwhile must not leave
    # the dead socket watched (at EOF it is always readable: the loop would spin on it).
    ctx = zmq.asyncio.Context()
    port = free_port()
    try:
        pub = publisher(ctx, port)
        async with subscribed(port) as record:
            subscriber = record.subscriber
            assert subscriber is not None
            release = asyncio.Event()

            async def slow_catch_up() -> None:
                record.connected += 1
                await release.wait()

            await publish_until(pub, [b"", b"one"], lambda: bool(record.messages))
            subscriber.on_connected = slow_catch_up
            pub.close(linger=0)  # the first connection is lost: the next one is held up
            pub = await restarted(ctx, port)
            await eventually_async(
                lambda: record.connected == 2, what="the reconnect", timeout_seconds=WAIT_SECONDS
            )
            pub.close(linger=0)  # lost during its catch-up
            before = subscriber.turns
            await asyncio.sleep(0.5)
            assert subscriber.turns - before < 5
            release.set()
            await eventually_async(
                lambda: record.disconnected == 2, what="the second loss told",
                timeout_seconds=WAIT_SECONDS,
            )  # fmt: skip
    finally:
        ctx.destroy(linger=0)


async def test_a_busy_stream_is_read_when_a_decision_finds_it_due_else_at_the_backstop() -> None:
    # Under load the group's turn rides a request's wake-up: `read_if_due`, called before
    # each routing decision, reads once the interval has passed; its timer only backs that
    # up, after `backstop` seconds without a decision.
    ctx = zmq.asyncio.Context()
    port = free_port()
    group = SubscriberGroup(1.0, backstop=3.0)
    record = Record()
    record.subscriber = ZmtpSubscriber(
        "127.0.0.1", port, b"", group, record.on_connected, record.on_disconnected,
        record.on_messages, 100, "test",
    )  # fmt: skip
    pub = publisher(ctx, port)
    record.subscriber.start()
    loop = asyncio.get_running_loop()
    try:
        # the first message wakes the watched socket; the stream is busy from then on
        await publish_until(pub, [b"", b"first"], lambda: bool(record.messages))
        group.read_if_due()  # no turn yet: due at once
        turn = loop.time()
        await pub.send_multipart([b"", b"second"])
        await asyncio.sleep(0.2)
        group.read_if_due()  # 0.2 s after the turn: not due
        assert [b"", b"second"] not in record.messages
        await asyncio.sleep(max(0.0, turn + 1.1 - loop.time()))
        group.read_if_due()  # past the interval: read now
        assert record.messages[-1] == [b"", b"second"]
        turn = loop.time()
        await pub.send_multipart([b"", b"third"])
        await asyncio.sleep(1.5)  # past the interval, but no decision asks: the timer waits
        assert [b"", b"third"] not in record.messages
        await eventually_async(
            lambda: record.messages[-1] == [b"", b"third"], what="the backstop's turn",
            timeout_seconds=WAIT_SECONDS,
        )  # fmt: skip
        assert loop.time() - turn >= 3.0 - 0.01
    finally:
        await record.subscriber.close()
        group.close()
        ctx.destroy(linger=0)


async def test_a_host_name_the_resolver_refuses_is_retried_not_fatal() -> None:
    group = SubscriberGroup(0.005)
    record = Record()
    subscriber = ZmtpSubscriber(
        "x" * 64 + ".invalid", 5557, b"", group, record.on_connected, record.on_disconnected,
        record.on_messages, 100, "test",
    )  # fmt: skip
    subscriber.start()
    await asyncio.sleep(0.3)  # attempts fail (the label is over 63 characters) and back off
    await subscriber.close()  # raises nothing
    group.close()
    assert record.connected == 0
