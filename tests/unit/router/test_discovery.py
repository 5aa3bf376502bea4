"""Kubernetes discovery: only ready leader pods become workers, at the right address."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_tpu.disaggregation import BOOTSTRAP_PORT_ANNOTATION, PD_CONTRACT_LABEL, PD_ROLE_LABEL
from tpuserve_router.engines.discovery.kubernetes import (
    PodRules,
    PodSet,
    worker_from_pod,
    workers_from_pods,
)
from tpuserve_router.engines.discovery.static import static_workers

pytestmark = pytest.mark.unit

RULES = PodRules(leader_label=("serving.tpuserve.dev/role", "leader"), fallback_port=30000)


def pod(
    name: str = "llama-0",
    *,
    role: str = "leader",
    ready: bool = True,
    phase: str = "Running",
    ip: str | None = "10.4.0.7",
    annotations: dict[str, str] | None = None,
    env_port: str | None = None,
    named_port: int | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "engine", "env": [], "ports": []}
    if env_port:
        container["env"].append({"name": "TPUSERVE_HTTP_PORT", "value": env_port})
    if named_port:
        container["ports"].append({"name": "http", "containerPort": named_port})
    metadata: dict[str, Any] = {
        "name": name, "uid": f"uid-{name}", "annotations": annotations or {},
        "labels": {"serving.tpuserve.dev/role": role},
    }  # fmt: skip
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
    return {"metadata": metadata, "spec": {"containers": [container]}, "status": status}


def test_a_ready_leader_is_a_worker_at_pod_ip_and_default_port() -> None:
    spec = worker_from_pod(pod(), RULES)
    assert spec is not None
    assert spec.url == "http://10.4.0.7:30000"


@pytest.mark.parametrize(
    "candidate",
    [pod(role="worker"), pod(ready=False), pod(phase="Pending"), pod(ip=None), pod(deleting=True)],
)
def test_workers_not_ready_or_not_leaders_are_not_routable(candidate: dict[str, Any]) -> None:
    assert worker_from_pod(candidate, RULES) is None


def url_of(candidate: dict[str, Any], rules: PodRules) -> str:
    spec = worker_from_pod(candidate, rules)
    assert spec is not None, "the pod is not routable"
    return spec.url


def test_port_comes_from_flag_then_env_then_named_port() -> None:
    assert url_of(pod(env_port="31000", named_port=32000), RULES).endswith(":31000")
    assert url_of(pod(named_port=32000), RULES).endswith(":32000")
    flagged = PodRules(RULES.leader_label, worker_port=33000)
    assert url_of(pod(env_port="31000"), flagged).endswith(":33000")


def test_annotations_override_the_address_and_kv_endpoints() -> None:
    annotated = pod(annotations={
        "serving.tpuserve.dev/worker-url": "http://127.0.0.1:4000",
        "serving.tpuserve.dev/kv-events-endpoint": "tcp://127.0.0.1:4001",
        "serving.tpuserve.dev/kv-replay-endpoint": "tcp://127.0.0.1:4002",
    })  # fmt: skip
    spec = worker_from_pod(annotated, RULES)
    assert spec is not None
    assert (spec.url, spec.kv_events_endpoint, spec.kv_replay_endpoint) == (
        "http://127.0.0.1:4000", "tcp://127.0.0.1:4001", "tcp://127.0.0.1:4002")  # fmt: skip


def test_without_a_leader_label_any_ready_pod_counts() -> None:
    rules = PodRules(leader_label=None)
    assert worker_from_pod(pod(role="worker"), rules) is not None


def test_ipv6_pod_addresses_are_bracketed() -> None:
    spec = worker_from_pod(pod(ip="fd00::7"), RULES)
    assert spec is not None
    assert spec.url == "http://[fd00::7]:30000"


def test_watch_events_update_the_worker_set_in_name_order() -> None:
    pods = PodSet()
    pods.reset([pod("b", ip="10.0.0.2"), pod("a", ip="10.0.0.1", ready=False)])
    assert [s.url for s in workers_from_pods(pods.pods.values(), RULES)] == [
        "http://10.0.0.2:30000"
    ]
    assert pods.apply("MODIFIED", pod("a", ip="10.0.0.1"))
    assert [s.url for s in workers_from_pods(pods.pods.values(), RULES)] == [
        "http://10.0.0.1:30000", "http://10.0.0.2:30000"]  # fmt: skip
    assert pods.apply("DELETED", pod("b"))
    assert not pods.apply("DELETED", pod("zzz"))
    assert not pods.apply("BOOKMARK", pod("c"))
    assert [s.url for s in workers_from_pods(pods.pods.values(), RULES)] == [
        "http://10.0.0.1:30000"
    ]


def test_static_workers_keep_order_and_drop_duplicates() -> None:
    specs = static_workers(["http://a:1", "http://b:1", "http://a:1"])
    assert [s.url for s in specs] == ["http://a:1", "http://b:1"]


def test_static_workers_may_name_their_model() -> None:
    specs = static_workers(["http://a:1", "llama=http://b:1"])
    assert [(s.url, s.model) for s in specs] == [("http://a:1", None), ("http://b:1", "llama")]


def test_a_pod_s_model_label_names_the_model_it_serves() -> None:
    labelled = pod()
    labelled["metadata"]["labels"]["model"] = "qwen3-8b"
    spec = worker_from_pod(labelled, RULES)
    assert spec is not None
    assert spec.model == "qwen3-8b"
    unlabelled = worker_from_pod(pod(), RULES)
    assert unlabelled is not None
    assert unlabelled.model is None  # learned from its /v1/models
    ignored = worker_from_pod(labelled, PodRules(RULES.leader_label, model_label=""))
    assert ignored is not None
    assert ignored.model is None


def test_the_default_model_label_is_the_operator_s() -> None:
    from tpuserve_operator import labels
    from tpuserve_router.config import DEFAULT_MODEL_LABEL

    assert DEFAULT_MODEL_LABEL == labels.MODEL


def test_a_pd_pods_role_bootstrap_port_and_pairing_contract_are_read() -> None:
    prefill = pod(annotations={BOOTSTRAP_PORT_ANNOTATION: "8998"})
    prefill["metadata"]["labels"] |= {PD_ROLE_LABEL: "prefill", PD_CONTRACT_LABEL: "abc"}
    spec = worker_from_pod(prefill, RULES)
    assert spec is not None
    assert (spec.role, spec.bootstrap_port, spec.pd_contract) == ("prefill", 8998, "abc")
    colocated = pod()
    colocated["metadata"]["labels"][PD_CONTRACT_LABEL] = "abc"  # no role: not a PD worker
    spec = worker_from_pod(colocated, RULES)
    assert spec is not None
    assert (spec.role, spec.pd_contract) == (None, None)


@pytest.mark.parametrize(
    "annotations",
    [
        {"serving.tpuserve.dev/worker-url": "http://169.254.169.254:80"},
        {"serving.tpuserve.dev/worker-url": "http://metadata.google.internal:80"},
        {"serving.tpuserve.dev/kv-events-endpoint": "tcp://169.254.169.254:5557"},
        {"serving.tpuserve.dev/worker-url": "http://8.8.8.8:30000"},
    ],
    ids=["link-local-url", "host-name-url", "link-local-kv-endpoint", "public-url"],
)
def test_without_worker_networks_annotations_are_dialled_only_inside_private_ranges(
    annotations: dict[str, str],
) -> None:
    """Issue 68: with ``--worker-networks`` unset, a pod annotated with 169.254.169.254 (the
    metadata server) was dialled. What annotations name must be an IP in the default
    networks (loopback, private ranges); the pod's own address is routed as before."""
    from tpuserve_router.engines.discovery.kubernetes import classify_pods

    specs, rejected = classify_pods([pod(annotations=annotations)], RULES)
    assert specs == []
    (refusal,) = rejected
    assert "without --worker-networks" in refusal.reason
    private = {"serving.tpuserve.dev/worker-url": "http://10.1.2.3:30000"}
    assert len(classify_pods([pod(annotations=private)], RULES)[0]) == 1
    assert len(classify_pods([pod()], RULES)[0]) == 1
