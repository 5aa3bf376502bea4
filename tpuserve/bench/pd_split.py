"""How a disaggregated deployment's engines split between prefill, decode and colocated pools,
by the performance model, never by a sweep of runs. Used by the PD benchmark
(``bench/pd_disaggregation.py``) and by ``tpuserve plan --disaggregate``.

Over a stream of requests (`PdRequest`: arrival, the prompt's prefix-cache keys, prompt and
output tokens), each pool needs, in engines: its prefill compute (each prompt's uncached
tokens, the cache being the prefixes of the pool's earlier prompts), its decode compute, and
the KV its running requests hold (Little's law over one engine's pool, `KV_USABLE` of it, with
the decode batch the KV allows; ``rule="compute"`` leaves KV out). Engines go to the pool with
the most need per engine: the max-min split, the one that sustains the highest load
(`Pools.load`, the rate as a multiple of the stream's that the split keeps up with).

Modes: ``colocated`` (every engine serves whole requests), ``always`` (every request to a
prefill engine, then a decode engine), ``conditional`` (a request whose prefill would stall a
colocated engine's decodes for the ITL budget or more, by the router's rule
`sglang_tpu.disaggregation.prefill_stalls`, goes to a pair, the others stay colocated; pairs
alone when a colocated pool would sustain less load).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sglang_tpu import disaggregation as pd
from sglang_tpu.perf_model import StepTimer

MODES = ("colocated", "always", "conditional")
KV_USABLE = 0.9
"""Of an engine's KV pool, what running requests can hold (the scheduler keeps a reserve)."""
MAX_DECODE_BATCH = 256.0
COMPUTE_DECODE_BATCH = 32


@dataclass(frozen=True, slots=True)
class PdRequest:
    t: float
    """Arrival, seconds."""
    keys: tuple[int, ...]
    """The prompt's prefix-cache keys, one per whole block (a key names its block and every
    block before it, as a radix cache's path does)."""
    prompt: int
    output: int


@dataclass
class Pools:
    prefill: int
    decode: int
    colocated: int
    load: float = math.inf
    """The rate, as a multiple of the stream's, the model says the split keeps up with."""


class Cache:
    """Prefixes seen, by block: how much of a prompt an unbounded radix cache would hold."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.keys: set[int] = set()

    def held(self, keys: Sequence[int]) -> int:
        """Tokens of the prompt's leading blocks already seen."""
        n = 0
        for key in keys:
            if key not in self.keys:
                break
            n += 1
        return n * self.block_tokens

    def add(self, keys: Sequence[int]) -> None:
        self.keys.update(keys)


@dataclass
class Need:
    """One pool's work over the stream: chip-seconds of prefill and decode, KV token-seconds."""

    prefill: float = 0.0
    decode_tokens: float = 0.0  # output tokens
    context_tokens: float = 0.0  # sum over output tokens of the context they decode at
    prompts: int = 0  # prefills and decodes the pool runs (none: it needs no engine)

    def add_prefill(self, timer: StepTimer, req: PdRequest, held: int) -> None:
        self.prefill += timer.prefill_seconds(req.prompt - held, held)
        self.prompts += 1

    def add_decode(self, req: PdRequest) -> None:
        self.prompts += 1
        self.decode_tokens += req.output
        self.context_tokens += req.output * (req.prompt + req.output / 2)

    def engines(self, timer: StepTimer, span: float, cache_tokens: int, kv: bool) -> float:
        """Engines this pool needs to keep up with the stream over ``span`` seconds."""
        if self.prompts == 0:
            return 0.0
        decode = 0.0
        if self.decode_tokens:
            context = self.context_tokens / self.decode_tokens  # mean, per token decoded
            batch = max(1.0, min(MAX_DECODE_BATCH, KV_USABLE * cache_tokens / context))
            step = timer.decode_step_seconds(int(batch), int(batch * context))
            decode = self.decode_tokens * step / batch  # engine-seconds at the KV's batch
            if not kv:  # compute alone: the batch is not bound by KV room
                b = COMPUTE_DECODE_BATCH
                decode = self.decode_tokens * timer.decode_step_seconds(b, int(b * context)) / b
        return (self.prefill + decode) / span


def split(
    mode: str, requests: Sequence[PdRequest], timer: StepTimer, engines: int, budget: float,
    cache_tokens: int, block_tokens: int, rule: str = "kv",
) -> Pools:  # fmt: skip
    """Engines per pool (see the module docstring); ``budget``: the ITL budget, seconds, a
    colocated prefill may stall decodes for (conditional); ``timer`` and ``cache_tokens``:
    one engine's step times and KV pool."""
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not allowed; allowed: {', '.join(MODES)}")
    if mode == "colocated":
        return Pools(0, 0, engines)
    if not requests:
        raise ValueError("requests: none; allowed: at least one request to split by")
    times = [r.t for r in requests]
    span = max(1e-9, max(times) - min(times))
    kv = rule == "kv"
    threshold = pd.threshold_tokens(timer, budget)

    def needs(colocate: bool) -> dict[str, Need]:
        out = {"prefill": Need(), "decode": Need(), "colocated": Need()}
        caches = {"prefill": Cache(block_tokens), "colocated": Cache(block_tokens)}
        for req in requests:
            held = caches["colocated"].held(req.keys) if colocate else 0
            short = colocate and not pd.prefill_stalls(
                timer, req.prompt - held, held, threshold, budget
            )
            where = "colocated" if short else "prefill"
            if not short:
                held = caches["prefill"].held(req.keys)
            caches[where].add(req.keys)
            out[where].add_prefill(timer, req, held)
            out["colocated" if short else "decode"].add_decode(req)
        return out

    def allocate(need: dict[str, Need]) -> Pools:
        wanted = {k: n.engines(timer, span, cache_tokens, kv) for k, n in need.items()}
        used = {k: v for k, v in wanted.items() if v > 0}
        if len(used) > engines:
            return Pools(0, 0, 0, 0.0)
        counts = dict.fromkeys(used, 1)
        for _ in range(engines - len(used)):  # the next engine to the most need per engine
            k = max(used, key=lambda k: used[k] / counts[k])
            counts[k] += 1
        load = min(counts[k] / used[k] for k in used)
        return Pools(
            counts.get("prefill", 0), counts.get("decode", 0), counts.get("colocated", 0), load
        )

    pairs_only = allocate(needs(False))
    if mode == "always":
        return pairs_only
    with_colocated = allocate(needs(True))
    if with_colocated.colocated and with_colocated.load >= pairs_only.load:
        return with_colocated
    return pairs_only if pairs_only.load > 0 else with_colocated


def colocated_load(
    requests: Sequence[PdRequest],
    timer: StepTimer,
    engines: int,
    cache_tokens: int,
    block_tokens: int,
    rule: str = "kv",
) -> float:
    """The rate multiple ``engines`` colocated engines keep up with by the same need model
    (one pool, one cache): what a split is compared with."""
    if not requests:
        raise ValueError("requests: none; allowed: at least one request to split by")
    times = [r.t for r in requests]
    span = max(1e-9, max(times) - min(times))
    need, cache = Need(), Cache(block_tokens)
    for req in requests:
        need.add_prefill(timer, req, cache.held(req.keys))
        cache.add(req.keys)
        need.add_decode(req)
    wanted = need.engines(timer, span, cache_tokens, rule == "kv")
    return engines / wanted if wanted > 0 else math.inf
