"""KV snapshots: what a router knows of its engines' KV-event streams, given to a replica
started late, and taken by one to seed its block index.

An engine's replay buffer holds its last batches only (SGLang keeps 10,000), and a block whose
parent the index never saw cannot be placed, so a replica started after the buffer wrapped
would never learn the prefixes stored before it (a hot system prompt is stored once). Such a
replica starts from a peer router's snapshot (`snapshot_of`): per stream, the engine hash ->
router key entries and the next sequence number. It takes one before any worker is
subscribed, from ``--kv-snapshot-from`` (`seed_from_url`: ``GET /kv_snapshot`` with an admin
key) or else from its peers over peering (`seed_from_peers`, `peer_snapshot`). `Seeds` keeps
what it took until the streams it describes are subscribed: `kv_events.KvEventHub` asks it
where each new stream starts (`Seeds.resume`), and the subscription then replays only from the
snapshot's number. If the engine no longer holds the batches since, the usual gap rule drops
the snapshot; if it no longer holds the snapshot's last batch nor any later one (it restarted
meanwhile, busy or idle), the snapshot's blocks are dropped (``engine_restart``) and the
stream is replayed from 0 (`kv_events`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol

import aiohttp

from tpuserve_router.config import RouterConfig
from tpuserve_router.engines import health
from tpuserve_router.engines.workers import InvalidWorkerURL, normalize_worker_url
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.kv.kv_publishers import Endpoints
from tpuserve_router.peering.peer_snapshot import (
    SnapshotService,
    snapshot_endpoint,
    unpack_snapshot,
)

if TYPE_CHECKING:
    from tpuserve_router.kv.kv_events import KvEventHub

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT: Final = "tpuserve-kv-snapshot-1"
"""Names the snapshot's layout and its router keys (`block_index.block_keys`): a router
takes only snapshots of its own format."""
MAX_PAGE_SIZE: Final = 1 << 20


class Stream(Protocol):
    """What a snapshot reads of a KV-event stream, and a seed sets (`kv_events`'s
    subscription)."""

    worker: str
    rank: int
    label: str
    endpoints: Endpoints
    expected: int | None
    """The next batch number, None while the stream knows nothing of its engine's."""
    seeded: bool
    """``expected`` (and the index) came from a peer's snapshot."""


@dataclass(frozen=True)
class Seed:
    """One stream of a peer's snapshot, waiting for its subscription."""

    worker: str
    rank: int
    events: str
    seq: int
    blocks: list[tuple[int, int | None]]


def snapshot_of(hub: KvEventHub) -> dict[str, Any]:
    """What ``hub``'s router knows of every stream it follows, for a peer started late: the
    index's entries and the next batch number (`SNAPSHOT_FORMAT`)."""
    index = hub.index
    streams = [
        {"worker": stream.worker, "rank": stream.rank, "events": stream.endpoints.events,
         "seq": stream.expected, "blocks": index.stream_blocks(stream.worker, stream.rank)}
        for stream in hub.streams()
        if stream.expected is not None
    ]  # fmt: skip
    return {"format": SNAPSHOT_FORMAT, "page_size": index.page_size, "streams": streams}


def snapshot_to_give(hub: KvEventHub | None) -> dict[str, Any] | None:
    """This router's snapshot for a peer over peering, None when it has none to give (it
    follows no KV events, or has heard no batch yet)."""
    if hub is None:
        return None
    snapshot = snapshot_of(hub)
    return snapshot if snapshot["streams"] else None


class Seeds:
    """The streams of a peer's snapshot, each kept until its subscription starts."""

    def __init__(self, index: BlockIndex) -> None:
        self.index = index
        self._waiting: dict[tuple[str, int], Seed] = {}

    def take(self, snapshot: object) -> int:
        """Keep a peer's snapshot until the streams it describes are subscribed; the number
        of streams taken. Raises ValueError naming what is wrong with it."""
        if not isinstance(snapshot, dict) or snapshot.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"KV snapshot: 'format' must be {SNAPSHOT_FORMAT!r}")
        page_size = snapshot.get("page_size")
        if not isinstance(page_size, int) or not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(
                f"KV snapshot: page_size {page_size!r}; allowed: an integer from 1 to "
                f"{MAX_PAGE_SIZE}"
            )
        streams = snapshot.get("streams")
        if not isinstance(streams, list):
            raise ValueError("KV snapshot: 'streams' must be a list")
        seeds: dict[tuple[str, int], Seed] = {}
        for i, stream in enumerate(streams):
            try:
                seed = Seed(
                    str(stream["worker"]), int(stream["rank"]), str(stream["events"]),
                    int(stream["seq"]),
                    [_snapshot_block(block) for block in stream["blocks"]],
                )  # fmt: skip
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"KV snapshot: streams[{i}] is malformed: {err!r}") from None
            seeds[(seed.worker, seed.rank)] = seed
        if not self.index.page_size_learned:
            self.index.page_size = page_size
        self._waiting.update(seeds)
        return len(seeds)

    async def take_packed(self, body: bytes, source: str) -> None:
        """`take` a packed snapshot from ``source``, unpacked off the event loop (ValueError
        when it cannot be read)."""
        snapshot = await asyncio.to_thread(unpack_snapshot, body)
        taken = self.take(snapshot)
        log.info("KV snapshot from %s: %d event streams", source, taken)

    def resume(self, stream: Stream) -> None:
        """A stream is about to start: from its seed, if a snapshot described it at the same
        endpoint and it knows nothing yet (its blocks loaded, its next batch number set)."""
        seed = self._waiting.pop((stream.worker, stream.rank), None)
        if seed is None or seed.events != stream.endpoints.events or stream.expected is not None:
            return
        self.index.load_stream(stream.worker, stream.rank, seed.blocks)
        stream.expected = seed.seq
        stream.seeded = True
        log.info(
            "%s: %d blocks from a peer router's snapshot, replaying from batch %d",
            stream.label, len(seed.blocks), seed.seq,
        )  # fmt: skip


async def seed_from_peers(seeds: Seeds, service: SnapshotService, peers: Iterable[str]) -> None:
    """Seed from the first snapshot one of ``peers`` (their peering endpoints) gives, all
    asked at once (`SnapshotService.take_from`)."""
    endpoints = [snapshot_endpoint(endpoint) for endpoint in peers]
    if endpoints and await service.take_from(endpoints, seeds.take_packed) is None:
        log.info("no KV snapshot from any peer: starting from the engines' replay")


async def seed_from_url(seeds: Seeds, url: str, config: RouterConfig) -> None:
    """Seed from ``GET URL/kv_snapshot`` with the admin key of ``--kv-snapshot-key-file``,
    within ``--kv-snapshot-timeout`` and ``--kv-snapshot-max-bytes``; on failure the
    engines' replay buffers are all the catch-up there is."""
    timeout = aiohttp.ClientTimeout(total=config.kv_snapshot_timeout_seconds)
    try:
        headers = {}
        if config.kv_snapshot_key_file is not None:
            key_file = Path(config.kv_snapshot_key_file)
            key = await asyncio.to_thread(key_file.read_text, encoding="utf-8")
            headers["Authorization"] = f"Bearer {key.strip()}"
        snapshot_url = normalize_worker_url(url)[0] + "/kv_snapshot"
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(snapshot_url, headers=headers) as response,
        ):
            response.raise_for_status()
            body = await read_bounded(response, config.kv_snapshot_max_bytes)
        await seeds.take_packed(body, url)
    except (OSError, aiohttp.ClientError, ValueError) as err:  # OSError: the key file too
        log.warning("no KV snapshot from %s: %s", url, err or type(err).__name__)


async def read_bounded(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """A snapshot's body, or ValueError once it is longer than ``max_bytes``."""
    too_long = f"the snapshot is larger than --kv-snapshot-max-bytes {max_bytes}"
    return await health.read_bounded(response, max_bytes, too_long)


def _int_within(value: object, low: int, high: int, what: str, kind: str) -> int:
    """A snapshot's number, refused (naming ``what`` and ``kind``) unless in ``[low, high)``."""
    number: int = int(value)  # type: ignore[call-overload]
    if not low <= number < high:
        raise ValueError(f"{what} {number} is not a {kind}")
    return number


def _snapshot_block(block: Any) -> tuple[int, int | None]:
    """A snapshot's (engine block hash, router key or None): a 64-bit engine hash, signed
    (SGLang) or not, and a key as `block_index.block_keys` gives them (signed 64-bit)."""
    engine_hash, key = block
    return (
        _int_within(engine_hash, -(1 << 63), 1 << 64, "engine block hash", "64-bit integer"),
        None
        if key is None
        else _int_within(key, -(1 << 63), 1 << 63, "router key", "signed 64-bit integer"),
    )


def snapshot_source_problems(config: RouterConfig) -> list[str]:
    """What is wrong with ``kv_snapshot_from``: a URL that is not a router's."""
    if config.kv_snapshot_from is None:
        return []
    try:
        normalize_worker_url(config.kv_snapshot_from)
    except InvalidWorkerURL as err:
        return [f"kv_snapshot_from: {err}"]
    return []
