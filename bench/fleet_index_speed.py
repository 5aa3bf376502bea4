"""The fleet model's block index against the router's own (`tpuserve_router.kv.BlockIndex`, Rust),
on the fleet hour's workload at 1,000 chips: what each costs per simulated request.

Issue 69 asked the fleet model (`tpuserve/fleet/`) to use the router's index instead of its own
(`tpuserve.fleet.index`), or to say with a measurement why not. Both answer the questions the
fleet's routing asks of an index, on the same requests and the same engines:

- the longest prefix of a prompt's blocks that any engine holds, and which engines hold it
  (the fleet: a binary search over ``holders``, then ``holders.get``; the router's index:
  ``keys`` of the prompt, then ``match`` against every engine, the holders being those at the
  deepest match);
- an engine caching a prompt's blocks past what it held and evicting its least recently used
  ones (the fleet: `hold` / `unhold` per block; the router's index: one ``store`` of the new
  blocks with their parent, one ``remove`` of the evicted ones, as KV events).

The requests are the fleet hour's (``bench/fleet_hour.py``'s `FleetConfig`: 250 v6e ``2x2``
replicas of Llama 3.1 8B, the Mooncake mix), drawn by `FleetSim.requests`; each engine's cache
is an LRU of the performance model's KV pool; a request goes to an engine holding its longest
prefix (the lowest-numbered, so both runs route alike) or, with none or one time in five,
round-robin. The two runs must agree on every prefix and holder set (checked), so only the
index's cost differs. Both loops include the engines' LRU work, the same in both; the figure
is each loop's time less that of the same loop without an index (``run_no_index``).

    .venv/bin/python bench/fleet_index_speed.py --requests 200000 --rounds 3 \
        --json bench/fleet_results/2026-12-07e/index_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_tpu.perf_model import get_profile, kv_pool_tokens
from tpuserve.fleet import FleetConfig, FleetSim
from tpuserve.fleet.index import Holders, depth, hold, unhold
from tpuserve_router.kv.block_index import BlockIndex

ROUND_ROBIN_EVERY = 5


def workload(n: int) -> tuple[list[tuple[int, ...]], int, int]:
    """The fleet hour's first ``n`` requests' blocks, its engines and their cache in blocks."""
    config = FleetConfig(replicas=250, initial_replicas=250, duration_seconds=3600.0)
    sim = FleetSim(config)
    requests = [r.blocks for r in sim.requests(n)]
    c = sim.config
    pool = kv_pool_tokens(c.shape, c.profile or get_profile(c.model, "model"), c.quantization)
    return requests, c.replicas, pool // c.block_tokens


def _pick(i: int, holders: list[int], engines: int) -> int:
    if holders and i % ROUND_ROBIN_EVERY:
        return holders[0]
    return i % engines


def _lru(cache: OrderedDict[int, None], blocks: tuple[int, ...], cap: int) -> list[int]:
    """Cache ``blocks``, touched from the last to the first (parents freshest, so children go
    first and what an engine holds stays a prefix, as in `tpuserve.fleet.engines`); the
    evicted ones."""
    for b in reversed(blocks):
        if b in cache:
            cache.move_to_end(b)
        else:
            cache[b] = None
    evicted = []
    while len(cache) > cap:
        evicted.append(cache.popitem(last=False)[0])
    return evicted


def run_fleet_index(
    requests: list[tuple[int, ...]], engines: int, cap: int
) -> tuple[float, list[tuple[int, ...]]]:
    holders: Holders = {}
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(engines)]
    seen: list[tuple[int, ...]] = []
    start = time.process_time()
    for i, blocks in enumerate(requests):
        d = depth(blocks, holders.__contains__)
        h = holders.get(blocks[d - 1]) if d else None
        held = sorted([h] if isinstance(h, int) else h) if h is not None else []
        seen.append((d, *held))
        e = _pick(i, held, engines)
        cache = caches[e]
        own = depth(blocks, cache.__contains__)
        for b in blocks[own:]:
            hold(holders, b, e)
        for b in _lru(cache, blocks, cap):
            unhold(holders, b, e)
    return time.process_time() - start, seen


def run_router_index(
    requests: list[tuple[int, ...]], engines: int, cap: int
) -> tuple[float, list[tuple[int, ...]]]:
    index = BlockIndex(page_size=1, max_stream_blocks=4 * cap, clock=lambda: 0.0)
    names = [f"e{e}" for e in range(engines)]
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(engines)]
    seen: list[tuple[int, ...]] = []
    start = time.process_time()
    for i, blocks in enumerate(requests):
        keys = index.keys(list(blocks))
        depths = index.match(keys, names)
        d = max(depths)
        held = [e for e, x in enumerate(depths) if x == d] if d else []
        seen.append((d, *held))
        e = _pick(i, held, engines)
        own = depths[e]
        new = list(blocks[own:])
        if new:
            parent = blocks[own - 1] if own else None
            index.store(names[e], new, parent, new, 1)
        evicted = _lru(caches[e], blocks, cap)
        if evicted:
            index.remove(names[e], evicted)
    return time.process_time() - start, seen


def run_no_index(
    requests: list[tuple[int, ...]], engines: int, cap: int, seen: list[tuple[int, ...]]
) -> float:
    """The same loop without an index (the holders given, from a run with one): what the
    engines' LRU and the loop cost, subtracted from both."""
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(engines)]
    out: list[tuple[int, ...]] = []
    start = time.process_time()
    for i, blocks in enumerate(requests):
        got = seen[i]
        out.append(got)
        e = _pick(i, list(got[1:]), engines)
        depth(blocks, caches[e].__contains__)
        _lru(caches[e], blocks, cap)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    for name in ("requests", "rounds"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    requests, engines, cap = workload(args.requests)
    mean_blocks = sum(map(len, requests)) / len(requests)
    n = len(requests)
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):  # the three loops one after the other, each round
        fleet_s, fleet_seen = run_fleet_index(requests, engines, cap)
        router_s, router_seen = run_router_index(requests, engines, cap)
        if fleet_seen != router_seen:
            pairs = enumerate(zip(fleet_seen, router_seen, strict=True))
            first = next(i for i, (a, b) in pairs if a != b)
            ours, theirs = fleet_seen[first][:6], router_seen[first][:6]
            raise SystemExit(f"the indexes disagree at request {first}: {ours} against {theirs}")
        base_s = run_no_index(requests, engines, cap, fleet_seen)
        rounds.append({
            "loop_without_index_us": base_s / n * 1e6,
            "fleet_index_us": (fleet_s - base_s) / n * 1e6,
            "router_index_us": (router_s - base_s) / n * 1e6,
        })  # fmt: skip
    median = {k: round(statistics.median(r[k] for r in rounds), 1) for k in rounds[0]}
    out: dict[str, Any] = {
        "requests": n,
        "engines": engines,
        "cache_blocks_per_engine": cap,
        "mean_blocks_per_request": round(mean_blocks, 1),
        "rounds": [{k: round(v, 1) for k, v in r.items()} for r in rounds],
        "median_us_per_request": median,
        "ratio": round(median["router_index_us"] / median["fleet_index_us"], 2),
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(out, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
