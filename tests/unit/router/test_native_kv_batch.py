"""The compiled reader of the usual KV-event batch (`BlockIndex.apply_batch`) applies exactly
what the schema's Python decoder (`sglang_tpu.kv_events.decode_batch`) gives, on batches
SGLang's own classes encode (both wire generations), and declines everything else.

Declining is safe (the router then decodes the batch in Python, which names what is wrong);
applying a batch the Python decoder would read differently is not. So the differential
check runs both ways: on every batch the compiled reader applies, the Python decoder must
agree event for event; and on damaged payloads it must never apply what Python rejects.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from sglang_tpu.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventDecodeError,
    Wire,
    block_hashes,
    decode_batch,
    encode_batch,
)
from tests.sglang_kv_events import as_fields
from tests.unit.sglang_tpu.test_kv_events_sglang import legacy_classes, sglang_batch, twin_events
from tpuserve_router._native import ZmtpReader
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.kv.zmtp import MAX_FRAME_BYTES, MORE, message_frame

pytestmark = pytest.mark.unit

PAGE = 16
WORKER = "http://127.0.0.1:30000"


def common_events() -> list[Any]:
    return [e for e in twin_events() if not isinstance(e, AllBlocksCleared)]


def apply_in_python(index: BlockIndex, payload: bytes, rank: int = 0) -> tuple[int, int]:
    """What the router does with a batch the compiled reader declines."""
    stored = removed = 0
    for event in decode_batch(payload).events:
        if isinstance(event, BlockStored):
            index.store(WORKER, event.block_hashes, event.parent_block_hash, event.token_ids,
                        event.block_size, rank, event.medium)  # fmt: skip
            stored += 1
        elif isinstance(event, BlockRemoved):
            index.remove(WORKER, event.block_hashes, rank, event.medium)
            removed += 1
    return stored, removed


def state(index: BlockIndex, probes: list[list[int]]) -> tuple[Any, ...]:
    return (
        index.engine_hashes(WORKER), index.worker_blocks(WORKER), index.confirmed_blocks,
        index.orphan_blocks, index.page_size,
        [index.match(index.keys(tokens), [WORKER]) for tokens in probes],
    )  # fmt: skip


def probes() -> list[list[int]]:
    tokens = list(range(3000, 3000 + 3 * PAGE))
    return [tokens[: k * PAGE] for k in range(1, 4)]


def assert_same_as_python(payloads: list[bytes], rank: int = 0) -> None:
    native, python = BlockIndex(), BlockIndex()
    for payload in payloads:
        assert native.apply_batch(WORKER, payload, rank) == apply_in_python(python, payload, rank)
        assert state(native, probes()) == state(python, probes())


def test_sglangs_current_wire_applies_as_the_python_decoder_reads_it() -> None:
    events = common_events()
    payloads = [msgspec.msgpack.encode(sglang_batch(EventBatch(1.5, [e], 0))) for e in events]
    assert_same_as_python(payloads)
    whole = msgspec.msgpack.encode(sglang_batch(EventBatch(2, events, 3)))
    assert BlockIndex().apply_batch(WORKER, whole) == (3, 2)
    assert_same_as_python([whole], rank=1)


def test_sglangs_array_like_wire_applies_as_the_python_decoder_reads_it() -> None:
    legacy = dict(legacy_classes())
    wire_events = []
    for event in common_events():
        name, fields = as_fields(event)
        if name == "BlockStored" and fields.get("cache_salt") is not None:
            continue
        kept = set(legacy[name].__struct_fields__)
        wire_events.append(legacy[name](**{k: v for k, v in fields.items() if k in kept}))
    for tail in ([], [0]):
        assert_same_as_python([msgspec.msgpack.encode([3.5, wire_events, *tail])])


def raw_batch(event: bytes) -> bytes:
    """``[0, [event], 0]`` around a hand-written msgpack event."""
    return b"\x93\x00\x91" + event + b"\x00"


def unhashable_or_checked_by_msgpack() -> list[bytes]:
    """Events Python's msgpack refuses, or reads otherwise than a lenient reader would."""
    removed = b"\xa4type\xacBlockRemoved\xacblock_hashes\x91\x01"
    hidden = b"\xc0\xa4type\xacBlockRemoved\xacblock_hashes\x95"
    return [
        raw_batch(b"\x83\x90\x00" + removed),  # an array as a key: unhashable in Python
        # A bin key whose bytes look like a BlockRemoved: Python sees a map without a type.
        raw_batch(b"\x83\xc4" + bytes([len(hidden)]) + hidden + b"\x01\x02\x03\x04\x05"),
        raw_batch(b"\x83" + removed + b"\xa6medium\xd4\xff\x00"),  # a 1-byte timestamp
        raw_batch(b"\x83" + removed + b"\xa7lora_id\x81\x90\x01"),  # a nested array key
    ]


def test_python_refuses_or_misreads_what_it_declines() -> None:
    """The hand-written events above really are ones Python does not read as BlockRemoved."""
    for payload in unhashable_or_checked_by_msgpack():
        skipped: list[KVEventDecodeError] = []
        try:
            batch = decode_batch(payload, skipped)
        except KVEventDecodeError:
            continue
        assert batch.events == []
        assert len(skipped) == 1


def test_batches_it_does_not_read_are_left_to_python_untouched() -> None:
    tokens = list(range(PAGE))
    (block,) = block_hashes(tokens, PAGE)
    stored = BlockStored([block], None, tokens, PAGE)
    declined = [
        encode_batch(EventBatch(1.0, [stored, AllBlocksCleared()])),  # a resync: Python's job
        msgspec.msgpack.encode([1.0, [{"type": "BlockMoved", "block_hashes": [1]}]]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [block],
                                       "token_ids": tokens, "block_size": PAGE}]]),  # no parent
        msgspec.msgpack.encode([1.0, [["BlockStored", [block], None, tokens, 0, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [block], None, tokens, True, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [block], None, [2**63], PAGE, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockRemoved", ["not a hash"]]]]),
        msgspec.msgpack.encode([True, []]),
        msgspec.msgpack.encode([1.0]),
        msgspec.msgpack.encode({"ts": 1.0}),
        encode_batch(EventBatch(1.0, [stored])) + b"\x00",  # trailing bytes
        *unhashable_or_checked_by_msgpack(),
        b"\xc1",
        b"",
    ]  # fmt: skip
    for payload in declined:
        index = BlockIndex()
        assert index.apply_batch(WORKER, payload) is None, payload
        assert index.workers() == []


def msgpack_int(value: int, form: int) -> bytes:
    """``value`` in the msgpack integer format ``form`` (its first byte; 0 for a fixint)."""
    if form == 0:
        return value.to_bytes(1, "big", signed=value < 0)
    size = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}[form]
    return bytes([form]) + value.to_bytes(size, "big", signed=form >= 0xD0)


@pytest.mark.parametrize(
    ("token", "form"),
    [
        (5, 0), (127, 0), (200, 0xCC), (40_000, 0xCD), (100_000, 0xCE), (2**40, 0xCF),
        (7, 0xCC), (7, 0xCD), (7, 0xCE), (7, 0xCF), (7, 0xD0), (300, 0xD1), (7, 0xD3),
        (-1, 0), (-3, 0xD0), (-70_000, 0xD2),
    ],
)  # fmt: skip
def test_a_token_id_in_any_integer_format_is_read_as_python_reads_it(token: int, form: int) -> None:
    # The compiled reader takes the usual formats of an id in place, any other through its
    # general integer reader: every format must give what the Python decoder gives.
    tokens = [11, 12, token, *range(13, 13 + PAGE - 3)]
    (block,) = block_hashes(list(range(PAGE)), PAGE)  # any engine hash: it only names the block
    plain = msgspec.msgpack.encode(tokens)
    ids = bytes([0xDC]) + len(tokens).to_bytes(2, "big")
    ids += b"".join(msgpack_int(t, form if t == token else 0) for t in tokens)
    for wire in (Wire.CURRENT, Wire.LEGACY):
        payload = encode_batch(EventBatch(1.5, [BlockStored([block], None, tokens, PAGE)]), wire)
        assert payload.count(plain) == 1
        payload = payload.replace(plain, ids)
        (event,) = decode_batch(payload).events
        assert isinstance(event, BlockStored)
        assert event.token_ids == tokens
        assert_same_as_python([payload])


def test_damaged_payloads_are_never_applied_unlike_python() -> None:
    """Every truncation and many random byte changes of real batches: whatever the compiled
    reader applies, the Python decoder reads the same way (same events, none skipped)."""
    rng = random.Random(5)
    originals = [
        encode_batch(EventBatch(7.25, common_events(), 0), wire)
        for wire in (Wire.CURRENT, Wire.LEGACY)
    ]
    damaged = [p[:cut] for p in originals for cut in range(len(p))]
    for _ in range(3000):
        changed = bytearray(rng.choice(originals))
        for _ in range(rng.randint(1, 3)):
            changed[rng.randrange(len(changed))] = rng.randrange(256)
        damaged.append(bytes(changed))
    applied = 0
    for payload in damaged:
        native = BlockIndex()
        result = native.apply_batch(WORKER, payload)
        if result is None:
            assert native.workers() == []
            continue
        applied += 1
        skipped: list[KVEventDecodeError] = []
        batch = decode_batch(payload, skipped)
        assert skipped == []
        python = BlockIndex()
        try:
            assert apply_in_python(python, payload) == result
        except (TypeError, ValueError, OverflowError):  # pragma: no cover - a failure to see
            pytest.fail(f"compiled reader applied a batch Python cannot: {batch!r:.200}")
        assert state(native, probes()) == state(python, probes())
    assert applied > 0  # some changes (a token id, a timestamp) still make a good batch


def pub_message(seq: int, payload: bytes, topic: bytes = b"kv") -> bytes:
    """A KV-event PUB message as it comes over ZMTP: [topic, 8-byte seq, payload]."""
    return (
        bytes([MORE, len(topic)]) + topic + bytes([MORE, 8]) + seq.to_bytes(8, "big")
        + message_frame(payload)
    )  # fmt: skip


def test_the_reader_applies_the_next_batches_in_order_as_apply_batch_does() -> None:
    """`ZmtpReader.apply_in_order` (a stream's usual run, applied where it was read) leaves
    the index exactly as `apply_batch` on each payload would, and stops, leaving it queued
    for Python, at the first message that is not the next common batch."""
    events = common_events()
    payloads = [msgspec.msgpack.encode(sglang_batch(EventBatch(1.5, [e], 0))) for e in events]
    n = len(payloads)
    cleared = encode_batch(EventBatch(1.0, [AllBlocksCleared()]))
    reader = ZmtpReader(b"kv", MAX_FRAME_BYTES)
    reader.feed(
        b"".join(pub_message(7 + i, p) for i, p in enumerate(payloads))
        + pub_message(8, payloads[1], topic=b"other")  # not ours: dropped
        + pub_message(7 + n, cleared)  # not the common batch: Python's
        + pub_message(99, payloads[0])  # a gap: Python's
    )
    native, python = BlockIndex(), BlockIndex()
    counts = [python.apply_batch(WORKER, p, 2) for p in payloads]

    def total(some: list[tuple[int, int] | None]) -> tuple[int, int, int]:
        return len(some), sum(c[0] for c in some if c), sum(c[1] for c in some if c)

    assert reader.apply_in_order(native, WORKER, 2, 8, 1000) == (0, 0, 0)  # not the next
    assert reader.apply_in_order(native, WORKER, 2, 7, 2) == total(counts[:2])  # at most 2
    assert reader.apply_in_order(native, WORKER, 2, 9, 1000) == total(counts[2:])
    assert state(native, probes()) == state(python, probes())
    assert reader.apply_in_order(native, WORKER, 2, 7 + n, 1000) == (0, 0, 0)
    assert reader.popleft()[2] == cleared  # left for Python, whole
    assert reader.apply_in_order(native, WORKER, 2, 8 + n, 1000) == (0, 0, 0)
    assert reader.popleft()[1] == (99).to_bytes(8, "big")
    assert len(reader) == 0


def test_the_reader_leaves_malformed_messages_to_python() -> None:
    tokens = list(range(PAGE))
    (block,) = block_hashes(tokens, PAGE)
    payload = encode_batch(EventBatch(1.0, [BlockStored([block], None, tokens, PAGE)]))
    for message in (
        message_frame(b"kv"),  # one frame
        bytes([MORE, 2]) + b"kv" + bytes([MORE, 4]) + b"\x00" * 4 + message_frame(payload),
        bytes([MORE, 2]) + b"kv" + bytes([MORE, 8]) + bytes(8) + message_frame(b"\xc1"),
    ):
        reader = ZmtpReader(b"kv", MAX_FRAME_BYTES)
        reader.feed(message + pub_message(1, payload))
        index = BlockIndex()
        assert reader.apply_in_order(index, WORKER, 0, 0, 1000) == (0, 0, 0)
        assert len(reader) == 2
        assert index.workers() == []
