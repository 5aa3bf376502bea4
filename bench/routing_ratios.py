"""A routing sweep's points as ratios: each policy against round-robin and the oracle.

Reads the JSON lines of `bench/routing_sweep.py` (medians over seeds) and prints, per workload
and load, a Markdown table of hit rate, p99 TTFT, goodput (5 x and 2 x SLO) and p99 E2E with
the ratios the long-context targets are stated in (docs/benchmarks.md): hit rate / oracle's,
p99 TTFT / round-robin's and / oracle's, goodput / oracle's. With ``--baseline FILE`` (an
earlier sweep of the same points) each policy also gets a row from the baseline, marked
"before", so a policy change reads as before/after from runs with the same traces. With
``--replicas`` the sweeps given (``routing_sweep.py --router-replicas N``, any number of files)
are read as one and shown per router-replica count instead: hit rate and p99 TTFT for N = 1,
2, 4, ... and each as a ratio to the same policy's with one replica.

    .venv/bin/python bench/routing_ratios.py bench/results/routing_sweep.jsonl \\
        --workloads W9,W10 --baseline bench/results/before.jsonl --policies precise
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ORACLE = "oracle"
ROUND_ROBIN = "round_robin"


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ratio(a: Any, b: Any) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return "–"
    return f"{a / b:.2f}"


def num(value: Any) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "–"
    return f"{value:.3g}"


def table(
    rows: list[dict[str, Any]], baseline: list[dict[str, Any]], workloads: Sequence[str],
    policies: Sequence[str] | None,
) -> str:  # fmt: skip
    header = (
        "| workload | load | policy | hit rate | / oracle | TTFT p99 s | / RR | / oracle "
        "| goodput 5x | / oracle | goodput 2x | / oracle | E2E p99 s |"
    )
    out = [header, "|" + "---|" * (header.count("|") - 1)]
    points = sorted(
        {(r["workload"], r["load"]) for r in rows}, key=lambda p: (len(p[0]), p[0], p[1])
    )
    for workload, load_ in points:
        if workloads and workload not in workloads:
            continue
        here = {r["policy"]: r for r in rows if (r["workload"], r["load"]) == (workload, load_)}
        before = {
            r["policy"]: r for r in baseline if (r["workload"], r["load"]) == (workload, load_)
        }
        oracle = here.get(ORACLE) or before.get(ORACLE, {})
        rr = here.get(ROUND_ROBIN) or before.get(ROUND_ROBIN, {})
        names = [p for p in (policies or list(here)) if p in here]
        labelled = [(f"{p} (before)", before[p]) for p in names if p in before]
        labelled += [(p, here[p]) for p in names]
        for label, r in labelled:
            out.append(
                "| " + " | ".join([
                    workload, f"{load_:g}", label,
                    num(r.get("hit_rate")), ratio(r.get("hit_rate"), oracle.get("hit_rate")),
                    num(r.get("ttft_p99")), ratio(r.get("ttft_p99"), rr.get("ttft_p99")),
                    ratio(r.get("ttft_p99"), oracle.get("ttft_p99")),
                    num(r.get("goodput_rps")),
                    ratio(r.get("goodput_rps"), oracle.get("goodput_rps")),
                    num(r.get("goodput_rps_strict")),
                    ratio(r.get("goodput_rps_strict"), oracle.get("goodput_rps_strict")),
                    num(r.get("e2e_p99")),
                ]) + " |"
            )  # fmt: skip
    return "\n".join(out)


def replica_table(rows: list[dict[str, Any]], policies: Sequence[str] | None) -> str:
    counts = sorted({int(r.get("router_replicas", 1)) for r in rows})
    header = ["workload", "load", "policy"]
    for n in counts:
        header += [f"hit N={n}", f"TTFT p99 s N={n}"]
    header += [f"hit, TTFT p99 / N=1 at N={n}" for n in counts if n != 1]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    keys = sorted(
        {(r["workload"], r["load"], r["policy"]) for r in rows},
        key=lambda k: (len(k[0]), k[0], k[1], k[2]),
    )
    for workload, load_, policy in keys:
        if policies and policy not in policies:
            continue
        by_n = {
            int(r.get("router_replicas", 1)): r
            for r in rows
            if (r["workload"], r["load"], r["policy"]) == (workload, load_, policy)
        }
        cells = [workload, f"{load_:g}", policy]
        for n in counts:
            r = by_n.get(n, {})
            cells += [num(r.get("hit_rate")), num(r.get("ttft_p99"))]
        one = by_n.get(1, {})
        for n in counts:
            if n != 1:
                r = by_n.get(n, {})
                cells.append(
                    f"{ratio(r.get('hit_rate'), one.get('hit_rate'))}, "
                    f"{ratio(r.get('ttft_p99'), one.get('ttft_p99'))}"
                )
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", type=Path, nargs="+", help="JSON lines of bench/routing_sweep.py.")
    parser.add_argument(
        "--replicas", action="store_true", help="Compare router-replica counts (see above)."
    )
    parser.add_argument("--baseline", type=Path, help="An earlier sweep of the same points.")
    parser.add_argument("--workloads", default="", help="Comma-separated (default: all).")
    parser.add_argument(
        "--policies", default="", help="Policies to show, in order (default: all in the sweep)."
    )
    args = parser.parse_args()
    rows = [row for path in args.sweep for row in load(path)]
    workloads = [w for w in args.workloads.split(",") if w]
    policies = [p for p in args.policies.split(",") if p] or None
    if args.replicas:
        rows = [r for r in rows if not workloads or r["workload"] in workloads]
        print(replica_table(rows, policies))
        return 0
    baseline = load(args.baseline) if args.baseline else []
    print(table(rows, baseline, workloads, policies))
    return 0


if __name__ == "__main__":
    sys.exit(main())
