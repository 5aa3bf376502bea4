"""Synthetic Mooncake-format traces shaped by the published statistics of Mooncake's traces.

Mooncake's FAST'25 release (github.com/kvcache-ai/Mooncake, ``FAST25-release/traces``)
publishes one-hour production traces with no text: each line is
``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``, where
``hash_ids`` name the prompt's 512-token blocks and equal ids mean equal prefixes. The
lines carry no id, many share a timestamp (the conversation trace's arrive in 3-second
steps) and every prompt starts with the same block. This module makes traces of that
format, no download needed, from a `TraceShape`: sessions (conversations, agent runs) whose
later turns extend the earlier turns' blocks, so prompts share a system block, reuse their
session's context and grow from thousands to tens of thousands of tokens.

The shapes are fitted to what was published about the traces (`PublishedStats`; the
numbers and their sources are in docs/benchmarks.md, "Long-context workloads"):
`CONVERSATION` to the conversation trace, `TOOL_AGENT` to the tool&agent trace. `trace_stats`
measures a trace the way those numbers are defined (mean and median prompt, mean output,
the share of prompt blocks an unbounded cache would hold), and a unit test checks the
shapes still reproduce them.

The workloads W9 and W10 (`tpuserve.bench.workloads`) are these traces turned into prompts;
``bench/traces/mooncake-conversation-small.jsonl`` is a small one as a file.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuserve.bench.traces import write_json_lines

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per hash id in Mooncake's traces."""


@dataclass(frozen=True)
class PublishedStats:
    """What is published about one Mooncake trace (docs/benchmarks.md names the sources)."""

    name: str
    requests_per_hour: int
    mean_input_tokens: float
    median_input_tokens: float | None
    mean_output_tokens: float
    reusable_share: float
    """Share of prompt tokens an unbounded prefix cache holds (the trace's "cache ratio")."""


CONVERSATION_STATS = PublishedStats("conversation", 12_031, 12_035, 6_909, 343, 0.40)
TOOL_AGENT_STATS = PublishedStats("tool&agent", 23_608, 8_596, None, 182, 0.59)


@dataclass(frozen=True)
class TraceShape:
    """How a synthetic trace is drawn (tokens unless named otherwise).

    Sessions start as a Poisson process. A session first picks a template: the shared
    system block(s) every prompt starts with, plus one of ``templates`` template prompts
    (Zipf ``template_zipf``; 0 templates: none) of ``template_min``-``template_max``
    tokens. Its first prompt adds a context drawn from a log-normal distribution (median
    ``first_median``, shape ``first_sigma``); each later turn (another one follows with
    probability ``continue_probability``) keeps the previous prompt's whole blocks and adds
    the previous answer plus a log-normal new message (``turn_median``, ``turn_sigma``),
    after a think time of ``think_seconds`` (exponential mean) at the nominal rate. A
    session ends before its prompt would pass ``max_input_tokens``. Answers are
    ``output_min``-``output_max`` tokens, uniform.
    """

    stats: PublishedStats
    shared_blocks: int = 1
    templates: int = 0
    template_min: int = 0
    template_max: int = 0
    template_zipf: float = 0.0
    first_median: float = 6000.0
    first_sigma: float = 1.0
    turn_median: float = 1000.0
    turn_sigma: float = 1.0
    continue_probability: float = 0.4
    think_seconds: float = 30.0
    output_min: int = 1
    output_max: int = 700
    max_input_tokens: int = 92_000
    nominal_rate: float = 3.34
    """Requests per second before a runner rescales the trace (the published trace's)."""
    timestamp_quantum_ms: int = 0
    """Round arrivals down to a multiple of this (the conversation trace: 3,000 ms steps);
    0 keeps exact times."""


CONVERSATION = TraceShape(
    CONVERSATION_STATS, shared_blocks=1, first_median=5000.0, first_sigma=1.3,
    turn_median=1200.0, turn_sigma=1.0, continue_probability=0.4, think_seconds=30.0,
    output_min=1, output_max=700, nominal_rate=CONVERSATION_STATS.requests_per_hour / 3600,
)  # fmt: skip
"""Long-context chat: one shared system block, conversations of 1.7 turns on average."""

TOOL_AGENT = TraceShape(
    TOOL_AGENT_STATS, shared_blocks=1, templates=16, template_min=1500, template_max=3000,
    template_zipf=0.8, first_median=3500.0, first_sigma=0.8, turn_median=600.0,
    turn_sigma=1.0, continue_probability=0.45, think_seconds=5.0, output_min=16,
    output_max=350, nominal_rate=TOOL_AGENT_STATS.requests_per_hour / 3600,
)  # fmt: skip
"""Agentic tool use: 16 tool/agent templates of 1.5-3k tokens shared by all runs (Zipf
0.8), runs of 1.8 steps on average, each step appending a tool call and its observation."""

SHAPES = {"conversation": CONVERSATION, "tool_agent": TOOL_AGENT}


@dataclass(frozen=True)
class MooncakeLine:
    """One request of a Mooncake-format trace (`to_json` is the line; `session` is ours)."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session: str

    def to_json(self) -> dict[str, object]:
        return {
            "timestamp": self.timestamp_ms, "input_length": self.input_length,
            "output_length": self.output_length, "hash_ids": list(self.hash_ids),
        }  # fmt: skip


class _Blocks:
    """Fresh hash ids (`generate_lines` renumbers them in order of first appearance)."""

    def __init__(self, first: int) -> None:
        self.next = first

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def lognormal_tokens(rng: random.Random, median: float, sigma: float) -> int:
    """A log-normal length in tokens (median ``median``, shape ``sigma``), at least 1."""
    return max(1, int(median * math.exp(sigma * rng.gauss(0.0, 1.0))))


def zipf_index(rng: random.Random, n: int, alpha: float) -> int:
    """One of ``0..n-1``, index ``k`` with weight ``1 / (k + 1) ** alpha``."""
    return rng.choices(range(n), cum_weights=_zipf_cum_weights(n, alpha))[0]


@functools.cache
def _zipf_cum_weights(n: int, alpha: float) -> tuple[float, ...]:
    """What `random.choices` accumulates from the weights ``1 / (k + 1) ** alpha`` (the same
    draw, computed once)."""
    return tuple(itertools.accumulate(1.0 / (k + 1) ** alpha for k in range(n)))


def generate_lines(shape: TraceShape, seed: int, requests: int) -> list[MooncakeLine]:
    """`requests` lines of a trace drawn from `shape` (seeded), in arrival order."""
    rng = random.Random(f"mooncake:{shape.stats.name}:{seed}")
    block = MOONCAKE_BLOCK_TOKENS
    shared = list(range(shape.shared_blocks))
    blocks = _Blocks(len(shared))
    templates: list[tuple[list[int], int]] = []  # (hash ids, tokens)
    for _ in range(shape.templates):
        tokens = rng.randint(shape.template_min, shape.template_max) // block * block
        templates.append((blocks.take(tokens // block), tokens))
    lines: list[tuple[float, MooncakeLine]] = []
    turns_mean = 1.0 / (1.0 - shape.continue_probability)
    session_rate = shape.nominal_rate / turns_mean
    start = 0.0
    s = 0
    while len(lines) < requests:
        start += rng.expovariate(session_rate)
        hash_ids = list(shared)
        length = len(shared) * block
        if templates:
            ids, tokens = templates[zipf_index(rng, len(templates), shape.template_zipf)]
            hash_ids += ids
            length += tokens
        add = lognormal_tokens(rng, shape.first_median, shape.first_sigma)
        t = start
        while len(lines) < requests:
            if length + add > shape.max_input_tokens:
                break
            # The previous prompt's last partial block differs from this prompt's block
            # at that place, so only its whole blocks are shared.
            kept = length // block
            length += add
            hash_ids = hash_ids[:kept] + blocks.take(math.ceil(length / block) - kept)
            output = rng.randint(shape.output_min, shape.output_max)
            quantum = shape.timestamp_quantum_ms
            ms = int(t * 1000.0)
            if quantum:
                ms -= ms % quantum
            lines.append((t, MooncakeLine(ms, length, output, tuple(hash_ids), f"s{s}")))
            if rng.random() >= shape.continue_probability:
                break
            add = output + lognormal_tokens(rng, shape.turn_median, shape.turn_sigma)
            t += rng.expovariate(1.0 / shape.think_seconds)
        s += 1
    lines.sort(key=lambda x: x[0])
    return _renumbered([line for _, line in lines[:requests]])


def _renumbered(lines: Sequence[MooncakeLine]) -> list[MooncakeLine]:
    """The same lines with hash ids numbered in order of first appearance, as Mooncake's."""
    numbers: dict[int, int] = {}
    out = []
    for line in lines:
        ids = tuple(numbers.setdefault(h, len(numbers)) for h in line.hash_ids)
        out.append(dataclasses.replace(line, hash_ids=ids))
    return out


def trace_stats(
    lines: Sequence[MooncakeLine], block: int = MOONCAKE_BLOCK_TOKENS
) -> dict[str, float]:
    """Mean and median prompt, mean output, longest prompt, and the share of prompt tokens
    in blocks an earlier line already had (what an unbounded prefix cache would hold)."""
    seen: set[int] = set()  # a hash id names its whole prefix, as in Mooncake's traces
    reusable = 0
    for line in lines:
        hit = True
        for i, h in enumerate(line.hash_ids):
            if hit and h in seen:
                reusable += max(0, min(block, line.input_length - i * block))
            else:
                hit = False
                seen.add(h)
    inputs = [line.input_length for line in lines]
    return {
        "requests": len(lines),
        "mean_input_tokens": statistics.fmean(inputs),
        "median_input_tokens": statistics.median(inputs),
        "max_input_tokens": max(inputs),
        "mean_output_tokens": statistics.fmean(line.output_length for line in lines),
        "reusable_share": reusable / sum(inputs),
    }


def write_lines(lines: Iterable[MooncakeLine], path: str | Path) -> int:
    """Write `lines` as a Mooncake JSON Lines file; returns how many were written."""
    return write_json_lines((line.to_json() for line in lines), path)
