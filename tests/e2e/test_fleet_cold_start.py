"""Cold start from no replica, with a cold and a warm compile cache, on the living fleet.

A TPUModelServer of the engine twin (Qwen3-8B on v6e 2x4, the twin's cold-start model at
TPU figures scaled by 0.05 through `spec.engine.args`) with a compile cache on a
PersistentVolumeClaim. Three times from nothing (the server created, answered once with the
official `openai` client through its router, then deleted):

1. a new key: the leader compiles cold and writes the cache: status shows a miss;
2. the same key again: the leader finds the cache: a hit, and its reported compile phase is
   the warm one;
3. another engine image: a new key, so a miss again.

Assertions are on what the engines report (phases, hit or miss) through the status and the
cluster's Prometheus, never on wall-clock times; the times to the first answer are printed
(`-s`) and recorded in docs/operator.md.
"""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest

from sglang_tpu.cold_start import PHASES
from sglang_tpu.metric_names import COMPILE_CACHE_TOTAL
from tests.e2e import fleet_harness as fleet
from tests.e2e.fleet_harness import NAMESPACE, get, wait
from tpuserve.cluster import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NAME = "cold-start"
CLAIM = "xla-cache"
STARTUP_TIME_SCALE = 0.05  # compile 17 s cold, 6.75 s warm: more than a probe period apart
NEXT_ENGINE = "ghcr.io/tpuserve/tpuserve:0.0.0-next-engine"


def manifest(image: str | None) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "type": "simulated",
        "compileCache": {"persistentVolumeClaim": CLAIM},
        "args": {"startup-time-scale": STARTUP_TIME_SCALE},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
    }
    if image is not None:
        engine["image"] = image
    return {
        "apiVersion": "serving.tpuserve.dev/v1alpha1",
        "kind": "TPUModelServer",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "model": {"source": "hf://Qwen/Qwen3-8B", "contextLength": 8192},
            "tpu": {"generation": "v6e", "topology": "2x4"},
            "replicas": 1,
            "engine": engine,
            "router": {"replicas": 1},
        },
    }


def claim(cluster: Cluster) -> None:
    """A claim bound to a volume made for it (the pod runner gives it a shared directory)."""
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{NAMESPACE}-{CLAIM}"},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "hostPath": {"path": "/var/cache/tpuserve-e2e-xla"},
            "claimRef": {"namespace": NAMESPACE, "name": CLAIM},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": f"{NAMESPACE}-{CLAIM}",
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }
    for body in (volume, pvc):
        cluster.kubectl("apply", "-f", "-", input=_yaml(body))
    wait(
        f"{CLAIM} Bound",
        lambda: get(cluster, "pvc", CLAIM, "-n", NAMESPACE)["status"]["phase"] == "Bound",
    )


def _yaml(body: dict[str, Any]) -> str:
    return json.dumps(body)  # JSON is YAML


def first_answer_seconds(cluster: Cluster, image: str | None) -> tuple[float, float]:
    """Create the server; seconds until it is Ready, and until the official client gets its
    first answer through the router."""
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=_yaml(manifest(image)))
    base_url = wait("the endpoint's local address", lambda: fleet.local_base_url(cluster, NAME))
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    served = wait("the served name", lambda: _served_name(cluster))
    wait(f"{NAME} Ready", lambda: fleet.ready(cluster, NAME), timeout_seconds=300)
    ready_after = time.monotonic() - started

    def answered() -> bool:
        return bool(fleet.ask(client, served, "Hello from a cold start").choices[0].message.content)

    wait("the first answer", answered, timeout_seconds=300)
    return ready_after, time.monotonic() - started


def _served_name(cluster: Cluster) -> str:
    name = get(cluster, "tpumodelserver", NAME, "-n", NAMESPACE)["status"]["servedName"]
    assert name
    return str(name)


def reported(cluster: Cluster) -> dict[str, Any]:
    """status.compileCache once a leader's cold start is counted in it."""

    def counted() -> dict[str, Any]:
        status = get(cluster, "tpumodelserver", NAME, "-n", NAMESPACE)["status"]
        cache: dict[str, Any] = status["compileCache"]
        assert cache["hits"] + cache["misses"] == 1, cache
        return cache

    return wait("status.compileCache with the leader's cold start", counted)


def delete(cluster: Cluster) -> None:
    cluster.kubectl("delete", "tpumodelserver", NAME, "-n", NAMESPACE, "--wait=true")
    selector = f"app.kubernetes.io/instance={NAME}"
    wait(f"{NAME}'s pods gone", lambda: not fleet.pods(cluster, selector), timeout_seconds=240)


def test_a_warm_compile_cache_shortens_the_cold_start_and_a_new_engine_misses(
    living_cluster: Cluster,
) -> None:
    cluster = living_cluster
    fleet.install_chart(cluster)
    claim(cluster)

    runs: dict[str, tuple[float, dict[str, Any]]] = {}
    for run, image in (("cold", None), ("warm", None), ("new engine", NEXT_ENGINE)):
        ready_after, seconds = first_answer_seconds(cluster, image)
        cache = reported(cluster)
        runs[run] = (seconds, cache)
        leader = cache["lastColdStart"]
        print(
            f"{run}: Ready after {ready_after:.1f} s, first answer after {seconds:.1f} s; "
            f"key {cache['key']}; "
            f"{leader['cacheResult']}; phases "
            + ", ".join(f"{p} {leader[f'{p}Seconds']:.2f} s" for p in PHASES)
        )
        if run != "new engine":
            delete(cluster)

    cold, warm, new = (runs[r][1] for r in ("cold", "warm", "new engine"))
    assert cold["location"] == f"pvc/{CLAIM}"
    assert (cold["misses"], cold["lastColdStart"]["cacheResult"]) == (1, "miss")
    assert (warm["hits"], warm["lastColdStart"]["cacheResult"]) == (1, "hit")
    assert warm["key"] == cold["key"]
    assert (new["misses"], new["lastColdStart"]["cacheResult"]) == (1, "miss")
    assert new["key"] != cold["key"]
    assert new["key"].endswith("0.0.0-next-engine")
    for cache in (cold, warm, new):
        assert all(cache["lastColdStart"][f"{p}Seconds"] >= 0 for p in PHASES)

    # The engines' own series, as the cluster's Prometheus scraped them.
    assert cluster.prometheus_url is not None
    prometheus = cluster.prometheus_url

    def counted_by_prometheus() -> set[str]:
        # This server's pods only: the living cluster's Prometheus also holds earlier modules'.
        series = f'{COMPILE_CACHE_TOTAL}{{namespace="{NAMESPACE}", pod=~"{NAME}-.+"}}'
        rows = fleet.query(prometheus, f"max_over_time({series}[15m]) > 0")  # gone engines too
        results = {r["metric"]["result"] for r in rows}
        assert results == {"hit", "miss"}, rows
        return results

    wait("Prometheus counting a hit and a miss", counted_by_prometheus)
    delete(cluster)
