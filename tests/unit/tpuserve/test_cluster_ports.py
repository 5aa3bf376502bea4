"""Free loopback ports for components that cannot bind port 0."""

from __future__ import annotations

import socket

import pytest

from tpuserve.cluster import ports

pytestmark = pytest.mark.unit


def test_a_port_pair_is_bindable_and_below_the_ephemeral_range() -> None:
    """Below the range, no outgoing connection or port-0 bind can take P + 1 meanwhile."""
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.free_port_pair()
        assert port + 1 < low or low <= ports._FLOOR + 2
        for each in (port, port + 1):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((ports.LOOPBACK, each))


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low = ports._ephemeral_low()
    chosen = ports.free_ports(16)
    assert len(set(chosen)) == 16
    assert all(port < low for port in chosen) or low <= ports._FLOOR + 16
    for port in chosen:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((ports.LOOPBACK, port))
