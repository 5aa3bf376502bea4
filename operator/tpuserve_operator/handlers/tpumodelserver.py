"""kopf handlers for TPUModelServer: decorators only; decide, delegate, report.

- startup: settings (finalizer, server-side label selectors, peering), the Kubernetes
  client, the reconciler, the metrics server, the peering object;
- one daemon per TPUModelServer runs the reconciler's loop for it (converge, wait for an
  event or a recheck); kopf starts it on create/resume, stops it on deletion or when peering
  pauses this operator;
- event handlers feed watch events of servers, children and pods to the reconciler, which
  wakes the owning server's loop;
- a liveness probe, and cleanup of what startup made.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, start_http_server

from tpuserve_operator import labels, peering
from tpuserve_operator.cold_starts import read_server_info
from tpuserve_operator.kube import KINDS, Kube, load_configuration
from tpuserve_operator.metrics import create_operator_metrics
from tpuserve_operator.options import OperatorOptions
from tpuserve_operator.reconciler import CHILD_KINDS, Reconciler

log = logging.getLogger(__name__)

FINALIZER = f"{labels.GROUP}/kopf-finalizer"
MANAGED = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
MANAGED_SELECTOR = labels.selector_string(MANAGED)


def _resource(api_version: str, kind: str) -> tuple[str, str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version, KINDS[(api_version, kind)].plural


# Children the operator creates (group, version, plural), watched to restore and report:
# the reconciler's list, pods aside (they have a handler of their own).
CHILD_RESOURCES: tuple[tuple[str, str, str], ...] = tuple(
    _resource(api_version, kind) for api_version, kind in CHILD_KINDS if kind != "Pod"
)
FILTERED = {(g, p) for g, _, p in CHILD_RESOURCES} | {("", "pods")}


def connection_info(configuration: Any) -> kopf.ConnectionInfo:
    """The same credentials, as kopf's ConnectionInfo (kopf's watches use them)."""
    # The client keeps the bearer token under "BearerToken" (kubernetes>=35) or
    # "authorization" (older); the getter runs the refresh hook of in-cluster tokens.
    authorization = (
        configuration.get_api_key_with_prefix("BearerToken")
        or configuration.get_api_key_with_prefix("authorization")
        or ""
    )
    scheme, _, token = str(authorization).partition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


def _reconciler(memo: Any) -> Reconciler:
    reconciler: Reconciler = memo.reconciler
    return reconciler


def _emit(body: Any, kind: str, reason: str, message: str) -> None:
    kopf.event(body, type=kind, reason=reason, message=message)


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    options: OperatorOptions = memo.options
    settings.persistence.finalizer = FINALIZER
    settings.posting.reporting_component = labels.FIELD_MANAGER
    settings.posting.event_name_prefix = "tpuserve-"
    settings.peering.name = options.peering_name
    settings.peering.priority = options.peering_priority
    settings.peering.lifetime = options.peering_lifetime
    settings.peering.standalone = options.standalone
    settings.peering.mandatory = not options.standalone
    settings.peering.clusterwide = options.clusterwide
    settings.peering.stealth = True
    # Watch only what the operator made: the apiserver filters, not this process.
    settings.watching.label_selectors[lambda r: (r.group, r.plural) in FILTERED] = MANAGED_SELECTOR

    kube = Kube(load_configuration(options.kubeconfig, options.api_workers), options.api_workers)
    registry = CollectorRegistry()
    reconciler: Reconciler | None = None

    def rows() -> Any:
        return reconciler.replica_rows() if reconciler else ()

    def servers() -> Any:
        return reconciler.server_readiness() if reconciler else ()

    def unschedulable() -> Any:
        return reconciler.unschedulable_rows() if reconciler else ()

    metrics = create_operator_metrics(registry, rows, servers, unschedulable)
    skip_reports = options.reconciler.skip_cold_start_reports
    reconciler = Reconciler(
        kube,
        options.reconciler,
        metrics,
        _emit,
        read_cold_start=None if skip_reports else read_server_info,
    )
    memo.reconciler = reconciler
    memo.kube = kube
    memo.metrics_server, _thread = start_http_server(
        options.metrics_port, options.listen_address, registry
    )
    if not options.standalone:
        for namespace in options.namespaces or (None,):
            await kube.create_if_missing(peering.peering_object(options.peering_name, namespace))
    log.info(
        "operator started: %s, peering %s (priority %d)",
        "all namespaces" if options.clusterwide else ", ".join(options.namespaces),
        "off" if options.standalone else options.peering_name,
        options.peering_priority,
    )


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's watches use the same credentials as the operator's client (--kubeconfig,
    else in-cluster, else KUBECONFIG); kopf calls this again when they are refused."""
    options: OperatorOptions = memo.options
    return connection_info(load_configuration(options.kubeconfig))


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        server.shutdown()
    kube = getattr(memo, "kube", None)
    if kube is not None:
        kube.close()


@kopf.on.probe(id="reconciler")
def probe(memo: kopf.Memo, **_: Any) -> str:
    return "ok" if getattr(memo, "reconciler", None) is not None else "starting"


@kopf.daemon(labels.GROUP, labels.VERSION, labels.PLURAL, cancellation_timeout=2.0)
async def reconcile_loop(
    body: kopf.Body, meta: kopf.Meta, stopped: kopf.DaemonStopped, memo: kopf.Memo, **_: Any
) -> None:
    """The TPUModelServer's reconcile loop, for as long as it exists."""
    key = (str(meta.namespace), str(meta.name))
    await _reconciler(memo).run(key, body, stopped)


@kopf.on.event(labels.GROUP, labels.VERSION, labels.PLURAL)
async def on_server(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconciler(memo).on_server_event(event.get("type"), body)


async def on_child(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconciler(memo).on_child_event(event.get("type"), body)


for _group, _version, _plural in CHILD_RESOURCES:
    kopf.on.event(_group, _version, _plural, labels=MANAGED, id=f"child-{_plural}")(on_child)


@kopf.on.event("", "v1", "nodes")
async def on_node(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconciler(memo).on_node_event(event.get("type"), body)


@kopf.on.event("", "v1", "pods", labels=MANAGED)
async def on_pod(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _reconciler(memo).on_pod_event(event.get("type"), body)
