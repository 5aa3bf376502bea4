"""Ending a libzmq socket monitor without the deadlock libzmq allows.

libzmq's I/O thread sends each monitor event to the monitor's PAIR socket with a blocking send,
holding the socket's monitor lock; `disable_monitor` and closing the socket take that lock. A
PAIR whose reader is closed never takes the event, so an event raised after the reader closed
(a disconnect, a handshake) blocks the I/O thread for ever, and the next `disable_monitor`
with it (a component test hung so in `PeerNetwork.stop`). So the monitor is always stopped
while its reader is still open, then the reader closed.
"""

from __future__ import annotations

import contextlib
from typing import Any

import zmq


def stop_monitor(socket: zmq.Socket[Any], reader: zmq.Socket[Any]) -> None:
    """Stop ``socket``'s monitor, then close its ``reader`` (the PAIR socket reading it)."""
    with contextlib.suppress(zmq.ZMQError):  # the socket may be closed already
        socket.disable_monitor()
    reader.close(linger=0)
