"""`tpuserve operator`: run the TPUModelServer operator (kopf) against the current cluster."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from typing import Any

from sglang_tpu import cli_types
from tpuserve_operator import peering
from tpuserve_operator.reconciler import ReconcilerSettings
from tpuserve_operator.render.context import DEFAULT_ENGINE_IMAGE, DEFAULT_IMAGE, RenderConfig
from tpuserve_operator.status import DEFAULT_PARTIAL_GROUP_SECONDS

DESCRIPTION = """Run the TPUModelServer operator.

Watches TPUModelServers (serving.tpuserve.dev/v1alpha1) in the given namespaces, or all of
them, and reconciles each into replica groups on GKE TPU node pools, a router, Services and
a PodDisruptionBudget, reporting conditions, replica counts and the endpoint in status.
Credentials: in-cluster service account, else KUBECONFIG / ~/.kube/config.

High availability: run several replicas with peering (the default); each picks a random
priority, the highest serves and the others wait (kopf peering). --standalone turns it off.
"""

ROUTER_RESOURCES_ENV = "TPUSERVE_ROUTER_RESOURCES"


def configure(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="Watch this namespace (repeatable). Default: all namespaces.",
    )
    scope.add_argument(
        "--all-namespaces", action="store_true", help="Watch every namespace (the default)."
    )
    parser.add_argument("--kubeconfig", default=None, help="Kubeconfig file (default: KUBECONFIG).")
    parser.add_argument(
        "--listen-address",
        default="0.0.0.0",
        help="Address of the metrics and liveness endpoints (default: %(default)s).",
    )
    parser.add_argument(
        "--metrics-port",
        type=cli_types.nonzero_port,
        default=9090,
        help="Prometheus /metrics port (default: %(default)s).",
    )
    parser.add_argument(
        "--liveness-port",
        type=cli_types.nonzero_port,
        default=8081,
        help="kopf /healthz port (default: %(default)s).",
    )
    peer = parser.add_mutually_exclusive_group()
    peer.add_argument("--standalone", action="store_true", help="Run without peering.")
    peer.add_argument(
        "--peering",
        default="tpuserve",
        metavar="NAME",
        help="Peering object name (default: %(default)s).",
    )
    parser.add_argument(
        "--peering-priority",
        type=cli_types.non_negative_int,
        default=None,
        help="kopf peering priority; default: random, so replicas never tie (a tie pauses all).",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=cli_types.positive_int,
        default=60,
        help="Seconds a peer's keep-alive lasts; a standby takes over this long after a crash.",
    )
    parser.add_argument(
        "--engine-image", default=DEFAULT_ENGINE_IMAGE, help="Default SGLang-on-TPU image."
    )
    parser.add_argument(
        "--router-image", default=DEFAULT_IMAGE, help="Default router (and simulated engine) image."
    )
    parser.add_argument(
        "--router-policy",
        default=None,
        metavar="NAME",
        help="Routing policy of routers whose TPUModelServer sets none (default: none given, "
        "so the router's own default applies; empty means the same).",
    )
    parser.add_argument(
        "--router-replicas",
        type=cli_types.positive_int,
        default=1,
        help="Router replicas of servers that set none (default: %(default)s).",
    )
    parser.add_argument(
        "--router-resources",
        default=os.environ.get(ROUTER_RESOURCES_ENV, "{}"),
        help=f"Default router resources as JSON (default: ${ROUTER_RESOURCES_ENV} or none).",
    )
    parser.add_argument(
        "--workload",
        choices=("auto", "leaderworkerset", "statefulset"),
        default="auto",
        help="Replica-group workload for new servers; auto: LeaderWorkerSet when its CRD is "
        "installed, else StatefulSets (default). A server keeps the kind it started with.",
    )
    parser.add_argument(
        "--partial-group-seconds",
        type=cli_types.duration_seconds,
        default=DEFAULT_PARTIAL_GROUP_SECONDS,
        help="A group partly up this long is Degraded (default: %(default)s).",
    )
    parser.add_argument(
        "--resync-seconds",
        type=cli_types.duration_seconds,
        default=60.0,
        help="Re-check every server this often (default: %(default)s).",
    )
    parser.add_argument(
        "--relist-seconds",
        type=cli_types.duration_seconds,
        default=300.0,
        help="Re-list each server's children and pods this often (watches can miss deletions).",
    )
    parser.add_argument(
        "--max-concurrent",
        type=cli_types.positive_int,
        default=16,
        help="Servers reconciled at the same time (default: %(default)s).",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "plain"),
        default="json",
        help="json: one JSON object per line with the object reference (default).",
    )


def _router_resources(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as err:
        raise SystemExit(f"--router-resources: {text!r} is not JSON ({err})") from None
    if not isinstance(value, dict):
        raise SystemExit(f"--router-resources: {text!r} is not allowed; allowed: a JSON object")
    return value


def options_from(args: argparse.Namespace) -> Any:
    from tpuserve_operator.options import OperatorOptions

    render = RenderConfig(
        engine_image=args.engine_image,
        router_image=args.router_image,
        router_policy=args.router_policy or None,
        router_replicas=args.router_replicas,
        router_resources=_router_resources(args.router_resources),
    )
    return OperatorOptions(
        namespaces=tuple(args.namespace),
        kubeconfig=args.kubeconfig,
        listen_address=args.listen_address,
        metrics_port=args.metrics_port,
        liveness_port=args.liveness_port,
        standalone=args.standalone,
        peering_name=args.peering,
        peering_priority=(
            args.peering_priority
            if args.peering_priority is not None
            else peering.random_priority()
        ),
        peering_lifetime=args.peering_lifetime,
        reconciler=ReconcilerSettings(
            render=render,
            workload=args.workload,
            partial_group_seconds=args.partial_group_seconds,
            resync_seconds=args.resync_seconds,
            relist_seconds=args.relist_seconds,
            max_concurrent=args.max_concurrent,
        ),
    )


def run(args: argparse.Namespace) -> int:
    import kopf

    import tpuserve_operator.handlers.tpumodelserver  # noqa: F401  (registers the handlers)

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
