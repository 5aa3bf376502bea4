"""The ZMTP 3.0 pieces the router's KV-event reader sends and parses (`tpuserve_router.kv.zmtp`,
and the compiled `ZmtpReader` that splits the frames).

The component test (`tests/component/router/test_zmtp_subscriber.py`) checks them against
libzmq's own PUB socket; here the framing rules, one by one.
"""

from __future__ import annotations

import socket
from collections import deque

import pytest

from tpuserve_router._native import ZmtpReader
from tpuserve_router.kv import zmtp
from tpuserve_router.kv.zmtp import (
    COMMAND,
    GREETING,
    GREETING_BYTES,
    LONG,
    MAX_FRAME_BYTES,
    MORE,
    ZmtpError,
    check_greeting,
    command,
    message_frame,
    properties,
    ready,
    subscription,
    tcp_address,
)

pytestmark = pytest.mark.unit


def parse(
    data: bytes, reader: ZmtpReader | None = None, prefix: bytes = b""
) -> tuple[list[list[bytes]], list[tuple[bytes, bytes]]]:
    """The messages and commands in ``data`` (after what ``reader`` was fed before)."""
    if reader is None:  # (not `or`: a reader with no message queued is falsy)
        reader = ZmtpReader(prefix, zmtp.MAX_FRAME_BYTES)
    commands = zmtp._feed(reader, data)
    return [reader.popleft() for _ in range(len(reader))], commands


def test_our_greeting_is_zmtp_3_0_null_as_client() -> None:
    assert len(GREETING) == GREETING_BYTES
    assert GREETING[:10] == b"\xff" + b"\x00" * 8 + b"\x7f"
    assert GREETING[10:12] == bytes([3, 0])
    assert GREETING[12:32] == b"NULL" + b"\x00" * 16
    assert GREETING[32] == 0  # as-server: no
    check_greeting(GREETING)


@pytest.mark.parametrize(
    ("greeting", "message"),
    [
        (b"GET / HTTP/1.1\r\n".ljust(64, b"x"), "not a ZMTP greeting"),
        (GREETING[:10] + bytes([2, 0]) + GREETING[12:], "ZMTP version 2.0"),
        (GREETING[:12] + b"CURVE".ljust(20, b"\x00") + GREETING[32:], "only NULL"),
        (GREETING[:63], "not a ZMTP greeting"),
    ],
)
def test_a_greeting_we_cannot_speak_is_refused(greeting: bytes, message: str) -> None:
    with pytest.raises(ZmtpError, match=message):
        check_greeting(greeting)


def test_ready_names_the_socket_type() -> None:
    (name, body), *_ = parse(ready(b"SUB"))[1]
    assert name == b"READY"
    assert properties(body) == {b"socket-type": b"SUB"}


def test_the_subscription_is_a_message_of_1_and_the_prefix() -> None:
    assert subscription(b"kv") == bytes([0, 3]) + b"\x01kv"
    assert parse(subscription(b""))[0] == [[b"\x01"]]


def test_frames_short_and_long_make_messages_and_commands_in_order() -> None:
    big = b"p" * 300
    data = (
        bytes([MORE, 2])
        + b"kv"
        + bytes([MORE, 8])
        + (7).to_bytes(8, "big")
        + bytes([LONG])
        + len(big).to_bytes(8, "big")
        + big
        + command(b"PING", b"\x00\x0actx")
        + message_frame(b"single")
    )
    messages, commands = parse(data)
    assert messages == [[b"kv", (7).to_bytes(8, "big"), big], [b"single"]]
    assert commands == [(b"PING", b"\x00\x0actx")]


def test_a_stream_cut_anywhere_parses_the_same() -> None:
    data = message_frame(b"a" * 40) + bytes([MORE, 1]) + b"t" + message_frame(b"b" * 400)
    whole = parse(data)
    for cut in range(1, len(data)):
        reader = ZmtpReader(b"", MAX_FRAME_BYTES)
        first, first_commands = parse(data[:cut], reader)
        second, second_commands = parse(data[cut:], reader)
        assert (first + second, first_commands + second_commands) == whole


def test_reserved_flags_oversized_frames_and_empty_commands_are_refused() -> None:
    with pytest.raises(ZmtpError, match="reserved bits"):
        parse(bytes([0x08, 0]))
    with pytest.raises(ZmtpError, match=f"at most {MAX_FRAME_BYTES}"):
        parse(bytes([LONG]) + (MAX_FRAME_BYTES + 1).to_bytes(8, "big"))
    with pytest.raises(ZmtpError, match="malformed command"):
        parse(bytes([COMMAND, 0]))
    with pytest.raises(ZmtpError, match="truncated READY"):
        properties(b"\x0bSocket-Type\x00\x00")


@pytest.mark.parametrize(
    ("endpoint", "address"),
    [
        ("tcp://127.0.0.1:5557", ("127.0.0.1", 5557)),
        ("tcp://engine-0.engines.svc:5557", ("engine-0.engines.svc", 5557)),
        ("tcp://[::1]:5557", ("::1", 5557)),
        ("tcp://*:5557", None),
        ("tcp://eth0;10.0.0.1:5557", None),
        ("tcp://host:0", None),
        ("tcp://host:http", None),
        ("ipc:///tmp/kv", None),
    ],
)
def test_only_tcp_host_port_endpoints_are_read_without_libzmq(
    endpoint: str, address: tuple[str, int] | None
) -> None:
    assert tcp_address(endpoint) == address


def test_a_message_is_bounded_as_a_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zmtp, "MAX_FRAME_BYTES", 100)
    frames = bytes([MORE, 60]) + b"a" * 60
    with pytest.raises(ZmtpError, match="a message of over 100 bytes"):
        parse(frames + frames)
    assert parse(frames[:0] + message_frame(b"b" * 100))[0] == [[b"b" * 100]]


def test_only_messages_with_the_prefix_are_kept() -> None:
    data = (
        bytes([MORE, 3]) + b"kv1" + message_frame(b"a")
        + bytes([MORE, 2]) + b"xx" + message_frame(b"b")
        + message_frame(b"kv")
    )  # fmt: skip
    assert parse(data, prefix=b"kv")[0] == [[b"kv1", b"a"], [b"kv"]]


def test_a_read_takes_what_the_socket_has_and_says_so_at_its_end() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)
        reader = ZmtpReader(b"", MAX_FRAME_BYTES)
        with pytest.raises(BlockingIOError):
            reader.receive(ours.fileno(), 1024)
        data = message_frame(b"x" * 100) + command(b"PING", b"\x00\x01")
        theirs.sendall(data + message_frame(b"y" * 10)[:5])
        assert reader.receive(ours.fileno(), 1024) == (len(data) + 5, [(b"PING", b"\x00\x01")])
        assert reader.popleft() == [b"x" * 100]
        assert len(reader) == 0  # the second message is not whole yet
        theirs.sendall(message_frame(b"y" * 10)[5:])
        assert reader.receive(ours.fileno(), 3) == (3, [])  # at most what was asked
        assert reader.receive(ours.fileno(), 1024) == (4, [])
        assert reader.popleft() == [b"y" * 10]
        theirs.sendall(message_frame(b"z"))
        theirs.close()
        assert reader.receive(ours.fileno(), 1024) == (3, [])
        assert reader.receive(ours.fileno(), 1024) == (0, [])  # the end of the stream
        assert len(reader) == 1
        reader.clear()
        assert len(reader) == 0
        with pytest.raises(IndexError):
            reader.popleft()


class ChunkedReader:
    """A connection's reads, scripted and counted: each `receive` takes the next chunk into a
    real `ZmtpReader`, and says EAGAIN (BlockingIOError) once there is none."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = deque(chunks)
        self.reads = 0
        self.reader = ZmtpReader(b"", MAX_FRAME_BYTES)

    def receive(self, fd: int, max_bytes: int) -> tuple[int, list[tuple[bytes, bytes]]]:
        self.reads += 1
        if not self.chunks:
            raise BlockingIOError
        chunk = self.chunks.popleft()
        assert len(chunk) <= max_bytes
        return len(chunk), self.reader.feed(chunk)

    def __len__(self) -> int:
        return len(self.reader)


class Unread:
    """The connection's socket: only its descriptor is asked for (the reads are scripted)."""

    def fileno(self) -> int:
        return -1


async def nothing() -> None:
    return None


@pytest.mark.parametrize(
    ("sizes", "reads"),
    [
        ([100], 1),  # one short read: the socket had no more, no second recv to hear EAGAIN
        ([zmtp.READ_BYTES, 100], 2),  # a full buffer: there may be more, read again
        ([zmtp.READ_BYTES, zmtp.READ_BYTES], 3),  # ... until EAGAIN says there is not
    ],
)
def test_a_turn_reads_a_socket_until_a_read_does_not_fill_the_buffer(
    sizes: list[int], reads: int
) -> None:
    body = b"".join(message_frame(b"k" * 200) for _ in range(sum(sizes) // 202 + 1))
    chunks, at = [], 0
    for size in sizes:
        chunks.append(body[at : at + size])
        at += size
    reads_of = ChunkedReader(chunks)
    subscriber = zmtp.ZmtpSubscriber(
        "127.0.0.1", 1, b"", zmtp.SubscriberGroup(0.01), nothing, nothing, lambda: None,
        high_water_mark=10**6, label="test",
    )  # fmt: skip
    subscriber._sock = Unread()  # type: ignore[assignment]
    subscriber.pending = reads_of  # type: ignore[assignment]
    subscriber.connected = True
    assert subscriber.read_turn()
    assert reads_of.reads == reads
    assert len(subscriber.pending) == at // 202
