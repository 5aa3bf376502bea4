"""Benchmark workloads W0-W10 and 1k1k/1k8k/8k1k as seeded generators of traces (`.traces`).

Prompts are built from the traces' one-token words, so the generators know every prompt's
token ids without tokenizing. Chat prompts (W3, W4) are sent as ``messages`` and rendered by
the engine's ChatML template, so their token ids carry the template's special and role tokens.

The workloads, scaled from the published ones (docs/benchmarks.md; reference router.md §7.4):

== ================================================================================================
W0 no sharing (control): unique 1,024-token prompts, output 64
W1 shared-prefix groups: 32 groups x 16 prompts, system prompt 1,024, question 64, output 64, Zipf
W2 tool use: 60 tool templates of 1.5-3k tokens, Zipf 0.9, question 50-150, output 30-120, 1,800
W3 agent chains: 40 episodes x 10-20 steps, each step = previous prompt + action + observation
W4 multi-turn chat: 64 clients x 8 turns, turn = previous context + user 50-200 + assistant 100-300
W5 long-document QA: 24 documents of 6-8k tokens, 8-12 questions each, interleaved, output 32-64
W6 B2B SaaS: 24 customers x 3k context, 5 users each, 600-token queries, output 64-128
W7 trace replay: Mooncake-style hash_ids (512-token blocks), synthetic conversation sessions
W8 adversarial: one prefix takes 80 % of the traffic (W8b: sibling bursts of 16 prompts x 4)
W9 long-context conversation: Mooncake's conversation trace's shape (prompts 1-92k tokens)
W10 long-context agentic tool use: Mooncake's tool&agent trace's shape (16 shared templates)
== ================================================================================================

Then TPU serving recipes' fixed shapes, nothing shared: ``1k1k``, ``1k8k`` and ``8k1k`` (unique
prompts of 1,024 or 8,192 tokens, exactly 1,024 or 8,192 out).

Arrivals are Poisson (sessions start as a Poisson process; turns within a session follow after
a think time). The nominal rate only fixes the order: runners rescale times to the rate asked
for (`traces.rescale_to_rate`).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve.bench import mooncake
from tpuserve.bench.traces import (
    TraceError,
    TraceRequest,
    Vocabulary,
    from_mooncake,
    vocabulary,
)

NOMINAL_RATE = 10.0
"""Arrivals per second a generator uses before a runner rescales the trace."""

FIXED = ("1k1k", "1k8k", "8k1k")
"""The fixed shapes TPU serving recipes report (input k tokens, output k tokens)."""


class _Builder:
    """Collects requests of one generator; knows how to make words and token ids."""

    def __init__(self, seed: int, name: str) -> None:
        self.rng = random.Random(f"{name}:{seed}")
        self.vocab = vocabulary()
        self.requests: list[TraceRequest] = []

    def words(self, n: int) -> list[int]:
        r = self.rng.randrange
        size = Vocabulary.SIZE
        return [r(size) for _ in range(n)]

    def add_prompt(self, t: float, words: list[int], max_tokens: int, session: str | None) -> None:
        rid = f"r{len(self.requests)}"
        req = TraceRequest(rid, t, max_tokens, prompt=self.vocab.text(words), session=session)
        req.token_ids = self.vocab.token_ids(words)
        self.requests.append(req)

    def add_chat(
        self, t: float, messages: list[dict[str, Any]], max_tokens: int, session: str | None
    ) -> None:
        rid = f"r{len(self.requests)}"
        self.requests.append(TraceRequest(rid, t, max_tokens, messages=messages, session=session))

    def done(self, limit: int) -> list[TraceRequest]:
        out = sorted(self.requests, key=lambda r: r.t)[:limit]
        for i, r in enumerate(out):
            r.id = f"r{i}"
        return out


def zipf_picker(rng: random.Random, n: int, alpha: float) -> Callable[[], int]:
    """Draw 0..n-1 with P(k) proportional to 1/(k+1)^alpha (alpha 0: uniform)."""
    weights = [1.0 / (k + 1) ** alpha for k in range(n)]
    cumulative = list(itertools.accumulate(weights))
    total = cumulative[-1]

    def pick() -> int:
        return min(n - 1, bisect.bisect_left(cumulative, rng.random() * total))

    return pick


def _poisson_times(rng: random.Random, n: int, rate: float = NOMINAL_RATE) -> Iterator[float]:
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        yield t


# ---------------------------------------------------------------------------------- generators


Generator = Callable[[int, int, Mapping[str, float]], list[TraceRequest]]
"""(seed, requests, parameters) -> the trace."""


@dataclass(frozen=True)
class Workload:
    name: str
    summary: str
    default_requests: int
    params: Mapping[str, float]
    generate: Generator


def _w0(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W0")
    for t in _poisson_times(b.rng, n):
        b.add_prompt(t, b.words(int(p["prompt"])), int(p["output"]), None)
    return b.done(n)


def _fixed(name: str) -> Generator:
    """TPU serving recipes' fixed shapes: unique prompts of exactly ``prompt`` tokens, exactly
    ``output`` out (the engines stop at max_tokens), nothing shared."""

    def generate(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
        b = _Builder(seed, name)
        for t in _poisson_times(b.rng, n):
            b.add_prompt(t, b.words(int(p["prompt"])), int(p["output"]), None)
        return b.done(n)

    return generate


def _w1(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W1")
    groups = int(p["groups"])
    systems = [b.words(int(p["system"])) for _ in range(groups)]
    pick = zipf_picker(b.rng, groups, p["zipf"])
    for t in _poisson_times(b.rng, n):
        g = pick()
        b.add_prompt(t, systems[g] + b.words(int(p["question"])), int(p["output"]), f"g{g}")
    return b.done(n)


def _w2(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W2")
    rng = b.rng
    tools = [
        b.words(rng.randint(int(p["tool_min"]), int(p["tool_max"]))) for _ in range(int(p["tools"]))
    ]
    pick = zipf_picker(rng, len(tools), p["zipf"])
    for t in _poisson_times(rng, n):
        k = pick()
        question = b.words(rng.randint(50, 150))
        b.add_prompt(t, tools[k] + question, rng.randint(30, 120), f"tool{k}")
    return b.done(n)


def _w3(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W3")
    rng = b.rng
    vocab = b.vocab
    system = vocab.text(b.words(int(p["system"])))
    episodes = max(1, math.ceil(n / 15))  # 10-20 steps each, 15 on average
    starts = list(_poisson_times(rng, episodes, NOMINAL_RATE / 15))
    for e, start in enumerate(starts):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": vocab.text(b.words(rng.randint(100, 300)))},
        ]
        t = start
        for _step in range(rng.randint(10, 20)):
            b.add_chat(t, [dict(m) for m in messages], rng.randint(32, 64), f"ep{e}")
            messages.append(
                {"role": "assistant", "content": vocab.text(b.words(rng.randint(20, 60)))}
            )
            messages.append({"role": "user", "content": vocab.text(b.words(rng.randint(100, 300)))})
            t += p["step_seconds"] + rng.expovariate(1.0 / p["think_seconds"])
    return b.done(n)


def _w4(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W4")
    rng = b.rng
    vocab = b.vocab
    turns = int(p["turns"])
    clients = max(1, math.ceil(n / turns))
    system = vocab.text(b.words(int(p["system"])))
    for c, start in enumerate(_poisson_times(rng, clients, NOMINAL_RATE / turns)):
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        t = start
        for _turn in range(turns):
            messages.append({"role": "user", "content": vocab.text(b.words(rng.randint(50, 200)))})
            b.add_chat(t, [dict(m) for m in messages], rng.randint(100, 300), f"c{c}")
            messages.append(
                {"role": "assistant", "content": vocab.text(b.words(rng.randint(100, 300)))}
            )
            t += p["step_seconds"] + rng.expovariate(1.0 / p["think_seconds"])
    return b.done(n)


def _w5(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W5")
    rng = b.rng
    docs = [
        b.words(rng.randint(int(p["doc_min"]), int(p["doc_max"])))
        for _ in range(int(p["documents"]))
    ]
    # 8-12 questions per document, interleaved; more requests asked -> more rounds of them.
    order: list[int] = []
    while len(order) < n:
        round_ = [d for d in range(len(docs)) for _ in range(rng.randint(8, 12))]
        rng.shuffle(round_)
        order.extend(round_)
    for t, d in zip(_poisson_times(rng, n), order, strict=False):
        b.add_prompt(t, docs[d] + b.words(rng.randint(20, 60)), rng.randint(32, 64), f"doc{d}")
    return b.done(n)


def _w6(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W6")
    rng = b.rng
    customers = [b.words(int(p["context"])) for _ in range(int(p["customers"]))]
    users = int(p["users"])
    for t in _poisson_times(rng, n):
        c = rng.randrange(len(customers))
        u = rng.randrange(users)
        query = b.words(int(p["query"]))
        b.add_prompt(t, customers[c] + query, rng.randint(64, 128), f"cust{c}/u{u}")
    return b.done(n)


def _w7(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    """Synthetic Mooncake `conversation`-style sessions: each turn extends its hash_ids."""
    b = _Builder(seed, "W7")
    rng = b.rng
    block = int(p["block"])
    shared = list(range(int(p["shared_blocks"])))
    next_id = itertools.count(len(shared))
    turns_per_session = int(p["turns"])
    sessions = max(1, math.ceil(n / turns_per_session))
    for s, start in enumerate(_poisson_times(rng, sessions, NOMINAL_RATE / turns_per_session)):
        hash_ids = shared[: rng.randint(0, len(shared))]
        t = start
        for _turn in range(turns_per_session):
            hash_ids = hash_ids + [next(next_id) for _ in range(rng.randint(1, 3))]
            input_length = len(hash_ids) * block - rng.randrange(block // 2)
            line = {
                "timestamp": t * 1000.0, "input_length": input_length,
                "output_length": rng.randint(32, 128), "hash_ids": hash_ids,
            }  # fmt: skip
            req = from_mooncake(line, "W7", block, line=len(b.requests))
            req.session = f"s{s}"
            b.requests.append(req)
            t += p["step_seconds"] + rng.expovariate(1.0 / p["think_seconds"])
    return b.done(n)


def _long_context(shape: mooncake.TraceShape, name: str) -> Generator:
    """A synthetic Mooncake-format trace (`tpuserve.bench.mooncake`) as word prompts."""

    def generate(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
        b = _Builder(seed, name)
        changed = dataclasses.replace(
            shape, first_median=p["first_median"], continue_probability=p["continue"],
            max_input_tokens=int(p["max_input"]), think_seconds=p["think_seconds"],
            timestamp_quantum_ms=int(p["quantum_ms"]),
        )  # fmt: skip
        for i, line in enumerate(mooncake.generate_lines(changed, seed, n)):
            req = from_mooncake(
                line.to_json(), name, mooncake.MOONCAKE_BLOCK_TOKENS, line=i, as_text=True
            )
            req.session = line.session
            b.requests.append(req)
        return b.done(n)

    return generate


def _long_context_params(shape: mooncake.TraceShape) -> dict[str, float]:
    return {
        "first_median": shape.first_median, "continue": shape.continue_probability,
        "max_input": shape.max_input_tokens, "think_seconds": shape.think_seconds,
        "quantum_ms": shape.timestamp_quantum_ms,
    }  # fmt: skip


def _w8(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W8")
    rng = b.rng
    hot = b.words(int(p["system"]))
    cold = [b.words(int(p["system"])) for _ in range(int(p["cold_prefixes"]))]
    for t in _poisson_times(rng, n):
        if rng.random() < p["hot_share"]:
            prefix, session = hot, "hot"
        else:
            k = rng.randrange(len(cold))
            prefix, session = cold[k], f"cold{k}"
        b.add_prompt(t, prefix + b.words(int(p["question"])), int(p["output"]), session)
    return b.done(n)


def _w8b(seed: int, n: int, p: Mapping[str, float]) -> list[TraceRequest]:
    b = _Builder(seed, "W8b")
    rng = b.rng
    per_burst = int(p["siblings"]) * int(p["samples"])
    bursts = max(1, math.ceil(n / per_burst))
    for k, start in enumerate(_poisson_times(rng, bursts, NOMINAL_RATE / per_burst)):
        prefix = b.words(int(p["system"]))
        t = start
        for _s in range(int(p["siblings"])):
            words = prefix + b.words(int(p["question"]))
            for _r in range(int(p["samples"])):
                b.add_prompt(t, words, int(p["output"]), f"burst{k}")
                t += 0.001
    return b.done(n)


WORKLOADS: Mapping[str, Workload] = {
    w.name: w
    for w in (
        Workload("W0", "no sharing (control): unique prompts", 2400,
                 {"prompt": 1088, "output": 64}, _w0),
        Workload("W1", "shared-prefix groups", 2400,
                 {"groups": 32, "system": 1024, "question": 64, "output": 64, "zipf": 0.0}, _w1),
        Workload("W2", "tool use (Preble ToolBench)", 2400,
                 {"tools": 60, "tool_min": 1500, "tool_max": 3000, "zipf": 0.9}, _w2),
        Workload("W3", "agent chains", 2400,
                 {"system": 500, "step_seconds": 2.0, "think_seconds": 1.0}, _w3),
        Workload("W4", "multi-turn chat", 2400,
                 {"turns": 8, "system": 200, "step_seconds": 4.0, "think_seconds": 5.0}, _w4),
        Workload("W5", "long-document QA (Preble LooGLE)", 2400,
                 {"documents": 24, "doc_min": 6000, "doc_max": 8000}, _w5),
        Workload("W6", "B2B SaaS (llm-d blog)", 2400,
                 {"customers": 24, "context": 3000, "users": 5, "query": 600}, _w6),
        Workload("W7", "Mooncake-style trace replay (synthetic)", 2400,
                 {"block": 512, "shared_blocks": 4, "turns": 6, "step_seconds": 3.0,
                  "think_seconds": 5.0}, _w7),
        Workload("W8", "adversarial: one prefix takes 80 % of traffic", 2400,
                 {"system": 1024, "question": 64, "output": 64, "hot_share": 0.8,
                  "cold_prefixes": 64}, _w8),
        Workload("W8b", "adversarial: sibling bursts of 16 prompts x 4 samples", 2432,
                 {"system": 1500, "question": 64, "output": 64, "siblings": 16, "samples": 4},
                 _w8b),
        Workload("W9", "long-context conversation (Mooncake conversation trace's shape)",
                 2400, _long_context_params(mooncake.CONVERSATION),
                 _long_context(mooncake.CONVERSATION, "W9")),
        Workload("W10", "long-context agentic tool use (Mooncake tool&agent trace's shape)",
                 2400, _long_context_params(mooncake.TOOL_AGENT),
                 _long_context(mooncake.TOOL_AGENT, "W10")),
        *(Workload(name, f"fixed {name[:2]} in, {name[2:]} out (TPU recipes' shape)", 2400,
                   {"prompt": 1024 * int(name[0]), "output": 1024 * int(name[2])}, _fixed(name))
          for name in FIXED),
    )
}  # fmt: skip


def workload_names() -> list[str]:
    return list(WORKLOADS)


def generate(
    name: str, seed: int = 0, requests: int | None = None, **overrides: float
) -> list[TraceRequest]:
    """The trace of workload `name` (seeded, deterministic); TraceError for bad arguments."""
    workload = WORKLOADS.get(name)
    if workload is None:
        raise TraceError(f"--workload: {name!r} is not allowed; allowed: {', '.join(WORKLOADS)}")
    n = workload.default_requests if requests is None else requests
    if n < 1:
        raise TraceError(f"--requests: {n} is not allowed; allowed: an integer >= 1")
    params = dict(workload.params)
    for key, value in overrides.items():
        if key not in params:
            raise TraceError(
                f"--workload-param {key}: not a parameter of {name}; allowed: {', '.join(params)}"
            )
        params[key] = float(value)
    return workload.generate(seed, n, params)
