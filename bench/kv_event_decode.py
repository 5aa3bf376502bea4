"""CPU cost of decoding KV-event batches, per SGLang wire generation, as the router pays it.

Two batches, each encoded by `sglang_tpu.kv_events.encode_batch` in both wires: *legacy*
(tagged arrays, SGLang 0.5.6-0.5.19) and *current* (tagged maps in a 3-element batch, 0.5.21
on; the pinned 0.5.23, whose recorder coalesces chained stores):

- ``decode-8``: 8 events of a busy decode step, 6 ``BlockStored`` of one 16-token page each
  (six requests, so nothing coalesces) and 2 ``BlockRemoved`` of 2 hashes each;
- ``prefill-12``: a 192-token prompt cached at once, 12 chained pages: 12 events on the
  legacy wire, 1 on the current one (as a real 0.5.23 engine sends it).

``decode_batch`` is timed on the thread's CPU clock (``time.thread_time_ns``); the median of
``--rounds`` rounds of ``--batches`` decodes each, in µs per batch and per block.

    taskset -c 1 python bench/kv_event_decode.py [--batches 20000] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

from sglang_tpu.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    EventBatch,
    KVEvent,
    Wire,
    block_hashes,
    coalesce,
    decode_batch,
    encode_batch,
    page_stores,
)

PAGE = 16


def decode_step() -> list[KVEvent]:
    events: list[KVEvent] = []
    for request in range(6):  # each request's second page, chained to its first
        start = 5000 + 1000 * request
        events.append(page_stores(range(start, start + 2 * PAGE), PAGE, "GPU")[1])
    for request in range(2):
        tokens = list(range(90000 + 1000 * request, 90000 + 1000 * request + 2 * PAGE))
        events.append(BlockRemoved(block_hashes(tokens, PAGE), "GPU"))
    return events


def prefill() -> list[KVEvent]:
    return [*page_stores(range(7000, 7000 + 12 * PAGE), PAGE, "GPU")]


def payloads() -> dict[tuple[str, str], tuple[bytes, int]]:
    """(batch, wire) -> (payload, blocks in it), laid out as each SGLang generation sends it."""
    out: dict[tuple[str, str], tuple[bytes, int]] = {}
    for name, events in (("decode-8", decode_step()), ("prefill-12", prefill())):
        blocks = sum(len(e.block_hashes) for e in events if not isinstance(e, AllBlocksCleared))
        out[(name, "legacy")] = (encode_batch(EventBatch(1.0, events), Wire.LEGACY), blocks)
        current = EventBatch(1.0, coalesce(events), 0)
        out[(name, "current")] = (encode_batch(current, Wire.CURRENT), blocks)
    return out


def time_decode(payload: bytes, batches: int, rounds: int) -> float:
    """Median microseconds of CPU per decoded batch."""
    decode_batch(payload)  # fails loudly here when the encoding is not understood
    per_round = []
    gc.disable()
    try:
        for _ in range(rounds):
            start = time.thread_time_ns()
            for _ in range(batches):
                decode_batch(payload)
            per_round.append((time.thread_time_ns() - start) / batches / 1000)
    finally:
        gc.enable()
    return statistics.median(per_round)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    print(f"{'batch':<12}{'wire':<9}{'bytes':>7}{'µs/batch':>10}{'µs/block':>10}")
    for (name, wire), (payload, blocks) in payloads().items():
        micros = time_decode(payload, args.batches, args.rounds)
        print(f"{name:<12}{wire:<9}{len(payload):>7}{micros:>10.2f}{micros / blocks:>10.2f}")
        results[f"{name}/{wire}"] = {"bytes": len(payload), "us_per_batch": micros}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
