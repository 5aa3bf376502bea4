"""One simulated hour of a 1,000-chip fleet on the virtual clock, timed (issue 48).

250 replicas of `llama-3.1-8b` on v6e `2x2` slices (1,000 chips) behind several router
replicas, the daily peak hour of a conversation + tool&agent mix with bursts, the autoscaler
(``tokensInFlight``) with 4-8 minute cold starts and Spot preemptions in the loop
(`tpuserve.fleet`). Prints the run's summary as one JSON object, with the wall time.

    .venv/bin/python bench/fleet_hour.py --json-out bench/fleet_results/2026-12-06/fleet_hour.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from tpuserve.fleet import FleetConfig, add_peering_arguments, peer_delay_from, run_fleet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="precise")
    parser.add_argument("--replicas", type=int, default=250)
    parser.add_argument("--initial-replicas", type=int, default=200)
    parser.add_argument("--router-replicas", type=int, default=4)
    parser.add_argument("--peak-rate", type=float, default=500.0, help="requests/s at the peak")
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--preemptions", type=float, default=0.05, help="per replica-hour")
    parser.add_argument("--target-tokens-per-chip", type=float, default=50_000.0)
    parser.add_argument("--seed", type=int, default=0)
    add_peering_arguments(parser)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    config = FleetConfig(
        policy=args.policy, replicas=args.replicas, initial_replicas=args.initial_replicas,
        min_replicas=25, router_replicas=args.router_replicas, peak_rate=args.peak_rate,
        start_hour=14.0, duration_seconds=args.seconds, autoscale=True,
        target_tokens_per_chip=args.target_tokens_per_chip,
        preemptions_per_replica_hour=args.preemptions, seed=args.seed,
        peer_delay_seconds=peer_delay_from(args),
    )  # fmt: skip
    result = run_fleet(config)
    out = {
        "command": "bench/fleet_hour.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "python": platform.python_version(),
        "config": {k: v for k, v in config.as_dict().items()},
        "summary": result.summary(),
    }
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
