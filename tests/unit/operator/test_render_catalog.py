"""For every catalog slice and both workload kinds, render gives the right pods: host count,
google.com/tpu per pod, cpu and memory from the host's machine type, node selectors, the taint
toleration, and a launch contract that the launcher itself accepts for every host."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.torch_tpu import torch_tpu_env
from sglang_tpu.topology import (
    ACCELERATOR_LABEL,
    SLICE_SHAPES,
    TOPOLOGY_LABEL,
    TPU_RESOURCE,
    SliceShape,
)
from tpuserve_operator import labels
from tpuserve_operator.engine_resources import DAEMONSET_SHARE, quantity
from tpuserve_operator.render import Rendered

pytestmark = pytest.mark.unit

RenderFn = Callable[..., Rendered]

# A model small enough for every slice in the catalog, so the fit check passes everywhere.
SMALL_MODEL = {"source": "hf://Qwen/Qwen3-8B", "quantization": "fp8", "contextLength": 4096}


def _spec(shape: SliceShape, engine_type: str = "sglang") -> dict[str, Any]:
    return {
        "model": SMALL_MODEL,
        "tpu": {"generation": shape.generation.name, "topology": shape.topology},
        "replicas": 2,
        "engine": {"type": engine_type},
    }


def _pods(children: list[dict[str, Any]], replica: int) -> list[tuple[dict[str, Any], int, int]]:
    """(pod template, pods from it, first ordinal) for replica group `replica`."""
    out = []
    for child in children:
        if child["metadata"]["labels"].get(labels.REPLICA) != str(replica):
            continue
        if child["kind"] == "StatefulSet":
            first = child["spec"].get("ordinals", {}).get("start", 0)
            out.append((child["spec"]["template"], child["spec"]["replicas"], first))
        elif child["kind"] == "LeaderWorkerSet":
            lwt = child["spec"]["leaderWorkerTemplate"]
            out.append((lwt["leaderTemplate"], 1, 0))
            if lwt["size"] > 1:
                out.append((lwt["workerTemplate"], lwt["size"] - 1, 1))
    return out


def _resolve_env(template: dict[str, Any], host_index: int, pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet would give it (downward API resolved)."""
    env: dict[str, str] = {}
    for item in template["spec"]["containers"][0]["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if "index" in path:
                env[item["name"]] = str(host_index)
            elif path == "metadata.name":
                env[item["name"]] = pod_name
            elif path == "status.podIP":
                env[item["name"]] = "10.0.0.7"
            elif "group-key" in path:
                env[item["name"]] = "group-key-1"
            else:
                raise AssertionError(f"unexpected fieldRef {path}")
    return env


# Every catalog slice, rendered as StatefulSets and as LeaderWorkerSets.
EVERY_SLICE_BOTH_KINDS = pytest.mark.parametrize(
    ("shape", "lws"),
    [
        pytest.param(shape, lws, id=f"{shape.key}-{kind}")
        for shape in SLICE_SHAPES
        for lws, kind in ((False, "statefulset"), (True, "leaderworkerset"))
    ],
)


@EVERY_SLICE_BOTH_KINDS
def test_every_slice_renders_hosts_chips_and_selectors(
    shape: SliceShape, lws: bool, rendered: RenderFn
) -> None:
    result = rendered(_spec(shape), leaderworkerset=lws)
    assert result.plan.hosts == shape.hosts
    assert result.plan.chips_per_host == shape.chips_per_host
    for replica in range(2):
        pods = _pods(result.children, replica)
        assert sum(count for _, count, _ in pods) == shape.hosts
        for template, _, _ in pods:
            spec = template["spec"]
            resources = spec["containers"][0]["resources"]
            assert resources["requests"][TPU_RESOURCE] == str(shape.chips_per_host)
            assert resources["limits"][TPU_RESOURCE] == str(shape.chips_per_host)
            assert spec["nodeSelector"][ACCELERATOR_LABEL] == shape.generation.accelerator
            assert spec["nodeSelector"][TOPOLOGY_LABEL] == shape.topology
            assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
                "tolerations"
            ]


@EVERY_SLICE_BOTH_KINDS
def test_every_host_pod_takes_its_hosts_cpu_and_memory_less_the_daemonsets_share(
    shape: SliceShape, lws: bool, rendered: RenderFn
) -> None:
    """Requests = limits (Guaranteed): 90% of what GKE leaves to pods on the machine type, so
    the engine fits beside the node's DaemonSets and cannot take what they were promised."""
    result = rendered(_spec(shape), leaderworkerset=lws)
    machine = shape.machine
    for template, _, _ in _pods(result.children, 0):
        resources = template["spec"]["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"]
        cpu = quantity(resources["limits"]["cpu"])
        memory = quantity(resources["limits"]["memory"])
        assert cpu is not None
        assert memory is not None
        keep = 1 - DAEMONSET_SHARE
        allocatable_cpu = Decimal(machine.allocatable_millicpu) / 1000
        assert allocatable_cpu * keep - Decimal("0.001") <= cpu <= allocatable_cpu * keep
        allocatable_memory = Decimal(machine.allocatable_bytes)
        assert allocatable_memory * keep - 2**20 <= memory <= allocatable_memory * keep


@EVERY_SLICE_BOTH_KINDS
def test_every_host_gets_a_contract_the_launcher_accepts(
    shape: SliceShape, lws: bool, rendered: RenderFn
) -> None:
    result = rendered(_spec(shape), leaderworkerset=lws)
    replica = 1
    seen_hosts: set[int] = set()
    for template, count, first in _pods(result.children, replica):
        for ordinal in range(first, first + count):
            env = _resolve_env(template, ordinal, pod_name=f"pod-{ordinal}")
            contract = LaunchContract.from_env(env)
            seen_hosts.add(contract.host_index)
            assert contract.host_index == ordinal
            assert contract.replica_index == replica
            assert (contract.generation, contract.topology) == (
                shape.generation.name,
                shape.topology,
            )
            assert (contract.hosts, contract.chips_per_host) == (shape.hosts, shape.chips_per_host)
            hostnames = contract.hostnames
            assert len(hostnames) == (shape.hosts if shape.multi_host else 1)
            leader = (
                f"qwen-r{replica}-0.qwen-r{replica}.ml.svc" if shape.multi_host else "localhost"
            )
            assert hostnames[0] == leader
            derived = torch_tpu_env(contract)
            assert derived["TPU_WORKER_ID"] == str(ordinal) == env["TPU_WORKER_ID"]
            if shape.multi_host:
                assert derived["NODE_RANK"] == str(ordinal)
                assert derived["MASTER_ADDR"] == hostnames[0]
    assert seen_hosts == set(range(shape.hosts))


MULTI_HOST = [s for s in SLICE_SHAPES if s.multi_host]


@pytest.mark.parametrize("shape", MULTI_HOST, ids=[s.key for s in MULTI_HOST])
def test_worker_hostnames_are_the_pods_real_dns_names(
    shape: SliceShape, rendered: RenderFn
) -> None:
    """Host i's name in the contract is pod i's name under the group's headless Service."""
    result = rendered(_spec(shape))
    env = _resolve_env(_pods(result.children, 0)[0][0], 0, "qwen-r0-0")
    names = env["TPUSERVE_WORKER_HOSTNAMES"].split(",")
    expected = ["qwen-r0-0"] + [f"qwen-r0-w-{i}" for i in range(1, shape.hosts)]
    assert [n.split(".")[0] for n in names] == expected
    assert {n.split(".", 1)[1] for n in names} == {"qwen-r0.ml.svc"}


@EVERY_SLICE_BOTH_KINDS
def test_simulated_engine_keeps_topology_but_needs_no_tpu(
    shape: SliceShape, lws: bool, rendered: RenderFn
) -> None:
    result = rendered(_spec(shape, "simulated"), leaderworkerset=lws)
    pods = _pods(result.children, 0)
    assert sum(count for _, count, _ in pods) == shape.hosts
    for template, _, _ in pods:
        spec = template["spec"]
        assert spec["containers"][0].get("resources", {}) == {}  # CPU nodes of unknown size
        assert "nodeSelector" not in spec
        assert "tolerations" not in spec
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["TPUSERVE_ENGINE"] == "simulated"
        assert env["TPUSERVE_TPU_TOPOLOGY"] == shape.topology
