"""The TPU topology catalog: the one place that knows GKE TPU generations and slice shapes.

The operator (node selectors, `google.com/tpu` requests, host counts), the launcher
(TorchTPU topology strings, devices per host), the engine twin's performance model (HBM,
FLOP/s, bandwidth) and the test cluster's fake node pools all read this module.

Everything is keyed on (generation, topology), never on a chip count alone: v6e `2x4` is one
8-chip VM (`ct6e-standard-8t`) while tpu7x `2x2x2` is two 4-chip VMs. Facts and their
sources: GKE's TPU pages (cloud.google.com/kubernetes-engine/docs/concepts/tpus and
`plan-tpus`), the TPU version pages (cloud.google.com/tpu/docs/v5e, `v6e`), XPK's
`system_characteristics.py`, and torch_tpu 0.2.0's `_internal/utils/hardware.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

TPU_RESOURCE = "google.com/tpu"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
ACCELERATOR_COUNT_LABEL = "cloud.google.com/gke-accelerator-count"
SPOT_LABEL = "cloud.google.com/gke-spot"
RESERVATION_LABEL = "cloud.google.com/reservation-name"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
# GKE taints TPU slice nodes google.com/tpu=present:NoSchedule; pods tolerate it explicitly.
TPU_TAINT_KEY = TPU_RESOURCE
TPU_TAINT_VALUE = "present"
TPU_TAINT_EFFECT = "NoSchedule"

GIB = 1024**3
MIB = 1024**2
TERA = 1e12


class CatalogError(ValueError):
    """A (generation, topology) pair the catalog does not know; names field, value and allowed."""

    def __init__(
        self, field_path: str, value: object, allowed: list[str], detail: str = ""
    ) -> None:
        self.field = field_path
        self.value = value
        self.allowed = allowed
        what = f"{detail}; " if detail else ""
        super().__init__(
            f"{field_path}: {value!r} is not allowed; {what}allowed: {', '.join(allowed)}"
        )


@dataclass(frozen=True, slots=True)
class TPUGeneration:
    """One TPU generation's per-chip hardware facts."""

    name: str
    accelerator: str  # value of cloud.google.com/gke-tpu-accelerator
    pci_device_id: str
    hbm_bytes_per_chip: int
    hbm_bandwidth_bytes_per_second: float
    peak_bf16_flops_per_chip: float
    # Dense 8-bit peak (fp8 where the chip has it, int8 otherwise); None when unpublished.
    peak_8bit_flops_per_chip: float | None
    # torch_tpu exposes one device per chip, except Ironwood (two TensorCores, one device each).
    devices_per_chip: int
    # torch_tpu's host-local TORCH_TPU_TOPOLOGY by number of devices on the host.
    host_topology_by_devices: Mapping[int, str]
    # Cloud TPU's accelerator-type name (TPU_ACCELERATOR_TYPE) is `<prefix>-<TensorCores>`.
    accelerator_type_prefix: str
    tensorcores_per_chip: int = 1
    # Chips on each multi-host VM (4 on every multi-host machine type).
    chips_per_multi_host_vm: int = 4
    # What torch (TorchTPU's get_device_name) and JAX (device_kind) call one of its devices.
    device_names: tuple[str, ...] = ()
    # Host-to-device copy bandwidth of one chip (host DRAM to HBM over its PCIe link): what a
    # host-memory KV tier's load back runs at; sources in `HOST_TO_DEVICE_SOURCES`.
    host_to_device_bytes_per_second: float = 7.0e9

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.hbm_bytes_per_chip // self.devices_per_chip


@dataclass(frozen=True, slots=True)
class MachineType:
    """One TPU VM's host: what its vCPUs and memory are, and what GKE leaves to pods of them."""

    name: str
    vcpus: int
    memory_bytes: int

    @property
    def allocatable_millicpu(self) -> int:
        """CPU GKE leaves to pods (node allocatable): the vCPUs less what GKE reserves for the
        kubelet and the system, 6% of the first core, 1% of the next, 0.5% of the next two and
        0.25% of every core above four (GKE "Standard cluster architecture", node allocatable).
        """
        tiers = ((1, 60), (1, 10), (2, 5), (self.vcpus, 2.5))  # (cores, millicores reserved each)
        left, reserved = self.vcpus, 0.0
        for cores, each in tiers:
            taken = min(left, cores)
            reserved += taken * each
            left -= taken
        return self.vcpus * 1000 - math.ceil(reserved)

    @property
    def allocatable_bytes(self) -> int:
        """Memory GKE leaves to pods: less 25% of the first 4 GiB, 20% of the next 4, 10% of the
        next 8, 6% of the next 112 and 2% above 128 GiB, and the 100 MiB eviction threshold."""
        tiers = ((4 * GIB, 0.25), (4 * GIB, 0.20), (8 * GIB, 0.10), (112 * GIB, 0.06))
        left, reserved = self.memory_bytes, 0.0
        for size, share in tiers:
            taken = min(left, size)
            reserved += taken * share
            left -= taken
        reserved += left * 0.02
        return self.memory_bytes - math.ceil(reserved) - 100 * MIB


# vCPUs and memory of each TPU machine type (Compute Engine's machine-type listing; GCE's "GB"
# of memory are GiB). v5e checked against the GCE machine-type list; the others [unconfirmed].
MACHINE_TYPES: Mapping[str, MachineType] = MappingProxyType(
    {
        m.name: m
        for m in (
            MachineType("ct5lp-hightpu-1t", 24, 48 * GIB),
            MachineType("ct5lp-hightpu-4t", 112, 192 * GIB),
            MachineType("ct5lp-hightpu-8t", 224, 384 * GIB),
            MachineType("ct5p-hightpu-4t", 208, 448 * GIB),
            MachineType("ct6e-standard-1t", 44, 176 * GIB),
            MachineType("ct6e-standard-4t", 180, 720 * GIB),
            MachineType("ct6e-standard-8t", 180, 1440 * GIB),
            MachineType("tpu7x-standard-4t", 224, 960 * GIB),
        )
    }
)


@dataclass(frozen=True, slots=True)
class SliceShape:
    """One slice shape of a generation: what one serving replica runs on."""

    generation: TPUGeneration
    topology: str  # as GKE labels it: cloud.google.com/gke-tpu-topology
    machine_type: str
    hosts: int
    chips_per_host: int
    dims: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", parse_topology(self.topology))
        if self.hosts * self.chips_per_host != math.prod(self.dims):
            raise AssertionError(f"catalog entry {self.generation.name} {self.topology} is wrong")

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def devices_per_host(self) -> int:
        return self.chips_per_host * self.generation.devices_per_chip

    @property
    def devices(self) -> int:
        return self.hosts * self.devices_per_host

    @property
    def host_topology(self) -> str:
        """TorchTPU's host-local topology string (`TORCH_TPU_TOPOLOGY` on one host)."""
        return self.generation.host_topology_by_devices[self.devices_per_host]

    @property
    def accelerator_type(self) -> str:
        """Cloud TPU's name of the whole slice (`TPU_ACCELERATOR_TYPE`), e.g. `v6e-16`.

        It counts TensorCores: v5p and tpu7x chips have two (`tpu7x-128` is 64 chips),
        v5e and v6e chips one.
        """
        g = self.generation
        return f"{g.accelerator_type_prefix}-{self.chips * g.tensorcores_per_chip}"

    @property
    def hbm_bytes(self) -> int:
        return self.chips * self.generation.hbm_bytes_per_chip

    @property
    def machine(self) -> MachineType:
        """The host each of the slice's pods runs on (one pod per host)."""
        return MACHINE_TYPES[self.machine_type]

    def node_selector(self) -> dict[str, str]:
        return {ACCELERATOR_LABEL: self.generation.accelerator, TOPOLOGY_LABEL: self.topology}

    @property
    def key(self) -> str:
        return f"{self.generation.name}/{self.topology}"


def parse_topology(topology: str) -> tuple[int, ...]:
    """`4x4` -> (4, 4); `2x2x2` -> (2, 2, 2). Raises ValueError for anything else."""
    parts = topology.split("x")
    if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"topology {topology!r} is not of the form AxB or AxBxC")
    return tuple(int(p) for p in parts)


_SINGLE_CORE_2D = MappingProxyType({1: "1,1,1", 4: "2,2,1", 8: "2,4,1"})
_SINGLE_CORE_3D = MappingProxyType({1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"})

GENERATIONS: Mapping[str, TPUGeneration] = MappingProxyType(
    {
        "v5e": TPUGeneration(
            name="v5e",
            accelerator="tpu-v5-lite-podslice",
            pci_device_id="0x0063",
            hbm_bytes_per_chip=16 * GIB,
            hbm_bandwidth_bytes_per_second=819e9,
            peak_bf16_flops_per_chip=197 * TERA,
            peak_8bit_flops_per_chip=394 * TERA,  # int8
            devices_per_chip=1,
            host_topology_by_devices=_SINGLE_CORE_2D,
            accelerator_type_prefix="v5litepod",
            # both seen on a v5e (TorchTPU 0.2.0, JAX 0.10.2): docs/tpu-lane.md
            device_names=("TPU v5e", "TPU v5 lite"),
            host_to_device_bytes_per_second=7.0e9,  # measured, HOST_TO_DEVICE_SOURCES
        ),
        "v5p": TPUGeneration(
            name="v5p",
            accelerator="tpu-v5p-slice",
            pci_device_id="0x0062",
            hbm_bytes_per_chip=95 * GIB,
            hbm_bandwidth_bytes_per_second=2765e9,
            peak_bf16_flops_per_chip=459 * TERA,
            peak_8bit_flops_per_chip=918 * TERA,  # int8
            devices_per_chip=1,
            host_topology_by_devices=_SINGLE_CORE_3D,
            accelerator_type_prefix="v5p",
            tensorcores_per_chip=2,  # megacore: one torch device per chip, two TensorCores
            device_names=("TPU v5p", "TPU v5"),  # [unconfirmed]
            host_to_device_bytes_per_second=7.0e9,  # [unconfirmed] v5e's measured figure
        ),
        "v6e": TPUGeneration(
            name="v6e",
            accelerator="tpu-v6e-slice",
            pci_device_id="0x006f",
            hbm_bytes_per_chip=32 * GIB,
            hbm_bandwidth_bytes_per_second=1640e9,
            peak_bf16_flops_per_chip=918 * TERA,
            peak_8bit_flops_per_chip=1836 * TERA,  # int8
            devices_per_chip=1,
            host_topology_by_devices=_SINGLE_CORE_2D,
            accelerator_type_prefix="v6e",
            device_names=("TPU v6e", "TPU v6 lite"),  # [unconfirmed]
            host_to_device_bytes_per_second=7.0e9,  # [unconfirmed] v5e's measured figure
        ),
        "tpu7x": TPUGeneration(
            name="tpu7x",
            accelerator="tpu7x",
            pci_device_id="0x0076",
            hbm_bytes_per_chip=192 * GIB,
            hbm_bandwidth_bytes_per_second=7380e9,
            peak_bf16_flops_per_chip=2307 * TERA,
            peak_8bit_flops_per_chip=4614 * TERA,  # fp8
            devices_per_chip=2,
            host_topology_by_devices=MappingProxyType({2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"}),
            accelerator_type_prefix="tpu7x",
            tensorcores_per_chip=2,
            device_names=("TPU7x", "TPU v7x", "TPU v7"),  # [unconfirmed]
            host_to_device_bytes_per_second=25e9,  # [unconfirmed] HOST_TO_DEVICE_SOURCES
        ),
    }
)


HOST_TO_DEVICE_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "v5e": "measured on the project's v5e (ct5lp-hightpu-1t, JAX 0.10.2, 2026-12-06): "
        "jax.device_put of a 1 GiB pageable numpy buffer, best of 5, 7.02 GB/s (64 MiB: 6.51, "
        "256 MiB: 6.77); SGLang copies from pinned buffers, which may be faster",
        "v5p": "[unconfirmed] no measurement; v5e's figure",
        "v6e": "[unconfirmed] no measurement; v5e's figure",
        "tpu7x": "[unconfirmed] vLLM-TPU issue #2019 reports device-to-host copies of about "
        "100 GB/s on tpu7x (1 GB in ~10 ms); taken here as one 4-chip host's figure, 25 GB/s "
        "per chip",
    }
)


def _shapes() -> tuple[SliceShape, ...]:
    g = GENERATIONS
    # (generation, topology, machine type, hosts, chips per host)
    rows: list[tuple[str, str, str, int, int]] = [
        ("v5e", "1x1", "ct5lp-hightpu-1t", 1, 1),
        ("v5e", "2x2", "ct5lp-hightpu-4t", 1, 4),
        ("v5e", "2x4", "ct5lp-hightpu-8t", 1, 8),
        ("v5e", "4x4", "ct5lp-hightpu-4t", 4, 4),
        ("v5e", "4x8", "ct5lp-hightpu-4t", 8, 4),
        ("v5e", "8x8", "ct5lp-hightpu-4t", 16, 4),
        ("v5e", "8x16", "ct5lp-hightpu-4t", 32, 4),
        ("v5e", "16x16", "ct5lp-hightpu-4t", 64, 4),
        ("v5p", "2x2x1", "ct5p-hightpu-4t", 1, 4),
        ("v5p", "2x2x2", "ct5p-hightpu-4t", 2, 4),
        ("v5p", "2x2x4", "ct5p-hightpu-4t", 4, 4),
        ("v5p", "2x4x4", "ct5p-hightpu-4t", 8, 4),
        ("v5p", "4x4x4", "ct5p-hightpu-4t", 16, 4),
        ("v5p", "4x4x8", "ct5p-hightpu-4t", 32, 4),
        ("v6e", "1x1", "ct6e-standard-1t", 1, 1),
        ("v6e", "2x2", "ct6e-standard-4t", 1, 4),
        ("v6e", "2x4", "ct6e-standard-8t", 1, 8),
        ("v6e", "4x4", "ct6e-standard-4t", 4, 4),
        ("v6e", "4x8", "ct6e-standard-4t", 8, 4),
        ("v6e", "8x8", "ct6e-standard-4t", 16, 4),
        ("v6e", "8x16", "ct6e-standard-4t", 32, 4),
        ("v6e", "16x16", "ct6e-standard-4t", 64, 4),
        ("tpu7x", "2x2x1", "tpu7x-standard-4t", 1, 4),
        ("tpu7x", "2x2x2", "tpu7x-standard-4t", 2, 4),
        ("tpu7x", "2x2x4", "tpu7x-standard-4t", 4, 4),
        ("tpu7x", "2x4x4", "tpu7x-standard-4t", 8, 4),
        ("tpu7x", "4x4x4", "tpu7x-standard-4t", 16, 4),
    ]
    return tuple(SliceShape(g[gen], topo, mt, hosts, cph) for gen, topo, mt, hosts, cph in rows)


SLICE_SHAPES: tuple[SliceShape, ...] = _shapes()
_BY_KEY: Mapping[tuple[str, str], SliceShape] = MappingProxyType(
    {(s.generation.name, s.topology): s for s in SLICE_SHAPES}
)


def generation_names() -> list[str]:
    return list(GENERATIONS)


def topologies_for(generation: str) -> list[str]:
    return [s.topology for s in SLICE_SHAPES if s.generation.name == generation]


def get_generation(name: str, field_path: str = "tpu.generation") -> TPUGeneration:
    try:
        return GENERATIONS[name]
    except KeyError:
        raise CatalogError(field_path, name, generation_names()) from None


def _squeeze(name: str) -> str:
    return "".join(name.lower().split())


def generation_of_device_name(name: str) -> str | None:
    """The generation whose devices torch or JAX call `name` ("TPU v5e"), else None."""
    wanted = _squeeze(name)
    return next(
        (g.name for g in GENERATIONS.values() if wanted in map(_squeeze, g.device_names)), None
    )


def generation_of_pci_device(device_id: str) -> str | None:
    """The generation of a Google PCI device id ("0x0063"), else None."""
    return next((g.name for g in GENERATIONS.values() if g.pci_device_id == device_id), None)


def generation_of_accelerator_type(accelerator_type: str) -> str | None:
    """The generation of a Cloud TPU accelerator type (`v5litepod-4`), else None."""
    prefix = accelerator_type.rsplit("-", 1)[0]
    return next((g.name for g in GENERATIONS.values() if g.accelerator_type_prefix == prefix), None)


def lookup(generation: str, topology: str, field_path: str = "tpu.topology") -> SliceShape:
    """The slice shape for (generation, topology), or a CatalogError listing valid topologies."""
    get_generation(generation, field_path.rsplit(".", 1)[0] + ".generation")
    shape = _BY_KEY.get((generation, topology))
    if shape is None:
        raise CatalogError(
            field_path, topology, topologies_for(generation), detail=f"not a {generation} topology"
        )
    return shape
