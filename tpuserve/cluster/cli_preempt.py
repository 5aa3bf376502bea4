"""`tpuserve cluster preempt`: preempt a fake Spot node, with GKE's notice or none."""

from __future__ import annotations

import argparse

from sglang_tpu import cli_types
from tpuserve.cluster import disruption, nodes
from tpuserve_operator.node_signals import TERMINATION_TAINT

DESCRIPTION = f"""Preempt a fake node as Compute Engine preempts a Spot VM.

With notice (default {30} s, Spot's): taint {TERMINATION_TAINT}:NoSchedule, delete the node's
pods with the grace the kubelet's graceful node shutdown leaves them (the notice minus
{disruption.SYSTEM_POD_SHARE_SECONDS} s kept for system pods); when the notice ends, delete the
node and remove what is left of its pods. --no-notice: the node and its pods vanish at once.
With --return-after, the node comes back (a Spot node pool recreates its VM) and the command
waits until it is Ready. Every step is printed with its UTC time."""

NODE_READY_TIMEOUT_SECONDS = 120.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node", required=True, help="The node to preempt (a fake node).")
    notice = parser.add_mutually_exclusive_group()
    notice.add_argument(
        "--notice",
        metavar="SECONDS",
        type=cli_types.positive_int,
        default=30,
        help="Seconds of notice before the node goes (default: %(default)s, GKE Spot's).",
    )
    notice.add_argument(
        "--no-notice", action="store_true", help="The node vanishes at once, without notice."
    )
    parser.add_argument(
        "--return-after",
        metavar="SECONDS",
        type=cli_types.non_negative_int,
        default=None,
        help="Recreate the node this many seconds after it is gone (default: it stays gone).",
    )
    disruption.add_run_dir(parser)


def run(args: argparse.Namespace) -> int:
    say = disruption.say
    with disruption.core_api(args.run_dir, "preempt") as (cluster, api, core):
        (name,) = disruption.nodes_or_exit(core, args.node, None, "preempt")
        saved = disruption.saved_node(core, api, name)
        disruption.preempt(core, name, None if args.no_notice else args.notice, say)
        if args.return_after is None:
            return 0
        disruption.pause(core, args.return_after)
        disruption.restore(core, saved)
        nodes.wait_ready(cluster.api_client, [name], NODE_READY_TIMEOUT_SECONDS)
        say(f"node {name}: back and Ready")
    return 0
