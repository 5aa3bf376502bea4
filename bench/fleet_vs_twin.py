"""The fleet model against the token-level engine twin on the same load (issue 48).

Both run round-robin over 4 replicas of ``llama-3.1-8b`` on v6e ``2x2`` with the same KV pool
(`perf_model.kv_pool_tokens`) and the same step-time model; the twin (`tpuserve bench` mode
sim: SGLang's scheduler token by token) on workload W0 (unique prompts of ``--prompt`` tokens,
``--output`` output tokens, Poisson arrivals), the fleet model (`tpuserve.fleet`, closed-
form decode phases) on its ``lengths`` workload with the same fixed lengths and no reuse.
Prints one JSON line per rate with both sides' TTFT p50/p99, mean ITL and output tokens/s.

    .venv/bin/python bench/fleet_vs_twin.py --rates 20,40,60
"""

from __future__ import annotations

import argparse
import json
import statistics

from sglang_tpu.perf_model import get_profile, kv_pool_tokens
from sglang_tpu.topology import lookup
from tpuserve.bench import traces, workloads
from tpuserve.bench.report import summarize
from tpuserve.bench.sim_config import SimConfig
from tpuserve.bench.sim_runner import run_sim
from tpuserve.fleet import FleetConfig, run_fleet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")],
                        default=[20.0, 40.0, 60.0])  # fmt: skip
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--output", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    pool = kv_pool_tokens(lookup("v6e", "2x2"), get_profile("llama-3.1-8b"))
    for rate in args.rates:
        n = int(rate * args.seconds)
        trace = workloads.generate("W0", 0, n, prompt=args.prompt, output=args.output)
        trace = traces.rescale_to_rate(trace, rate)
        twin_config = SimConfig(workers=4, cache_tokens=pool, tpu="v6e", topology="2x2",
                                model_profile="llama-3.1-8b")  # fmt: skip
        twin = summarize("round_robin", run_sim(trace, "round_robin", twin_config).records, None)
        fleet = run_fleet(
            FleetConfig(
                replicas=4,
                policy="round_robin",
                workload="lengths",
                input_median=float(args.prompt),
                input_sigma=0.0,
                output_min=args.output,
                output_max=args.output,
                reuse_share=0.0,
                peak_rate=rate,
                trough=1.0,
                bursts_per_hour=0.0,
                duration_seconds=args.seconds,
                warmup_seconds=args.seconds / 10,
                load_poll_seconds=0.0,
            )
        )
        f = fleet.summary()
        print(json.dumps({
            "rate": rate,
            "twin": {k: twin[k] for k in ("ttft_p50", "ttft_p99", "tpot_mean",
                                         "output_tokens_per_s")},
            "fleet": {"ttft_p50": f["ttft_p50"], "ttft_p99": f["ttft_p99"],
                      "tpot_mean": statistics.fmean(fleet.itl) if fleet.itl else None,
                      "output_tokens_per_s": f["output_tokens_per_second"]},
        }))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
