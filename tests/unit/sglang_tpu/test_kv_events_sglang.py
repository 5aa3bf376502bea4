"""The twin's KV-event bytes are SGLang 0.5.23's, checked with SGLang's own classes from the wheel.

Both directions: what the twin encodes decodes with SGLang's ``KVEventBatch`` to the same
event types and fields (and is byte for byte what SGLang's encoder writes), and what SGLang's
classes encode decodes in the router to the same events. The twin's legacy encoding is
rejected by SGLang's decoder, so a twin switched back to it fails these tests. Events in the
0.5.6-0.5.19 array shape are built from SGLang's own struct fields with ``array_like`` on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from sglang_tpu.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    Wire,
    block_hashes,
    decode_batch,
    encode_batch,
)
from tests.sglang_kv_events import as_fields, batch_decoder, sglang_kv_events

pytestmark = pytest.mark.unit

PAGE = 16


def twin_events() -> list[KVEvent]:
    """Every event type, with every optional field both set and left out."""
    tokens = list(range(3000, 3000 + 3 * PAGE))
    hashes = block_hashes(tokens, PAGE)
    return [
        BlockStored(hashes[:2], None, tokens[: 2 * PAGE], PAGE, None, "GPU"),
        BlockStored(hashes[2:], hashes[1], tokens[2 * PAGE :], PAGE, 4, "CPU", "salt", "s", "x"),
        BlockStored([hashes[0]], None, tokens[:PAGE], PAGE),
        BlockRemoved(hashes, "GPU"),
        BlockRemoved([hashes[0]]),
        AllBlocksCleared(),
    ]


def sglang_batch(batch: EventBatch) -> Any:
    """The same batch built from SGLang's classes."""
    module = sglang_kv_events()
    events = [getattr(module, name)(**fields) for name, fields in map(as_fields, batch.events)]
    return module.KVEventBatch(ts=batch.ts, events=events, attn_dp_rank=batch.attn_dp_rank)


@pytest.fixture(scope="module")
def decoder() -> Any:
    return batch_decoder()


def test_sglang_decodes_the_twins_batch_to_the_same_events(decoder: Any) -> None:
    batch = EventBatch(1700000000.25, twin_events(), 0)
    decoded = decoder.decode(encode_batch(batch))
    assert (decoded.ts, decoded.attn_dp_rank) == (batch.ts, 0)
    assert [as_fields(e) for e in decoded.events] == [as_fields(e) for e in batch.events]


def test_the_twins_bytes_are_sglangs_bytes() -> None:
    batch = EventBatch(1700000000.25, twin_events(), 2)
    assert encode_batch(batch) == msgspec.msgpack.encode(sglang_batch(batch))


def test_the_router_decodes_sglangs_batch_to_the_same_events() -> None:
    batch = EventBatch(12.5, twin_events(), 1)
    assert decode_batch(msgspec.msgpack.encode(sglang_batch(batch))) == batch


def test_sglang_rejects_the_twins_legacy_encoding(decoder: Any) -> None:
    """The differential check can fail: the old twin's bytes do not decode."""
    legacy = encode_batch(EventBatch(1.0, twin_events()[:1]), Wire.LEGACY)
    with pytest.raises(msgspec.ValidationError, match=r"Expected `object`, got `array`"):
        decoder.decode(legacy)


def test_the_event_types_and_fields_are_sglangs() -> None:
    """A field SGLang adds (or renames) shows up here before the twin silently drops it."""
    module = sglang_kv_events()
    for ours in (BlockStored, BlockRemoved, AllBlocksCleared):
        theirs = getattr(module, ours.__name__)
        assert [f.name for f in dataclasses.fields(ours)] == list(theirs.__struct_fields__)
    assert [f.name for f in dataclasses.fields(EventBatch)] == list(
        module.KVEventBatch.__struct_fields__
    )


# ---------------------------------------------------------------- the 0.5.6-0.5.19 array shape


def legacy_classes() -> Iterator[tuple[str, Any]]:
    """SGLang's event structs as the array-like generation declared them: same names and
    fields (BlockStored up to ``medium``; the salt and session came later), tagged arrays."""
    module = sglang_kv_events()
    for name, last in (("BlockStored", "medium"), ("BlockRemoved", "medium"),
                       ("AllBlocksCleared", None)):  # fmt: skip
        fields = msgspec.structs.fields(getattr(module, name))
        names = [f.name for f in fields]
        kept = fields[: names.index(last) + 1] if last else ()
        spec = [(f.name, f.type) if f.required else (f.name, f.type, f.default) for f in kept]
        yield name, msgspec.defstruct(name, spec, array_like=True, tag=True)


def test_the_router_decodes_sglangs_array_like_events() -> None:
    legacy = dict(legacy_classes())
    events = [e for e in twin_events() if not isinstance(e, BlockStored) or e.cache_salt is None]
    wire_events = []
    for event in events:
        name, fields = as_fields(event)
        kept = set(legacy[name].__struct_fields__)
        wire_events.append(legacy[name](**{k: v for k, v in fields.items() if k in kept}))
    for rank in (None, 0):  # 2-element batches of the oldest releases, then with the rank
        tail = [] if rank is None else [rank]
        payload = msgspec.msgpack.encode([3.5, wire_events, *tail])
        assert decode_batch(payload) == EventBatch(3.5, events, rank)
