"""Colocated vs always-PD vs conditional PD at equal chips, on the engine twin's virtual clock.

Every engine is the twin's own core (`sglang_tpu.sim.engine.EngineCore`) on one shared
virtual clock; PD moves a prompt's KV from a prefill engine to a decode engine in
`sglang_tpu.disaggregation.kv_transfer_seconds` (its KV bytes over one host's DCN) and the
decode engine admits it as the twin's decode role does (`EngineCore.add_transferred`):

- **colocated**: N engines serve whole requests;
- **always**: every request to a prefill engine, then a decode engine; P + D = N;
- **conditional**: a request whose uncached tokens on the colocated engine it would go to
  reach the threshold (`sglang_tpu.disaggregation.threshold_tokens`: the shortest prefill
  that takes `--itl-budget` seconds by the performance model, the router's rule) goes to a
  pair, the others to colocated engines; P + D + C = N. SGLang's decode engines cannot
  prefill a request themselves, so the short requests need colocated engines.

The split of the N chips comes from the performance model, not a sweep (`split`): each pool
needs its compute (prefill seconds of its prompts, decode seconds of its outputs at
`--decode-batch`) and, with ``--split kv`` (the default), at least the KV its requests hold
(Little's law over one chip's pool: a decode engine in SGLang is bound by KV room, its
prealloc queue); chips go where the need per chip is highest, so the P:D ratio is the
model's. ``--split compute`` counts compute alone.

Routing, the same for every mode: a prefill or colocated engine is picked by prefix affinity
(the engine holding the longest prefix of the prompt, when it holds at least half of it and
is not more than `--balance` requests busier than the least busy) else the least busy; a
decode engine is the least busy. Per request: TTFT (to the decode engine's first token in
PD), its tokens' gaps (ITL), and good when TTFT and mean TPOT meet the workload's SLO.

    .venv/bin/python bench/pd_disaggregation.py --workloads W9,W10,10k1k,W1,W2 \\
        --chips 8 --json bench/results/pd_disaggregation.json
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sglang_tpu import disaggregation as pd
from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.sim.engine import EngineConfig, EngineCore, Step
from sglang_tpu.sim.output_text import OutputPalette
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.virtual_clock import VirtualEngine
from sglang_tpu.tokenizer import load_tokenizer
from sglang_tpu.topology import lookup
from tpuserve.bench.traces import TraceRequest, token_ids_of
from tpuserve.bench.workloads import generate

MODES = ("colocated", "always", "conditional")
LONG = ("W9", "W10", "10k1k")
# (TTFT seconds, mean TPOT seconds) a request must meet to count in goodput, per workload:
# long prompts are given seconds to first token, short ones one; every one 50 ms a token.
SLOS: dict[str, tuple[float, float]] = {
    "W9": (5.0, 0.05), "W10": (5.0, 0.05), "10k1k": (5.0, 0.05),
    "W1": (1.0, 0.05), "W2": (1.0, 0.05),
}  # fmt: skip


def trace_10k1k(seed: int, n: int, rate: float) -> list[TraceRequest]:
    """Unique 10,000-token prompts with 1,000-token answers, Poisson arrivals at ``rate``."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        ids = [1000 + rng.randrange(50_000) for _ in range(10_000)]
        out.append(TraceRequest(f"r{i}", t, 1000, prompt_token_ids=ids))
    return out


@dataclass
class Record:
    arrival: float
    prompt: int
    output: int
    ttft: float | None = None
    finish: float | None = None
    gaps: list[float] = field(default_factory=list)
    disaggregated: bool = False


class Gaps:
    """Engine observer: every token's gap since the request's previous one (its ITL)."""

    def __init__(self, records: dict[str, Record]) -> None:
        self.records = records

    def on_scheduled(self, req: Request, now: float) -> None: ...

    def on_step(self, step: Step, now: float) -> None: ...

    def on_token(self, req: Request, now: float, interval: float | None) -> None:
        record = self.records.get(req.rid)
        if record is not None and interval is not None:
            record.gaps.append(interval)

    def on_finish(self, req: Request, now: float) -> None: ...

    def on_abort(self, req: Request, now: float) -> None: ...


@dataclass
class Pools:
    prefill: int
    decode: int
    colocated: int


def split(
    mode: str, trace: Sequence[TraceRequest], ids: list[list[int]], timer: StepTimer,
    chips: int, threshold: int, decode_batch: int, cache_tokens: int, rule: str = "kv",
) -> Pools:  # fmt: skip
    """Chips per pool by the performance model: each pool needs, in chips, its compute (its
    requests' prefill and decode seconds per second of the trace) and, with ``rule`` "kv",
    at least its KV (Little's law: the tokens its requests hold times how long they hold
    them, per second, over one chip's KV pool); chips go to the pool with the most need per
    chip, one at a time, at least one each."""
    step = timer.decode_step_seconds(decode_batch, decode_batch * 2000)
    span = max(1e-9, max(r.t for r in trace) - min(r.t for r in trace))
    compute = {"prefill": 0.0, "decode": 0.0, "colocated": 0.0}
    kv = dict.fromkeys(compute, 0.0)
    for req, prompt in zip(trace, ids, strict=True):
        prefill = timer.prefill_seconds(len(prompt))
        decoding = req.max_tokens * step  # how long the request holds its KV, decoding
        held = (len(prompt) + req.max_tokens) * decoding
        if mode == "colocated" or (mode == "conditional" and len(prompt) < threshold):
            compute["colocated"] += prefill + decoding / decode_batch
            kv["colocated"] += held
        else:
            compute["prefill"] += prefill
            compute["decode"] += decoding / decode_batch
            kv["decode"] += held
    if mode == "colocated":
        return Pools(0, 0, chips)
    need = {
        k: max(compute[k] / span, kv[k] / span / cache_tokens if rule == "kv" else 0.0)
        for k in compute
    }
    used = {k: v for k, v in need.items() if v > 0}
    counts = dict.fromkeys(used, 1)
    for _ in range(chips - len(used)):  # the next chip to the pool with most need per chip
        k = max(used, key=lambda k: used[k] / counts[k])
        counts[k] += 1
    return Pools(counts.get("prefill", 0), counts.get("decode", 0), counts.get("colocated", 0))


class Run:
    def __init__(
        self, mode: str, trace: Sequence[TraceRequest], ids: list[list[int]], pools: Pools,
        timer: StepTimer, cache_tokens: int, threshold: int, balance: int, link: str,
    ) -> None:  # fmt: skip
        self.mode, self.trace, self.ids, self.timer = mode, trace, ids, timer
        self.threshold, self.balance, self.link = threshold, balance, link
        self.records: dict[str, Record] = {}
        palette = OutputPalette(load_tokenizer())
        config = EngineConfig(cache_tokens=cache_tokens, max_queued_requests=1_000_000)

        def engines(n: int) -> list[VirtualEngine]:
            out = []
            for _ in range(n):
                core = EngineCore(config, timer, palette, observer=Gaps(self.records))
                out.append(VirtualEngine(core))
            return out

        self.prefill = engines(pools.prefill)
        self.decode = engines(pools.decode)
        self.colocated = engines(pools.colocated)
        self.all = [*self.prefill, *self.decode, *self.colocated]
        self.busy: dict[int, int] = {id(e): 0 for e in self.all}
        self.events: list[tuple[float, int, str, Any]] = []
        self.prealloc: list[tuple[int, Record]] = []
        self.seq = itertools.count()

    def push(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def pick(self, engines: list[VirtualEngine], tokens: list[int]) -> tuple[VirtualEngine, int]:
        """Prefix affinity within ``balance`` requests of the least busy, else least busy;
        returns the engine and the prompt tokens it holds."""
        least = min(self.busy[id(e)] for e in engines)
        best, held = None, 0
        for e in engines:
            match = e.core.match_prefix_length(tokens[:-1])
            if match > held and self.busy[id(e)] <= least + self.balance:
                best, held = e, match
        if best is not None and held * 2 >= len(tokens):
            return best, held
        idle = min(engines, key=lambda e: self.busy[id(e)])
        return idle, idle.core.match_prefix_length(tokens[:-1])

    def run(self) -> list[Record]:
        for i, req in enumerate(self.trace):
            self.push(req.t, "arrive", i)
        while True:
            step_end = min((e._step_end for e in self.all), default=math.inf)
            next_event = self.events[0][0] if self.events else math.inf
            t = min(step_end, next_event)
            if t == math.inf:
                break
            for e in self.all:
                e.run_until(t)
            while self.events and self.events[0][0] <= t:
                _, _, kind, payload = heapq.heappop(self.events)
                if kind == "arrive":
                    self.arrive(payload, t)
                elif kind == "prealloc":
                    self.retry_prealloc(t)
                else:
                    self.handoff(payload[0], payload[1], t)
            for e in self.all:  # start what arrived
                e.run_until(t)
        return list(self.records.values())

    def arrive(self, i: int, now: float) -> None:
        req, tokens = self.trace[i], self.ids[i]
        rid = f"r{i}"
        record = self.records[rid] = Record(now, len(tokens), req.max_tokens)
        pair = self.mode == "always" or not self.colocated
        target: VirtualEngine | None = None
        if not pair:
            target, held = self.pick(self.colocated, tokens)
            pair = self.mode == "conditional" and len(tokens) - held >= self.threshold
        if not pair:
            assert target is not None
            self.submit(target, Request(rid, tokens, req.max_tokens), record, now)
            return
        record.disaggregated = True
        prefill, _ = self.pick(self.prefill, tokens)
        first = Request(rid + "p", tokens, 1)

        def done(r: Request, engine: VirtualEngine = prefill) -> None:
            if r.finished:
                self.busy[id(engine)] -= 1
                seconds = pd.kv_transfer_seconds(
                    len(tokens), self.timer.kv_bytes_per_token, self.link
                )
                self.push(r.finish_time + seconds, "handoff", (i, record))  # type: ignore[operator]

        first.on_update = done
        self.busy[id(prefill)] += 1
        prefill.submit(first, now)

    def room(self, engine: VirtualEngine, i: int) -> bool:
        """The decode engine can preallocate request ``i``'s KV as SGLang's decode does
        before it bootstraps (its prompt and `pd.RESERVED_DECODE_TOKENS`, keeping as many for
        each running request); else the request waits in its prealloc queue."""
        core = engine.core
        free = core.config.cache_tokens - core.num_used_tokens
        reserved = pd.RESERVED_DECODE_TOKENS * (core.num_running + 1)
        return free - reserved >= len(self.ids[i])

    def handoff(self, i: int, record: Record, now: float) -> None:
        fitting = [e for e in self.decode if self.room(e, i)]
        if not fitting:
            self.prealloc.append((i, record))  # waits for a decode engine with room
            return
        decode = min(fitting, key=lambda e: self.busy[id(e)])
        req = Request(f"r{i}", self.ids[i], self.trace[i].max_tokens)
        self.watch(decode, req, record)
        self.busy[id(decode)] += 1
        decode.core.add_transferred(req, record.arrival, now)

    def retry_prealloc(self, now: float) -> None:
        waiting, self.prealloc = self.prealloc, []
        for i, record in waiting:
            self.handoff(i, record, now)

    def submit(self, engine: VirtualEngine, req: Request, record: Record, now: float) -> None:
        self.watch(engine, req, record)
        self.busy[id(engine)] += 1
        engine.submit(req, now)

    def watch(self, engine: VirtualEngine, req: Request, record: Record) -> None:
        def update(r: Request) -> None:
            if record.ttft is None and r.first_token_time is not None:
                record.ttft = r.first_token_time - record.arrival
            if r.finished:
                record.finish = r.finish_time
                self.busy[id(engine)] -= 1
                if self.prealloc and r.finish_time is not None:
                    self.push(r.finish_time, "prealloc", None)

        req.on_update = update


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(records: list[Record], slo: tuple[float, float]) -> dict[str, Any]:
    ttfts = [r.ttft for r in records if r.ttft is not None]
    gaps = [g for r in records for g in r.gaps]
    finished = [r for r in records if r.finish is not None and r.ttft is not None]
    ends = [r.finish for r in finished if r.finish is not None]
    span = max(ends, default=0.0) - min(r.arrival for r in records)

    def good(r: Record) -> bool:
        assert r.ttft is not None
        assert r.finish is not None
        tpot = (r.finish - r.arrival - r.ttft) / max(1, r.output - 1)
        return r.ttft <= slo[0] and tpot <= slo[1]

    return {
        "requests": len(records),
        "finished": len(finished),
        "disaggregated": sum(r.disaggregated for r in records),
        "p50_ttft_s": percentile(ttfts, 0.5),
        "p99_ttft_s": percentile(ttfts, 0.99),
        "p50_itl_s": percentile(gaps, 0.5),
        "p99_itl_s": percentile(gaps, 0.99),
        "p999_itl_s": percentile(gaps, 0.999),
        "goodput_rps": sum(good(r) for r in finished) / span if span > 0 else 0.0,
        "good_share": sum(good(r) for r in finished) / len(records),
        "span_s": span,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="W9,W10,10k1k,W1,W2")
    parser.add_argument("--chips", type=int, default=8, help="single-chip engines in all")
    parser.add_argument("--tpu", default="v6e")
    parser.add_argument("--topology", default="1x1")
    parser.add_argument("--model-profile", default="llama-3.1-8b")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--rate-10k1k", type=float, default=2.0, help="requests/s of 10k1k")
    parser.add_argument(
        "--rate-scale", type=float, default=1.0, help="arrivals this many times as fast"
    )
    parser.add_argument("--itl-budget", type=float, default=pd.DEFAULT_ITL_BUDGET_SECONDS)
    parser.add_argument("--decode-batch", type=int, default=32)
    parser.add_argument("--balance", type=int, default=8)
    parser.add_argument(
        "--split", default="kv", choices=("kv", "compute"),
        help="chips per pool by compute and KV need (kv) or compute alone",
    )  # fmt: skip
    parser.add_argument("--link", default=pd.DEFAULT_KV_LINK, choices=tuple(pd.KV_LINKS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    shape = lookup(args.tpu, args.topology)
    profile = get_profile(args.model_profile)
    timer = StepTimer(shape, profile)
    cache_tokens = kv_pool_tokens(shape, profile, "bf16", "auto")
    threshold = pd.threshold_tokens(timer, args.itl_budget)
    tokenizer = load_tokenizer()
    results = []
    print(
        f"# {args.chips} x {args.tpu} {args.topology} {profile.name}, {cache_tokens} KV tokens "
        f"each; threshold {threshold} uncached tokens (ITL budget {args.itl_budget:g} s); "
        f"KV over {args.link}; arrivals x{args.rate_scale:g}; split by {args.split}",
        flush=True,
    )
    print(
        "| workload | mode | P:D:C | pairs | p99 TTFT s | p99 ITL s | p99.9 ITL s "
        "| goodput req/s | good |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.workloads.split(","):
        if name == "10k1k":
            trace = trace_10k1k(args.seed, args.requests, args.rate_10k1k)
        else:
            trace = generate(name, seed=args.seed, requests=args.requests)
        if args.rate_scale != 1.0:
            trace = [replace(r, t=r.t / args.rate_scale) for r in trace]
        ids = [token_ids_of(r, tokenizer) for r in trace]
        context = min(profile.context_length, cache_tokens) - 1
        keep = [i for i, t in enumerate(ids) if len(t) + trace[i].max_tokens < context]
        trace, ids = [trace[i] for i in keep], [ids[i] for i in keep]
        for mode in MODES:
            pools = split(
                mode, trace, ids, timer, args.chips, threshold, args.decode_batch,
                cache_tokens, args.split,
            )  # fmt: skip
            run = Run(
                mode, trace, ids, pools, timer, cache_tokens, threshold, args.balance, args.link
            )
            summary = summarize(run.run(), SLOS[name])
            row = {"workload": name, "mode": mode, "pools": asdict(pools), **summary}
            results.append(row)
            print(
                f"| {name} | {mode} | {pools.prefill}:{pools.decode}:{pools.colocated} | "
                f"{summary['disaggregated']} | {summary['p99_ttft_s']:.3f} | "
                f"{summary['p99_itl_s']:.4f} | {summary['p999_itl_s']:.4f} | "
                f"{summary['goodput_rps']:.3f} | "
                f"{summary['good_share']:.2f} |",
                flush=True,
            )
    if args.json:
        meta = {
            "chips": args.chips, "tpu": args.tpu, "topology": args.topology,
            "model_profile": profile.name, "cache_tokens": cache_tokens, "threshold": threshold,
            "itl_budget_s": args.itl_budget, "link": args.link, "requests": args.requests,
            "seed": args.seed, "slos": SLOS, "rate_scale": args.rate_scale, "split": args.split,
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"config": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
