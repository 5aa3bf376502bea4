"""KV events encode in both SGLang wire generations, decode from either, and hash like SGLang.

That the current encoding is byte for byte SGLang 0.5.23's is checked against SGLang's own
classes in `test_kv_events_sglang.py`; this module checks the layouts and the tolerance.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest

from sglang_tpu.kv_events import (
    DECODE_ERROR_REASONS,
    END_SEQ,
    END_SEQ_BYTES,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    KVEventDecodeError,
    Wire,
    block_hashes,
    coalesce,
    decode_batch,
    encode_batch,
    page_stores,
    parse_pub_frames,
    parse_replay_reply,
    pub_frames,
    replay_reply,
    replay_request,
)

pytestmark = pytest.mark.unit


def sglang_reference_hashes(tokens: list[int], page_size: int) -> list[int]:
    """SGLang's get_hash_str + hash_str_to_int64, written the way SGLang writes it (hex strings)."""
    out, prior = [], None
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        hasher = hashlib.sha256()
        if prior:
            hasher.update(bytes.fromhex(prior))
        for t in tokens[start : start + page_size]:
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = hasher.hexdigest()
        value = int(prior[:16], 16)
        out.append(value - 2**64 if value >= 2**63 else value)
    return out


def test_block_hashes_match_sglangs_hex_chain() -> None:
    tokens = list(range(1000, 1000 + 70))
    assert block_hashes(tokens, 16) == sglang_reference_hashes(tokens, 16)
    assert len(block_hashes(tokens, 16)) == 4  # the partial tail page is not a block


def test_hash_depends_on_position() -> None:
    page = [7] * 4
    first, second = block_hashes(page + page, 4)
    assert first != second


def sample_events() -> list[KVEvent]:
    return [
        BlockStored([11, 12], None, [1, 2, 3, 4], 2, None, "GPU"),
        BlockStored([13], 12, [5, 6], 2, 7, "GPU", "tenant-a", "session-1", "adapter-x"),
        BlockRemoved([11], "GPU"),
        AllBlocksCleared(),
    ]


def test_current_encoding_is_tagged_maps_in_a_three_element_batch() -> None:
    raw = msgpack.unpackb(encode_batch(EventBatch(1.5, sample_events(), 0)))
    assert raw == [
        1.5,
        [
            {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
             "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": None, "medium": "GPU"},
            {"type": "BlockStored", "block_hashes": [13], "parent_block_hash": 12,
             "token_ids": [5, 6], "block_size": 2, "lora_id": 7, "medium": "GPU",
             "cache_salt": "tenant-a", "session_id": "session-1", "lora_name": "adapter-x"},
            {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"},
            {"type": "AllBlocksCleared"},
        ],
        0,
    ]  # fmt: skip
    first = next(iter(raw[1][0]))
    assert first == "type"  # msgspec writes the tag first


def test_current_encoding_keeps_the_rank_element_when_no_rank_is_set() -> None:
    assert msgpack.unpackb(encode_batch(EventBatch(2.0, []))) == [2.0, [], None]


def test_legacy_encoding_is_tagged_arrays_in_a_two_element_batch() -> None:
    events = sample_events()[:1] + sample_events()[2:]
    raw = msgpack.unpackb(encode_batch(EventBatch(1.5, events), Wire.LEGACY))
    assert raw == [
        1.5,
        [
            ["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None, "GPU"],
            ["BlockRemoved", [11], "GPU"],
            ["AllBlocksCleared"],
        ],
    ]


@pytest.mark.parametrize("wire", list(Wire))
def test_both_encodings_decode_to_the_same_batch(wire: Wire) -> None:
    events = sample_events() if wire is Wire.CURRENT else sample_events()[:1] + sample_events()[2:]
    batch = EventBatch(1.5, events, 3)
    assert decode_batch(encode_batch(batch, wire)) == batch


def test_one_batch_may_mix_maps_and_arrays() -> None:
    payload = msgpack.packb(
        [1.0, [["BlockRemoved", [1], "GPU"], {"type": "BlockRemoved", "block_hashes": [2]}]]
    )
    assert decode_batch(payload).events == [BlockRemoved([1], "GPU"), BlockRemoved([2])]


def test_decoding_tolerates_missing_optional_and_extra_fields() -> None:
    payload = msgpack.packb(
        [
            2.0,
            [
                ["BlockStored", [5], 4, [9, 9], 2, None],
                ["BlockStored", [6], 5, [8], 1, None, "CPU", {"cache_salt": "s"}, ["extra"]],
                ["BlockRemoved", [b"\x01\x02"]],
                {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
                 "token_ids": [1], "block_size": 1, "group_idx": 0, "extra_keys": [None]},
                {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU", "new": 1},
            ],
            0,
            "future-field",
        ]
    )  # fmt: skip
    batch = decode_batch(payload)
    assert batch.attn_dp_rank == 0
    assert batch.events == [
        BlockStored([5], 4, [9, 9], 2, None, None),
        BlockStored([6], 5, [8], 1, None, "CPU", "s"),
        BlockRemoved([b"\x01\x02"]),  # type: ignore[list-item]  # vLLM sends bytes hashes
        BlockStored([7], None, [1], 1),
        BlockRemoved([7], "GPU"),
    ]


def map_stored(**fields: Any) -> dict[str, Any]:
    event = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
             "token_ids": [1, 2], "block_size": 2, "lora_id": None}  # fmt: skip
    event.update(fields)
    return {k: v for k, v in event.items() if v != "<absent>"}


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (["BlockStored", [1]], "malformed_event"),
        (["BlockStored", 7, None, [1, 2], 2], "malformed_event"),  # hashes not an array
        (["BlockStored", [7], None, "ab", 2], "malformed_event"),  # tokens not an array
        (["BlockStored", [7], None, [1, 2], "x"], "malformed_event"),  # block size
        (["BlockStored", [7], None, [1, 2], True], "malformed_event"),  # a bool is no size
        (["BlockStored", [7], None, [1, 2], 0], "malformed_event"),
        (["BlockRemoved", 7], "malformed_event"),
        ([3, [7]], "malformed_event"),  # tag not a string
        ([], "malformed_event"),
        (map_stored(block_hashes="<absent>"), "malformed_event"),
        (map_stored(parent_block_hash="<absent>"), "malformed_event"),
        (map_stored(token_ids=None), "malformed_event"),
        (map_stored(block_size=2.0), "malformed_event"),
        (map_stored(block_size=-1), "malformed_event"),
        ({"type": "BlockRemoved"}, "malformed_event"),
        ({"block_hashes": [1]}, "malformed_event"),  # no type
        (7, "malformed_event"),
        (["SomethingNew", 1, 2], "unknown_event"),
        ({"type": "SomethingNew"}, "unknown_event"),
    ],
)
def test_a_bad_event_raises_or_is_skipped_with_its_reason(event: Any, reason: str) -> None:
    good = {"type": "BlockRemoved", "block_hashes": [1]}
    payload = msgpack.packb([1.0, [good, event, good], 0])
    with pytest.raises(KVEventDecodeError) as raised:
        decode_batch(payload)
    assert raised.value.reason == reason
    skipped: list[KVEventDecodeError] = []
    assert decode_batch(payload, skipped).events == [BlockRemoved([1]), BlockRemoved([1])]
    assert [s.reason for s in skipped] == [reason]
    assert reason in DECODE_ERROR_REASONS


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgpack.packb({"ts": 1}),
        msgpack.packb([1.0]),
        msgpack.packb([1.0, {"events": []}]),
        msgpack.packb(["now", []]),
    ],
)
def test_a_payload_that_is_not_a_batch_always_raises(payload: bytes) -> None:
    lists: tuple[list[KVEventDecodeError] | None, ...] = (None, [])
    for skipped in lists:
        with pytest.raises(KVEventDecodeError) as raised:
            decode_batch(payload, skipped)
        assert raised.value.reason == "undecodable_batch"


# ---------------------------------------------------------------- coalescing (0.5.23's recorder


def test_a_chain_of_page_stores_becomes_one_event() -> None:
    tokens = list(range(12))
    events = page_stores(tokens, 4, "GPU")
    assert coalesce(events) == [BlockStored(block_hashes(tokens, 4), None, tokens, 4, None, "GPU")]
    assert events == page_stores(tokens, 4, "GPU")  # the inputs are left alone


def test_stores_that_do_not_chain_or_differ_stay_apart() -> None:
    first, second = page_stores(list(range(8)), 4, "GPU")
    other = page_stores([9, 9, 9, 9], 4, "GPU")[0]  # hangs off the root, not off `first`
    salted = BlockStored(second.block_hashes, second.parent_block_hash, second.token_ids, 4,
                         None, "GPU", "salt")  # fmt: skip
    assert coalesce([first, other]) == [first, other]
    assert coalesce([first, salted]) == [first, salted]
    assert len(coalesce([first, BlockRemoved([1]), second])) == 3


def test_consecutive_removals_of_one_medium_become_one() -> None:
    events: list[KVEvent] = [BlockRemoved([1], "GPU"), BlockRemoved([2, 3], "GPU"),
                             BlockRemoved([4], "CPU_PINNED"), AllBlocksCleared()]  # fmt: skip
    assert coalesce(events) == [
        BlockRemoved([1, 2, 3], "GPU"),
        BlockRemoved([4], "CPU_PINNED"),
        AllBlocksCleared(),
    ]


# ---------------------------------------------------------------- framing and replay


def test_pub_frames_carry_an_eight_byte_big_endian_sequence() -> None:
    frames = pub_frames(b"kv", 258, b"p")
    assert frames[1] == b"\x00" * 6 + b"\x01\x02"
    assert parse_pub_frames(frames) == (b"kv", 258, b"p")
    with pytest.raises(KVEventDecodeError) as raised:
        parse_pub_frames([b"kv", b"p"])
    assert raised.value.reason == "bad_frames"


def test_replay_replies_of_each_generation() -> None:
    seq = (3).to_bytes(8, "big")
    assert replay_request(3) == [b"", seq]
    assert replay_reply(b"id", b"kv", 3, b"p") == (b"id", b"", b"kv", seq, b"p")
    assert replay_reply(b"id", b"kv", END_SEQ, b"") == (b"id", b"", b"", END_SEQ_BYTES, b"")
    assert replay_reply(b"id", b"kv", 3, b"p", Wire.LEGACY) == (b"id", b"", seq, b"p")
    assert replay_reply(b"id", b"kv", END_SEQ, b"", Wire.LEGACY) == (
        b"id", b"", END_SEQ_BYTES, b""
    )  # fmt: skip


@pytest.mark.parametrize(
    "frames",
    [
        [(3).to_bytes(8, "big"), b"p"],  # REQ socket, old layout
        [b"", (3).to_bytes(8, "big"), b"p"],  # DEALER, old layout
        [b"kv", (3).to_bytes(8, "big"), b"p"],  # REQ socket, 0.5.23
        [b"", b"kv", (3).to_bytes(8, "big"), b"p"],  # DEALER, 0.5.23
        [b"client", b"", b"kv", (3).to_bytes(8, "big"), b"p"],  # ROUTER-side capture
    ],
)
def test_replay_replies_parse_in_every_layout(frames: list[bytes]) -> None:
    assert parse_replay_reply(frames) == (3, b"p")


def test_the_end_marker_parses_in_both_generations() -> None:
    assert parse_replay_reply([b"", b"", END_SEQ_BYTES, b""]) == (END_SEQ, b"")
    assert parse_replay_reply([b"", END_SEQ_BYTES, b""]) == (END_SEQ, b"")


@pytest.mark.parametrize(
    "frames", [[b"p"], [b"", b"short", b"p"], [b"a", b"b", b"c", b"d", b"e", b"f"]]
)
def test_other_replay_replies_are_bad_frames(frames: list[bytes]) -> None:
    with pytest.raises(KVEventDecodeError) as raised:
        parse_replay_reply(frames)
    assert raised.value.reason == "bad_frames"
