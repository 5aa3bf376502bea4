"""Decision latency of the prefix policies with 16 workers and 10^6 indexed blocks.

In-process, on one core: each policy's index is filled to 10^6 blocks (16-token blocks for
`precise` and `cost`, fed as the engines' BlockStored events; 64-character blocks of text,
i.e. 64 M characters, for `cache_aware`), then ``choose`` is timed for 20,000 requests of
~2 kB (496 tokens): half extend an indexed prompt (hits), half are new (misses). The
prompt's tokenization, which the router does before ``choose`` for token policies, is
timed separately with the engine twin's default tokenizer. Times are the thread's CPU time
(``time.thread_time_ns``), so neighbours on a shared machine do not inflate them.

    taskset -c 1 python bench/router_decisions.py [--blocks 1000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_tpu.kv_events import block_hashes
from sglang_tpu.tokenizer import load_tokenizer
from tpuserve_router.policies import RouteRequest, make_policy

PAGE = 16
PAGES_PER_PROMPT = 31  # 496 tokens, about 2 kB of text
CHARS_PER_BLOCK = 64
WORKERS = 16


@dataclass
class Worker:
    name: str
    in_flight: int = 0
    healthy: bool = True
    peer_prefill_tokens: int = 0


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def token_prompt(rng: random.Random) -> list[int]:
    return [rng.randrange(3000, 100_000) for _ in range(PAGES_PER_PROMPT * PAGE)]


def text_prompt(rng: random.Random) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(rng.choice(letters) for _ in range(PAGES_PER_PROMPT * CHARS_PER_BLOCK))


def fill_block_index(
    policy: Any, workers: list[Worker], blocks: int, rng: random.Random
) -> list[list[int]]:
    """Feed BlockStored events until the index holds ``blocks`` blocks; returns the prompts."""
    index = policy.block_index
    prompts = []
    stored = 0
    i = 0
    while stored < blocks:
        tokens = token_prompt(rng)
        hashes = block_hashes(tokens, PAGE)
        name = workers[i % len(workers)].name
        index.store(name, hashes[:1], None, tokens[:PAGE], PAGE)
        for p in range(1, len(hashes)):
            index.store(
                name, hashes[p : p + 1], hashes[p - 1], tokens[p * PAGE : (p + 1) * PAGE], PAGE
            )
        stored += len(hashes)
        prompts.append(tokens)
        i += 1
    return prompts


def fill_tree(policy: Any, workers: list[Worker], blocks: int, rng: random.Random) -> list[str]:
    prompts = []
    chars = 0
    i = 0
    while chars < blocks * CHARS_PER_BLOCK:
        text = text_prompt(rng)
        policy.tree("").insert(text, workers[i % len(workers)].name)
        chars += len(text)
        prompts.append(text)
        i += 1
    return prompts


def bench_policy(name: str, blocks: int, requests: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    workers = [Worker(f"http://10.0.0.{i}:30000") for i in range(WORKERS)]
    policy = make_policy(name, seed=seed)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fill_started = time.perf_counter()
    if name == "cache_aware":
        indexed: list[Any] = fill_tree(policy, workers, blocks, rng)
        size = policy.index_sizes()["tree_chars"] // CHARS_PER_BLOCK
    else:
        indexed = fill_block_index(policy, workers, blocks, rng)
        size = policy.index_sizes()["confirmed_blocks"]
    fill_seconds = time.perf_counter() - fill_started
    queries: list[RouteRequest] = []
    for i in range(requests):
        base = rng.choice(indexed)
        if name == "cache_aware":
            text = (
                base[: 24 * CHARS_PER_BLOCK] + text_prompt(rng)[: 7 * CHARS_PER_BLOCK]
                if i % 2
                else text_prompt(rng)
            )
            queries.append(RouteRequest("", text, None))
        else:
            tokens = (
                base[: 24 * PAGE] + token_prompt(rng)[: 7 * PAGE] if i % 2 else token_prompt(rng)
            )
            queries.append(RouteRequest("", "", tokens))
    gc.collect()
    timings = []
    outcomes: dict[str, int] = {}
    # CPU time of this thread: on a shared 2-core machine wall time would mostly measure the
    # neighbours (preemption); a garbage collection inside choose() still counts.
    clock = time.thread_time_ns
    for request in queries:
        start = clock()
        decision = policy.choose(request, workers)
        timings.append((clock() - start) / 1000)
        policy.on_prefill_done(decision)
        policy.on_request_done(decision, True)
        outcomes[decision.outcome] = outcomes.get(decision.outcome, 0) + 1
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "policy": name,
        "indexed_blocks": size,
        "workers": WORKERS,
        "decisions": requests,
        "p50_us": percentile(timings, 0.5),
        "p99_us": percentile(timings, 0.99),
        "max_us": max(timings),
        "outcomes": outcomes,
        "fill_seconds": fill_seconds,
        "max_rss_growth_mib": (rss_after - rss_before) / 1024,
    }


def tokenize_cost(requests: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    tokenizer = load_tokenizer()
    words = [
        " " + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    texts = ["".join(rng.choice(words) for _ in range(350)) for _ in range(requests)]
    timings = []
    for text in texts:
        start = time.thread_time_ns()
        tokenizer.encode(text)
        timings.append((time.thread_time_ns() - start) / 1000)
    return {"p50_us": percentile(timings, 0.5), "p99_us": percentile(timings, 0.99),
            "chars": sum(map(len, texts)) / len(texts)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--policies", default="cache_aware,precise,cost")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for name in args.policies.split(","):
        row = bench_policy(name, args.blocks, args.requests, args.seed)
        rows.append(row)
        print(f"{name}: {row['indexed_blocks']} blocks, {WORKERS} workers: decision p50 "
              f"{row['p50_us']:.1f} us, p99 {row['p99_us']:.1f} us, max {row['max_us']:.0f} us; "
              f"outcomes {row['outcomes']}; index filled in {row['fill_seconds']:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
        gc.collect()
    tokenize = tokenize_cost(2000, args.seed)
    print(
        f"tokenizing a ~{tokenize['chars']:.0f}-char prompt (default tokenizer): p50 "
        f"{tokenize['p50_us']:.1f} us, p99 {tokenize['p99_us']:.1f} us",
        file=sys.stderr,
    )
    if args.json:
        args.json.write_text(json.dumps({"decisions": rows, "tokenize": tokenize}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
