"""A reconciler wired to a `FakeKube` the way the kopf handlers wire it to the cluster
(`make_operator`, `Operator`), and the servers the reconciler tests create."""

from __future__ import annotations

import copy
import datetime
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from sglang_tpu.cold_start import ColdStartReport
from tests.fake_kube import FakeKube
from tpuserve_operator import labels
from tpuserve_operator.metrics import create_operator_metrics
from tpuserve_operator.reconciler import Reconciler, ReconcilerSettings
from tpuserve_operator.render import RenderConfig

NAMESPACE = "ml"
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
RESYNC_SECONDS = 60.0

ONE_HOST = {
    "model": {"source": "hf://Qwen/Qwen3-8B"},
    "tpu": {"generation": "v6e", "topology": "2x4"},
    "replicas": 2,
    "engine": {"type": "simulated"},
}
FOUR_HOSTS = {**ONE_HOST, "tpu": {"generation": "v6e", "topology": "4x4"}, "replicas": 1}


@dataclass
class Operator:
    """A reconciler wired to a FakeKube the way the kopf handlers wire it to the cluster."""

    kube: FakeKube
    reconciler: Reconciler
    registry: CollectorRegistry
    events: list[tuple[str, str, str]] = field(default_factory=list)  # type, reason, message

    def create(self, spec: dict[str, Any], name: str = "qwen") -> tuple[str, str]:
        self.kube.put(
            {
                "apiVersion": labels.API_VERSION,
                "kind": labels.KIND,
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "uid": f"{name}-uid",
                    "generation": 1,
                },
                "spec": copy.deepcopy(spec),
            }
        )
        return (NAMESPACE, name)

    def body(self, key: tuple[str, str]) -> dict[str, Any]:
        return self.kube.get_object(labels.API_VERSION, labels.KIND, *key)

    def edit(self, key: tuple[str, str], **spec: Any) -> None:
        """A spec change, as `kubectl apply` makes it: a new generation."""
        body = self.body(key)
        body["spec"] |= spec
        body["metadata"]["generation"] += 1
        self.kube.put(body)

    async def converge(self, key: tuple[str, str]) -> float | None:
        return await self.reconciler.converge(key, self.body(key))

    def status(self, key: tuple[str, str]) -> dict[str, Any]:
        status: dict[str, Any] = self.body(key)["status"]
        return status

    def conditions(self, key: tuple[str, str]) -> dict[str, tuple[str, str]]:
        """type -> (status, reason)"""
        return {c["type"]: (c["status"], c["reason"]) for c in self.status(key)["conditions"]}

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.events]

    def reconciles(self, result: str) -> float:
        value = self.registry.get_sample_value(
            "tpuserve_operator_reconciles_total", {"result": result}
        )
        return value or 0.0


COLD_START = ColdStartReport(
    {"pull": 0.0, "weights": 13.7, "compile": 340.0, "warmup": 5.0}, "miss"
)


async def report_cold_start(base_url: str) -> ColdStartReport | None:
    """A leader's `/server_info` report, without a network: every leader reports a miss."""
    return COLD_START


def make_operator() -> Operator:
    """A reconciler on an empty FakeKube that hears every change of it."""
    kube = FakeKube()
    registry = CollectorRegistry()
    events: list[tuple[str, str, str]] = []
    reconciler = Reconciler(
        kube,
        ReconcilerSettings(render=RenderConfig(), resync_seconds=RESYNC_SECONDS),
        create_operator_metrics(registry),
        lambda body, kind, reason, message: events.append((kind, reason, message)),
        clock=lambda: NOW,
        read_cold_start=report_cold_start,
    )

    def deliver(event_type: str, body: Any) -> None:
        if body["kind"] == labels.KIND:
            reconciler.on_server_event(event_type, body)
        elif body["kind"] == "Pod":
            reconciler.on_pod_event(event_type, body)
        else:
            reconciler.on_child_event(event_type, body)

    kube.watch(deliver)
    return Operator(kube, reconciler, registry, events)
