"""Fake GKE node pools: a profile file of pools, and the kwok Node objects for each pool.

Every TPU fact (accelerator label, topology, machine type, hosts, chips per host, label keys,
taint) comes from `sglang_tpu.topology`. A multi-host TPU pool is exactly one slice: one Node
per host, all sharing the pool's `cloud.google.com/gke-nodepool` label, as on GKE where a
multi-host slice pool is atomic. A single-host TPU pool may have any number of nodes, each a
whole slice. CPU pools carry no TPU labels, taint or resource.

A TPU node's cpu/memory allocatable is GKE's for its machine type (the catalog's
`MachineType`: vCPUs and memory less GKE's reservations), so engine pods, which request most of
their host (`tpuserve_operator.engine_resources`), fit one per node as on GKE. CPU nodes get
generous test values; a profile may set either.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sglang_tpu import topology
from sglang_tpu.topology import SliceShape

DEFAULT_PROFILE = Path(__file__).parent / "profiles" / "default.yaml"
DEFAULT_ZONE = "us-central2-b"
# kwok manages exactly the nodes with this annotation (--manage-nodes-with-annotation-selector).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
# Marks nodes this harness created, so they can be listed and removed together.
FAKE_NODE_LABEL = "tpuserve.dev/fake-node"
NODE_NAME_PREFIX = "gke-tpuserve"


class ProfileError(ValueError):
    """A profile file or pool that cannot be built; the message names the field and value."""


@dataclass(frozen=True, slots=True)
class NodePool:
    """One fake GKE node pool. Build with `NodePool.tpu(...)` or `NodePool.cpu(...)`."""

    name: str
    nodes: int
    machine_type: str
    zone: str = DEFAULT_ZONE
    spot: bool = False
    shape: SliceShape | None = None
    cpu: str = "96"
    memory: str = "384Gi"
    max_pods: int = 110

    @classmethod
    def tpu(
        cls,
        name: str,
        generation: str,
        topology_name: str,
        *,
        nodes: int | None = None,
        zone: str = DEFAULT_ZONE,
        spot: bool = False,
        cpu: str | None = None,
        memory: str | None = None,
    ) -> NodePool:
        """A TPU pool. Multi-host: one slice, hosts-many nodes. Single-host: `nodes` slices.
        `cpu`/`memory`: each node's allocatable (default: GKE's for the machine type)."""
        shape = topology.lookup(generation, topology_name, field_path=f"{name}.tpu.topology")
        machine = shape.machine
        cpu = cpu or f"{machine.allocatable_millicpu}m"
        memory = memory or f"{machine.allocatable_bytes // topology.MIB}Mi"
        if shape.multi_host:
            if nodes not in (None, shape.hosts):
                raise ProfileError(
                    f"{name}.nodes: {nodes!r} is not allowed; a multi-host pool is one "
                    f"{generation} {topology_name} slice of {shape.hosts} nodes (omit nodes)"
                )
            count = shape.hosts
        else:
            count = 1 if nodes is None else nodes
        return cls(
            name=name,
            nodes=count,
            machine_type=shape.machine_type,
            zone=zone,
            spot=spot,
            shape=shape,
            cpu=cpu,
            memory=memory,
        )

    @classmethod
    def cpu_pool(
        cls,
        name: str,
        *,
        nodes: int = 1,
        machine_type: str = "e2-standard-8",
        zone: str = DEFAULT_ZONE,
        spot: bool = False,
        cpu: str = "8",
        memory: str = "32Gi",
    ) -> NodePool:
        return cls(name, nodes, machine_type, zone, spot, None, cpu, memory)

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 40 or not _is_dns_label(self.name):
            raise ProfileError(
                f"name: {self.name!r} is not allowed; a node pool name is 1-40 lowercase "
                "letters, digits and '-', starting with a letter"
            )
        if self.nodes < 1:
            raise ProfileError(f"{self.name}.nodes: {self.nodes!r} is not allowed; at least 1")

    def node_names(self) -> list[str]:
        return [f"{NODE_NAME_PREFIX}-{self.name}-{i}" for i in range(self.nodes)]

    def node_labels(self, node_name: str) -> dict[str, str]:
        labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            FAKE_NODE_LABEL: "true",
            topology.NODE_POOL_LABEL: self.name,
            topology.INSTANCE_TYPE_LABEL: self.machine_type,
            topology.ZONE_LABEL: self.zone,
        }
        if self.spot:
            labels[topology.SPOT_LABEL] = "true"
        if self.shape is not None:
            labels[topology.ACCELERATOR_LABEL] = self.shape.generation.accelerator
            labels[topology.TOPOLOGY_LABEL] = self.shape.topology
            labels[topology.ACCELERATOR_COUNT_LABEL] = str(self.shape.chips_per_host)
        return labels

    def node_manifests(self) -> list[dict[str, Any]]:
        """The Node objects of this pool, ready to create (kwok then keeps them Ready)."""
        resources: dict[str, str] = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.max_pods),
            "ephemeral-storage": "100Gi",
        }
        taints: list[dict[str, str]] = []
        if self.shape is not None:
            resources[topology.TPU_RESOURCE] = str(self.shape.chips_per_host)
            taints.append(
                {
                    "key": topology.TPU_TAINT_KEY,
                    "value": topology.TPU_TAINT_VALUE,
                    "effect": topology.TPU_TAINT_EFFECT,
                }
            )
        return [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE,
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": self.node_labels(name),
                },
                "spec": {"taints": taints} if taints else {},
                # kwok's node-initialize stage keeps these and fills conditions and nodeInfo.
                "status": {"allocatable": dict(resources), "capacity": dict(resources)},
            }
            for name in self.node_names()
        ]


def _is_dns_label(name: str) -> bool:
    return (
        name[0].isalpha()
        and name[-1].isalnum()
        and all(c.islower() or c.isdigit() or c == "-" for c in name)
    )


# ---- profile files -------------------------------------------------------------------------


class _TPUSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    generation: str
    topology: str


class _PoolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    kind: Literal["tpu", "cpu"] = "tpu"
    tpu: _TPUSpec | None = None
    nodes: int | None = Field(default=None, ge=1, le=256)
    machine_type: str | None = Field(default=None, alias="machineType")
    zone: str | None = None
    spot: bool = False
    cpu: str | None = None
    memory: str | None = None

    @model_validator(mode="after")
    def _kind_matches(self) -> _PoolSpec:
        if self.kind == "tpu" and self.tpu is None:
            raise ValueError("a tpu pool needs tpu: {generation, topology}")
        if self.kind == "cpu" and self.tpu is not None:
            raise ValueError("a cpu pool has no tpu block")
        if self.kind == "tpu" and self.machine_type is not None:
            raise ValueError("machineType of a tpu pool comes from the topology catalog; omit it")
        return self


class _ProfileSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    zone: str = DEFAULT_ZONE
    pools: list[_PoolSpec]


def _pool_from_spec(spec: _PoolSpec, default_zone: str) -> NodePool:
    zone = spec.zone or default_zone
    extra = {k: v for k, v in (("cpu", spec.cpu), ("memory", spec.memory)) if v is not None}
    if spec.tpu is not None:
        return NodePool.tpu(
            spec.name,
            spec.tpu.generation,
            spec.tpu.topology,
            nodes=spec.nodes,
            zone=zone,
            spot=spec.spot,
            **extra,
        )
    return NodePool.cpu_pool(
        spec.name,
        nodes=spec.nodes or 1,
        machine_type=spec.machine_type or "e2-standard-8",
        zone=zone,
        spot=spec.spot,
        **extra,
    )


def parse_profile(data: object, source: str = "profile") -> list[NodePool]:
    """Node pools from a parsed profile document; ProfileError names the bad field."""
    try:
        spec = _ProfileSpec.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        value = first.get("input")
        raise ProfileError(f"{source}: {where}: {first['msg']} (got {value!r})") from None
    pools: list[NodePool] = []
    for i, pool_spec in enumerate(spec.pools):
        try:
            pools.append(_pool_from_spec(pool_spec, spec.zone))
        except (ProfileError, topology.CatalogError) as err:
            raise ProfileError(f"{source}: pools[{i}]: {err}") from None
    names = [p.name for p in pools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ProfileError(f"{source}: pools: names must be unique, repeated: {duplicates}")
    return pools


def load_profile(path: Path = DEFAULT_PROFILE) -> list[NodePool]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ProfileError(f"profile {path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ProfileError(f"profile {path}: not valid YAML: {err}") from None
    return parse_profile(data, str(path))


def node_names(pools: Sequence[NodePool]) -> list[str]:
    return [name for pool in pools for name in pool.node_names()]
