"""Colocated vs always-PD vs conditional PD at equal chips, on the engine twin's virtual clock.

Every engine is the twin's own core (`sglang_tpu.sim.engine.EngineCore`) on one shared
virtual clock; PD moves a prompt's KV from a prefill engine to a decode engine in
`sglang_tpu.disaggregation.kv_transfer_seconds` (its KV bytes over one host's DCN) and the
decode engine admits it as the twin's decode role does (`EngineCore.add_transferred`), once
it has room for it (SGLang's prealloc queue):

- **colocated**: N engines serve whole requests;
- **always**: every request to a prefill engine, then a decode engine; P + D = N;
- **conditional**: a request whose prefill on the colocated engine it would go to (of the
  tokens that engine does not hold, after the prefills already waiting there) would stall
  that engine's decodes for `--itl-budget` seconds or more by the performance model
  (`sglang_tpu.disaggregation.prefill_stalls`, the router's rule) goes to a pair, the others
  to colocated engines; P + D + C = N. SGLang's decode engines cannot prefill a request
  themselves, so the short requests need colocated engines.

**SLO** (`SLOS`, per workload): a request is good when its TTFT and the 99th percentile of
its own inter-token gaps (its ITL) are within the workload's budgets.

**Load**: for each workload, the rate at which colocated serves `--attainment` (90 %) of its
requests within the SLO, found by bisection on colocated alone (`capacity`; or given with
``--capacity W9=1.7,...``, as the scale of the trace's own rate); every mode then runs at
that rate times each of ``--multipliers`` (1 and 2).

**Split** of the N chips (`split`, i.e. `tpuserve.bench.pd_split`, which `tpuserve plan
--disaggregate` uses too), by the performance model over the workload's own trace
at the rate run, never by a sweep of runs: each pool needs, in chips, its prefill compute
(each prompt's uncached tokens, the cache being the prefixes of the pool's earlier prompts),
its decode compute, and the KV its running requests hold (Little's law over one chip's pool,
`KV_USABLE` of it, with the decode batch the KV allows). Chips go to the pool with the most
need per chip (max-min of chips / need: the split that sustains the highest load).

**Conditional's deployment** (`deployments`): a user deploying conditional PD also chooses
how many chips get a role, and the router's policy serves every request colocated when no
pair exists. The candidates, each split as above: a colocated pool for the requests whose
prefill does not stall beside pairs for the others (or pairs alone, when the model says the
colocated pool sustains less load), and colocated engines alone. The one with the highest
goodput on a *sample* of the workload drawn with another seed (``--sample-requests``), at
the same load, is deployed: the twin used as a capacity planner, never the measured trace.

Routing, the same for every mode: a prefill or colocated engine is picked by prefix affinity
(the engine holding the longest prefix of the prompt, when it holds at least half of it and
is not more than `--balance` requests busier than the least busy) else the least busy, then
moved off a long prefill queue as the router's `precise` policy moves (`leave_long_queue`:
when the queued uncached tokens avoided exceed twice the prefix given up plus 8,192); a
decode engine is the least busy with room. Per request: TTFT (to the decode engine's first
token in PD) and its tokens' gaps (ITL). Diagnostics per run: which SLO part failed, the
pairs' wait for a prefill and for decode KV room (prealloc), the share of gaps over budget.

    for w in W9 W10 10k1k W1 W2; do .venv/bin/python bench/pd_disaggregation.py \\
        --workloads $w --json bench/pd_results/2026-12-06-$w.json; done
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from sglang_tpu import disaggregation as pd
from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.sim.engine import EngineConfig, EngineCore, Step
from sglang_tpu.sim.output_text import OutputPalette
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.virtual_clock import VirtualEngine
from sglang_tpu.tokenizer import Tokenizer, load_tokenizer
from sglang_tpu.topology import lookup
from tpuserve.bench import pd_split
from tpuserve.bench.pd_split import KV_USABLE, PdRequest, Pools
from tpuserve.bench.traces import TraceRequest, token_ids_of
from tpuserve.bench.workloads import generate

MODES = pd_split.MODES
LONG = ("W9", "W10", "10k1k")


@dataclass(frozen=True)
class Slo:
    """A request is good when its TTFT is at most ``ttft_s`` and the 99th percentile of its
    own inter-token gaps at most ``itl_s`` (it stalls on at most 1 % of its tokens)."""

    ttft_s: float
    itl_s: float


# ITL: 100 ms at p99 of each stream, every workload: 10 tokens/s, faster than anyone reads,
# is an interactive stream's floor; it is two to three decode steps of this model on one v6e
# chip (30-60 ms at the batches KV allows), so a decode step plus a prefill of up to the 50 ms
# `--itl-budget` (the router's threshold) keeps within it, and a prefill stall of 10k tokens
# (0.27 s) does not. TTFT: 1 s for the short prompts (chat); 5 s for the long ones, whose
# prefill alone takes 0.3-4 s on one chip.
SLOS: dict[str, Slo] = {
    "W9": Slo(5.0, 0.1), "W10": Slo(5.0, 0.1), "10k1k": Slo(5.0, 0.1),
    "W1": Slo(1.0, 0.1), "W2": Slo(1.0, 0.1),
}  # fmt: skip
QUEUE_PREFIX_WEIGHT = 2.0  # the router's QueueParams: saved_prefix_weight
QUEUE_MARGIN_TOKENS = 8192  # ... and queue_margin_tokens
CACHE_PAGE = 64  # tokens per page of the split's prefix-cache estimate


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


def scaled(trace: Sequence[TraceRequest], scale: float) -> list[TraceRequest]:
    """The trace with arrivals ``scale`` times as fast."""
    return [replace(r, t=r.t / scale) for r in trace]


@dataclass
class Record:
    arrival: float
    prompt: int
    output: int
    ttft: float | None = None
    finish: float | None = None
    gaps: list[float] = field(default_factory=list)
    disaggregated: bool = False
    prefilled: float | None = None  # a pair's prefill done (its first token made)
    handed_off: float | None = None  # a pair's KV arrived at the decode side
    admitted: float | None = None  # a pair's decode engine took it (had room)


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


def cache_keys(tokens: Sequence[int]) -> tuple[int, ...]:
    """The prompt's prefix-cache keys for the split, one per whole `CACHE_PAGE` page."""
    keys, key = [], 0
    for start in range(0, len(tokens) - CACHE_PAGE + 1, CACHE_PAGE):
        key = hash((key, tuple(tokens[start : start + CACHE_PAGE])))
        keys.append(key)
    return tuple(keys)


def split(
    mode: str, trace: Sequence[TraceRequest], ids: list[list[int]], timer: StepTimer,
    chips: int, budget: float, cache_tokens: int, rule: str = "kv",
) -> Pools:  # fmt: skip
    """Chips per pool by the performance model (`tpuserve.bench.pd_split.split`, one
    single-chip engine a chip); ``budget``: the ITL budget a colocated prefill may stall
    decodes for (conditional)."""
    requests = [
        PdRequest(r.t, cache_keys(prompt), len(prompt), r.max_tokens)
        for r, prompt in zip(trace, ids, strict=True)
    ]
    return pd_split.split(mode, requests, timer, chips, budget, cache_tokens, CACHE_PAGE, rule)


def deployments(
    trace: Sequence[TraceRequest], ids: list[list[int]], timer: StepTimer, chips: int,
    budget: float, cache_tokens: int, rule: str = "kv",
) -> list[Pools]:  # fmt: skip
    """Conditional PD's candidate deployments, each split by the model (`split`): a
    colocated pool for the requests whose prefill does not stall beside prefill/decode
    pairs for the others, pairs alone, and colocated engines alone (with no pair the router's
    conditional policy serves every request colocated)."""
    out: list[Pools] = []
    for mode in ("conditional", "always", "colocated"):
        pools = split(mode, trace, ids, timer, chips, budget, cache_tokens, rule)
        if all(
            (pools.prefill, pools.decode, pools.colocated) != (o.prefill, o.decode, o.colocated)
            for o in out
        ):
            out.append(pools)
    return out


class Run:
    def __init__(
        self, mode: str, trace: Sequence[TraceRequest], ids: list[list[int]], pools: Pools,
        timer: StepTimer, cache_tokens: int, budget: float, balance: int, link: str,
    ) -> None:  # fmt: skip
        self.mode, self.trace, self.ids, self.timer = mode, trace, ids, timer
        self.budget, self.balance, self.link = budget, balance, link
        self.threshold = pd.threshold_tokens(timer, budget)
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
        """Prefix affinity within ``balance`` requests of the least busy, else least busy,
        then away from a long prefill queue as the router's `precise` policy moves; returns
        the engine and the prompt tokens it holds."""
        least = min(self.busy[id(e)] for e in engines)
        best, held = None, 0
        for e in engines:
            match = e.core.match_prefix_length(tokens[:-1])
            if match > held and self.busy[id(e)] <= least + self.balance:
                best, held = e, match
        if best is None or held * 2 < len(tokens):
            best = min(engines, key=lambda e: self.busy[id(e)])
            held = best.core.match_prefix_length(tokens[:-1])
        # the router's `precise` rule (`leave_long_queue`): leave a long prefill queue when
        # the queue avoided outweighs twice the prefix given up, plus one prefill step
        queued = {id(e): e.core.waiting_uncached_tokens for e in engines}
        matches = {id(e): e.core.match_prefix_length(tokens[:-1]) for e in engines}
        other = min(engines, key=lambda e: queued[id(e)] + len(tokens) - matches[id(e)])
        avoided = queued[id(best)] - queued[id(other)]
        if avoided > QUEUE_PREFIX_WEIGHT * (held - matches[id(other)]) + QUEUE_MARGIN_TOKENS:
            return other, matches[id(other)]
        return best, held

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
            pair = (
                self.mode == "conditional"
                and bool(self.prefill)
                and pd.prefill_stalls(  # after the prefills waiting there, as the router
                    self.timer,
                    len(tokens) - held + target.core.waiting_uncached_tokens,
                    held,
                    self.threshold,
                    self.budget,
                )
            )
        if not pair:
            assert target is not None
            self.submit(target, Request(rid, tokens, req.max_tokens), record, now)
            return
        record.disaggregated = True
        prefill, _ = self.pick(self.prefill, tokens)
        first = Request(rid + "p", tokens, 1)

        def done(r: Request, engine: VirtualEngine = prefill) -> None:
            if r.finished:
                assert r.finish_time is not None
                self.busy[id(engine)] -= 1
                record.prefilled = r.finish_time
                seconds = pd.kv_transfer_seconds(
                    len(tokens), self.timer.kv_bytes_per_token, self.link
                )
                self.push(r.finish_time + seconds, "handoff", (i, record))

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
        if record.handed_off is None:
            record.handed_off = now
        fitting = [e for e in self.decode if self.room(e, i)]
        if not fitting:
            self.prealloc.append((i, record))  # waits for a decode engine with room
            return
        record.admitted = now
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


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(records: list[Record], slo: Slo) -> dict[str, Any]:
    ttfts = [r.ttft for r in records if r.ttft is not None]
    gaps = [g for r in records for g in r.gaps]
    finished = [r for r in records if r.finish is not None and r.ttft is not None]
    ends = [r.finish for r in finished if r.finish is not None]
    span = max(ends, default=0.0) - min(r.arrival for r in records)
    ttft_ok = {id(r) for r in finished if r.ttft is not None and r.ttft <= slo.ttft_s}
    itl_ok = {id(r) for r in finished if not r.gaps or percentile(r.gaps, 0.99) <= slo.itl_s}
    good = sum(id(r) in ttft_ok and id(r) in itl_ok for r in finished)
    pairs = [r for r in records if r.disaggregated and r.prefilled is not None]
    waits = [r.admitted - r.handed_off for r in pairs if r.admitted and r.handed_off]
    return {
        "requests": len(records),
        "finished": len(finished),
        "disaggregated": sum(r.disaggregated for r in records),
        "p50_ttft_s": percentile(ttfts, 0.5),
        "p99_ttft_s": percentile(ttfts, 0.99),
        "p50_itl_s": percentile(gaps, 0.5),
        "p99_itl_s": percentile(gaps, 0.99),
        "p999_itl_s": percentile(gaps, 0.999),
        "goodput_rps": good / span if span > 0 else 0.0,
        "good_share": good / len(records),
        "span_s": span,
        # why requests miss the SLO, and where pairs wait
        "ttft_miss_share": 1 - len(ttft_ok) / len(records),
        "itl_miss_share": 1 - len(itl_ok) / len(records),
        "gaps_over_itl_share": sum(g > slo.itl_s for g in gaps) / len(gaps) if gaps else 0.0,
        "mean_prefill_s": mean([r.prefilled - r.arrival for r in pairs if r.prefilled]),
        "mean_prealloc_wait_s": mean(waits),
        "p99_prealloc_wait_s": percentile(waits, 0.99),
    }


Runner = Callable[[str, list[TraceRequest], list[list[int]]], tuple[Pools, dict[str, Any]]]


def capacity(
    trace: list[TraceRequest], ids: list[list[int]], runner: Runner, attainment: float,
    precision: float = 0.05, log: Callable[[str], None] = print,
) -> float:  # fmt: skip
    """The highest scale of ``trace``'s rate at which colocated has ``attainment`` of its
    requests good, by doubling or halving to a bracket and bisecting to ``precision``."""

    def holds(scale: float) -> bool:
        _, summary = runner("colocated", scaled(trace, scale), ids)
        log(f"#   colocated at x{scale:.3f} of the trace's rate: good {summary['good_share']:.3f}")
        return bool(summary["good_share"] >= attainment)

    low, high = 0.0, 0.0
    scale = 1.0
    if holds(scale):
        low = scale
        while not high:
            scale *= 2
            if holds(scale):
                low = scale
            else:
                high = scale
            if scale > 1e4:
                return low
    else:
        high = scale
        while not low:
            scale /= 2
            if holds(scale):
                low = scale
            else:
                high = scale
            if scale < 1e-4:
                return scale
    while high / low > 1 + precision:
        middle = math.sqrt(low * high)
        if holds(middle):
            low = middle
        else:
            high = middle
    return low


def workload(
    name: str, seed: int, requests: int, tokenizer: Tokenizer, context: int, rate_10k1k: float
) -> tuple[list[TraceRequest], list[list[int]]]:
    """The workload's trace and its prompts' token ids; a prompt whose answer would pass
    ``context`` tokens (one chip's KV) is left out."""
    if name == "10k1k":
        trace = trace_10k1k(seed, requests, rate_10k1k)
    else:
        # the first n of 2n: a session trace of n requests stops starting sessions early and
        # ends draining their later turns, its first part a burst at several times its mean
        # rate; of 2n, the first n arrive while sessions still start
        trace = generate(name, seed=seed, requests=2 * requests)[:requests]
    ids = [token_ids_of(r, tokenizer) for r in trace]
    keep = [i for i, t in enumerate(ids) if len(t) + trace[i].max_tokens < context]
    return [trace[i] for i in keep], [ids[i] for i in keep]


def parse_capacity(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(
                f"--capacity: {part!r} is not allowed; allowed: WORKLOAD=SCALE, e.g. W9=1.5"
            ) from None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="W9,W10,10k1k,W1,W2")
    parser.add_argument("--chips", type=int, default=8, help="single-chip engines in all")
    parser.add_argument("--tpu", default="v6e")
    parser.add_argument("--topology", default="1x1")
    parser.add_argument("--model-profile", default="llama-3.1-8b")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate-10k1k", type=float, default=1.0, help="requests/s of 10k1k")
    parser.add_argument(
        "--capacity", default="",
        help="WORKLOAD=SCALE,...: colocated's capacity as a scale of the trace's rate "
        "(skips its search for those workloads)",
    )  # fmt: skip
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument(
        "--sample-requests", type=int, default=200,
        help="requests of the sample (seed + 1) conditional's deployment is chosen on",
    )  # fmt: skip
    parser.add_argument("--multipliers", default="1,2", help="loads run, x colocated's capacity")
    parser.add_argument("--itl-budget", type=float, default=pd.DEFAULT_ITL_BUDGET_SECONDS)
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
    context = min(profile.context_length, cache_tokens) - 1
    given = parse_capacity(args.capacity)
    multipliers = [float(m) for m in args.multipliers.split(",")]
    results = []
    capacities: dict[str, float] = {}
    print(
        f"# {args.chips} x {args.tpu} {args.topology} {profile.name}, {cache_tokens} KV tokens "
        f"each; threshold {threshold} uncached tokens (ITL budget {args.itl_budget:g} s); "
        f"KV over {args.link}; split by {args.split}; load: colocated's capacity at "
        f"{args.attainment:.0%} of requests within the SLO, x {args.multipliers}",
        flush=True,
    )

    def runner(
        mode: str, trace: list[TraceRequest], ids: list[list[int]], slo: Slo,
        pools: Pools | None = None,
    ) -> tuple[Pools, dict[str, Any]]:  # fmt: skip
        if pools is None:
            pools = split(
                mode, trace, ids, timer, args.chips, args.itl_budget, cache_tokens, args.split
            )
        run = Run(
            mode, trace, ids, pools, timer, cache_tokens, args.itl_budget, args.balance, args.link
        )
        return pools, summarize(run.run(), slo)

    header = (
        "| workload | load | mode | P:D:C | pairs | p99 TTFT s | p99 ITL s | p99.9 ITL s "
        "| goodput req/s | good | TTFT miss | ITL miss | prealloc wait s |"
    )
    rows = []
    for name in args.workloads.split(","):
        slo = SLOS[name]
        trace, ids = workload(name, args.seed, args.requests, tokenizer, context, args.rate_10k1k)
        sample, sample_ids = workload(
            name, args.seed + 1, args.sample_requests, tokenizer, context, args.rate_10k1k
        )
        rate = (len(trace) - 1) / max(1e-9, trace[-1].t - trace[0].t)
        if name in given:
            scale = given[name]
        else:
            print(f"# {name}: searching colocated's capacity (SLO {slo})", flush=True)
            scale = capacity(trace, ids, functools.partial(runner, slo=slo), args.attainment)
        capacities[name] = scale
        print(
            f"# {name}: SLO TTFT <= {slo.ttft_s:g} s, p99 ITL <= {slo.itl_s:g} s; colocated's "
            f"capacity x{scale:.3f} of the trace's rate = {rate * scale:.3f} req/s",
            flush=True,
        )
        for multiplier in multipliers:
            loaded = scaled(trace, scale * multiplier)
            # conditional's deployment: the candidate serving the most good requests on a
            # sample drawn with another seed, at the same load (the twin as capacity planner)
            sampled = scaled(sample, scale * multiplier)
            tried = []
            for candidate in deployments(
                sampled, sample_ids, timer, args.chips, args.itl_budget, cache_tokens, args.split
            ):
                _, trial = runner("conditional", sampled, sample_ids, slo, candidate)
                tried.append((trial["goodput_rps"], candidate))
                print(
                    f"#   {name} x{multiplier:g}: conditional as "
                    f"{candidate.prefill}:{candidate.decode}:{candidate.colocated} on the "
                    f"sample: goodput {trial['goodput_rps']:.3f}",
                    flush=True,
                )
            chosen = max(tried, key=lambda t: t[0])[1]
            for mode in MODES:
                pools, summary = runner(
                    mode, loaded, ids, slo, chosen if mode == "conditional" else None
                )
                row = {
                    "workload": name, "load": multiplier, "rate_rps": rate * scale * multiplier,
                    "mode": mode, "pools": asdict(pools), **summary,
                }  # fmt: skip
                results.append(row)
                line = (
                    f"| {name} | x{multiplier:g} | {mode} | "
                    f"{pools.prefill}:{pools.decode}:{pools.colocated} | "
                    f"{summary['disaggregated']} | {summary['p99_ttft_s']:.3f} | "
                    f"{summary['p99_itl_s']:.4f} | {summary['p999_itl_s']:.4f} | "
                    f"{summary['goodput_rps']:.3f} | {summary['good_share']:.2f} | "
                    f"{summary['ttft_miss_share']:.2f} | {summary['itl_miss_share']:.2f} | "
                    f"{summary['mean_prealloc_wait_s']:.2f} |"
                )
                rows.append(line)
                print(line, flush=True)
    print()
    print(header)
    print("|" + "---|" * 13)
    print("\n".join(rows))
    if args.json:
        meta = {
            "chips": args.chips, "tpu": args.tpu, "topology": args.topology,
            "model_profile": profile.name, "cache_tokens": cache_tokens, "threshold": threshold,
            "itl_budget_s": args.itl_budget, "link": args.link, "requests": args.requests,
            "seed": args.seed, "slos": {k: asdict(v) for k, v in SLOS.items()},
            "attainment": args.attainment, "multipliers": multipliers,
            "capacity_scale": capacities, "split": args.split, "kv_usable": KV_USABLE,
            "rate_10k1k": args.rate_10k1k,
        }  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"config": meta, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
