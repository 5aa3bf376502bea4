"""`tpuserve cluster maintenance|preempt`: which nodes a flag names, with errors naming the
flag, the value and what exists; a preempted node comes back without the signals."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import urllib3
from kubernetes import client

from tpuserve.cluster import disruption
from tpuserve_operator.node_signals import MAINTENANCE_TIME_LABEL, TERMINATION_TAINT

pytestmark = pytest.mark.unit


def node(name: str, pool: str) -> SimpleNamespace:
    labels = {"cloud.google.com/gke-nodepool": pool, "tpuserve.dev/fake-node": "true"}
    return SimpleNamespace(metadata=SimpleNamespace(name=name, labels=labels))


class Core:
    """The two CoreV1Api reads `select_nodes` and `saved_node` make."""

    def __init__(self, *nodes: SimpleNamespace, body: dict[str, Any] | None = None) -> None:
        self.nodes = list(nodes)
        self.body = body

    def list_node(self, label_selector: str) -> SimpleNamespace:
        assert label_selector == "tpuserve.dev/fake-node=true"
        return SimpleNamespace(items=self.nodes)

    def read_node(self, name: str) -> dict[str, Any] | None:
        return self.body


class Api:
    @staticmethod
    def sanitize_for_serialization(body: dict[str, Any]) -> dict[str, Any]:
        return body


CORE = Core(node("a-0", "a"), node("a-1", "a"), node("b-0", "b"))


def test_a_pool_names_all_its_nodes() -> None:
    assert disruption.select_nodes(CORE, None, "a") == ["a-0", "a-1"]
    assert disruption.select_nodes(CORE, "b-0", None) == ["b-0"]


def test_an_unknown_node_or_pool_is_refused_listing_what_exists() -> None:
    with pytest.raises(ValueError, match=r"--node: 'c-0' is not a node .*\['a-0', 'a-1', 'b-0'\]"):
        disruption.select_nodes(CORE, "c-0", None)
    with pytest.raises(ValueError, match=r"--pool: 'c' is not a node pool .*\['a', 'b'\]"):
        disruption.select_nodes(CORE, None, "c")


def test_a_saved_node_comes_back_with_its_tpu_taint_but_no_signals() -> None:
    body = {
        "metadata": {
            "name": "a-0",
            "uid": "u",
            "resourceVersion": "9",
            "labels": {"cloud.google.com/gke-nodepool": "a", MAINTENANCE_TIME_LABEL: "1"},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {
            "taints": [
                {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"},
                {"key": TERMINATION_TAINT, "value": "true", "effect": "NoSchedule"},
            ]
        },
        "status": {"capacity": {"google.com/tpu": "8"}, "allocatable": {"google.com/tpu": "8"}},
    }
    saved = disruption.saved_node(Core(body=body), Api(), "a-0")
    assert saved["metadata"] == {
        "name": "a-0",
        "labels": {"cloud.google.com/gke-nodepool": "a"},
        "annotations": {"kwok.x-k8s.io/node": "fake"},
    }
    assert [t["key"] for t in saved["spec"]["taints"]] == ["google.com/tpu"]
    assert saved["status"]["capacity"] == {"google.com/tpu": "8"}


def test_a_pause_as_long_as_the_apiservers_idle_timeout_drops_the_pooled_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube-apiserver closes a connection idle 90 s; reusing it as it closes fails a write."""
    monkeypatch.setattr("tpuserve.cluster.disruption.time.sleep", lambda seconds: None)
    core = client.CoreV1Api(client.ApiClient())
    pools = core.api_client.rest_client.pool_manager
    assert isinstance(pools, urllib3.PoolManager)
    pools.connection_from_url("http://127.0.0.1:1")  # a pooled connection, as after a request
    disruption.pause(core, 5)
    assert len(pools.pools) == 1  # a short pause keeps it
    disruption.pause(core, disruption.APISERVER_IDLE_SECONDS)
    assert len(pools.pools) == 0
