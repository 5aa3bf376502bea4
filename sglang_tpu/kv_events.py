"""The KV-event schema: the one module that knows SGLang's KV-cache event wire format.

The engine twin publishes with it and the router decodes with it. It follows SGLang's
``sglang/srt/disaggregation/kv_events.py`` (msgspec structs, the class name as tag,
``omit_defaults``) and ``mem_cache`` hashing. Two generations of the wire are in the field:

- ``Wire.CURRENT`` (SGLang 0.5.21 on; the pinned 0.5.23): every event is a tagged *map* and
  the batch is always 3 elements (SGLang's publisher fills in its DP rank)::

      EventBatch       = [ts, [Event, ...], attn_dp_rank]
      BlockStored      = {"type": "BlockStored", "block_hashes": [int], "parent_block_hash":
                          int | None, "token_ids": [int], "block_size": int, "lora_id":
                          int | None (, "medium", "cache_salt", "session_id", "lora_name")}
      BlockRemoved     = {"type": "BlockRemoved", "block_hashes": [int] (, "medium")}
      AllBlocksCleared = {"type": "AllBlocksCleared"}

  Keys in parentheses are left out when None (``lora_id`` has no default, so it is always
  there). Consecutive events of a step are coalesced as SGLang's recorder does (`coalesce`).
- ``Wire.LEGACY`` (SGLang 0.5.6-0.5.19): every event is a tagged *array*, the batch 2
  elements (3 when a DP rank is set)::

      EventBatch       = [ts, [Event, ...] (, attn_dp_rank)]
      BlockStored      = ["BlockStored", block_hashes, parent_block_hash, token_ids,
                          block_size, lora_id (, medium (, {"cache_salt": ..,
                          "session_id": ..}))]
      BlockRemoved     = ["BlockRemoved", block_hashes (, medium)]
      AllBlocksCleared = ["AllBlocksCleared"]

`decode_batch` reads both, event by event, and ignores keys and trailing fields it does not
know, so newer SGLang still decodes. Block hashes are typed as SGLang's (int64); vLLM's
bytes hashes pass through undecoded (they only serve as keys).

ZMQ framing: every batch is a 3-frame PUB message ``[topic, seq (8-byte big-endian), payload]``;
``seq`` starts at 0 in each publisher process, so a backwards jump means the engine
restarted. The replay socket is a ROUTER: a client sends ``[b"", start_seq (8-byte BE)]``
(a DEALER sends the empty delimiter itself) and gets every buffered batch with
``seq >= start_seq``, then an end marker with seq END_SEQ = -1 (signed 8-byte BE). A DEALER
receives ``[b"", topic, seq, payload]`` and ``[b"", b"", END_SEQ, b""]`` from 0.5.23 (the topic
frame came with 0.5.22/0.5.23), ``[b"", seq, payload]`` and ``[b"", END_SEQ, b""]`` from older
engines; `parse_replay_reply` takes either.

Block hashes: a page's hash is ``SHA256(previous page digest || uint32-LE of each token)``
(no previous digest for the first page of a sequence) and the event carries the first 8
bytes of the digest as a signed big-endian int64. `block_hashes` recomputes that chain.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

END_SEQ: Final = -1
END_SEQ_BYTES: Final = END_SEQ.to_bytes(8, "big", signed=True)
MEDIUM_GPU: Final = "GPU"
# SGLang's StorageMedium.CPU: the host-memory tier of HiCache (docs/host-kv-tier.md).
MEDIUM_HOST: Final = "CPU_PINNED"


class Wire(enum.Enum):
    """Which SGLang generation's KV-event wire a publisher speaks (see the module docstring)."""

    CURRENT = "0.5.23"
    LEGACY = "0.5.19"


DECODE_ERROR_REASONS: Final = (
    "bad_frames",  # not [topic, 8-byte seq, payload], or a replay reply of another shape
    "undecodable_batch",  # the payload is not msgpack, or not [ts, [events], ...]
    "malformed_event",  # a known event type with missing or mistyped fields
    "unknown_event",  # an event type this schema does not know (a newer engine)
)


class KVEventDecodeError(ValueError):
    """Frames, a payload or an event that is not SGLang's KV-event wire.

    ``reason`` is one of `DECODE_ERROR_REASONS` (a bounded metric label)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)  # not frozen: a frozen init costs 2x, and routers decode every event
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None

    def to_map(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": self.block_hashes,
            "parent_block_hash": self.parent_block_hash,
            "token_ids": self.token_ids,
            "block_size": self.block_size,
            "lora_id": self.lora_id,
        }
        for key, value in (
            ("medium", self.medium),
            ("cache_salt", self.cache_salt),
            ("session_id", self.session_id),
            ("lora_name", self.lora_name),
        ):
            if value is not None:
                wire[key] = value
        return wire

    def to_array(self) -> list[Any]:
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
    block_hashes: list[int]
    medium: str | None = None

    def to_map(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": self.block_hashes}
        if self.medium is not None:
            wire["medium"] = self.medium
        return wire

    def to_array(self) -> list[Any]:
        wire: list[Any] = ["BlockRemoved", self.block_hashes]
        if self.medium is not None:
            wire.append(self.medium)
        return wire


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    def to_map(self) -> dict[str, Any]:
        return {"type": "AllBlocksCleared"}

    def to_array(self) -> list[Any]:
        return ["AllBlocksCleared"]


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: list[KVEvent] = field(default_factory=list)
    attn_dp_rank: int | None = None


def encode_batch(batch: EventBatch, wire: Wire = Wire.CURRENT) -> bytes:
    """msgpack payload of one batch. `Wire.CURRENT` is byte for byte what SGLang 0.5.23's
    msgspec encoder writes for the same batch; `Wire.LEGACY` is the array shape of
    0.5.6-0.5.19 (what the twin sent before it spoke 0.5.23)."""
    out: bytes
    if wire is Wire.CURRENT:
        maps = [e.to_map() for e in batch.events]
        out = msgpack.packb([batch.ts, maps, batch.attn_dp_rank], use_bin_type=True)
        return out
    arrays: list[Any] = [batch.ts, [e.to_array() for e in batch.events]]
    if batch.attn_dp_rank is not None:
        arrays.append(batch.attn_dp_rank)
    out = msgpack.packb(arrays, use_bin_type=True)
    return out


def coalesce(events: Sequence[KVEvent]) -> list[KVEvent]:
    """Merge runs of events as SGLang 0.5.23's event recorder does before publishing.

    A ``BlockStored`` whose parent is the previous store's last block (and with the same
    medium, LoRA, block size, salt and session) extends it; consecutive ``BlockRemoved`` of
    one medium become one. The inputs are not modified."""
    out: list[KVEvent] = []
    for event in events:
        tail = out[-1] if out else None
        if isinstance(event, BlockStored) and isinstance(tail, BlockStored):
            if (
                tail.block_hashes
                and event.parent_block_hash == tail.block_hashes[-1]
                and (tail.medium, tail.lora_id, tail.block_size, tail.cache_salt)
                == (event.medium, event.lora_id, event.block_size, event.cache_salt)
                and (tail.session_id, tail.lora_name) == (event.session_id, event.lora_name)
            ):
                tail.block_hashes = [*tail.block_hashes, *event.block_hashes]
                tail.token_ids = [*tail.token_ids, *event.token_ids]
                continue
        elif (
            isinstance(event, BlockRemoved)
            and isinstance(tail, BlockRemoved)
            and tail.medium == event.medium
        ):
            tail.block_hashes = [*tail.block_hashes, *event.block_hashes]
            continue
        if isinstance(event, BlockStored):
            event = BlockStored(
                list(event.block_hashes),
                event.parent_block_hash,
                list(event.token_ids),
                event.block_size,
                event.lora_id,
                event.medium,
                event.cache_salt,
                event.session_id,
                event.lora_name,
            )
        elif isinstance(event, BlockRemoved):
            event = BlockRemoved(list(event.block_hashes), event.medium)
        out.append(event)
    return out


# --- decoding (the router's hot path: it decodes every event every engine publishes) ----


def _malformed(tag: object, raw: object) -> KVEventDecodeError:
    return KVEventDecodeError("malformed_event", f"malformed {tag} event: {raw!r:.80}")


def _decode_map_event(raw: dict[Any, Any]) -> KVEvent:
    tag = raw.get("type")
    try:
        if tag == "BlockStored":
            hashes = raw["block_hashes"]
            tokens = raw["token_ids"]
            size = raw["block_size"]
            if type(hashes) is not list or type(tokens) is not list or type(size) is not int:
                raise TypeError("block_hashes, token_ids: arrays; block_size: an integer")
            if size < 1:
                raise ValueError("block_size must be >= 1")
            get = raw.get
            return BlockStored(
                hashes,
                raw["parent_block_hash"],
                tokens,
                size,
                get("lora_id"),
                get("medium"),
                get("cache_salt"),
                get("session_id"),
                get("lora_name"),
            )
        if tag == "BlockRemoved":
            hashes = raw["block_hashes"]
            if type(hashes) is not list:
                raise TypeError("block_hashes must be an array")
            return BlockRemoved(hashes, raw.get("medium"))
    except (KeyError, TypeError, ValueError) as err:
        raise _malformed(tag, raw) from err
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if type(tag) is not str:
        raise KVEventDecodeError("malformed_event", f"event map without a type: {raw!r:.80}")
    raise KVEventDecodeError("unknown_event", f"unknown event type {tag!r}")


def _decode_array_event(raw: list[Any]) -> KVEvent:
    tag = raw[0] if raw else None
    n = len(raw)
    try:
        if tag == "BlockStored":
            hashes, tokens, size = raw[1], raw[3], raw[4]
            if type(hashes) is not list or type(tokens) is not list or type(size) is not int:
                raise TypeError("block_hashes, token_ids: arrays; block_size: an integer")
            if size < 1:
                raise ValueError("block_size must be >= 1")
            if n < 8:
                lora_id = raw[5] if n > 5 else None
                return BlockStored(hashes, raw[2], tokens, size, lora_id, raw[6] if n > 6 else None)
            meta = raw[7] if type(raw[7]) is dict else {}  # salted stores: a metadata map
            return BlockStored(
                hashes, raw[2], tokens, size, raw[5], raw[6],
                meta.get("cache_salt"), meta.get("session_id"), meta.get("lora_name"),
            )  # fmt: skip
        if tag == "BlockRemoved":
            hashes = raw[1]
            if type(hashes) is not list:
                raise TypeError("block_hashes must be an array")
            return BlockRemoved(hashes, raw[2] if n > 2 else None)
    except (IndexError, TypeError, ValueError) as err:
        raise _malformed(tag, raw) from err
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if type(tag) is not str:
        raise KVEventDecodeError("malformed_event", f"event array without a tag: {raw!r:.80}")
    raise KVEventDecodeError("unknown_event", f"unknown event type {tag!r}")


def decode_batch(payload: bytes, skipped: list[KVEventDecodeError] | None = None) -> EventBatch:
    """Decode one msgpack payload of either wire generation, event by event.

    An event that is malformed or of an unknown type raises `KVEventDecodeError`, or, when
    ``skipped`` is a list, is left out of the batch and its error appended there (the
    router's choice: the rest of the batch is still good). A payload that is not a batch
    always raises."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as err:  # msgpack raises several unrelated exception types
        raise KVEventDecodeError("undecodable_batch", f"payload is not msgpack: {err}") from err
    if type(raw) is not list or len(raw) < 2 or type(raw[1]) is not list:
        raise KVEventDecodeError("undecodable_batch", f"not [ts, events, ...]: {raw!r:.80}")
    ts = raw[0]
    if type(ts) is not float and type(ts) is not int:
        raise KVEventDecodeError("undecodable_batch", f"batch ts is not a number: {ts!r:.40}")
    events: list[KVEvent] = []
    append = events.append
    for event in raw[1]:
        try:
            kind = type(event)
            if kind is dict:
                append(_decode_map_event(event))
            elif kind is list:
                append(_decode_array_event(event))
            else:
                raise KVEventDecodeError(
                    "malformed_event", f"event is neither a map nor an array: {event!r:.80}"
                )
        except KVEventDecodeError as err:
            if skipped is None:
                raise
            skipped.append(err)
    rank = raw[2] if len(raw) > 2 and type(raw[2]) is int else None
    return EventBatch(ts, events, rank)


# --- ZMQ framing ------------------------------------------------------------------------


def pub_frames(topic: bytes, seq: int, payload: bytes) -> tuple[bytes, bytes, bytes]:
    """The 3 frames of one published batch."""
    return topic, seq.to_bytes(8, "big"), payload


def parse_pub_frames(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """(topic, seq, payload) of a received PUB message."""
    if len(frames) != 3 or len(frames[1]) != 8:
        raise KVEventDecodeError(
            "bad_frames",
            f"expected 3 frames [topic, 8-byte seq, payload], got {len(frames)} frames",
        )
    return frames[0], int.from_bytes(frames[1], "big"), frames[2]


def replay_request(start_seq: int) -> list[bytes]:
    """Frames a DEALER sends to the replay ROUTER to get every batch from `start_seq` on."""
    return [b"", start_seq.to_bytes(8, "big")]


def replay_reply(
    client: bytes, topic: bytes, seq: int, payload: bytes, wire: Wire = Wire.CURRENT
) -> tuple[bytes, ...]:
    """Frames a replay ROUTER sends for one batch (`END_SEQ` and b"" payload: the end)."""
    seq_bytes = seq.to_bytes(8, "big", signed=True)
    if wire is Wire.CURRENT:
        return client, b"", topic if seq != END_SEQ else b"", seq_bytes, payload
    return client, b"", seq_bytes, payload


def parse_replay_reply(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """(seq, payload) of one replay reply; seq == END_SEQ ends the replay.

    Accepts every layout in the field: ``[b"", topic, seq, payload]`` (0.5.23, on a DEALER),
    ``[b"", seq, payload]`` (older engines), with or without the empty delimiter (a REQ
    socket strips it), and with the client id in front, as a ROUTER-side capture shows it
    (``[client, b"", topic, seq, payload]``). Seq and payload are always the last two."""
    n = len(frames)
    if n < 2 or n > 5 or len(frames[-2]) != 8:
        raise KVEventDecodeError(
            "bad_frames", f"replay reply is not [..., 8-byte seq, payload]: {n} frames"
        )
    return int.from_bytes(frames[-2], "big", signed=True), frames[-1]


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


def page_stores(
    token_ids: Sequence[int], page_size: int, medium: str | None = None
) -> list[BlockStored]:
    """One `BlockStored` per full page of `token_ids`, each chained to the page before: the
    events of caching them page by page, before `coalesce` (what SGLang before 0.5.23 sends)."""
    hashes = block_hashes(token_ids, page_size)
    return [
        BlockStored([h], hashes[i - 1] if i else None,
                    list(token_ids[i * page_size : (i + 1) * page_size]), page_size, None, medium)
        for i, h in enumerate(hashes)
    ]  # fmt: skip
