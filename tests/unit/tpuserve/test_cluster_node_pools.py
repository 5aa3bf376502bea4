"""Fake GKE node pools carry the topology catalog's facts, and bad profiles name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_tpu import topology
from tpuserve.cluster.node_pools import (
    DEFAULT_PROFILE,
    KWOK_NODE_ANNOTATION,
    NodePool,
    ProfileError,
    load_profile,
    parse_profile,
)
from tpuserve_operator.engine_resources import defaults, quantity

pytestmark = pytest.mark.unit


def test_multi_host_pool_is_one_slice_of_hosts_many_nodes() -> None:
    pool = NodePool.tpu("v6e-a", "v6e", "4x4")
    shape = topology.lookup("v6e", "4x4")
    nodes = pool.node_manifests()
    assert len(nodes) == shape.hosts == 4
    assert {n["metadata"]["labels"][topology.NODE_POOL_LABEL] for n in nodes} == {"v6e-a"}
    assert len({n["metadata"]["name"] for n in nodes}) == 4


def test_tpu_node_is_labelled_tainted_and_sized_as_gke_does() -> None:
    shape = topology.lookup("tpu7x", "2x2x2")
    node = NodePool.tpu("ironwood", "tpu7x", "2x2x2", zone="us-east5-b").node_manifests()[0]
    labels = node["metadata"]["labels"]
    assert labels[topology.ACCELERATOR_LABEL] == shape.generation.accelerator
    assert labels[topology.TOPOLOGY_LABEL] == "2x2x2"
    assert labels[topology.INSTANCE_TYPE_LABEL] == shape.machine_type
    assert labels[topology.ACCELERATOR_COUNT_LABEL] == str(shape.chips_per_host)
    assert labels[topology.ZONE_LABEL] == "us-east5-b"
    assert topology.SPOT_LABEL not in labels
    assert node["spec"]["taints"] == [
        {
            "key": topology.TPU_TAINT_KEY,
            "value": topology.TPU_TAINT_VALUE,
            "effect": topology.TPU_TAINT_EFFECT,
        }
    ]
    for field in ("allocatable", "capacity"):
        assert node["status"][field][topology.TPU_RESOURCE] == str(shape.chips_per_host)
    assert node["metadata"]["annotations"][KWOK_NODE_ANNOTATION] == "fake"


def test_every_fake_tpu_node_fits_one_engine_pod_as_rendered() -> None:
    """A TPU node's allocatable is GKE's for its machine type; the engine the operator renders
    for that host (its default cpu/memory) fits on it, two do not."""
    for shape in topology.SLICE_SHAPES:
        node = NodePool.tpu("p", shape.generation.name, shape.topology).node_manifests()[0]
        engine = defaults(shape.machine)
        for resource in ("cpu", "memory"):
            allocatable = quantity(node["status"]["allocatable"][resource])
            assert allocatable is not None
            assert engine[resource] <= allocatable < 2 * engine[resource], (shape.key, resource)


def test_single_host_pool_has_one_whole_slice_per_node() -> None:
    pool = NodePool.tpu("v6e-small", "v6e", "2x4", nodes=3, spot=True)
    nodes = pool.node_manifests()
    assert len(nodes) == 3
    for node in nodes:
        assert node["status"]["allocatable"][topology.TPU_RESOURCE] == "8"
        assert node["metadata"]["labels"][topology.SPOT_LABEL] == "true"
        assert node["metadata"]["labels"][topology.INSTANCE_TYPE_LABEL] == "ct6e-standard-8t"


def test_cpu_pool_has_no_tpu_label_taint_or_resource() -> None:
    node = NodePool.cpu_pool("cpu", nodes=2).node_manifests()[0]
    assert topology.ACCELERATOR_LABEL not in node["metadata"]["labels"]
    assert "taints" not in node["spec"]
    assert topology.TPU_RESOURCE not in node["status"]["allocatable"]


def test_multi_host_pool_rejects_a_node_count() -> None:
    with pytest.raises(ProfileError, match=r"v6e-a\.nodes: 2 is not allowed.*4 nodes"):
        NodePool.tpu("v6e-a", "v6e", "4x4", nodes=2)


def test_unknown_topology_names_field_value_and_allowed() -> None:
    with pytest.raises(topology.CatalogError) as err:
        NodePool.tpu("odd", "v6e", "3x3")
    assert err.value.field == "odd.tpu.topology"
    assert "4x4" in err.value.allowed


def test_pool_name_must_be_a_dns_label() -> None:
    with pytest.raises(ProfileError, match="name: 'Bad_Name' is not allowed"):
        NodePool.cpu_pool("Bad_Name")


def test_default_profile_has_the_pools_the_e2e_suite_relies_on() -> None:
    pools = {p.name: p for p in load_profile(DEFAULT_PROFILE)}
    by_shape = [(p.shape.key, p.nodes) for p in pools.values() if p.shape is not None]
    assert by_shape.count(("v6e/4x4", 4)) == 2
    assert ("v6e/2x4", 4) in by_shape
    assert ("tpu7x/2x2x2", 2) in by_shape
    assert ("v5e/2x4", 1) in by_shape
    assert any(p.shape is None for p in pools.values())


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"pools": [{"name": "a", "tpu": {"generation": "v9", "topology": "2x2"}}]},
         r"pools\[0\]: a\.tpu\.generation: 'v9' is not allowed; allowed: v5e, v5p, v6e, tpu7x"),
        ({"pools": [{"name": "a", "tpu": {"generation": "v6e", "topology": "4x4"}, "colour": 1}]},
         r"pools\.0\.colour: Extra inputs are not permitted"),
        ({"pools": [{"name": "a"}]}, r"a tpu pool needs tpu"),
        ({"pools": [{"name": "a", "kind": "cpu"}, {"name": "a", "kind": "cpu"}]},
         r"names must be unique, repeated: \['a'\]"),
        ({"pools": [{"name": "a", "kind": "gpu"}]},
         r"pools\.0\.kind: Input should be 'tpu' or 'cpu'"),
        ({"pool": []}, r"pools: Field required"),
    ],
)  # fmt: skip
def test_bad_profile_is_rejected_naming_the_field(profile: object, message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_profile(profile, "p.yaml")


def test_unreadable_profile_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(bad)
