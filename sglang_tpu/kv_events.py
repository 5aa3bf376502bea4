"""The KV-event schema: the one module that knows SGLang's KV-cache event wire format.

The engine twin publishes with it and the router decodes with it. It mirrors SGLang's
``sglang/srt/disaggregation/kv_events.py`` (msgspec structs with ``array_like=True``,
``omit_defaults=True`` and the class name as tag) and ``mem_cache`` hashing:

Payload (msgpack)::

    EventBatch       = [ts: float, events: [Event, ...]  (, attn_dp_rank)]
    BlockStored      = ["BlockStored", block_hashes: [int], parent_block_hash: int | None,
                        token_ids: [int], block_size: int, lora_id: int | None (, medium)]
    BlockRemoved     = ["BlockRemoved", block_hashes: [int] (, medium)]
    AllBlocksCleared = ["AllBlocksCleared"]

Fields in parentheses are optional trailing fields (omitted when None); decoding reads
positionally and ignores any further trailing fields, so newer SGLang or vLLM payloads still
decode. vLLM may send block hashes as bytes; they decode as bytes.

ZMQ framing: every batch is a 3-frame PUB message ``[topic, seq (8-byte big-endian), payload]``;
``seq`` starts at 0 in each publisher process, so a backwards jump means the engine
restarted. The replay socket is a ROUTER: a client sends ``[b"", start_seq (8-byte BE)]``
(a DEALER sends the empty delimiter itself) and receives ``[b"", seq, payload]`` for every
buffered batch with ``seq >= start_seq``, then ``[b"", END_SEQ, b""]`` with END_SEQ = -1
(signed 8-byte BE).

Block hashes: SGLang emits one BlockStored per page of ``page_size`` tokens. A page's hash is
``SHA256(previous page digest || uint32-LE of each token)`` (no previous digest for the
first page of a sequence) and the event carries the first 8 bytes of the digest as a signed
big-endian int64. `block_hashes` recomputes that chain from token ids.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

BlockHash = int | bytes

END_SEQ = -1
END_SEQ_BYTES = END_SEQ.to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"


class KVEventDecodeError(ValueError):
    """A payload or frame set that is not a KV-event batch."""


@dataclass(slots=True)  # not frozen: a frozen init costs 2x, and routers decode every event
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None

    def to_wire(self) -> list[Any]:
        wire: list[Any] = [
            "BlockStored",
            self.block_hashes,
            self.parent_block_hash,
            self.token_ids,
            self.block_size,
            self.lora_id,
        ]
        if self.medium is not None:
            wire.append(self.medium)
        return wire


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None = None

    def to_wire(self) -> list[Any]:
        wire: list[Any] = ["BlockRemoved", self.block_hashes]
        if self.medium is not None:
            wire.append(self.medium)
        return wire


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    def to_wire(self) -> list[Any]:
        return ["AllBlocksCleared"]


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: list[KVEvent] = field(default_factory=list)
    attn_dp_rank: int | None = None


def encode_batch(batch: EventBatch) -> bytes:
    """msgpack payload of one batch, byte-compatible with SGLang's msgspec encoder."""
    wire: list[Any] = [batch.ts, [e.to_wire() for e in batch.events]]
    if batch.attn_dp_rank is not None:
        wire.append(batch.attn_dp_rank)
    out: bytes = msgpack.packb(wire, use_bin_type=True)
    return out


def _decode_event(raw: Any) -> KVEvent | None:
    # Hot path (a router decodes every event every engine publishes): positional
    # construction and type checks instead of copies.
    if type(raw) is not list or not raw or type(raw[0]) is not str:
        raise KVEventDecodeError(f"event is not a tagged array: {raw!r:.80}")
    tag = raw[0]
    n = len(raw)
    try:
        if tag == "BlockStored":
            hashes, tokens = raw[1], raw[3]
            if type(hashes) is not list or type(tokens) is not list:
                raise TypeError("block_hashes and token_ids must be arrays")
            return BlockStored(
                hashes,
                raw[2],
                tokens,
                int(raw[4]),
                raw[5] if n > 5 else None,
                raw[6] if n > 6 else None,
            )
        if tag == "BlockRemoved":
            hashes = raw[1]
            if type(hashes) is not list:
                raise TypeError("block_hashes must be an array")
            return BlockRemoved(hashes, raw[2] if n > 2 else None)
    except (IndexError, TypeError, ValueError) as err:
        raise KVEventDecodeError(f"malformed {tag} event: {raw!r:.80}") from err
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None  # an event type this schema does not know (newer engines); skipped


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack payload; unknown event types are skipped, extra fields ignored."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as err:  # msgpack raises several unrelated exception types
        raise KVEventDecodeError(f"payload is not msgpack: {err}") from err
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise KVEventDecodeError(f"payload is not [ts, events, ...]: {raw!r:.80}")
    events = []
    for r in raw[1]:
        event = _decode_event(r)
        if event is not None:
            events.append(event)
    dp_rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else None
    return EventBatch(ts=float(raw[0]), events=events, attn_dp_rank=dp_rank)


# --- ZMQ framing ------------------------------------------------------------------------


def pub_frames(topic: bytes, seq: int, payload: bytes) -> tuple[bytes, bytes, bytes]:
    """The 3 frames of one published batch."""
    return topic, seq.to_bytes(8, "big"), payload


def parse_pub_frames(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """(topic, seq, payload) of a received PUB message."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise KVEventDecodeError(
            f"expected 3 frames [topic, 8-byte seq, payload], got {len(frames)} frames"
        )
    return frames[0], int.from_bytes(frames[1], "big"), frames[2]


def replay_request(start_seq: int) -> list[bytes]:
    """Frames a DEALER sends to the replay ROUTER to get every batch from `start_seq` on."""
    return [b"", start_seq.to_bytes(8, "big")]


def parse_replay_reply(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """(seq, payload) of one replay reply received on a DEALER; seq == END_SEQ ends it."""
    if len(frames) == 3 and frames[0] == b"":
        frames = frames[1:]
    if len(frames) != 2 or len(frames[0]) != 8:
        raise KVEventDecodeError(f"replay reply is not [b'', seq, payload]: {len(frames)} frames")
    return int.from_bytes(frames[0], "big", signed=True), frames[1]


# --- block hashes -----------------------------------------------------------------------


def page_digest(token_ids: Sequence[int], prior_digest: bytes | None) -> bytes:
    """SHA-256 digest of one page, chained on the previous page's digest."""
    hasher = hashlib.sha256()
    if prior_digest:
        hasher.update(prior_digest)
    hasher.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return hasher.digest()


def digest_to_int64(digest: bytes) -> int:
    """The event id of a page digest: its first 8 bytes as a signed big-endian int64."""
    return int.from_bytes(digest[:8], "big", signed=True)


def block_hashes(
    token_ids: Sequence[int], page_size: int, prior_digest: bytes | None = None
) -> list[int]:
    """Event block hashes of every full page of `token_ids` (a partial tail is not cached).

    With `prior_digest` None the chain starts at the root, as SGLang's first page does.
    """
    if page_size <= 0:
        raise ValueError(f"page_size: {page_size!r} is not allowed; allowed: an integer >= 1")
    out: list[int] = []
    digest = prior_digest
    full = len(token_ids) - len(token_ids) % page_size
    for start in range(0, full, page_size):
        digest = page_digest(token_ids[start : start + page_size], digest)
        out.append(digest_to_int64(digest))
    return out
