"""The pod runner fills configMap, secret, downwardAPI and projected volumes as the kubelet does,
and a missing ConfigMap fails the pod unless the volume says it is optional."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakePodHost, pod_manifest
from tpuserve.cluster.pods import volumes
from tpuserve.cluster.pods.container_spec import ContainerConfigError

pytestmark = pytest.mark.unit

NAME_ITEM = {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}


def prepared(tmp_path: Path, *pod_volumes: dict[str, Any]) -> volumes.PodVolumes:
    host = FakePodHost(tmp_path / "host")
    host.objects[("ConfigMap", "ns", "cfg")] = {"a": "1"}
    host.objects[("Secret", "ns", "sec")] = {"b": "2"}
    pod = pod_manifest("web", [], volumes=list(pod_volumes))
    return volumes.prepare(
        host.reader, pod, tmp_path / "pod", tmp_path / "claims", "127.0.0.5", "127.0.0.1"
    )


def test_every_kind_of_volume_is_filled(tmp_path: Path) -> None:
    found = prepared(
        tmp_path,
        {"name": "c", "configMap": {"name": "cfg"}},
        {"name": "s", "secret": {"secretName": "sec"}},
        {"name": "d", "downwardAPI": {"items": [NAME_ITEM]}},
        {"name": "p", "projected": {"sources": [
            {"configMap": {"name": "cfg"}}, {"secret": {"name": "sec"}},
            {"downwardAPI": {"items": [NAME_ITEM]}}, {"serviceAccountToken": {"path": "tok"}},
        ]}},
        {"name": "e", "emptyDir": {}},
    )  # fmt: skip
    dirs = found.directories
    assert (dirs["c"] / "a").read_text() == "1"
    assert (dirs["s"] / "b").read_text() == "2"
    assert (dirs["d"] / "name").read_text() == "web"
    projected = {p.name: p.read_text() for p in dirs["p"].iterdir()}
    assert projected == {"a": "1", "b": "2", "name": "web", "tok": "token-for-ns-default"}
    assert list(dirs["e"].iterdir()) == []
    assert found.kubeconfig is not None  # the ServiceAccount token is mounted by default


def test_a_missing_config_map_fails_unless_optional(tmp_path: Path) -> None:
    with pytest.raises(ContainerConfigError, match='configmap "nope" not found'):
        prepared(tmp_path, {"name": "c", "configMap": {"name": "nope"}})
    found = prepared(tmp_path, {"name": "c", "configMap": {"name": "nope", "optional": True}})
    assert found.directories["c"].is_dir()
