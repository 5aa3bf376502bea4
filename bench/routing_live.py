"""Live comparison: tpuserve router vs the real sglang-router 0.3.2, same engine twins, same trace.

For each workload: generate the trace (seed 0), size caches by the rule, measure mu_RR in sim
mode, then replay the trace at 0.85 x mu_RR over HTTP through each router in turn
(`tpuserve bench --mode live`), in front of freshly started engine-twin processes. Each line
of the output records the summary, including the CPU share of the client, router and engines,
so a run can show the two cores were never the bottleneck.

    bench/routing_anchor_venv.sh                       # once: installs sglang-router 0.3.2
    .venv/bin/python bench/routing_live.py             # W1-W6, about 30 minutes

Run it on a quiet machine: the engine twins keep modelled time with real sleeps, so a host
whose cores are busy with other work (load average above the core count) stretches every
step and the measured latencies belong to the host, not to the routers. Each line records
the host's load average. ``--time-scale 2`` (the default) makes one modelled second two real
ones, which halves the CPU needed per modelled second.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tpuserve.bench import sizing, workloads
from tpuserve.bench.sim_config import SimConfig
from tpuserve.bench.sim_runner import measure_rr_saturation
from tpuserve_router.config import DEFAULT_POLICY

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "routing_live.jsonl"
ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="W1,W2,W3,W4,W5,W6")
    parser.add_argument("--policies", default=f"{DEFAULT_POLICY},sglang_cache_aware_v2,round_robin")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            row = json.loads(line)
            done.add((row["workload"], row["policy"]))
    for n, name in enumerate(args.workloads.split(",")):
        trace = workloads.generate(name, seed=args.seed, requests=args.requests)
        demand = sizing.measure_demand(trace)
        cache = sizing.cache_tokens_for(demand, 4)
        mu = measure_rr_saturation(trace, SimConfig(cache_tokens=cache, seed=args.seed))
        order = args.policies.split(",")
        if n % 2:
            order.reverse()  # alternate who runs first, so drift on the host hits both routers
        for policy in order:
            if (name, policy) in done:
                continue
            cmd = [
                sys.executable, "-c", ENTRY, "bench", "--workload", name, "--mode", "live",
                "--policy", policy, "--requests", str(args.requests), "--seed", str(args.seed),
                "--cache-tokens", str(cache), "--rate", repr(args.load * mu),
                "--time-scale", repr(args.time_scale), "--json",
            ]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{name} {policy}: failed: {out.stderr.strip()[-400:]}", file=sys.stderr)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(workload=name, policy=policy, load=args.load, mu_rr=mu)
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            cpu = row["cpu_total_cores"]
            print(f"{name} {policy:<24} hit {row['hit_rate']:.3f} p99 e2e {row['e2e_p99']:.2f} s"
                  f" cpu {cpu:.2f} cores", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
