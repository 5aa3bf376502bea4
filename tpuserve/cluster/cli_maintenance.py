"""`tpuserve cluster maintenance`: announce and run GKE host maintenance on fake nodes."""

from __future__ import annotations

import argparse
import time

from sglang_tpu import cli_types
from tpuserve.cluster import disruption
from tpuserve_operator.node_signals import (
    ACTIVE_MAINTENANCE_LABEL,
    MAINTENANCE_TIME_LABEL,
    TERMINATION_TAINT,
)

DESCRIPTION = f"""Announce host maintenance on fake nodes, then run it, as GKE does on TPU VMs.

1. now: label {MAINTENANCE_TIME_LABEL}=<start, Unix epoch seconds>;
2. after --in seconds: label {ACTIVE_MAINTENANCE_LABEL}=true, taint
   {TERMINATION_TAINT}:NoSchedule, and delete every pod on the nodes with its own grace
   period (TPU VMs cannot live-migrate);
3. after --duration more seconds: remove the labels and the taint.

Every step is printed with its UTC time. The operator moves TPUModelServer replica groups off
the nodes as soon as it sees step 1 (a surge slice first when rollout.maxSurge allows)."""


def configure(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--node", help="The node to maintain (a fake node's name).")
    target.add_argument("--pool", help="Every node of this node pool.")
    parser.add_argument(
        "--in",
        dest="in_seconds",
        metavar="SECONDS",
        type=cli_types.non_negative_int,
        default=60,
        help="Seconds from now until the maintenance starts (default: %(default)s).",
    )
    parser.add_argument(
        "--duration",
        metavar="SECONDS",
        type=cli_types.non_negative_int,
        default=30,
        help="Seconds the maintenance lasts, pods kept off (default: %(default)s).",
    )
    disruption.add_run_dir(parser)


def run(args: argparse.Namespace) -> int:
    say = disruption.say
    with disruption.core_api(args.run_dir, "maintenance") as (_, _, core):
        names = disruption.nodes_or_exit(core, args.node, args.pool, "maintenance")
        start = int(time.time()) + args.in_seconds
        disruption.schedule_maintenance(core, names, start)
        say(f"maintenance scheduled in {args.in_seconds} s on {', '.join(names)}")
        disruption.pause(core, args.in_seconds)
        for pod in disruption.start_maintenance(core, names):
            say(f"maintenance: pod {pod} terminating")
        say(f"maintenance started on {', '.join(names)}")
        disruption.pause(core, args.duration)
        disruption.end_maintenance(core, names)
        say(f"maintenance over on {', '.join(names)}")
    return 0
