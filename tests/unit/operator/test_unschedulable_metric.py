"""`tpuserve_unschedulable_pods` counts, per TPUModelServer, the pods the scheduler cannot place
(the "pods unschedulable for TPU" alert reads it), and is 0 once they are placed."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.fake_kube import FakeKube, pod_object
from tpuserve_operator import labels
from tpuserve_operator.metrics import ServerPodsRow, create_operator_metrics
from tpuserve_operator.reconciler import Reconciler, ReconcilerSettings

pytestmark = pytest.mark.unit

NO_TPU = "0/3 nodes are available: 3 Insufficient google.com/tpu."


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


def server(name: str, generation: str, topology: str) -> dict[str, Any]:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name, "namespace": "ml", "uid": f"{name}-uid", "generation": 1},
        "spec": {
            "model": {"source": "hf://Qwen/Qwen3-8B"},
            "tpu": {"generation": generation, "topology": topology},
            "replicas": 2,
        },
    }


async def test_the_reconciler_counts_live_unschedulable_pods_per_server() -> None:
    kube = FakeKube()
    reconciler = Reconciler(
        kube,
        ReconcilerSettings(),
        create_operator_metrics(CollectorRegistry()),
        emit_event=lambda *_: None,
    )
    kube.watch(lambda event_type, body: reconciler.on_pod_event(event_type, body))
    qwen = kube.put(server("qwen", "v6e", "4x4"))
    llama = kube.put(server("llama", "v5e", "2x4"))
    kube.put(pod_object("qwen", "qwen-r0-0", unschedulable=NO_TPU))
    kube.put(pod_object("qwen", "qwen-r0-w-1", unschedulable=NO_TPU))
    kube.put(pod_object("qwen", "qwen-r1-0", replica=1))
    kube.put(pod_object("llama", "llama-r0-0"))
    doomed = pod_object("qwen", "qwen-r1-w-1", replica=1, unschedulable=NO_TPU)
    doomed["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.put(doomed)
    assert reconciler.unschedulable_rows() == []  # no server has been reconciled yet

    await reconciler.converge(("ml", "qwen"), qwen)
    await reconciler.converge(("ml", "llama"), llama)
    rows = {r.tpumodelserver: r for r in reconciler.unschedulable_rows()}
    assert rows["qwen"] == ServerPodsRow("ml", "qwen", "v6e", "4x4", 2)
    assert rows["llama"] == ServerPodsRow("ml", "llama", "v5e", "2x4", 0)

    kube.put(pod_object("qwen", "qwen-r0-0"))
    kube.put(pod_object("qwen", "qwen-r0-w-1"))
    assert {r.tpumodelserver: r.unschedulable_pods for r in reconciler.unschedulable_rows()} == {
        "qwen": 0,
        "llama": 0,
    }
