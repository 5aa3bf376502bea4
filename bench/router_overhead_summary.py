"""The summary of a `router_overhead.py` run: per router, the median CPU per request, its ratio
to the anchor's (of the medians, and the median of the per-round ratios), the saturation
throughput and the upstreams' CPU (`cpu_summary`); the latency a router adds over the engines
measured directly (`add_latency_summary`); the printed table (`print_summary`)."""

from __future__ import annotations

import argparse
import statistics
from typing import Any


def median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def cpu_summary(rows: dict[str, list[dict[str, Any]]], anchor: str | None) -> dict[str, Any]:
    """Per router: median CPU per request and saturation throughput; against the anchor, the
    ratio of the medians and the median of the per-round ratios (each round runs every router
    under the same host load, so the paired ratio is the steadier one)."""
    anchor_cpu = median(rows[anchor], "cpu_us_per_request") if anchor else None
    summary: dict[str, Any] = {}
    for label, results in rows.items():
        cpu = median(results, "cpu_us_per_request")
        paired = None
        if anchor is not None:
            paired = statistics.median(
                r["cpu_us_per_request"] / a["cpu_us_per_request"]
                for r, a in zip(results, rows[anchor], strict=True)
            )
        at_rate = [
            r["cpu_at_rate_us_per_request"] for r in results if "cpu_at_rate_us_per_request" in r
        ]
        summary[label] = {
            "cpu_at_rate_us_per_request": statistics.median(at_rate) if at_rate else None,
            "cpu_us_per_request": cpu,
            "cpu_ratio_vs_sglang": cpu / anchor_cpu if anchor_cpu else None,
            "cpu_paired_ratio_vs_sglang": paired,
            "saturation_rps": median(results, "saturation_rps"),
            "upstreams_cpu_us_per_request": median(results, "upstreams_cpu_us_per_request"),
            "rounds": results,
        }
    return summary


def add_latency_summary(
    summary: dict[str, Any],
    rows: dict[str, list[dict[str, Any]]],
    direct: list[dict[str, Any]],
    args: argparse.Namespace,
) -> None:
    base50, base99 = median(direct, "latency_p50_ms"), median(direct, "latency_p99_ms")
    print(f"\ndirect to engines: p50 {base50:.2f} ms, p99 {base99:.2f} ms at {args.rate:g} req/s;"
          f" first chunk p50 {median(direct, 'first_chunk_p50_ms'):.2f} ms ({args.rounds} "
          "rounds, medians)")  # fmt: skip
    for label, results in rows.items():
        summary[label].update({
            "added_latency_p50_ms": median(results, "latency_p50_ms") - base50,
            "added_latency_p99_ms": median(results, "latency_p99_ms") - base99,
            "first_chunk_p50_ms": median(results, "first_chunk_p50_ms"),
            "first_chunk_p99_ms": median(results, "first_chunk_p99_ms"),
        })  # fmt: skip


def print_summary(summary: dict[str, Any], args: argparse.Namespace) -> None:
    header = ["router", "CPU/request", "vs sglang", "paired", "max req/s", "upstreams' CPU/request"]
    if args.cpu_rate:
        header.append(f"CPU/request at {args.cpu_rate:g} req/s")
    if not args.cpu_only:
        header += ["added p50", "added p99", "first chunk p50", "first chunk p99"]
    print(" | ".join(header))
    for label, entry in summary.items():
        ratio, paired = entry["cpu_ratio_vs_sglang"], entry["cpu_paired_ratio_vs_sglang"]
        cells = [label, f"{entry['cpu_us_per_request']:.0f} us",
                 f"{ratio:.2f}x" if ratio else "-", f"{paired:.2f}x" if paired else "-",
                 f"{entry['saturation_rps']:.0f}",
                 f"{entry['upstreams_cpu_us_per_request']:.0f} us"]  # fmt: skip
        if args.cpu_rate:
            cells.append(f"{entry['cpu_at_rate_us_per_request']:.0f} us")
        if not args.cpu_only:
            cells += [
                f"{entry['added_latency_p50_ms']:+.2f} ms",
                f"{entry['added_latency_p99_ms']:+.2f} ms",
                f"{entry['first_chunk_p50_ms']:.2f} ms",
                f"{entry['first_chunk_p99_ms']:.2f} ms",
            ]
        print(" | ".join(cells))
    for label, entry in summary.items():
        troubled = sum(1 for r in entry["rounds"] if r.get("kv_replays_failed"))
        if troubled:
            print(f"note: {label}: {troubled} of {len(entry['rounds'])} rounds had failed KV-event "
                  "replays (their CPU includes the retries)")  # fmt: skip
