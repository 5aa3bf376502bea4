"""Free loopback ports for components that cannot bind port 0."""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
import time
from pathlib import Path

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


def test_free_ports_stay_out_of_sglangs_rendezvous_range() -> None:
    """SGLang picks an engine's --nccl-port there and binds it only after loading its model."""
    chosen = ports.free_ports(200) + [ports.free_port_pair() for _ in range(20)]
    assert not [p for p in chosen if p in ports.SGLANG_RENDEZVOUS_PORTS]


def choose(count: int) -> list[int]:
    return ports.free_ports(count)


def test_choosers_in_parallel_processes_never_hand_out_one_port_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port is reserved between its check and its component's bind, for every process."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again, here and in children
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        chosen = [p for ports_of_one in pool.map(choose, [40] * 8) for p in ports_of_one]
    assert len(chosen) == len(set(chosen)) == 320
    (directory,) = tmp_path.glob("tpuserve-ports-*")
    assert {int(p.name) for p in directory.iterdir() if p.name.isdigit()} == set(chosen)


def test_a_reservation_holds_a_port_until_it_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (port,) = ports.free_ports(1)
    with ports._reservations() as reserved:
        assert port in reserved
    path = next(tmp_path.glob(f"tpuserve-ports-*/{port}"))
    old = time.time() - ports.RESERVATION_SECONDS - 1
    os.utime(path, (old, old))
    with ports._reservations() as reserved:
        assert port not in reserved
    assert not path.exists()  # swept: the directory holds only live reservations
