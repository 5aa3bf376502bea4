"""Sweep routing policies over workloads, loads and seeds in mode sim; one JSON line per point.

For each workload and seed the trace is generated once, each worker's cache sized by the rule
(`tpuserve.bench.sizing`), and mu_RR (round-robin's saturation throughput) measured. Each
point (workload, policy, load fraction) runs the three seeds and records the median over
seeds of every summary metric, and a 95 % bootstrap CI (1,000 resamples of the pooled
measured requests) for hit rate, mean and p99 TTFT and E2E. Points already in the output
file are skipped, so an interrupted sweep resumes.

    nice .venv/bin/python bench/routing_sweep.py                 # everything (about an hour)
    nice .venv/bin/python bench/routing_sweep.py --workloads W2 --loads 0.85 --policies cost

``--arrival-jitter S`` moves every arrival by a random 0..S seconds (seeded per workload seed,
order kept where it can be): the noise floor of a comparison, i.e. how much the metrics move when
nothing changes but arrivals by as little as peering's delay.

Controls: ``W0`` (no sharing) and ``W1-fits`` (W1 with caches that hold every prefix on every
worker) must show all policies converging; they run at 0.3 and 0.85 x mu_RR only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tpuserve.bench import sizing, traces, workloads
from tpuserve.bench.anchors import policy_names
from tpuserve.bench.report import RequestRecord, measured, summarize
from tpuserve.bench.sim_config import SimConfig
from tpuserve.bench.sim_runner import measure_rr_saturation, run_sim

LOADS = (0.3, 0.7, 0.85, 1.0, 1.15)
SWEEP_POLICIES = (
    "round_robin", "cache_aware", "precise", "cost", "sglang_cache_aware_v2", "oracle",
)  # fmt: skip
"""Policies swept over every load; every other policy and anchor runs at 0.85 x mu_RR."""
WORKLOADS = ("W0", "W1-fits", "W1", "W2", "W3", "W4", "W5", "W6", "W9", "W10")
CONTROLS = ("W0", "W1-fits")
CONTROL_LOADS = (0.3, 0.85)
SKIP = ("dynamo_cost_w0", "dynamo_cost_w0.5", "dynamo_cost_w2")
"""Dynamo's overlap-weight sweep runs on W1 only (``--workloads W1 --skip ''``)."""
HEADLINE_LOAD = 0.85
SEEDS = (0, 1, 2)
REQUESTS = 2400
RESAMPLES = 1000
OUT = Path(__file__).resolve().parent / "results" / "routing_sweep.jsonl"


def bootstrap(records: Sequence[RequestRecord], rng: np.random.Generator) -> dict[str, list[float]]:
    """95 % CIs over requests pooled from the seeds (resampling requests)."""
    done = [r for r in records if r.ok and r.ttft is not None and r.e2e is not None]
    if not done:
        return {}
    ttft = np.array([r.ttft for r in done])
    e2e = np.array([r.e2e for r in done])
    cached = np.array([r.cached_tokens for r in done], dtype=float)
    prompt = np.array([r.prompt_tokens for r in done], dtype=float)
    idx = rng.integers(0, len(done), size=(RESAMPLES, len(done)))
    stats = {
        "hit_rate": cached[idx].sum(axis=1) / prompt[idx].sum(axis=1),
        "ttft_mean": ttft[idx].mean(axis=1),
        "ttft_p99": np.percentile(ttft[idx], 99, axis=1),
        "e2e_mean": e2e[idx].mean(axis=1),
        "e2e_p99": np.percentile(e2e[idx], 99, axis=1),
    }
    return {
        k: [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))] for k, v in stats.items()
    }


def jitter_arrivals(
    trace: Sequence[traces.TraceRequest], seconds: float, seed: int
) -> list[traces.TraceRequest]:
    """The trace with each arrival moved later by a random 0..``seconds``, sorted again."""
    rng = random.Random(f"jitter:{seed}")
    moved = [dataclasses.replace(r, t=r.t + rng.uniform(0.0, seconds)) for r in trace]
    return sorted(moved, key=lambda r: r.t)


def median_of(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in summaries[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values = [s[key] for s in summaries if isinstance(s.get(key), int | float)]
            finite = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
            out[key] = statistics.median(finite) if finite else None
            out[key + "_seeds"] = values
    return out


def prepare(
    name: str,
    seed: int,
    requests: int,
    workers: int,
    router_replicas: int = 1,
    load_poll_seconds: float = SimConfig.load_poll_seconds,
    peer_delay_seconds: float | None = None,
    kv_event_interval_seconds: float = 0.0,
) -> tuple[list[Any], SimConfig, float]:
    base = "W1" if name == "W1-fits" else name
    trace = workloads.generate(base, seed=seed, requests=requests)
    demand = sizing.measure_demand(trace)
    cache = (
        sizing.fits_all(demand) if name == "W1-fits" else sizing.cache_tokens_for(demand, workers)
    )
    config = SimConfig(
        workers=workers, cache_tokens=cache, seed=seed, router_replicas=router_replicas,
        load_poll_seconds=load_poll_seconds, peer_delay_seconds=peer_delay_seconds,
        kv_event_interval_seconds=kv_event_interval_seconds,
    )  # fmt: skip
    mu = measure_rr_saturation(trace, config)
    return trace, config, mu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--policies", default=",".join(SWEEP_POLICIES))
    parser.add_argument("--all-policies-at", type=float, default=HEADLINE_LOAD,
                        help="Load fraction at which every policy and anchor runs.")  # fmt: skip
    parser.add_argument("--loads", default=",".join(map(str, LOADS)))
    parser.add_argument(
        "--skip",
        default=",".join(SKIP),
        help="Policies not to run at --all-policies-at (comma-separated).",
    )
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--router-replicas", type=int, default=1,
        help="Router replicas, each request to one at random (mu_RR is measured with one).",
    )  # fmt: skip
    parser.add_argument(
        "--load-poll-interval", type=float, default=SimConfig.load_poll_seconds,
        help="Seconds between a tpuserve policy's polls of the engines' load (0: none), as "
        "tpuserve router --load-poll-interval.",
    )  # fmt: skip
    parser.add_argument(
        "--peer-delay", type=float, default=None,
        help="Router replicas of a tpuserve policy peer (tpuserve router --peer-port), each "
        "hearing the others' decisions this many seconds late (default: no peering).",
    )  # fmt: skip
    parser.add_argument(
        "--kv-event-interval", type=float, default=0.0,
        help="Each replica reads the engines' KV events every S seconds, as tpuserve router "
        "reads busy streams (default 0: at once).",
    )  # fmt: skip
    parser.add_argument(
        "--arrival-jitter", type=float, default=0.0,
        help="Move each arrival later by a random 0..S seconds (the noise floor; default 0).",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    names = args.workloads.split(",")
    policies = args.policies.split(",")
    loads = [float(x) for x in args.loads.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    unknown = [p for p in policies if p not in policy_names()]
    if unknown:
        print(f"unknown policies: {unknown}; allowed: {policy_names()}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done: set[tuple[str, str, float]] = set()
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            row = json.loads(line)
            done.add((row["workload"], row["policy"], row["load"]))
    rng = np.random.default_rng(0)
    for name in names:
        prepared = None
        point_loads = [x for x in loads if x in CONTROL_LOADS] if name in CONTROLS else loads
        points = [(policy, load) for load in point_loads for policy in policies]
        if args.all_policies_at in point_loads and name not in CONTROLS:
            skip = set(args.skip.split(","))
            points += [
                (p, args.all_policies_at)
                for p in policy_names()
                if p not in policies and p not in skip
            ]
        for policy, load in points:
            if (name, policy, load) in done:
                continue
            if prepared is None:
                poll = args.load_poll_interval
                replicas = args.router_replicas
                prepared = [
                    prepare(
                        name,
                        s,
                        args.requests,
                        args.workers,
                        replicas,
                        poll,
                        args.peer_delay,
                        args.kv_event_interval,
                    )
                    for s in seeds
                ]
            summaries = []
            pooled: list[RequestRecord] = []
            started = time.perf_counter()
            for trace, config, mu in prepared:
                scaled = traces.rescale_to_rate(trace, load * mu)
                if args.arrival_jitter > 0:
                    scaled = jitter_arrivals(scaled, args.arrival_jitter, config.seed)
                result = run_sim(scaled, policy, config)
                summary = summarize(policy, result.records, result.samples)
                summary.update(mu_rr=mu, rate=load * mu, cache_tokens=config.cache_tokens)
                summaries.append(summary)
                pooled += measured(result.records, 0.1)
            row = {"workload": name, "policy": policy, "load": load, "seeds": seeds,
                   "router_replicas": args.router_replicas,
                   "load_poll_seconds": args.load_poll_interval,
                   "peer_delay_seconds": args.peer_delay,
                   "kv_event_interval_seconds": args.kv_event_interval,
                   "arrival_jitter_seconds": args.arrival_jitter}  # fmt: skip
            row.update(median_of(summaries))
            row["ci95"] = bootstrap(pooled, rng)
            row["wall_seconds"] = time.perf_counter() - started
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            hit, p99, wall = row["hit_rate"], row["e2e_p99"], row["wall_seconds"]
            print(
                f"{name} {policy:<28} {load:4.2f} hit {hit:.3f} p99 e2e {p99:.2f} s ({wall:.0f} s)"
            )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
