"""CPU cost of decoding one KV-event batch, per wire encoding, as the router's subscriber pays it.

A batch holds 8 events like an engine's decode steps under load: 6 ``BlockStored`` of one
16-token page each (chained) and 2 ``BlockRemoved`` of 2 hashes each. The payload is built
with msgpack exactly as each SGLang generation lays it out: *array* (tagged arrays, SGLang
0.5.6-0.5.19) and *map* (tagged maps and a 3-element batch, 0.5.21 on; the pinned 0.5.23).
``sglang_tpu.kv_events.decode_batch`` is timed for both; times are the thread's CPU time
(``time.thread_time_ns``), the median of ``--rounds`` rounds of ``--batches`` decodes each.

    taskset -c 1 python bench/kv_event_decode.py [--batches 20000] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import msgpack

from sglang_tpu.kv_events import block_hashes, decode_batch

PAGE = 16
STORED = 6
REMOVED = 2


def _events() -> list[tuple[str, dict[str, Any]]]:
    tokens = list(range(5000, 5000 + STORED * PAGE))
    hashes = block_hashes(tokens, PAGE)
    events: list[tuple[str, dict[str, Any]]] = []
    for i, block in enumerate(hashes):
        stored = {
            "block_hashes": [block],
            "parent_block_hash": hashes[i - 1] if i else None,
            "token_ids": tokens[i * PAGE : (i + 1) * PAGE],
            "block_size": PAGE,
            "lora_id": None,
            "medium": "GPU",
        }
        events.append(("BlockStored", stored))
    for i in range(REMOVED):
        removed = {"block_hashes": hashes[2 * i : 2 * i + 2], "medium": "GPU"}
        events.append(("BlockRemoved", removed))
    return events


def payloads() -> dict[str, bytes]:
    """One 8-event batch in each encoding, laid out as SGLang's msgspec encoder does."""
    events = _events()
    array = [[tag, *fields.values()] for tag, fields in events]
    tagged_maps = [{"type": tag, **fields} for tag, fields in events]
    return {
        "array": msgpack.packb([1.0, array], use_bin_type=True),
        "map": msgpack.packb([1.0, tagged_maps, 0], use_bin_type=True),
    }


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, float | None] = {}
    print(f"{'encoding':<10}{'bytes':>8}{'µs per 8-event batch':>24}")
    for name, payload in payloads().items():
        try:
            micros: float | None = time_decode(payload, args.batches, args.rounds)
        except ValueError as err:  # KVEventDecodeError: this decoder cannot read it
            micros = None
            print(f"{name:<10}{len(payload):>8}{'undecodable':>24}  ({err})")
        else:
            print(f"{name:<10}{len(payload):>8}{micros:>24.2f}")
        results[name] = micros
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
