"""Live proof for the operator's series: the operator runs against the real control plane,
a real Prometheus (Debian's) scrapes its /metrics as the chart's ServiceMonitor does
(`honorLabels`, job `tpuserve-operator`), and EVERY Operator dashboard panel query and BOTH
operator alert expressions return data, from a fleet with a ready server, a server whose TPU
pods cannot be scheduled, and a server whose children the apiserver refuses (a quota), so
reconcile passes fail."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
import yaml

from tests.e2e.tms_harness import (
    OperatorProcess,
    apply,
    server,
    wait_condition,
)
from tests.panel_queries import panel_queries
from tests.waiting import eventually_async
from tpuserve.cluster import Cluster
from tpuserve.cluster.ports import free_port
from tpuserve.observability import catalog, local_prometheus, rules

pytestmark = [
    pytest.mark.e2e,
    # one operator, with the default workload (auto): its series do not depend on the kind
    pytest.mark.parametrize("operator", ["auto"], indirect=True),
]

DEADLINE_SECONDS = 180.0
OPERATOR_ALERTS = ("TPUServeOperatorReconcileErrors", "TPUServeTPUPodsUnschedulable")


@pytest.fixture
def quota_namespace(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A namespace whose quota allows no Deployment: the operator's router apply is refused."""
    name = f"{namespace}-quota"
    cluster.kubectl("create", "namespace", name)
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-deployments", "namespace": name},
        "spec": {"hard": {"count/deployments.apps": "0"}},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(quota))
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    # Free the TPU capacity its pods hold now, not when the namespace controller gets to them.
    cluster.kubectl("delete", "pods", "--all", "-n", name, "--grace-period=0", check=False)


async def query(session: aiohttp.ClientSession, base: str, expr: str) -> list[Any]:
    async with session.get(f"{base}/api/v1/query?{urlencode({'query': expr})}") as response:
        answer = await response.json()
    assert answer["status"] == "success", (expr, answer)
    result: list[Any] = answer["data"]["result"]
    return result


async def test_operator_dashboard_and_alerts_return_data_from_a_live_operator(
    cluster: Cluster, namespace: str, quota_namespace: str, operator: OperatorProcess
) -> None:
    apply(cluster, namespace, server("ready", "v6e", "2x4", engine="simulated"))
    # One v5e 2x4 node exists (a spot pool): at most one of these groups finds room.
    apply(cluster, namespace, server("stuck", "v5e", "2x4", replicas=2))
    apply(cluster, quota_namespace, server("blocked", "v6e", "2x4", engine="simulated"))
    wait_condition(cluster, namespace, "ready", "Ready", "True", operator)
    wait_condition(cluster, namespace, "stuck", "Degraded", "True", operator, "Unschedulable")

    target = local_prometheus.ScrapeTarget(
        local_prometheus.OPERATOR_JOB,
        f"http://127.0.0.1:{operator.metrics_port}/metrics",
        {"namespace": "tpuserve-system", "pod": "tpuserve-operator-0"},
        honor_labels=True,  # as the chart's ServiceMonitor: keep the replicas' namespace/pod
    )
    prometheus = await local_prometheus.start([target], free_port())
    try:
        expressions = panel_queries(["tpuserve-operator"])
        expressions |= {
            f"alert {a.alert}": a.expr for a in rules.alerts() if a.alert in OPERATOR_ALERTS
        }
        assert len(expressions) > len(OPERATOR_ALERTS)
        empty = dict(expressions)
        found: dict[str, list[Any]] = {}
        async with aiohttp.ClientSession() as session:

            async def every_expression_has_data() -> bool:
                for key, expr in list(empty.items()):
                    result = await query(session, prometheus.url, expr)
                    if result:
                        found[key] = result
                        del empty[key]
                return not empty

            await eventually_async(
                every_expression_has_data,
                what="data for every operator panel and alert",
                timeout_seconds=DEADLINE_SECONDS,
                interval_seconds=1.0,
                context=lambda: f"still no data: {sorted(empty)}\n{operator.log_report()}",
            )
            names = await (
                await session.get(prometheus.url + "/api/v1/label/__name__/values")
            ).json()
    finally:
        await prometheus.stop()

    stuck = found["alert TPUServeTPUPodsUnschedulable"]
    assert {r["metric"]["tpumodelserver"] for r in stuck} == {"stuck"}
    assert {r["metric"]["namespace"] for r in stuck} == {namespace}
    assert stuck[0]["metric"]["tpu_generation"] == "v5e"
    errors = found["alert TPUServeOperatorReconcileErrors"]
    assert [r["metric"]["pod"] for r in errors] == ["tpuserve-operator-0"]
    ready = found["tpuserve-operator / TPUModelServers ready / A"]
    assert float(ready[0]["value"][1]) >= 1
    # Every metric the dashboard and the alerts select was scraped from the live operator.
    used: set[str] = set()
    for expr in expressions.values():
        used |= catalog.selected_names(expr)
    assert used - catalog.PROMETHEUS_SERIES <= set(names["data"])
