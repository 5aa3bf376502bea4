"""A stopped monitor raises no event that could block libzmq's I/O thread (real ZMQ sockets)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import zmq

from tpuserve_router.kv.zmq_monitor import stop_monitor

pytestmark = pytest.mark.unit

WAIT_SECONDS = 10.0


def test_the_monitor_is_stopped_before_its_reader_is_closed() -> None:
    calls: list[str] = []

    class Socket:
        def disable_monitor(self) -> None:
            calls.append("disable_monitor")

    class Reader:
        def close(self, linger: int | None = None) -> None:
            calls.append(f"close(linger={linger})")

    stop_monitor(Socket(), Reader())  # type: ignore[arg-type]
    assert calls == ["disable_monitor", "close(linger=0)"]


def _connect_receive_and_disconnect(outcome: dict[str, Any]) -> None:
    """Stop a SUB socket's monitor, then connect it (a handshake event), receive, lose the
    publisher (a disconnect event) and close everything. With the monitor still on and its
    reader closed, the handshake event would block the I/O thread: nothing would arrive."""
    ctx = zmq.Context()
    try:
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        reader = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        stop_monitor(sub, reader)
        sub.connect(f"tcp://127.0.0.1:{port}")
        for _ in range(200):  # PUB drops what it sends before the subscription arrives
            pub.send(b"hello")
            if sub.poll(50):
                outcome["received"] = sub.recv()
                break
        pub.close(linger=0)
        sub.close(linger=0)
    finally:
        ctx.term()
    outcome["closed"] = True


def test_events_after_the_monitor_stopped_block_nothing() -> None:
    outcome: dict[str, Any] = {}
    worker = threading.Thread(target=_connect_receive_and_disconnect, args=(outcome,))
    worker.daemon = True  # a blocked libzmq must not hang the suite: the test fails instead
    worker.start()
    worker.join(WAIT_SECONDS)
    assert outcome == {"received": b"hello", "closed": True}
