"""KV events encode as SGLang's msgspec arrays, decode tolerantly, and hash like SGLang."""

from __future__ import annotations

import hashlib

import msgpack
import pytest

from sglang_tpu.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventDecodeError,
    block_hashes,
    decode_batch,
    encode_batch,
    parse_pub_frames,
    parse_replay_reply,
    pub_frames,
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


def test_encoding_is_sglangs_array_like_tagged_layout() -> None:
    batch = EventBatch(
        ts=1.5,
        events=[
            BlockStored([11], None, [1, 2], 2, None, "GPU"),
            BlockRemoved([11], "GPU"),
            AllBlocksCleared(),
        ],
    )
    raw = msgpack.unpackb(encode_batch(batch))
    assert raw == [
        1.5,
        [
            ["BlockStored", [11], None, [1, 2], 2, None, "GPU"],
            ["BlockRemoved", [11], "GPU"],
            ["AllBlocksCleared"],
        ],
    ]
    assert decode_batch(encode_batch(batch)) == batch


def test_decoding_tolerates_missing_optional_and_extra_trailing_fields() -> None:
    payload = msgpack.packb(
        [
            2.0,
            [
                ["BlockStored", [5], 4, [9, 9], 2, None],
                ["BlockStored", [6], 5, [8], 1, None, "CPU", "lora-x", ["extra"]],
                ["BlockRemoved", [b"\x01\x02"]],
                ["SomethingNew", 1, 2],
            ],
            0,
            "future-field",
        ]
    )
    batch = decode_batch(payload)
    assert batch.attn_dp_rank == 0
    assert batch.events == [
        BlockStored([5], 4, [9, 9], 2, None, None),
        BlockStored([6], 5, [8], 1, None, "CPU"),
        BlockRemoved([b"\x01\x02"]),
    ]


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgpack.packb({"ts": 1}),
        msgpack.packb([1.0, [["BlockStored", [1]]]]),
        msgpack.packb([1.0, [["BlockStored", 7, None, [1, 2], 2]]]),  # hashes not an array
        msgpack.packb([1.0, [["BlockStored", [7], None, "ab", 2]]]),  # tokens not an array
        msgpack.packb([1.0, [["BlockStored", [7], None, [1, 2], "x"]]]),  # block size
        msgpack.packb([1.0, [["BlockRemoved", 7]]]),
        msgpack.packb([1.0, [[3, [7]]]]),  # tag not a string
    ],
)
def test_garbage_payloads_raise_a_decode_error(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload)


def test_pub_frames_carry_an_eight_byte_big_endian_sequence() -> None:
    frames = pub_frames(b"kv", 258, b"p")
    assert frames[1] == b"\x00" * 6 + b"\x01\x02"
    assert parse_pub_frames(frames) == (b"kv", 258, b"p")
    with pytest.raises(KVEventDecodeError):
        parse_pub_frames([b"kv", b"p"])


def test_replay_protocol_frames() -> None:
    assert replay_request(3) == [b"", (3).to_bytes(8, "big")]
    assert parse_replay_reply([b"", (3).to_bytes(8, "big"), b"p"]) == (3, b"p")
    end = parse_replay_reply([(-1).to_bytes(8, "big", signed=True), b""])
    assert end == (END_SEQ, b"")
