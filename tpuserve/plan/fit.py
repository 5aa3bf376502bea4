"""`tpuserve plan --fit`: the fast answer, analytic, no simulation (`sglang_tpu.slo_sizing`).

The same sizing the operator runs for a server that states ``spec.slo`` and ``spec.demand``:
for each allowed slice, whether the model fits, the operating point that meets the SLOs (the
rate per replica, its concurrency, TTFT and ITL there) and the replicas for the peak. The
workload's mean prompt, mean output and prefix reuse are drawn from the same workload the
simulation would run (`workload_means`). Ranked by $/1M output tokens (GIQ's formula, as the
simulated plan) when every slice that fits has a price, else by tokens per second per chip.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from sglang_tpu import slo_sizing
from sglang_tpu.perf_model import get_profile
from tpuserve.fleet import FleetConfig, FleetSim
from tpuserve.plan.planner import PlanInputs

MEAN_SAMPLES = 4000
"""Requests drawn to measure the workload's means."""


@dataclass(frozen=True)
class WorkloadMeans:
    prompt_tokens: float
    output_tokens: float
    prefix_reuse: float
    """Share of prompt tokens an unbounded prefix cache would hold (blocks seen before)."""


def workload_means(fleet: FleetConfig, samples: int = MEAN_SAMPLES) -> WorkloadMeans:
    """The workload's mean prompt and output and its prefix reuse, over ``samples`` drawn
    requests (whole sessions, not served)."""
    sim = FleetSim(
        replace(fleet, replicas=1, peak_rate=1.0, duration_seconds=1e9, bursts_per_hour=0.0,
                autoscale=False)
    )  # fmt: skip
    drawn = sim.session_requests(samples)
    block = fleet.block_tokens
    seen: set[int] = set()
    reused = 0
    for r in drawn:
        for i, b in enumerate(r.blocks):
            if b in seen:
                reused += min(block, r.prompt - i * block)
            else:
                seen.add(b)
    prompts = sum(r.prompt for r in drawn)
    return WorkloadMeans(
        statistics.fmean(r.prompt for r in drawn),
        statistics.fmean(r.output for r in drawn),
        min(0.95, reused / prompts) if prompts else 0.0,
    )


@dataclass
class FitResult:
    inputs: PlanInputs
    means: WorkloadMeans
    sizes: list[slo_sizing.SliceSize]
    ranked: list[slo_sizing.SliceSize]
    ranked_by: str


def usd_per_million_output(inputs: PlanInputs, s: slo_sizing.SliceSize) -> float | None:
    """GIQ's $/1M output tokens at the slice's operating point (None: no price)."""
    price = inputs.prices.chip_hour(s.shape.generation.name, inputs.pricing)
    if price is None or s.point is None:
        return None
    chips = s.shape.chips
    out = s.point.output_tokens_per_second_per_chip * chips
    inp = s.point.tokens_per_second_per_chip * chips - out
    return price * chips / 3600.0 / (inp / inputs.output_input_cost_ratio + out) * 1e6


def fit(inputs: PlanInputs) -> FitResult:
    """Size every allowed slice analytically and rank them."""
    inputs.validate()
    fleet = inputs.fleet
    profile = fleet.profile or get_profile(fleet.model, "--model")
    means = workload_means(fleet)
    demand = slo_sizing.Demand(
        requests_per_second=inputs.peak_rate,
        prompt_tokens=max(1, round(means.prompt_tokens)),
        output_tokens=max(1, round(means.output_tokens)),
        prefix_reuse=means.prefix_reuse,
        trough=inputs.trough,
    )
    slo = slo_sizing.Slo(inputs.slo.ttft_p99, inputs.slo.itl_p99, inputs.slo.ttft_p50,
                         inputs.slo.itl_p50)  # fmt: skip
    sizes = slo_sizing.size(
        inputs.shapes, profile, demand, slo, quantization=fleet.quantization,
        context_length=inputs.context_length,
    )  # fmt: skip
    ranked = slo_sizing.rank(sizes)
    costs = [usd_per_million_output(inputs, s) for s in ranked]
    if ranked and all(c is not None for c in costs):
        order = sorted(zip(costs, range(len(ranked)), strict=True))
        return FitResult(inputs, means, sizes, [ranked[i] for _, i in order], "price")
    return FitResult(inputs, means, sizes, ranked, "tokens per chip")


def to_json(result: FitResult) -> dict[str, Any]:
    def row(s: slo_sizing.SliceSize) -> dict[str, Any]:
        p = s.point
        return {
            "slice": f"{s.shape.generation.name} {s.shape.topology}",
            "chips_per_replica": s.shape.chips,
            "fits": s.fits,
            "why_not": s.why_not,
            "replicas": s.replicas,
            "min_replicas": s.min_replicas,
            "chips": s.chips,
            "operating_point": None if p is None else vars(p),
            "usd_per_million_output_tokens": usd_per_million_output(result.inputs, s),
        }

    best = result.ranked[0] if result.ranked else None
    return {
        "method": "analytic (sglang_tpu.slo_sizing), no simulation",
        "peak_rate": result.inputs.peak_rate,
        "slo": vars(result.inputs.slo),
        "workload_means": vars(result.means),
        "ranked_by": result.ranked_by,
        "ranked": [f"{s.shape.generation.name} {s.shape.topology}" for s in result.ranked],
        "choice": None if best is None else f"{best.shape.generation.name} {best.shape.topology}",
        "candidates": [row(s) for s in result.sizes],
        "error_band": {**slo_sizing.PERF_MODEL_ERROR, "ttft_p99": slo_sizing.TTFT_P99_ERROR},
    }


def _f(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def render(result: FitResult) -> str:
    inputs, m = result.inputs, result.means
    slo = inputs.slo
    lines = [
        f"fit check (analytic, no simulation): {inputs.peak_rate:.1f} req/s at the peak, mean "
        f"prompt {m.prompt_tokens:.0f} tokens ({m.prefix_reuse:.0%} reusable), mean output "
        f"{m.output_tokens:.0f}; SLO p99 TTFT {slo.ttft_p99} s, p99 ITL {slo.itl_p99} s",
        "",
        "| slice | replicas (trough-peak) | chips | req/s per replica | concurrency "
        "| TTFT p50/p99 s | ITL ms | tok/s/chip | $/1M out |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rest = [s for s in result.sizes if s not in result.ranked]
    for s in [*result.ranked, *rest]:
        key = f"{s.shape.generation.name} {s.shape.topology}"
        p = s.point
        if p is None or not s.fits:
            lines.append(f"| {key} | – | – | – | – | – | – | – | {s.why_not} |")
            continue
        lines.append(
            f"| {key} | {s.min_replicas}-{s.replicas} | {s.chips} | {p.requests_per_second:.2f} "
            f"| {p.concurrency:.0f} | {p.ttft_p50:.2f}/{p.ttft_p99:.2f} | {p.itl * 1e3:.0f} "
            f"| {p.tokens_per_second_per_chip:.0f} "
            f"| {_f(usd_per_million_output(inputs, s), '.3f')} |"
        )
    err, ttft = slo_sizing.PERF_MODEL_ERROR, slo_sizing.TTFT_P99_ERROR
    lines.append("")
    lines.append(
        f"ranked by {result.ranked_by}"
        + ("" if result.ranked_by == "price" else " (a slice that fits has no price)")
    )
    if result.ranked:
        best = result.ranked[0]
        p = best.point
        assert p is not None
        lines.append(
            f"choice: {best.replicas} x {best.shape.generation.name} {best.shape.topology} at the "
            f"peak ({best.min_replicas} at the trough); operating point {p.requests_per_second:.2f}"
            f" req/s per replica at concurrency {p.concurrency:.0f} ({p.decode_batch} decoding): "
            f"TTFT p99 {p.ttft_p99:.2f} s, ITL {p.itl * 1e3:.0f} ms"
        )
    else:
        lines.append("choice: none: no slice serves the demand within the SLOs")
    lines.append(
        f"error band: the performance model's {err['median']:.0%} median, {err['worst']:.0%} "
        "worst, plus the analytic model's against the simulation (docs/capacity-planning.md, "
        '"The fit check"); the engine twin\'s TTFT p99 at the point is '
        f"{ttft['low']:.2f}-{ttft['high']:.2f}x this one's; `tpuserve plan` without --fit "
        "simulates"
    )
    return "\n".join(lines)
