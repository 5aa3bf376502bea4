"""`tpuserve cluster services`: where each Service of a running local cluster answers.

With the pod runner on, a Service with ClusterIP 10.96.A.B answers at 127.96.A.B on its
ports (`tpuserve.cluster.pods.services`). This lists them, and for a TPUModelServer the
local URL of its `status.endpoint` (the in-cluster URL `http://NAME.NAMESPACE.svc:PORT`), the
base URL an OpenAI client uses with `/v1` appended.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tpuserve.cluster import kube
from tpuserve.cluster.cluster import Cluster, default_run_dir
from tpuserve.cluster.pods.services import local_address
from tpuserve_operator import labels

DESCRIPTION = """Where the Services of a local cluster started by `tpuserve cluster up` answer.

The pod runner serves a Service with ClusterIP 10.96.A.B at 127.96.A.B on its ports. For a
TPUModelServer this prints the local URL of its endpoint: add /v1 for an OpenAI client."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=default_run_dir(),
        help="The cluster's run directory (default: %(default)s).",
    )
    parser.add_argument(
        "-n", "--namespace", default=None, help="Only this namespace (default: all)."
    )


def local_url(endpoint: str, services: Iterable[Mapping[str, Any]]) -> str | None:
    """The loopback URL of an in-cluster `http://NAME.NAMESPACE.svc[...]:PORT` endpoint."""
    parts = urlsplit(endpoint)
    host = (parts.hostname or "").split(".")
    if len(host) < 2:
        return None
    for service in services:
        metadata = service["metadata"]
        if [metadata["name"], metadata.get("namespace")] == host[:2]:
            address = local_address(service)
            if address is None:
                return None
            return parts._replace(netloc=f"{address}:{parts.port or 80}").geturl()
    return None


def rows(
    services: list[Mapping[str, Any]], servers: list[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """(what, in-cluster, local) for every TPUModelServer endpoint and every ClusterIP Service."""
    out = []
    for server in servers:
        endpoint = str((server.get("status") or {}).get("endpoint") or "")
        local = local_url(endpoint, services) if endpoint else None
        name = f"{server['metadata'].get('namespace')}/{server['metadata']['name']}"
        out.append((f"tpumodelserver {name}", endpoint or "-", local or "- (no endpoint yet)"))
    for service in services:
        address = local_address(service)
        if address is None:
            continue
        ports = " ".join(
            f"{p.get('name') or p['port']}:{p['port']}" for p in service["spec"].get("ports") or []
        )
        name = f"{service['metadata'].get('namespace')}/{service['metadata']['name']}"
        out.append((f"service {name}", service["spec"]["clusterIP"], f"{address} {ports}"))
    return out


def run(args: argparse.Namespace) -> int:
    try:
        cluster = Cluster.attach(args.run_dir)
    except FileNotFoundError as err:
        print(f"tpuserve cluster services: {err}", file=sys.stderr)
        return 1
    if not cluster.run_pods:
        print(
            "tpuserve cluster services: this cluster runs no pods (started with --no-pods), "
            "so no Service answers locally",
            file=sys.stderr,
        )
        return 1
    with contextlib.closing(cluster.api_client()) as api:
        core = kube.client().CoreV1Api(api)
        custom = kube.client().CustomObjectsApi(api)
        if args.namespace:
            services = core.list_namespaced_service(args.namespace)
            servers = custom.list_namespaced_custom_object(
                labels.GROUP, labels.VERSION, args.namespace, labels.PLURAL
            )
        else:
            services = core.list_service_for_all_namespaces()
            try:
                servers = custom.list_cluster_custom_object(
                    labels.GROUP, labels.VERSION, labels.PLURAL
                )
            except kube.api_exception():  # the CRD is not installed
                servers = {"items": []}
        service_objects = [api.sanitize_for_serialization(s) for s in services.items]
    table = rows(service_objects, list(servers.get("items") or []))
    width = max((len(r[0]) for r in table), default=0)
    for what, cluster_address, local in table:
        print(f"{what:<{width}}  {local}   (in cluster: {cluster_address})")
    return 0
