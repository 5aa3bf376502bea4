"""The cache-sizing rule: how many KV tokens each worker gets, measured from the trace itself.

Prefix-aware routing only matters when the shared prefixes do not fit one worker but do fit
the fleet (llm-d's benchmark: cache demand 73 % of the cluster, about 6 x one worker;
reference router.md §7.3). So:

- **demand** = tokens of prompt prefixes that at least two requests share: the prompts are cut
  into pages (the engines' page size), each page keyed by its whole prefix, and every page seen
  in two or more prompts counts once;
- **per-worker cache** ``C = demand / k + working_set`` with ``k = clamp(0.7 x N, 3, 6)``, so
  demand is about 0.7 of the fleet's prefix capacity and 3-6 x one worker's (with N = 4,
  0.7 x N = 2.8 < 3, so demand = 3 x C, 0.75 of the fleet);
- **working_set** = room for ``RUNNING_ALLOWANCE`` requests' private tokens (the part of the
  prompt no other request shares, plus the output), because running requests hold KV in the
  same pool as the cache.

The controls: `fits_all` sizes caches so every worker holds every prefix (all policies must
then reach the same hit rate); the no-sharing control is workload W0 (demand 0).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_tpu.tokenizer import Tokenizer, load_tokenizer
from tpuserve.bench.traces import TraceRequest, token_ids_of
from tpuserve_router.kv.block_index import block_keys

DEMAND_SHARE_OF_FLEET = 0.7
MIN_WORKERS_OF_DEMAND = 3.0
MAX_WORKERS_OF_DEMAND = 6.0
RUNNING_ALLOWANCE = 8
MIN_CACHE_TOKENS = 4096


@dataclass(frozen=True)
class CacheDemand:
    shared_tokens: int
    """Tokens of prefixes two or more requests share (each counted once)."""
    mean_private_tokens: float
    """Mean tokens per request nobody else shares (unshared prompt tail + output)."""
    max_request_tokens: int
    """Largest prompt + output (a worker must hold at least one request)."""


def measure_demand(
    trace: Sequence[TraceRequest], page_size: int = 16, tokenizer: Tokenizer | None = None
) -> CacheDemand:
    tok = tokenizer or load_tokenizer()
    counts: Counter[int] = Counter()
    keyed: list[list[int]] = []
    for req in trace:
        keys = block_keys(token_ids_of(req, tok), page_size)
        keyed.append(keys)
        counts.update(set(keys))
    shared = sum(1 for c in counts.values() if c >= 2) * page_size
    private = 0
    largest = 0
    for req, keys in zip(trace, keyed, strict=True):
        ids = token_ids_of(req, tok)
        shared_pages = sum(1 for k in keys if counts[k] >= 2)
        private += len(ids) - shared_pages * page_size + req.max_tokens
        largest = max(largest, len(ids) + req.max_tokens)
    mean_private = private / len(trace) if trace else 0.0
    return CacheDemand(shared, mean_private, largest)


def workers_of_demand(workers: int) -> float:
    """How many workers' caches the shared prefixes fill: clamp(0.7 x N, 3, 6)."""
    return min(MAX_WORKERS_OF_DEMAND, max(MIN_WORKERS_OF_DEMAND, DEMAND_SHARE_OF_FLEET * workers))


def cache_tokens_for(demand: CacheDemand, workers: int) -> int:
    """Per-worker KV tokens by the sizing rule (module docstring)."""
    if workers < 1:
        raise ValueError(f"--workers: {workers} is not allowed; allowed: >= 1")
    working_set = RUNNING_ALLOWANCE * demand.mean_private_tokens
    tokens = demand.shared_tokens / workers_of_demand(workers) + working_set
    return _round_up(max(tokens, MIN_CACHE_TOKENS, 2 * demand.max_request_tokens))


def fits_all(demand: CacheDemand) -> int:
    """Per-worker KV tokens with which every worker can hold every shared prefix (control)."""
    tokens = 2 * demand.shared_tokens + 64 * demand.mean_private_tokens
    return _round_up(max(tokens, MIN_CACHE_TOKENS, 2 * demand.max_request_tokens))


def _round_up(tokens: float, step: int = 1024) -> int:
    return int(math.ceil(tokens / step) * step)


@dataclass(frozen=True)
class LiveDemand:
    mean_tokens: float
    """Time-average of the live shared tokens over the trace's span."""
    peak_tokens: int
    """Their largest value."""


def live_shared_tokens(
    trace: Sequence[TraceRequest], page_size: int = 16, tokenizer: Tokenizer | None = None
) -> LiveDemand:
    """The working set a cache must hold at once to serve every reuse: at time t, the shared
    pages (`measure_demand`'s) whose first use is at or before t and whose last use is after
    it, in tokens. A trace's shared tokens (``shared_tokens``) add up pages used minutes
    apart; a multi-turn workload whose conversations start and end over the trace needs only
    those of the conversations alive at once. Independent of the rate the trace is replayed
    at (`traces.rescale_to_rate` scales every time alike)."""
    tok = tokenizer or load_tokenizer()
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    count: Counter[int] = Counter()
    for req in trace:
        for k in set(block_keys(token_ids_of(req, tok), page_size)):
            first.setdefault(k, req.t)
            last[k] = req.t
            count[k] += 1
    changes: list[tuple[float, int]] = []
    for k, c in count.items():
        if c >= 2 and last[k] > first[k]:
            changes.append((first[k], page_size))
            changes.append((last[k], -page_size))
    changes.sort()
    if not changes or not trace:
        return LiveDemand(0.0, 0)
    start, end = trace[0].t, trace[-1].t
    live = peak = 0
    area = 0.0
    t_prev = start
    for t, delta in changes:
        area += live * (t - t_prev)
        t_prev = t
        live += delta
        peak = max(peak, live)
    span = end - start
    return LiveDemand(area / span if span > 0 else float(peak), peak)
