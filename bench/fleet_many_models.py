"""A hundred models behind one gateway on 1,000 chips: scale to zero, cold starts, one flood.

Issue 70's scenario in the fleet model's terms: 100 models, each at 1-2 requests/s while in
use and idle most of the time, behind one shared router (the namespace gateway) that holds a
model's requests while it has no Ready replica, per model (``HoldSpec``'s defaults: at most
256 held, each for at most 600 s; beyond either, 503); a model with no request for
``scaleToZero.idleSeconds`` (600 s) goes to zero; its next request wakes it. Each replica is
a v6e ``2x2`` slice (4 chips) of Llama 3.1 8B; 1,000 chips are 250 slices for all models.

What is modelled, and its numbers (each a stated assumption, not a fit):

- **Traffic.** Model ``m`` has its own rate, uniform in [1, 2] requests/s, and is in use in
  sessions: on for an exponential time (mean ``--on-minutes``, 15), off for another (mean
  ``--off-minutes``, 45), so about a quarter of the models are in use at any time. Poisson
  arrivals while on. Each model draws from its own random stream, so a model's traffic is the
  same in every run of a seed (the flood's run and the run without it differ only in the
  flooded model).
- **The gateway.** One router process: a FIFO server costing ``--router-us`` of CPU per request
  (default: the router CPU headline's, ``bench/router_results/headline.json``, 320 us), then a
  per-model hold queue while the model has no Ready replica, then the least-loaded Ready
  replica of that model.
- **Engines.** A replica runs at most 32 requests at once (more wait in its queue, in order);
  a request takes a 0.15-s prefill, then ``output x 0.02 s`` of decode, output uniform in
  [100, 500] tokens: about 5.2 requests/s per replica, `tpuserve plan`'s 5.25 for this slice
  and the Mooncake mix (docs/capacity-planning.md). TTFT = gateway + hold + engine queue +
  prefill.
- **Autoscaling.** Every 15 s a model asks for ``ceil(last minute's rate / 5.25)`` replicas
  (at least 1 while it has traffic, at most ``--max-replicas``, 8); up at once, down to the
  highest ask of the last 300 s. A new replica serves after its cold start: with the compile
  cache warm, uniform in [30, 60] s (weights only); cold, uniform in [240, 480] s (the fleet
  model's default, weights then compilation). No chips free: the replica waits for them.
- **The flood.** ``--flood-rate`` requests/s (100) on model 0 for ``--flood-minutes`` (10)
  from minute ``--flood-at`` (30), beyond what its 8 replicas serve (~42 requests/s).

Reported per run: cold starts from zero (p50 / p99 of the time from the waking request to the
first Ready replica), requests failed (refused at a full hold queue, or held past 600 s) for
the other models and for the flooded one, the other models' TTFT p50 / p99 (all requests and
those not held), chips in use over time (mean, max, a sample a minute). Run::

    .venv/bin/python bench/fleet_many_models.py \
        --out bench/fleet_results/2026-12-07e/many_models.json

which runs the cases of ``CASES`` at one seed (``--report FILE`` prints a file's table).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHIPS_PER_REPLICA = 4  # v6e 2x2
SLOTS = 32
PREFILL_S = 0.15
ITL_S = 0.02
CAPACITY_RPS = 5.25  # `tpuserve plan`'s planned capacity per v6e 2x2 replica (Mooncake mix)
HOLD_MAX_REQUESTS = 256  # HoldSpec.max_requests
HOLD_MAX_SECONDS = 600.0  # HoldSpec.max_seconds
IDLE_SECONDS = 600.0  # ScaleToZeroSpec.idle_seconds
TICK_S = 15.0
DOWN_WINDOW_S = 300.0
COLD_START_S = {"warm": (30.0, 60.0), "cold": (240.0, 480.0)}


def headline_router_us() -> float:
    """The router's CPU per request of the CPU headline's newest run (bench/goldens.py)."""
    runs = json.loads((ROOT / "bench" / "router_results" / "headline.json").read_text())["runs"]
    rows = json.loads((ROOT / "bench" / "router_results" / runs[0]["results"]).read_text())
    return float(next(r["cpu_us_per_request"] for r in rows if "cache_aware" in r["against"]))


@dataclass
class Config:
    models: int = 100
    chips: int = 1000
    hours: float = 2.0
    on_minutes: float = 15.0
    off_minutes: float = 45.0
    max_replicas: int = 8
    router_us: float = 320.0
    cache: str = "warm"
    flood_rate: float = 100.0
    flood_at: float = 30.0
    flood_minutes: float = 10.0
    flood: bool = False
    hold_max_requests: int = HOLD_MAX_REQUESTS
    seed: int = 0


@dataclass
class Replica:
    ready: bool = False
    running: int = 0
    waiting: deque[tuple[float, int, float]] = field(default_factory=deque)


@dataclass
class Model:
    rate: float
    rng: random.Random
    """Arrivals and sessions only, so they are the same whatever happens to the requests."""
    work: random.Random
    """Output lengths and cold starts."""
    on: bool = False
    replicas: list[Replica] = field(default_factory=list)
    held: deque[float] = field(default_factory=deque)
    wake_at: float | None = None
    last_seen: float = 0.0
    in_flight: int = 0
    arrivals: deque[float] = field(default_factory=deque)
    asks: deque[tuple[float, int]] = field(default_factory=deque)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def run(c: Config) -> dict[str, Any]:
    end = c.hours * 3600.0
    models = []
    for m in range(c.models):
        rng = random.Random(c.seed * 100_003 + m)
        work = random.Random(c.seed * 100_003 + m + 50_000)
        model = Model(rate=rng.uniform(1.0, 2.0), rng=rng, work=work)
        model.on = rng.random() < c.on_minutes / (c.on_minutes + c.off_minutes)
        models.append(model)
    events: list[tuple[float, int, str, int, Any]] = []
    seq = 0

    def push(t: float, kind: str, m: int, data: Any = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, m, data))

    for m, model in enumerate(models):
        mean = (c.on_minutes if model.on else c.off_minutes) * 60.0
        push(model.rng.expovariate(1.0 / mean), "toggle", m)
        if model.on:
            push(model.rng.expovariate(model.rate), "arrive", m)
    flood_from, flood_to = c.flood_at * 60.0, (c.flood_at + c.flood_minutes) * 60.0
    flood_rng = random.Random(c.seed * 31 + 5)
    if c.flood:
        push(flood_from + flood_rng.expovariate(c.flood_rate), "flood", 0)
    push(TICK_S, "tick", -1)
    push(60.0, "sample", -1)

    gateway_free = 0.0
    chips_used = 0
    pending: deque[int] = deque()  # models whose new replica waits for chips
    cold_starts: list[float] = []
    ttft: dict[str, list[float]] = {"others": [], "others_unheld": [], "flooded": [],
                                    "others_in_flood_window": []}  # fmt: skip
    failed = {"others_refused": 0, "others_timeout": 0, "flooded_refused": 0,
              "flooded_timeout": 0}  # fmt: skip
    served = {"others": 0, "flooded": 0}
    chips_series: list[int] = []
    arrived = {"others": 0, "flooded": 0}

    def who(m: int) -> str:
        return "flooded" if m == 0 else "others"  # model 0's own traffic too, flood or not

    def add_replica(m: int, t: float) -> None:
        nonlocal chips_used
        if chips_used + CHIPS_PER_REPLICA > c.chips:
            pending.append(m)
            return
        chips_used += CHIPS_PER_REPLICA
        replica = Replica()
        models[m].replicas.append(replica)
        lo, hi = COLD_START_S[c.cache]
        push(t + models[m].work.uniform(lo, hi), "ready", m, replica)

    def start(m: int, replica: Replica, t: float, arrival: float, held: bool) -> None:
        replica.running += 1
        output = models[m].work.randint(100, 500)
        first = t + PREFILL_S - arrival
        group = who(m)
        ttft[group].append(first)
        if group == "others" and not held:
            ttft["others_unheld"].append(first)
        if group == "others" and flood_from <= arrival < flood_to:
            ttft["others_in_flood_window"].append(first)
        push(t + PREFILL_S + output * ITL_S, "finish", m, replica)

    def send(m: int, t: float, arrival: float, held: bool) -> None:
        model = models[m]
        ready = [r for r in model.replicas if r.ready]
        replica = min(ready, key=lambda r: r.running + len(r.waiting))
        if replica.running < SLOTS:
            start(m, replica, t, arrival, held)
        else:
            replica.waiting.append((arrival, int(held), 0.0))

    def expire(m: int, t: float) -> None:
        held = models[m].held
        while held and held[0] + HOLD_MAX_SECONDS <= t:
            held.popleft()
            models[m].in_flight -= 1
            failed[f"{who(m)}_timeout"] += 1

    def dispatch(m: int, t: float, arrival: float) -> None:
        model = models[m]
        model.last_seen = t
        model.arrivals.append(t)
        if any(r.ready for r in model.replicas):
            model.in_flight += 1
            send(m, t, arrival, held=False)
            return
        expire(m, t)
        if len(model.held) >= c.hold_max_requests:
            failed[f"{who(m)}_refused"] += 1
            return
        model.in_flight += 1
        model.held.append(arrival)
        if not model.replicas and m not in pending:
            model.wake_at = t
            add_replica(m, t)

    def arrive(m: int, t: float) -> None:
        nonlocal gateway_free
        arrived[who(m)] += 1
        gateway_free = max(t, gateway_free) + c.router_us * 1e-6
        push(gateway_free, "dispatch", m, t)

    while events:
        t, _, kind, m, data = heapq.heappop(events)
        if t > end:
            break
        if kind == "arrive":
            model = models[m]
            if model.on:
                arrive(m, t)
                push(t + model.rng.expovariate(model.rate), "arrive", m)
        elif kind == "flood":
            arrive(0, t)
            nxt = t + flood_rng.expovariate(c.flood_rate)
            if nxt < flood_to:
                push(nxt, "flood", 0)
        elif kind == "toggle":
            model = models[m]
            model.on = not model.on
            mean = (c.on_minutes if model.on else c.off_minutes) * 60.0
            push(t + model.rng.expovariate(1.0 / mean), "toggle", m)
            if model.on:
                push(t + model.rng.expovariate(model.rate), "arrive", m)
        elif kind == "dispatch":
            dispatch(m, t, data)
        elif kind == "ready":
            replica, model = data, models[m]
            if replica not in model.replicas:
                continue  # removed while starting
            replica.ready = True
            if model.wake_at is not None:
                cold_starts.append(t - model.wake_at)
                model.wake_at = None
            expire(m, t)
            while model.held:
                send(m, t, model.held.popleft(), held=True)
        elif kind == "finish":
            replica, model = data, models[m]
            replica.running -= 1
            model.in_flight -= 1
            served[who(m)] += 1
            if replica.waiting and replica in model.replicas:
                arrival, held, _ = replica.waiting.popleft()
                start(m, replica, t, arrival, bool(held))
        elif kind == "tick":
            for i, model in enumerate(models):
                while model.arrivals and model.arrivals[0] < t - 60.0:
                    model.arrivals.popleft()
                busy = model.in_flight > 0 or bool(model.held)
                if not busy and t - model.last_seen >= IDLE_SECONDS and model.replicas:
                    chips_used -= CHIPS_PER_REPLICA * len(model.replicas)
                    model.replicas.clear()
                    model.asks.clear()
                    continue
                if not model.replicas:
                    continue
                ask = min(c.max_replicas, max(1, math.ceil(len(model.arrivals) / 60.0
                                                          / CAPACITY_RPS)))  # fmt: skip
                model.asks.append((t, ask))
                while model.asks and model.asks[0][0] < t - DOWN_WINDOW_S:
                    model.asks.popleft()
                have = len(model.replicas) + pending.count(i)
                if ask > have:
                    for _ in range(ask - have):
                        add_replica(i, t)
                else:
                    keep = max(a for _, a in model.asks)
                    idle = [r for r in model.replicas if r.running == 0 and not r.waiting]
                    while len(model.replicas) > keep and idle:
                        model.replicas.remove(idle.pop())
                        chips_used -= CHIPS_PER_REPLICA
            while pending and chips_used + CHIPS_PER_REPLICA <= c.chips:
                add_replica(pending.popleft(), t)
            push(t + TICK_S, "tick", -1)
        elif kind == "sample":
            chips_series.append(chips_used)
            push(t + 60.0, "sample", -1)

    def ms(values: list[float], q: float) -> float:
        return round(percentile(values, q) * 1e3, 1)

    return {
        "config": asdict(c),
        "requests": arrived,
        "served": served,
        "failed": failed,
        "cold_starts": len(cold_starts),
        "cold_start_p50_s": round(percentile(cold_starts, 0.5), 1),
        "cold_start_p99_s": round(percentile(cold_starts, 0.99), 1),
        "others_ttft_p50_ms": ms(ttft["others"], 0.5),
        "others_ttft_p99_ms": ms(ttft["others"], 0.99),
        "others_unheld_ttft_p50_ms": ms(ttft["others_unheld"], 0.5),
        "others_unheld_ttft_p99_ms": ms(ttft["others_unheld"], 0.99),
        "flooded_ttft_p99_ms": ms(ttft["flooded"], 0.99),
        "others_flood_window_ttft_p50_ms": ms(ttft["others_in_flood_window"], 0.5),
        "others_flood_window_ttft_p99_ms": ms(ttft["others_in_flood_window"], 0.99),
        "chips_mean": round(sum(chips_series) / max(1, len(chips_series)), 1),
        "chips_max": max(chips_series, default=0),
        "chips_per_minute": chips_series,
    }


CASES: tuple[dict[str, Any], ...] = (
    {"cache": "warm"},
    {"cache": "warm", "flood": True},
    {"cache": "cold"},
    {"cache": "cold", "flood": True},
    {"cache": "cold", "hold_max_requests": 1024},
    {"cache": "warm", "flood": True, "flood_rate": 2500.0},
)
"""The runs: the compile cache warm or cold, without and with the flood (100 requests/s); with
a cold cache, a hold queue sized for a cold start at 2 requests/s (1,024); a flood of 2,500
requests/s, which takes most of the gateway's one core (at 320 us a request, 80 %)."""


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "| compile cache | hold per model | flood on model 0 | cold starts | cold start p50 / p99 "
        "| failed, other models | failed, model 0 | other models' TTFT p50 / p99 "
        "| not held: p50 / p99 | in the flood's minutes: p50 / p99 | model 0's TTFT p99 "
        "| chips mean / max |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c, f = r["config"], r["failed"]
        others = f["others_refused"] + f["others_timeout"]
        flood_rate = f"{c['flood_rate']:,.0f} req/s" if c["flood"] else "no"
        flooded = f"{f['flooded_refused'] + f['flooded_timeout']:,} of {r['requests']['flooded']:,}"
        lines.append(
            f"| {c['cache']} | {c['hold_max_requests']:,} "
            f"| {flood_rate} | {r['cold_starts']} "
            f"| {r['cold_start_p50_s']:.0f} / {r['cold_start_p99_s']:.0f} s "
            f"| {others:,} of {r['requests']['others']:,} | {flooded} "
            f"| {r['others_ttft_p50_ms']:,.0f} / {r['others_ttft_p99_ms']:,.0f} ms "
            f"| {r['others_unheld_ttft_p50_ms']:,.0f} / {r['others_unheld_ttft_p99_ms']:,.0f} ms "
            f"| {r['others_flood_window_ttft_p50_ms']:,.1f} / "
            f"{r['others_flood_window_ttft_p99_ms']:,.1f} ms "
            f"| {r['flooded_ttft_p99_ms'] / 1e3:,.1f} s "
            f"| {r['chips_mean']:.0f} / {r['chips_max']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--chips", type=int, default=1000)
    parser.add_argument("--on-minutes", type=float, default=15.0)
    parser.add_argument("--off-minutes", type=float, default=45.0)
    parser.add_argument("--flood-rate", type=float, default=100.0)
    parser.add_argument("--flood-at", type=float, default=30.0)
    parser.add_argument("--flood-minutes", type=float, default=10.0)
    parser.add_argument("--router-us", type=float, default=None,
                        help="router CPU per request (default: the CPU headline's)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="write the runs' JSON here")
    parser.add_argument("--report", type=Path, default=None, help="print the table of a JSON")
    args = parser.parse_args(argv)
    if args.report is not None:
        print(report(json.loads(args.report.read_text())["runs"]))
        return 0
    for name in ("hours", "models", "chips", "on_minutes", "off_minutes", "flood_rate"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    router_us = headline_router_us() if args.router_us is None else args.router_us
    results = []
    for case in CASES:
        config = Config(
            models=args.models, chips=args.chips, hours=args.hours, on_minutes=args.on_minutes,
            off_minutes=args.off_minutes, router_us=router_us, flood_rate=args.flood_rate,
            flood_at=args.flood_at, flood_minutes=args.flood_minutes, seed=args.seed,
        )  # fmt: skip
        config = replace(config, **case)
        results.append(run(config))
        print(f"ran {case}", file=sys.stderr, flush=True)
    print(report(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"runs": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
