"""`tpuserve_unschedulable_pods` counts, per TPUModelServer, the pods the scheduler cannot place
(the "pods unschedulable for TPU" alert reads it), and is 0 once they are placed."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tpuserve_operator.metrics import ServerPodsRow, create_operator_metrics
from tpuserve_operator.observed import pod_view
from tpuserve_operator.reconciler import Reconciler, ReconcilerSettings, _Served
from tpuserve_operator.render import RenderConfig

pytestmark = pytest.mark.unit


def test_unschedulable_pods_are_exported_per_server() -> None:
    registry = CollectorRegistry()
    rows = [
        ServerPodsRow("ml", "qwen", "v6e", "4x4", 3),
        ServerPodsRow("ml", "llama", "v5e", "2x4", 0),
    ]
    create_operator_metrics(registry, unschedulable=lambda: rows)
    text = generate_latest(registry).decode()
    assert (
        'tpuserve_unschedulable_pods{namespace="ml",tpu_generation="v6e",tpu_topology="4x4",'
        'tpumodelserver="qwen"} 3.0'
    ) in text
    assert 'tpumodelserver="llama"} 0.0' in text


def pod(name: str, *, unschedulable: bool, deleting: bool = False) -> dict[str, Any]:
    scheduled = {"type": "PodScheduled", "status": "True"}
    if unschedulable:
        scheduled = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient google.com/tpu.",
        }
    meta: dict[str, Any] = {"name": name, "labels": {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Pending", "conditions": [scheduled]}}


def test_the_reconciler_counts_live_unschedulable_pods_per_server() -> None:
    reconciler = Reconciler(
        kube=None,  # type: ignore[arg-type]  # no API call is made
        settings=ReconcilerSettings(render=RenderConfig()),
        metrics=create_operator_metrics(CollectorRegistry()),
        emit_event=lambda *_: None,
    )
    qwen, llama = ("ml", "qwen"), ("ml", "llama")
    reconciler._served[qwen] = _Served("qwen3-8b", "v6e", "4x4", 16, ready=False)
    reconciler._served[llama] = _Served("llama", "v5e", "2x4", 8, ready=True)
    reconciler.cache.replace(
        qwen,
        [],
        [
            pod_view(pod("qwen-r0-0", unschedulable=True)),
            pod_view(pod("qwen-r0-1", unschedulable=True)),
            pod_view(pod("qwen-r1-0", unschedulable=True, deleting=True)),
            pod_view(pod("qwen-r1-1", unschedulable=False)),
        ],
    )
    reconciler.cache.replace(llama, [], [pod_view(pod("llama-r0-0", unschedulable=False))])
    rows = {r.tpumodelserver: r for r in reconciler.unschedulable_rows()}
    assert rows["qwen"] == ServerPodsRow("ml", "qwen", "v6e", "4x4", 2)
    assert rows["llama"].unschedulable_pods == 0
