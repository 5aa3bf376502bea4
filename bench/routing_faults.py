"""W8 in mode sim: load balance under one hot prefix, and hit-rate recovery after a fault.

W8 sends 80 % of the requests with one 1,024-token prefix. Each policy runs it at 0.85 x mu_RR
three times per seed: undisturbed, with worker 0 restarted in the middle of the trace (down for
5 s, back with an empty cache), and with worker 0's cache flushed in the middle. The output
line per (policy, fault) holds the medians over seeds of the summary (max/mean load, hit rate)
and of the recovery times (`tpuserve bench --fault`).

    nice .venv/bin/python bench/routing_faults.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tpuserve_router.config import DEFAULT_POLICY

OUT = Path(__file__).resolve().parent / "results" / "routing_faults.jsonl"
ENTRY = "import sys; from tpuserve.cli import main; sys.exit(main())"


def median(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--policies",
        default=f"{DEFAULT_POLICY},precise,cost,sglang_cache_aware_v2,sglang_cache_aware_v1,"
        "round_robin",
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--requests", type=int, default=2400)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for policy in args.policies.split(","):
        for kind in ("none", "restart", "flush"):
            runs = []
            for seed in args.seeds.split(","):
                cmd = [sys.executable, "-c", ENTRY, "bench", "--log-level", "warning",
                       "--workload", "W8", "--policy", policy, "--seed", seed,
                       "--requests", str(args.requests), "--json"]  # fmt: skip
                if kind != "none":
                    cmd += ["--fault", kind]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            row: dict[str, Any] = {"policy": policy, "kind": kind, "seeds": args.seeds}
            for key in ("imbalance_max_over_mean", "hit_rate", "e2e_p99", "failed"):
                row[key] = median([r[key] for r in runs])
            if kind != "none":
                row["fault"] = {
                    scope: {"recovery_seconds": median(
                        [r["fault"][scope]["recovery_seconds"] for r in runs])}
                    for scope in ("fleet", "faulted_worker")
                }  # fmt: skip
                row["recovery_seeds"] = [r["fault"] for r in runs]
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: v for k, v in row.items() if k != "recovery_seeds"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
