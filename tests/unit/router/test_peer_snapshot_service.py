"""The snapshot service without sockets (`peer_snapshot`): a snapshot that cannot be read is
a ValueError, the packed snapshot is built at most once per `CACHE_SECONDS`, and a start asks
all peers at once, taking the first snapshot it can read, whatever the others do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest

from tests.fakes import VirtualClock
from tpuserve_router.peering.peer_snapshot import CACHE_SECONDS, SnapshotService, unpack_snapshot

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "body",
    [
        b"\x81\x91\x01\x01",  # {[1]: 1}: msgpack raises TypeError (unhashable key)
        b"\x81\x81\x01\x01\x01",  # {{1: 1}: 1}
        b"\xc1",  # never used
        b"\x92\x01",  # cut short
        b"\x01\x02",  # extra data
    ],
)
def test_a_snapshot_that_cannot_be_read_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError, match="not a msgpack snapshot"):
        unpack_snapshot(body)


def test_a_snapshot_with_integer_keys_is_read() -> None:
    assert unpack_snapshot(msgpack.packb({1: [2]})) == {1: [2]}


class Giver:
    """A block index that counts how often its snapshot is built."""

    def __init__(self) -> None:
        self.built = 0
        self.snapshot: dict[str, Any] | None = {"streams": [1]}

    def __call__(self) -> dict[str, Any] | None:
        self.built += 1
        return self.snapshot


@pytest.fixture
async def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
async def giver() -> Giver:
    return Giver()


@pytest.fixture
async def snapshots(giver: Giver, clock: VirtualClock) -> AsyncIterator[SnapshotService]:
    service = SnapshotService(
        giver, host="127.0.0.1", port=1, timeout_seconds=30.0, max_bytes=1 << 20, clock=clock
    )
    yield service
    service.context.term()


async def test_the_packed_snapshot_is_built_once_per_cache_period(
    snapshots: SnapshotService, giver: Giver, clock: VirtualClock
) -> None:
    first = await snapshots.packed()
    clock.advance(CACHE_SECONDS / 2)
    giver.snapshot = {"streams": [2]}
    assert await snapshots.packed() == first == msgpack.packb({"streams": [1]})
    assert giver.built == 1
    clock.advance(CACHE_SECONDS / 2)
    assert await snapshots.packed() == msgpack.packb({"streams": [2]})
    assert giver.built == 2


async def test_having_none_to_give_is_kept_too(
    snapshots: SnapshotService, giver: Giver, clock: VirtualClock
) -> None:
    giver.snapshot = None
    assert await snapshots.packed() is None
    assert await snapshots.packed() is None
    assert giver.built == 1


async def test_a_start_asks_all_peers_at_once_and_takes_the_first_it_can_read(
    snapshots: SnapshotService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The silent peer, listed first, answers only once the others were asked: asked in turn,
    the start would wait on it and take nothing."""
    asked: list[str] = []
    others_asked = asyncio.Event()
    cancelled: list[str] = []

    async def ask(endpoint: str) -> bytes | None:
        asked.append(endpoint)
        if endpoint == "silent":
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.append(endpoint)
        if endpoint == "late-good":
            await others_asked.wait()
            return b"good"
        if len(asked) == 4:
            others_asked.set()
        return {"none": None, "garbage": b"garbage", "broken": b"broken"}[endpoint]

    async def take(body: bytes, endpoint: str) -> None:
        if body == b"garbage":
            raise ValueError("not a snapshot")
        if body == b"broken":
            raise TypeError("a bug the start must survive")
        taken.append((body, endpoint))

    taken: list[tuple[bytes, str]] = []
    monkeypatch.setattr(snapshots, "ask", ask)
    peers = ["silent", "late-good", "none", "garbage", "broken"]
    async with asyncio.timeout(10):  # a hang guard only: asked in turn, this would never end
        assert await snapshots.take_from(peers, take) == "late-good"
    assert sorted(asked) == sorted(peers)
    assert taken == [(b"good", "late-good")]
    assert cancelled == ["silent"]


async def test_a_start_waits_for_the_peers_in_all_not_per_peer(
    snapshots: SnapshotService, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    async def ask(endpoint: str) -> bytes | None:
        asked.append(endpoint)
        await asyncio.Event().wait()
        return None

    async def take(body: bytes, endpoint: str) -> None:
        raise AssertionError("nothing to take")

    monkeypatch.setattr(snapshots, "ask", ask)
    snapshots.timeout_seconds = 0.05
    async with asyncio.timeout(10):  # a hang guard only: asked in turn, this would never end
        assert await snapshots.take_from(["a", "b", "c"], take) is None
    assert sorted(asked) == ["a", "b", "c"]
