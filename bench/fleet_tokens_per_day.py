"""Tokens per day on a 1,000-chip fleet: routing policies x router replicas (issue 48).

The fleet: 250 replicas of ``llama-3.1-8b`` (bf16) on v6e ``2x2`` slices = 1,000 chips, a
fixed size (no autoscaler, no Spot: the seed's fleet was a fixed 1,000 chips, and a
policy-dependent fleet size would not compare policies). Traffic: the Mooncake conversation
and tool&agent shapes, half each (`tpuserve.bench.mooncake`: prompts 1-92k tokens, the
published reuse), a daily shape from 0.35 of the peak at 03:00 to the peak at 15:00, and
bursts (``--bursts-per-hour`` windows of 60 s at 2x). The peak demand is ``--overload`` x the
fleet's planned capacity: `tpuserve plan`'s per-replica capacity for this workload and SLO
(4 replicas, the default policy, 300 s windows) x 250.

A whole simulated day per configuration is too slow (~10^8 requests); the day is represented
by three windows, at 03:00 (the trough), 09:00 (the mean; 21:00 has the same demand) and
15:00 (the peak), each ``--window`` seconds with the first ``--warmup`` not counted, weighted
6 h, 12 h and 6 h (exact for any quantity linear in the demand multiplier; the cosine's
quarter points). tokens/day = sum of weight x tokens/s of the window.

Goodput counts the prompt + output tokens of requests within the SLO: TTFT <= ``--ttft`` and
mean inter-token latency <= ``--itl`` (per request). Policies: round_robin, precise
(tpuserve's default), llmd (llm-d's prefix-cache 2 : queue 1 scorers, an anchor), oracle;
router replicas 1, 4 and 8 (`tpuserve.fleet` documents each). Several ``precise``
routers peer as the operator deploys them, each hearing the others' decisions ``--peer-delay``
seconds later (default 1 ms); ``--no-peering`` leaves them the load poll alone.

    .venv/bin/python bench/fleet_tokens_per_day.py --jobs 2 \\
        --out bench/fleet_results/2026-12-06/fleet_tokens_per_day.json
    .venv/bin/python bench/fleet_tokens_per_day.py \\
        --report bench/fleet_results/2026-12-06/fleet_tokens_per_day.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tpuserve.fleet import FleetConfig, add_peering_arguments, peer_delay_from, run_fleet

POLICIES = ("round_robin", "precise", "llmd", "oracle")
ROUTERS = (1, 4, 8)
WINDOWS = ((3.0, 6.0), (9.0, 12.0), (15.0, 6.0))
"""(start hour, hours of the day it stands for)."""
SEED_RATIO = 5.97 / 1.47
"""The seed's claim: 1.47 -> 5.97 billion tokens a day on 1,000 v6e chips (4.06x)."""
PLANNED_CAPACITY_PER_REPLICA = 5.25
"""Requests/s one v6e 2x2 replica serves within p99 TTFT 5 s and p99 ITL 0.1 s on this
workload: `tpuserve.plan.planner.evaluate` (4 replicas, precise, 300 s window, 60 s warm-up),
measured 2026-12-06; `--capacity` overrides it."""


def base_config(args: argparse.Namespace) -> FleetConfig:
    return FleetConfig(
        generation="v6e", topology="2x2", model="llama-3.1-8b", replicas=250,
        workload="mooncake", conversation_share=0.5, trough=0.35,
        peak_rate=args.overload * args.capacity * 250, bursts_per_hour=args.bursts_per_hour,
        burst_factor=2.0, burst_seconds=60.0, duration_seconds=args.window,
        warmup_seconds=args.warmup, slo_ttft_seconds=args.ttft, slo_itl_seconds=args.itl,
        drain_seconds=120.0, seed=args.seed,
        peer_delay_seconds=peer_delay_from(args),
    )  # fmt: skip


def run_one(job: tuple[FleetConfig, float, float, Path | None]) -> dict[str, Any]:
    config, hour, weight, rows_file = job
    result = run_fleet(config)
    s = result.summary()
    s["start_hour"] = hour
    s["weight_hours"] = weight
    if rows_file is not None:  # each window as it ends: a cut-short run keeps what it did
        with rows_file.open("a") as f:
            f.write(json.dumps(s) + "\n")
    return s


def jobs(args: argparse.Namespace) -> list[tuple[FleetConfig, float, float, Path | None]]:
    """Every (policy, routers, window); the peak window of every configuration first."""
    base = base_config(args)
    out = []
    for hour, weight in sorted(WINDOWS, key=lambda w: -w[0]):
        for policy in args.policies:
            for routers in args.routers:
                config = replace(base, policy=policy, router_replicas=routers, start_hour=hour)
                out.append((config, hour, weight, args.rows))
    return out


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        key = (r["policy"], r["router_replicas"])
        t = table.setdefault(key, {
            "policy": r["policy"], "router_replicas": r["router_replicas"],
            "tokens_per_day": 0.0, "goodput_tokens_per_day": 0.0, "requests": 0, "good": 0.0,
            "windows": {},
        })  # fmt: skip
        seconds = r["weight_hours"] * 3600.0
        t["hours_covered"] = t.get("hours_covered", 0.0) + r["weight_hours"]
        t["tokens_per_day"] += r["tokens_per_second"] * seconds
        t["goodput_tokens_per_day"] += r["goodput_tokens_per_second"] * seconds
        t["windows"][f"{r['start_hour']:02.0f}:00"] = {
            k: r[k] for k in ("requests", "goodput_share", "cache_hit_rate", "ttft_p50",
                              "ttft_p99", "itl_p99", "tokens_per_second", "failed",
                              "unfinished", "wall_seconds")
        }  # fmt: skip
    return sorted(table.values(), key=lambda t: (POLICIES.index(t["policy"]), t["router_replicas"]))


def report(data: dict[str, Any]) -> str:
    table = data["table"]
    by = {(t["policy"], t["router_replicas"]): t for t in table}
    lines = [
        "| policy | routers | tokens/day (B) | goodput tokens/day (B) | goodput vs round-robin "
        "| vs llmd | vs oracle | hit rate at 15:00 | p99 TTFT at 15:00 (s) "
        "| goodput share at 15:00 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        n = t["router_replicas"]
        peak = t["windows"].get("15:00", {})

        def vs(policy: str, t: dict[str, Any] = t, n: int = n) -> str:
            other = by.get((policy, n))
            if not other or not other["goodput_tokens_per_day"]:
                return "–"
            return f"{t['goodput_tokens_per_day'] / other['goodput_tokens_per_day']:.3f}"

        lines.append(
            f"| {t['policy']} | {n} | {t['tokens_per_day'] / 1e9:.1f}"
            f"{'' if t.get('hours_covered') == 24 else ' (' + str(t.get('hours_covered')) + ' h)'} "
            f"| {t['goodput_tokens_per_day'] / 1e9:.1f} | {vs('round_robin')} | {vs('llmd')} "
            f"| {vs('oracle')} | {peak.get('cache_hit_rate', 0):.3f} "
            f"| {peak.get('ttft_p99', 0):.2f} | {peak.get('goodput_share', 0):.3f} |"
        )
    lines.append("")
    for policy in POLICIES:
        one = by.get((policy, 1))
        for n in (4, 8):
            many = by.get((policy, n))
            if not (one and many):
                continue
            ratios = []
            for hour, w1 in sorted(one["windows"].items()):
                wn = many["windows"].get(hour)
                if wn:
                    hit = wn["cache_hit_rate"] / max(1e-9, w1["cache_hit_rate"])
                    p99 = wn["ttft_p99"] / max(1e-9, w1["ttft_p99"])
                    ratios.append(f"{hour} hit rate {hit:.3f}, p99 TTFT {p99:.3f}")
            lines.append(f"- {policy}: {n} routers / 1: " + "; ".join(ratios))
    for policy in POLICIES:
        one = by.get((policy, 1))
        eight = by.get((policy, 8))
        if one and eight:
            p1, p8 = one["windows"]["15:00"], eight["windows"]["15:00"]
            lines.append(
                f"- {policy}: 8 routers / 1 at 15:00: hit rate "
                f"{p8['cache_hit_rate'] / max(1e-9, p1['cache_hit_rate']):.3f}, p99 TTFT "
                f"{p8['ttft_p99'] / max(1e-9, p1['ttft_p99']):.3f}, goodput/day "
                f"{eight['goodput_tokens_per_day'] / max(1e-9, one['goodput_tokens_per_day']):.3f}"
            )
    for n in sorted({t["router_replicas"] for t in table}):
        llmd = by.get(("llmd", n))
        if llmd and llmd["goodput_tokens_per_day"] and llmd.get("hours_covered") == 24:
            # what every policy serves is the demand (the same tokens/day for all): a router
            # that kept every request within the SLO would have goodput = tokens per day
            lines.append(
                f"- {n} router(s): the most any policy could get over llmd's goodput this day "
                f"(every request within the SLO): "
                f"{llmd['tokens_per_day'] / llmd['goodput_tokens_per_day']:.3f}x"
            )
    lines.append(f"- the seed's ratio (1.47 -> 5.97 B tokens/day): {SEED_RATIO:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES))
    parser.add_argument("--routers", type=lambda s: [int(x) for x in s.split(",")],
                        default=list(ROUTERS))  # fmt: skip
    parser.add_argument("--window", type=float, default=300.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--overload", type=float, default=1.2)
    parser.add_argument("--capacity", type=float, default=PLANNED_CAPACITY_PER_REPLICA)
    parser.add_argument("--bursts-per-hour", type=float, default=6.0)
    parser.add_argument("--ttft", type=float, default=5.0)
    parser.add_argument("--itl", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    add_peering_arguments(parser)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--merge", type=Path, nargs="*", default=[],
                        help="Earlier --out files whose rows join this run's.")  # fmt: skip
    parser.add_argument("--report", type=Path, help="Print the table of an --out file.")
    parser.add_argument("--rows", type=Path, help="Append each window's summary here (JSONL).")
    parser.add_argument("--from-rows", type=Path, help="Build --out from a --rows file.")
    args = parser.parse_args(argv)
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return 0
    start = time.perf_counter()
    if args.from_rows:
        rows = [json.loads(line) for line in args.from_rows.read_text().splitlines() if line]
        return _write(args, argv, rows, start)
    work = jobs(args)
    if args.jobs > 1:
        with multiprocessing.Pool(args.jobs) as pool:
            rows = pool.map(run_one, work, chunksize=1)
    else:
        rows = [run_one(j) for j in work]
    for path in args.merge:
        rows += json.loads(path.read_text())["rows"]
    return _write(args, argv, rows, start)


def _write(
    args: argparse.Namespace, argv: list[str] | None, rows: list[dict[str, Any]], start: float
) -> int:
    data = {
        "command": "bench/fleet_tokens_per_day.py " + " ".join(argv or sys.argv[1:]),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "wall_seconds": time.perf_counter() - start,
        "config": {k: str(v) for k, v in base_config(args).as_dict().items()},
        "rows": rows,
        "table": aggregate(rows),
    }
    text = json.dumps(data, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(report(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
