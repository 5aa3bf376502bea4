"""`tpuserve operator`: run the TPUModelServer operator (kopf) against the current cluster."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
from typing import Any

from sglang_tpu import cli_types
from tpuserve_operator import peering
from tpuserve_operator.flags import RENDER_FLAGS, Flag, add_flags, apply_flags, with_field
from tpuserve_operator.options import OperatorOptions
from tpuserve_operator.reconciler import WORKLOADS
from tpuserve_operator.render.context import DEFAULT_METRICS_FROM, DEFAULT_ROUTER_RESOURCES

DESCRIPTION = """Run the TPUModelServer operator.

Watches TPUModelServers (serving.tpuserve.dev/v1alpha1) in the given namespaces, or all of
them, and reconciles each into replica groups on GKE TPU node pools, a router, Services and
a PodDisruptionBudget, reporting conditions, replica counts and the endpoint in status.
Credentials: in-cluster service account, else KUBECONFIG / ~/.kube/config.

High availability: run several replicas with peering (the default); each picks a random
priority, the highest serves and the others wait (kopf peering). --standalone turns it off.
"""

ROUTER_RESOURCES_ENV = "TPUSERVE_ROUTER_RESOURCES"
METRICS_FROM_ENV = "TPUSERVE_METRICS_FROM"
POD_NAMESPACE_ENV = "POD_NAMESPACE"  # the operator's own namespace (the chart sets it)

DEFAULTS = OperatorOptions()

# Flags that set one field of OperatorOptions; their defaults are the dataclasses'.
OPTIONS: tuple[Flag, ...] = (
    Flag("--kubeconfig", "kubeconfig", "Kubeconfig file (default: KUBECONFIG)."),
    Flag(
        "--listen-address",
        "listen_address",
        "Address of the metrics and liveness endpoints (default: %(default)s).",
    ),
    Flag(
        "--metrics-port",
        "metrics_port",
        "Prometheus /metrics port (default: %(default)s).",
        kind=cli_types.nonzero_port,
    ),
    Flag(
        "--liveness-port",
        "liveness_port",
        "kopf /healthz port (default: %(default)s).",
        kind=cli_types.nonzero_port,
    ),
    Flag(
        "--peering-lifetime",
        "peering_lifetime",
        "Seconds a peer's keep-alive lasts; a standby takes over this long after a crash "
        "(default: %(default)s).",
        kind=cli_types.positive_int,
    ),
    *(f.under("reconciler.render") for f in RENDER_FLAGS),
    Flag(
        "--workload",
        "reconciler.workload",
        "Replica-group workload for new servers; auto: LeaderWorkerSet when its CRD is "
        "installed, else StatefulSets (default: %(default)s). A server keeps the kind it "
        "started with.",
        choices=WORKLOADS,
    ),
    Flag(
        "--partial-group-seconds",
        "reconciler.partial_group_seconds",
        "A group partly up this long is Degraded (default: %(default)s).",
        kind=cli_types.duration_seconds,
    ),
    Flag(
        "--resync-seconds",
        "reconciler.resync_seconds",
        "Re-check every server this often (default: %(default)s).",
        kind=cli_types.duration_seconds,
    ),
    Flag(
        "--relist-seconds",
        "reconciler.relist_seconds",
        "Re-list each server's children and pods this often; watches can miss deletions "
        "(default: %(default)s).",
        kind=cli_types.duration_seconds,
    ),
    Flag(
        "--skip-cold-start-reports",
        "reconciler.skip_cold_start_reports",
        "Do not read Ready leaders' cold-start reports from their /server_info (the status "
        "then shows the compile cache key and location only).",
        switch=True,
    ),
    Flag(
        "--max-concurrent",
        "reconciler.max_concurrent",
        "Servers reconciled at the same time (default: %(default)s).",
        kind=cli_types.positive_int,
    ),
)


def configure(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        action="append",
        default=list(DEFAULTS.namespaces),
        metavar="NS",
        help="Watch this namespace (repeatable). Default: all namespaces.",
    )
    scope.add_argument(
        "--all-namespaces", action="store_true", help="Watch every namespace (the default)."
    )
    peer = parser.add_mutually_exclusive_group()
    peer.add_argument("--standalone", action="store_true", help="Run without peering.")
    peer.add_argument(
        "--peering",
        dest="peering_name",
        default=DEFAULTS.peering_name,
        metavar="NAME",
        help="Peering object name (default: %(default)s).",
    )
    parser.add_argument(
        "--peering-priority",
        type=cli_types.non_negative_int,
        default=None,
        help="kopf peering priority; default: random, so replicas never tie (a tie pauses all).",
    )
    add_flags(parser, OPTIONS, DEFAULTS)
    parser.add_argument(
        "--metrics-from",
        default=os.environ.get(METRICS_FROM_ENV, ""),
        help="Who scrapes engines, as a JSON list of NetworkPolicy peers the engines' "
        f"NetworkPolicy admits to their HTTP port (default: ${METRICS_FROM_ENV}, else "
        "Prometheus pods in the monitoring namespace and GKE Managed Prometheus's gmp-system).",
    )
    parser.add_argument(
        "--router-resources",
        default=os.environ.get(ROUTER_RESOURCES_ENV, ""),
        help=f"Default router resources as JSON (default: ${ROUTER_RESOURCES_ENV}, else "
        f"{json.dumps(DEFAULT_ROUTER_RESOURCES, separators=(',', ':'))}; {{}}: none).",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "plain"),
        default="json",
        help="json: one JSON object per line with the object reference (default).",
    )


def _metrics_from(text: str) -> tuple[dict[str, Any], ...]:
    if not text.strip():
        return tuple(dict(p) for p in DEFAULT_METRICS_FROM)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--metrics-from: {text!r} is not JSON ({err})") from None
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise SystemExit(
            f"--metrics-from: {text!r} is not allowed; allowed: a JSON list of NetworkPolicy "
            'peers, e.g. [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]'
        )
    return tuple(value)


def _router_resources(text: str) -> dict[str, Any]:
    if not text.strip():
        return dict(DEFAULT_ROUTER_RESOURCES)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--router-resources: {text!r} is not JSON ({err})") from None
    if not isinstance(value, dict):
        raise SystemExit(f"--router-resources: {text!r} is not allowed; allowed: a JSON object")
    return value


def options_from(args: argparse.Namespace) -> OperatorOptions:
    options = apply_flags(DEFAULTS, OPTIONS, args)
    options = with_field(
        options, "reconciler.render.router_resources", _router_resources(args.router_resources)
    )
    options = with_field(
        options, "reconciler.render.metrics_from", _metrics_from(args.metrics_from)
    )
    if not options.reconciler.skip_cold_start_reports:
        # The chart sets POD_NAMESPACE; run locally, the engines need not admit this process.
        namespace = os.environ.get(POD_NAMESPACE_ENV) or None
        options = with_field(options, "reconciler.render.operator_namespace", namespace)
    return dataclasses.replace(
        options,
        namespaces=tuple(args.namespace),
        standalone=args.standalone,
        peering_name=args.peering_name,
        peering_priority=(
            args.peering_priority
            if args.peering_priority is not None
            else peering.random_priority()
        ),
    )


def run(args: argparse.Namespace) -> int:
    import kopf

    import tpuserve_operator.handlers.tpugateway
    import tpuserve_operator.handlers.tpumodelserver  # noqa: F401

    options = options_from(args)
    if args.log_format == "json":
        # Structured logs: one JSON object per line, with the object's reference.
        level = logging.getLogger().level
        logging.getLogger().handlers.clear()
        kopf.configure(log_format=kopf.LogFormat.JSON, log_refkey="object")
        logging.getLogger().setLevel(level)
    if args.log_level != "debug":
        # kopf logs every event handler call at INFO ("Handler 'on_pod' succeeded").
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    address = options.listen_address
    asyncio.run(
        kopf.operator(
            clusterwide=options.clusterwide,
            namespaces=list(options.namespaces),
            standalone=options.standalone,
            priority=options.peering_priority,
            peering_name=options.peering_name,
            liveness_endpoint=f"http://{address}:{options.liveness_port}/healthz",
            memo=kopf.Memo(options=options),
        )
    )
    return 0
