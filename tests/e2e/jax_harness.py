"""Shared pieces of the e2e tests that run a real SGLang-JAX on the living cluster.

`model_claim` puts the opt-in build's tiny model on a PersistentVolumeClaim the engine pods
read in place (`model.source: pvc://tiny-model/tiny-qwen3`); `remove_claim` takes it away.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from tests.e2e.fleet_harness import NAMESPACE, get, wait
from tests.real_sglang_jax import SGLangJax
from tpuserve.cluster import Cluster
from tpuserve.cluster.pods.runner import CLAIMS_DIR

CLAIM = "tiny-model"
MODEL_DIR = "tiny-qwen3"


def apply_object(cluster: Cluster, body: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))  # JSON is YAML


def model_claim(cluster: Cluster, build: SGLangJax) -> None:
    """A claim bound to a volume made for it, holding the tiny model where the pod runner keeps
    the claim's files (the engine reads it in place at /mnt/tpuserve/pvc/<claim>)."""
    apply_object(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{NAMESPACE}-{CLAIM}"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "hostPath": {"path": "/var/cache/tpuserve-e2e-tiny-model"},
                "claimRef": {"namespace": NAMESPACE, "name": CLAIM},
            },
        },
    )
    apply_object(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, "namespace": NAMESPACE},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": f"{NAMESPACE}-{CLAIM}",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    wait(
        f"{CLAIM} Bound",
        lambda: get(cluster, "pvc", CLAIM, "-n", NAMESPACE)["status"]["phase"] == "Bound",
    )
    target = cluster.run_dir / CLAIMS_DIR / NAMESPACE / CLAIM / MODEL_DIR
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(build.model, target)


def remove_claim(cluster: Cluster) -> None:
    cluster.kubectl("delete", "pvc", CLAIM, "-n", NAMESPACE, "--wait=false")
    cluster.kubectl("delete", "pv", f"{NAMESPACE}-{CLAIM}", "--wait=false")
