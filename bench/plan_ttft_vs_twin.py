"""The planner's TTFT p99 (`sglang_tpu.slo_sizing`, what ``status.plan`` and ``tpuserve plan
--fit`` report) against the engine twin's, below, at and past the operating point.

Three workloads of docs/capacity-planning.md, each one replica of the slice the planner sizes,
fixed prompt and output lengths, nothing shared (the twin's ``1k1k`` shape): the e2e case
(Qwen3-8B 2,000/500 on v6e ``2x4``, SLO TTFT p99 1 s, ITL 50 ms), chat (Llama-3.1-8B 1,200/300
on v6e ``2x2``, 1 s / 50 ms) and long documents (Qwen3-8B 7,100/144 on v6e ``2x2``, 2 s /
50 ms). The twin is ``tpuserve bench`` in sim mode (SGLang's scheduler token by token, the
slice's KV pool), one worker, Poisson arrivals at each rate; its first 10 % of requests are
not measured. ``--run DIR`` runs the twin and writes one ``CASE-RATE.json`` per point; without
it the committed results are read. Prints the table and the error band at the operating
point (measured / predicted TTFT p99), which `slo_sizing.TTFT_P99_ERROR` states::

    .venv/bin/python bench/plan_ttft_vs_twin.py --run /tmp/ttft   # about 40 min of CPU
    .venv/bin/python bench/plan_ttft_vs_twin.py                   # the committed results

Near the slots' cliff the twin's p99 rises with the run's length (a short run has not seen
the queue's rare excursions): the e2e case at its point measured 0.046 s over 3,000 requests
and 0.95 s over 10,000, so the runs are long (``requests`` per case, ~40+ holds of a slot).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_tpu import slo_sizing
from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.topology import lookup

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "fleet_results" / "2026-12-08" / "plan_ttft_vs_twin"


@dataclass(frozen=True)
class Case:
    model: str
    generation: str
    topology: str
    prompt: int
    output: int
    ttft_p99: float
    itl_p99: float
    rates: tuple[float, ...]
    """Below, at (the planner's point, rounded) and past the operating point."""
    requests: int


CASES = {
    "e2e": Case("qwen3-8b", "v6e", "2x4", 2000, 500, 1.0, 0.05, (14.0, 14.42, 14.7, 15.0), 10000),
    "chat": Case("llama-3.1-8b", "v6e", "2x2", 1200, 300, 1.0, 0.05, (19.0, 19.75, 20.5), 6000),
    "long-document": Case("qwen3-8b", "v6e", "2x2", 7100, 144, 2.0, 0.05, (8.2, 8.69, 9.1), 3000),
}  # fmt: skip


def sized(case: Case) -> tuple[StepTimer, int, slo_sizing.Demand, slo_sizing.OperatingPoint]:
    shape, profile = lookup(case.generation, case.topology), get_profile(case.model)
    demand = slo_sizing.Demand(20.0, case.prompt, case.output)
    slo = slo_sizing.Slo(case.ttft_p99, case.itl_p99)
    size = slo_sizing.size_slice(shape, profile, demand, slo)
    assert size.point is not None, size.why_not
    return StepTimer(shape, profile), kv_pool_tokens(shape, profile), demand, size.point


def run_twin(name: str, case: Case, rate: float, out: Path) -> None:
    pool = kv_pool_tokens(lookup(case.generation, case.topology), get_profile(case.model))
    command = [str(ROOT / ".venv" / "bin" / "tpuserve"), "bench", "--workload", "1k1k",
               "--workload-param", f"prompt={case.prompt}", "--workload-param",
               f"output={case.output}", "--tpu", case.generation, "--topology", case.topology,
               "--model-profile", case.model, "--cache-tokens", str(pool), "--requests",
               str(case.requests), "--json", "--workers", "1", "--rate", str(rate)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    (out / f"{name}-{rate}.json").write_text(done.stdout)


def rows(results: Path) -> list[dict[str, float | str]]:
    """One row per (case, rate): predicted and measured TTFT p99, ITL and TPOT."""
    out: list[dict[str, float | str]] = []
    for name, case in CASES.items():
        timer, pool, demand, point = sized(case)
        for rate in case.rates:
            twin = json.loads((results / f"{name}-{rate}.json").read_text())
            load = slo_sizing.at_rate(timer, pool, demand, rate)
            out.append({"case": name, "rate": rate, "point": point.requests_per_second,
                        "predicted_ttft_p99": load.ttft_p99, "measured_ttft_p99": twin["ttft_p99"],
                        "predicted_itl": load.itl, "measured_tpot": twin["tpot_mean"],
                        "requests": twin["requests"]})  # fmt: skip
    return out


def band(table: list[dict[str, float | str]]) -> dict[str, float]:
    """measured / predicted TTFT p99 at each case's operating point: the lowest and highest,
    and whether every point past it was predicted at or above the measured (``safe_past``)."""
    at = [r for r in table if abs(float(r["rate"]) / float(r["point"]) - 1) < 0.005]
    ratios = [float(r["measured_ttft_p99"]) / float(r["predicted_ttft_p99"]) for r in at]
    past = [r for r in table if float(r["rate"]) > float(r["point"]) * 1.005]
    safe = all(float(r["predicted_ttft_p99"]) >= float(r["measured_ttft_p99"]) for r in past)
    return {"low": round(min(ratios), 2), "high": round(max(ratios), 2),
            "cases": len(at), "safe_past": float(safe)}  # fmt: skip


def _s(x: float) -> str:
    return "over the slots (infinite)" if math.isinf(x) else f"{x:.3f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="run the twin, writing its results here")
    args = parser.parse_args(argv)
    results = RESULTS
    if args.run is not None:
        args.run.mkdir(parents=True, exist_ok=True)
        for name, case in CASES.items():
            for rate in case.rates:
                run_twin(name, case, rate, args.run)
                print(f"ran {name} at {rate} req/s", file=sys.stderr)
        results = args.run
    table = rows(results)
    print("| case | req/s (point) | TTFT p99 predicted / measured | ITL predicted / TPOT measured "
          "| requests measured |")  # fmt: skip
    print("|---|---|---|---|---|")
    for r in table:
        rate, point = float(r["rate"]), float(r["point"])
        print(f"| {r['case']} | {rate:g} ({rate / point - 1:+.0%}) "
              f"| {_s(float(r['predicted_ttft_p99']))} / {float(r['measured_ttft_p99']):.3f} s "
              f"| {float(r['predicted_itl']) * 1e3:.1f} / {float(r['measured_tpot']) * 1e3:.1f} ms "
              f"| {int(r['requests']):,} |")  # fmt: skip
    b = band(table)
    print(
        f"\nmeasured / predicted TTFT p99 at the operating point: {b['low']:.2f}-{b['high']:.2f} "
        f"over {b['cases']:.0f} cases; past it predicted >= measured: {bool(b['safe_past'])}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
