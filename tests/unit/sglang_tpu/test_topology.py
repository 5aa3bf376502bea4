"""The topology catalog: hosts and chips follow GKE's rules; unknown pairs name the allowed ones."""

from __future__ import annotations

import math

import pytest

from sglang_tpu import topology
from sglang_tpu.topology import SLICE_SHAPES, CatalogError, lookup

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("shape", SLICE_SHAPES, ids=lambda s: s.key)
def test_multi_host_slices_use_four_chip_vms_with_the_host_rule(shape: topology.SliceShape) -> None:
    assert shape.chips == math.prod(shape.dims)
    if shape.multi_host:
        assert shape.chips_per_host == shape.generation.chips_per_multi_host_vm == 4
        dims = (*shape.dims, 1)[:3]
        assert shape.hosts == max(1, dims[0] // 2) * max(1, dims[1] // 2) * max(1, dims[2])


@pytest.mark.parametrize("shape", SLICE_SHAPES, ids=lambda s: s.key)
def test_every_shape_has_a_torch_tpu_host_topology(shape: topology.SliceShape) -> None:
    assert shape.host_topology.count(",") in (2, 3)


def test_v6e_2x4_is_one_eight_chip_vm_and_tpu7x_2x2x2_two_four_chip_vms() -> None:
    v6e = lookup("v6e", "2x4")
    assert (v6e.hosts, v6e.chips_per_host, v6e.machine_type) == (1, 8, "ct6e-standard-8t")
    ironwood = lookup("tpu7x", "2x2x2")
    assert (ironwood.hosts, ironwood.chips_per_host, ironwood.devices_per_host) == (2, 4, 8)
    assert ironwood.host_topology == "2,2,1,2"


def test_unknown_topology_names_the_field_and_allowed_values() -> None:
    with pytest.raises(CatalogError) as err:
        lookup("v6e", "3x3")
    assert err.value.field == "tpu.topology"
    assert "4x4" in str(err.value)
    assert "'3x3'" in str(err.value)


def test_unknown_generation_names_the_generation_field() -> None:
    with pytest.raises(CatalogError, match=r"tpu.generation: 'v9'.*v5e, v5p, v6e, tpu7x"):
        lookup("v9", "2x2")


def test_node_selector_uses_gke_labels() -> None:
    assert lookup("v5e", "2x4").node_selector() == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }


@pytest.mark.parametrize(
    ("generation", "topo", "accelerator_type"),
    [
        ("v5e", "2x4", "v5litepod-8"),
        ("v5p", "2x2x1", "v5p-8"),  # 4 chips, 2 TensorCores each
        ("v6e", "4x4", "v6e-16"),
        ("tpu7x", "4x4x4", "tpu7x-128"),  # Google's dynamic-slicing sample: 64 chips
    ],
)
def test_accelerator_type_counts_tensorcores_as_cloud_tpu_names_slices(
    generation: str, topo: str, accelerator_type: str
) -> None:
    assert lookup(generation, topo).accelerator_type == accelerator_type


def test_every_slice_runs_on_a_machine_type_of_the_catalog() -> None:
    for shape in SLICE_SHAPES:
        machine = shape.machine
        assert machine.name == shape.machine_type
        assert 0 < machine.allocatable_millicpu < machine.vcpus * 1000
        assert 0 < machine.allocatable_bytes < machine.memory_bytes


def test_allocatable_follows_gkes_reservation_tiers() -> None:
    """GKE's own worked figures: 80 millicores of 4 vCPUs; 2.6 GiB of 16 GiB, 100 MiB eviction
    threshold on top."""
    small = topology.MachineType("four-vcpus", 4, 16 * topology.GIB)
    assert small.allocatable_millicpu == 4000 - 80
    reserved = small.memory_bytes - small.allocatable_bytes
    assert reserved == math.ceil(2.6 * topology.GIB) + 100 * topology.MIB
    host = topology.MACHINE_TYPES["ct5lp-hightpu-4t"]  # 112 vCPUs, 192 GiB
    assert host.allocatable_millicpu == 112_000 - (60 + 10 + 2 * 5) - 108 * 2.5
    above_128 = (192 - 128) * topology.GIB * 0.02
    assert (
        host.allocatable_bytes
        == host.memory_bytes
        - math.ceil((1 + 0.8 + 0.8) * topology.GIB + 112 * topology.GIB * 0.06 + above_128)
        - 100 * topology.MIB
    )
