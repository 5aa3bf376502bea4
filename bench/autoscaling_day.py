"""SLO-violation minutes and chip-hours per day for three autoscalers on the fleet model (issue 60).

The fleet: at most ``--replicas`` replicas of ``llama-3.1-8b`` (bf16) on v6e ``2x2`` slices
(250 = 1,000 chips), autoscaled by one of `tpuserve.bench.autoscaling.SCALERS`: today's HPA on
``queue`` (target 8 waiting requests per replica), KEDA on backlog seconds (target ``--ttft`` /
2 seconds of prefill per replica; the replica's throughput from the performance model), and
backlog seconds with the predictive floor (and, with ``--scalers keda_backlog_floor_peak``, the
floor holding the last hour's peak too; ``--scalers max_replicas``: every replica all the
time, a reference for what no autoscaler avoids). A new slice serves after a cold start drawn
uniformly from 240-480 s (`FleetConfig.cold_start_seconds`). How fast the replicas may change
is ``--behavior`` (`tpuserve_operator.scaling_behavior.NAMED`): ``default``, the operator's
default (up the most of 4 slices and 100 % per 15 s; down, after 300 s of lower demand, the
most of 1 slice and 10 % a minute); ``one-per-minute``, what the operator rendered until
2026-12-07; ``up-at-once-down-one-per-minute``, the fleet model's mechanics until then (the
earlier tables' rows, which name no behaviour). Traffic: the Mooncake
conversation and tool&agent shapes, half each, peaking at ``--peak-load`` x the fleet's
planned capacity (`tpuserve plan`'s 5.25 requests/s per replica for this workload within p99
TTFT 5 s and ITL 0.1 s) x ``--replicas``, on two days:

- ``planner``: `tpuserve plan`'s daily shape, a cosine from 0.35 of the peak at 03:00 to the
  peak at 15:00, with 2 bursts an hour of 60 s at 2x;
- ``bursty``: the same shape with 4 bursts an hour of 300 s at 2x (longer than a cold start's
  lower bound, so an autoscaler can act on them).

A whole simulated day per configuration is too slow on this project's machines, so each day is
four windows at the cosine's quarter points, 03:00, 09:00, 15:00 and 21:00, each standing for
6 hours (exact for anything linear in the demand; the ramps at 09:00 and 21:00 are the
steepest of the day), each ``--window`` seconds with the first ``--warmup`` not counted. Every
window starts with the replicas the planned capacity needs for its demand, the same for every
scaler. Per day: chip-hours (slices held: starting, serving, draining) and SLO-violation
minutes (a minute in which fewer than 99 % of the requests that arrived finished within TTFT
``--ttft`` and mean ITL ``--itl``; a failed request misses), each scaled from the windows by
their weights.

    .venv/bin/python bench/autoscaling_day.py --replicas 25 --jobs 2 \\
        --out bench/fleet_results/2026-12-06/autoscaling_day.json
    .venv/bin/python bench/autoscaling_day.py \\
        --report bench/fleet_results/2026-12-06/autoscaling_day.json

``--split FILE`` splits a run's violation minutes by the fleet's ceiling (``--ceiling``): the
ones in minutes whose demand no replica count the spec allows can serve (at most), and the rest
(at least), which an autoscaler could avoid.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tpuserve.bench.autoscaling import SCALERS, ScalerConfig, run_autoscaled
from tpuserve.fleet import FleetConfig, FleetSim, daily_multiplier
from tpuserve_operator import scaling_behavior

WINDOWS = ((3.0, 6.0), (9.0, 6.0), (15.0, 6.0), (21.0, 6.0))
"""(start hour, hours of the day it stands for)."""
DAYS: dict[str, tuple[float, float, float]] = {
    "planner": (2.0, 2.0, 60.0),
    "bursty": (4.0, 2.0, 300.0),
}
"""Bursts per hour, their factor and their seconds."""
PLANNED_CAPACITY_PER_REPLICA = 5.25
"""`bench/fleet_tokens_per_day.py`'s figure: requests/s of one v6e 2x2 replica on this workload
within p99 TTFT 5 s and ITL 0.1 s (`tpuserve plan`, measured 2026-12-06)."""

NAMES = {
    "hpa_queue": "HPA on `queue` (today)",
    "keda_backlog": "KEDA on backlog seconds",
    "keda_backlog_floor": "KEDA on backlog seconds + predictive floor",
    "keda_backlog_floor_peak": "KEDA on backlog seconds + predictive floor holding the "
    "last hour's peak",
    "max_replicas": "every replica all the time (no autoscaler; a reference)",
}
BEHAVIORS = ("one-per-minute", "up-at-once-down-one-per-minute", "default")
"""`--behavior` values (`tpuserve_operator.scaling_behavior.NAMED`), in the report's order; the
first `hpa_queue` row of a day in this order is what the "vs" columns compare against."""
BEHAVIOR_NAMES = {
    "one-per-minute": "1 slice/min up and down (the operator's behaviour until 2026-12-07)",
    "up-at-once-down-one-per-minute": "up at once, down 1 slice/min (the fleet model's "
    "mechanics until 2026-12-07)",
    "default": "the new default behaviour (up max(4, 100 %)/15 s, down max(1, 10 %)/min)",
}

RULE_NAMES = {
    "kubernetes": "Kubernetes' replica rule",
    "median-trend": "the floor's median trend",
    "current-x-mean": "the model's old rule, ceil(current x mean / target)",
    "least-squares": "the floor's old least-squares trend",
}
"""The rule a row ran, where it names one (`tpuserve.bench.autoscaling.run_autoscaled`'s
``rule``): rows from before 2026-12-07c name none and ran the old rules (the HPA's
``ceil(current x mean / target)``, the floor's least-squares trend); a table that puts them
beside new rows marks them ``current-x-mean`` and ``least-squares``."""
RULES = tuple(RULE_NAMES)
FLOOR_WINDOW = 300.0
"""The floor's trend window the model ran unless ``--floor-window`` says otherwise."""


def label(row: dict[str, Any]) -> str:
    """The autoscaler column: the scaler, the rule where the row names one, and the
    behaviour where the row names one (rows of runs before `--behavior` existed name none:
    those ran the fleet model's mechanics until 2026-12-07, up at once and down one slice a
    minute)."""
    name = NAMES[row["scaler"]]
    rule = row.get("rule")
    if rule is not None:
        window = row.get("floor_window_seconds", FLOOR_WINDOW)
        at = "" if window == FLOOR_WINDOW else f" over {window:g} s"
        name = name.replace(" (today)", "") + f" ({RULE_NAMES[rule]}{at})"
    behavior = row.get("behavior")
    if behavior is None:
        return name
    name = name.replace(" (today)", "")
    return f"{name}, {BEHAVIOR_NAMES[behavior]}"


def _order(row: dict[str, Any]) -> tuple[int, int, int]:
    behavior = row.get("behavior")
    rule = row.get("rule")
    return (
        SCALERS.index(row["scaler"]),
        -1 if behavior is None else BEHAVIORS.index(behavior),
        -1 if rule is None else RULES.index(rule),
    )


def _key(row: dict[str, Any]) -> tuple[str, str, str | None, str | None, float]:
    """The rows of one table line: a day, a scaler, a behaviour, a rule and the floor's
    window."""
    window = row.get("floor_window_seconds", FLOOR_WINDOW)
    return (row["day"], row["scaler"], row.get("behavior"), row.get("rule"), window)


def _bases(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each day's row the "vs" columns compare against: its first `hpa_queue` row."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["scaler"] == "hpa_queue":
            out.setdefault(r["day"], r)
    return out


Job = tuple[str, str, float, float, FleetConfig, ScalerConfig, Path | None, str]


def jobs(args: argparse.Namespace) -> list[Job]:
    out: list[Job] = []
    trough = 0.35
    for day in args.days:
        for hour, weight in WINDOWS:
            if args.hours is not None and hour not in args.hours:
                continue
            peak = args.peak_load * args.capacity * args.replicas
            rate = peak * daily_multiplier(hour, trough)
            initial = min(args.replicas, max(1, math.ceil(rate / args.capacity)))
            bursts, factor, seconds = DAYS[day]
            config = FleetConfig(
                generation="v6e", topology="2x2", model="llama-3.1-8b", replicas=args.replicas,
                min_replicas=1, initial_replicas=initial, workload="mooncake",
                conversation_share=0.5, trough=trough, peak_rate=peak,
                start_hour=hour, duration_seconds=args.window, warmup_seconds=args.warmup,
                autoscale=True, slo_ttft_seconds=args.ttft, slo_itl_seconds=args.itl,
                drain_seconds=120.0, seed=args.seed, bursts_per_hour=bursts,
                burst_factor=factor, burst_seconds=seconds,
                behavior=scaling_behavior.NAMED[args.behavior],
            )  # fmt: skip
            for scaler in args.scalers:
                sc = ScalerConfig(
                    scaler=scaler,
                    backlog_target_seconds=args.ttft / 2,
                    per_replica_rate=args.capacity,
                    floor_window_seconds=getattr(args, "floor_window", FLOOR_WINDOW),
                )
                out.append((day, scaler, hour, weight, replace(config), sc, args.rows,
                            args.behavior))  # fmt: skip
    return out


def run_one(job: Job) -> dict[str, Any]:
    day, scaler, hour, weight, config, sc, rows, behavior = job
    result, figures = run_autoscaled(config, sc)
    s = result.summary()
    row = {
        "day": day, "scaler": scaler, "behavior": behavior, "start_hour": hour,
        "weight_hours": weight,
        **figures,
        **{k: s[k] for k in ("requests", "failed", "goodput_share", "ttft_p99", "mean_chips",
                             "replicas_min", "replicas_max", "scale_ups", "scale_downs",
                             "wall_seconds")},
    }  # fmt: skip
    if rows is not None:
        with rows.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    table: dict[tuple[str, str, str | None, str | None, float], dict[str, Any]] = {}
    for r in rows:
        behavior = r.get("behavior")
        t = table.setdefault(
            _key(r),
            {"day": r["day"], "scaler": r["scaler"], "chip_hours_per_day": 0.0,
             "slo_violation_minutes_per_day": 0.0, "hours_covered": 0.0, "windows": {},
             **({} if behavior is None else {"behavior": behavior}),
             **({"rule": r["rule"]} if "rule" in r else {}),
             **({"floor_window_seconds": r["floor_window_seconds"]}
                if "floor_window_seconds" in r else {})},
        )  # fmt: skip
        share = r["weight_hours"] / r["window_hours"]
        t["chip_hours_per_day"] += r["chip_hours"] * share
        t["slo_violation_minutes_per_day"] += r["slo_violation_minutes"] * share
        t["hours_covered"] += r["weight_hours"]
        t["windows"][f"{r['start_hour']:02.0f}:00"] = {
            k: r[k] for k in ("slo_violation_minutes", "chip_hours", "goodput_share",
                              "ttft_p99", "replicas_min", "replicas_max", "failed")
        }  # fmt: skip
    for t in table.values():
        t["slo_violation_minutes_per_chip_hour"] = (
            t["slo_violation_minutes_per_day"] / t["chip_hours_per_day"]
        )
    return sorted(table.values(), key=lambda t: (t["day"] != "planner", _order(t)))


def ceiling(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Where the demand asks for more than the whole fleet (``--replicas`` x ``--capacity``):
    for each day and window, the counted seconds and minutes in which the arrival rate (daily
    shape x bursts, the fleet model's `FleetSim.rate_multiplier`) exceeds the most replicas'
    planned capacity. No autoscaler can serve those; the figure is the same at any
    ``--replicas`` (the demand scales with it). Nothing is simulated: the burst times come from
    the seed as in the runs."""
    out = []
    for day, scaler, hour, _weight, config, _sc, _rows, _behavior in jobs(args):
        if scaler != args.scalers[0]:
            continue
        sim = FleetSim(config)
        counted = range(int(config.warmup_seconds), int(config.duration_seconds))
        share = [sim.rate_multiplier(t) * args.peak_load for t in counted]
        over = [t for t, x in zip(counted, share, strict=True) if x > 1.0]
        minutes = {int((t - config.warmup_seconds) // 60) for t in over}
        out.append({
            "day": day, "window": f"{hour:02.0f}:00",
            "peak_demand_over_fleet": round(max(share), 3),
            "seconds_over_fleet": len(over), "counted_seconds": len(counted),
            "minutes_over_fleet": len(minutes),
            "counted_minutes": math.ceil(len(counted) / 60),
        })  # fmt: skip
    return out


def split(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each day's and scaler's violation minutes split by the fleet's ceiling (`ceiling`, from
    the run's own arguments): per window, at most ``min(v, c)`` of its ``v`` violation minutes
    fall in the ``c`` minutes whose demand exceeds every replica's planned capacity, so at
    least ``v - c`` fell in minutes that demand the fleet could serve: the part an autoscaler
    could avoid (a lower bound: a backlog built over the ceiling also spills past it). Scaled
    to the day by each window's weight like `aggregate`."""
    a = data["args"]
    args = argparse.Namespace(
        days=sorted({r["day"] for r in data["rows"]}), scalers=["hpa_queue"],
        replicas=a["replicas"], window=a["window"], warmup=a["warmup"],
        peak_load=a["peak_load"], capacity=a["capacity"], ttft=a["ttft"], itl=a["itl"],
        seed=a["seed"], rows=None, hours=None, behavior="default",
    )  # fmt: skip
    over = {(c["day"], c["window"]): c["minutes_over_fleet"] for c in ceiling(args)}
    out = []
    for t in data["table"]:
        rows = [r for r in data["rows"] if _key(r) == _key(t)]
        at_most = beyond = 0.0
        for r in rows:
            share = r["weight_hours"] / r["window_hours"]
            v = r["slo_violation_minutes"]
            c = over[(r["day"], f"{r['start_hour']:02.0f}:00")]
            at_most += min(v, c) * share
            beyond += max(0, v - c) * share
        out.append({
            "day": t["day"], "scaler": t["scaler"],
            **({"behavior": t["behavior"]} if "behavior" in t else {}),
            **({"rule": t["rule"]} if "rule" in t else {}),
            **({"floor_window_seconds": t["floor_window_seconds"]}
               if "floor_window_seconds" in t else {}),
            "slo_violation_minutes_per_day": t["slo_violation_minutes_per_day"],
            "at_the_ceiling_at_most": at_most, "beyond_the_ceiling_at_least": beyond,
            "chip_hours_per_day": t["chip_hours_per_day"], "covered": _covered(t),
        })  # fmt: skip
    return out


def _covered(t: dict[str, Any]) -> str:
    """`` (12 of 24 h)`` after a day whose windows were not all run; empty when they were."""
    hours = sum(w for _, w in WINDOWS)
    return "" if t["hours_covered"] >= hours else f" ({t['hours_covered']:g} of {hours:g} h)"


def _hours(row: dict[str, Any]) -> Any:
    """The hours of the day a table row (``hours_covered``) or a split row (``covered``)
    stands for."""
    return row.get("hours_covered", row.get("covered"))


def _relative(row: dict[str, Any], base: dict[str, Any] | None, key: str) -> str:
    """``row[key]`` against the HPA-on-queue row of its day, as a signed percentage; "–"
    when the two cover different hours of the day (a per-day figure from other windows)."""
    if base is None or not base[key]:
        return "–"
    if _hours(row) != _hours(base):
        return "–"
    return f"{100.0 * (row[key] / base[key] - 1.0):+.0f} %"


def split_report(data: dict[str, Any]) -> str:
    rows = split(data)
    base = _bases(rows)
    lines = [
        "| day | autoscaler | violation minutes/day | in minutes over the ceiling (at most) "
        "| beyond them (at least) | beyond them vs HPA on queue | chip-hours/day vs HPA |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b = base.get(r["day"])
        lines.append(
            f"| {r['day']}{r['covered']} | {label(r)} "
            f"| {r['slo_violation_minutes_per_day']:.0f} "
            f"| {r['at_the_ceiling_at_most']:.0f} | {r['beyond_the_ceiling_at_least']:.0f} "
            f"| {_relative(r, b, 'beyond_the_ceiling_at_least')} "
            f"| {_relative(r, b, 'chip_hours_per_day')} |"
        )
    return "\n".join(lines)


def report(data: dict[str, Any]) -> str:
    table = data["table"]
    base = _bases(table)
    lines = [
        "| day | autoscaler | SLO-violation minutes/day | vs HPA on queue | chip-hours/day "
        "| vs HPA on queue | violation minutes per chip-hour | violation minutes by window "
        "(03/09/15/21 h) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in table:
        b = base.get(t["day"])
        rel = functools.partial(_relative, t, b)

        windows = t["windows"]
        by_window = " / ".join(
            str(windows[w]["slo_violation_minutes"]) if w in windows else "not run"
            for w in (f"{h:02.0f}:00" for h, _ in WINDOWS)
        )
        covered = _covered(t)
        lines.append(
            f"| {t['day']}{covered} | {label(t)} "
            f"| {t['slo_violation_minutes_per_day']:.0f} "
            f"| {rel('slo_violation_minutes_per_day')} | {t['chip_hours_per_day']:.0f} "
            f"| {rel('chip_hours_per_day')} | {t['slo_violation_minutes_per_chip_hour']:.3f} "
            f"| {by_window} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=250, help="Most replicas (4 chips each).")
    parser.add_argument("--days", type=lambda s: s.split(","), default=list(DAYS))
    parser.add_argument("--scalers", type=lambda s: s.split(","), default=list(SCALERS[:3]))
    parser.add_argument(
        "--hours", type=lambda s: [float(h) for h in s.split(",")], default=None,
        help="Only these windows (start hours, e.g. 21); a day's table needs all four.",
    )  # fmt: skip
    parser.add_argument("--window", type=float, default=3600.0)
    parser.add_argument("--warmup", type=float, default=900.0)
    parser.add_argument("--peak-load", type=float, default=0.8)
    parser.add_argument("--capacity", type=float, default=PLANNED_CAPACITY_PER_REPLICA)
    parser.add_argument("--ttft", type=float, default=5.0)
    parser.add_argument("--itl", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--behavior", choices=BEHAVIORS, default="default",
        help="How fast the autoscaler may change the replicas "
        "(tpuserve_operator.scaling_behavior.NAMED); default: the operator's default.",
    )  # fmt: skip
    parser.add_argument(
        "--floor-window", type=float, default=300.0,
        help="The floor's trend window, seconds (the model's 300 s unless given; the CRD's "
        "windowSeconds defaults to 600).",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", type=Path, help="Append each window's row here (JSONL).")
    parser.add_argument("--from-rows", type=Path, help="Build --out from a --rows file.")
    parser.add_argument("--report", type=Path, help="Print the table of an --out file.")
    parser.add_argument(
        "--split", type=Path,
        help="Print an --out file's violation minutes split by the fleet's ceiling (no run).",
    )  # fmt: skip
    parser.add_argument(
        "--ceiling", action="store_true",
        help="Print where the demand exceeds the whole fleet's planned capacity (no run).",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.ceiling:
        print("| day | window | peak demand / whole fleet | seconds over the fleet | "
              "minutes touching it |\n|---|---|---|---|---|")  # fmt: skip
        for r in ceiling(args):
            print(f"| {r['day']} | {r['window']} | {r['peak_demand_over_fleet']:.2f} | "
                  f"{r['seconds_over_fleet']} / {r['counted_seconds']} | "
                  f"{r['minutes_over_fleet']} / {r['counted_minutes']} |")  # fmt: skip
        return 0
    if args.split is not None:
        print(split_report(json.loads(args.split.read_text())))
        return 0
    if args.report is not None:
        print(report(json.loads(args.report.read_text())))
        return 0
    started = time.time()
    if args.from_rows is not None:
        rows = [json.loads(line) for line in args.from_rows.read_text().splitlines() if line]
    else:
        todo = jobs(args)
        if args.jobs > 1:
            with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
                rows = pool.map(run_one, todo, chunksize=1)
        else:
            rows = [run_one(j) for j in todo]
    data = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "wall_seconds": round(time.time() - started, 1),
        "rows": rows,
        "table": aggregate(rows),
    }
    if args.out is not None:
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(report(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
