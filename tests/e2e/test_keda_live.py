"""KEDA live on the local cluster (issue 60): real KEDA (operator and metrics apiserver, built from
its Go module by `scripts/build-keda.sh`) scales a TPUModelServer with `autoscaling.engine: keda`
through the router under load, 1 -> 2 -> 1, with no failed request, and the server's status
shows the predictive floor KEDA's HPA reports. With `minReplicas: 0`, KEDA owns 0 <-> 1: idle,
it scales the server to zero after its cooldown (scaleToZero.idleSeconds); requests that then
arrive are held by the router's hold queue, the ScaledObject's router-demand trigger activates,
KEDA sets one replica, the held requests are answered, and idle again it goes back to zero, with
no failed request.

Runs only where KEDA was built (`scripts/build-keda.sh`, opt-in): not in CI, whose fresh
2-core machine has no time for it (KEDA links every scaler's cloud SDK; its build time here is
in docs/development.md). The cluster is a living one of its own (pods run on loopback) with
KEDA taking the external metrics API. The timeline is printed (`-s`) and recorded in
bench/keda_results/.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import living_network
from tests.e2e.fleet_harness import (
    NAMESPACE,
    Load,
    get,
    install_chart,
    local_base_url,
    pods,
    read,
    ready,
    wait,
)
from tpuserve.cluster import Cluster, NodePool, Toolchain
from tpuserve.cluster.pods.addresses import NETWORKS, Network

pytestmark = pytest.mark.e2e

NAME = "keda-live"
TOKENS_PER_CHIP_TARGET = 100  # as the HPA's live test: 800 tokens per v6e 2x4 replica
HEAVY_STREAMS = 6
HEAVY_PROMPT_WORDS = 1500
SCALE_TIMEOUT_SECONDS = 300.0


@pytest.fixture(scope="module")
def keda_cluster(
    toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    if not toolchain.has_keda:
        pytest.skip("KEDA was not built (scripts/build-keda.sh; opt-in, not in CI)")
    # a network of its own, away from the session's living cluster's
    network = Network((living_network().index + NETWORKS // 2) % NETWORKS or 1)
    cluster = Cluster(
        tmp_path_factory.mktemp("keda-cluster"),
        pools=[NodePool.cpu_pool("cpu", nodes=2)],
        run_pods=True,
        keda=True,
        toolchain=toolchain,
        network=network,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def server(name: str = NAME) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tpuserve.dev/v1alpha1",
        "kind": "TPUModelServer",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "hf://Qwen/Qwen3-8B", "contextLength": 8192},
            "tpu": {"generation": "v6e", "topology": "2x4"},
            "engine": {"type": "simulated"},
            "router": {"replicas": 1},
            "autoscaling": {
                "engine": "keda",
                "minReplicas": 1,
                "maxReplicas": 2,
                "metric": "tokensInFlight",
                "target": TOKENS_PER_CHIP_TARGET,
                "scaleDownStabilizationSeconds": 20,
                "keda": {
                    "pollingIntervalSeconds": 5,
                    # far above this load: the floor stays at the minimum, the reactive trigger
                    # decides, and the status says so
                    "predictiveFloor": {
                        "requestsPerReplica": 1000,
                        "horizonSeconds": 60,
                        "windowSeconds": 120,
                    },
                },
            },
        },
    }


def test_keda_scales_a_server_up_and_down_under_load_with_no_failed_request(
    keda_cluster: Cluster,
) -> None:
    cluster = keda_cluster
    prometheus = f"http://127.0.0.1:{cluster.ports.prometheus}"
    install_chart(cluster, f"keda.prometheusUrl={prometheus}")
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(server()))
    wait(f"{NAME} Ready", lambda: ready(cluster, NAME))
    scaled = get(cluster, "scaledobject", NAME, "-n", NAMESPACE)
    assert scaled["spec"]["scaleTargetRef"]["name"] == NAME

    def keda_ready() -> bool:
        conditions = get(cluster, "scaledobject", NAME, "-n", NAMESPACE).get("status", {})
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in conditions.get("conditions", [])
        )

    wait("KEDA's ScaledObject Ready", keda_ready)
    wait("KEDA's HPA reporting both triggers' metrics", lambda: len(h_metrics(cluster)) == 2)
    hpa = get(cluster, "hpa", f"keda-hpa-{NAME}", "-n", NAMESPACE)
    assert hpa["metadata"]["ownerReferences"][0]["kind"] == "ScaledObject"

    def floor() -> dict[str, Any] | None:
        status = get(cluster, "tpumodelserver", NAME, "-n", NAMESPACE)["status"]
        entries = status.get("predictiveFloor") or []
        return entries[0] if entries and entries[0].get("replicas") is not None else None

    measured = wait("status.predictiveFloor measured", floor)
    assert measured is not None
    assert measured["scaledObject"] == NAME
    assert measured["replicas"] == 1  # the minimum: the forecast is far below 1000 req/s
    assert measured["reason"] == "AtMinReplicas", measured  # load not started: both ask 1

    base_url = local_base_url(cluster, NAME)
    model = get(cluster, "tpumodelserver", NAME, "-n", NAMESPACE)["status"]["servedName"]
    timeline: dict[str, float] = {}
    load = Load(base_url, model)
    t0 = time.monotonic()

    def replicas() -> int:
        spec = get(cluster, "tpumodelserver", NAME, "-n", NAMESPACE)["spec"]
        return int(spec.get("replicas", 0))

    def ready_replicas() -> int:
        status = get(cluster, "tpumodelserver", NAME, "-n", NAMESPACE)["status"]
        return int(status.get("readyReplicas", 0))

    try:
        load.run(HEAVY_STREAMS, HEAVY_PROMPT_WORDS, max_tokens=400)
        timeline["load start"] = 0.0
        wait("KEDA raising spec.replicas", lambda: replicas() == 2, SCALE_TIMEOUT_SECONDS)
        timeline["scale-up decision (spec.replicas 2)"] = time.monotonic() - t0
        wait("the new slice Ready", lambda: ready_replicas() == 2, SCALE_TIMEOUT_SECONDS)
        timeline["new group Ready"] = time.monotonic() - t0
        load.run(1, 20, max_tokens=16)
        timeline["heavy load stops (light load goes on)"] = time.monotonic() - t0
        wait("KEDA lowering spec.replicas", lambda: replicas() == 1, SCALE_TIMEOUT_SECONDS)
        timeline["scale-down decision (spec.replicas 1)"] = time.monotonic() - t0
        leaders = f"app.kubernetes.io/instance={NAME},serving.tpuserve.dev/role=leader"
        wait(
            "the removed slice's pods gone",
            lambda: len(pods(cluster, leaders)) == 1,
            SCALE_TIMEOUT_SECONDS,
        )
        timeline["removed group gone"] = time.monotonic() - t0
        settled = load.ok
        wait("requests still answered after the scale-down", lambda: load.ok > settled + 3)
    finally:
        load.halt()
        report = ", ".join(f"{k} {v:.1f} s" for k, v in timeline.items())
        print(f"\nKEDA timeline: {report}; {load.ok} requests ok, {len(load.failed)} failed")
    assert load.failed == [], load.failed[:5]
    assert load.ok > 0
    last = floor()
    assert last is not None
    assert last["currentReplicas"] >= 1


def h_metrics(cluster: Cluster) -> list[Any]:
    """The external metrics KEDA's HPA reports (one per trigger once measured)."""
    found = cluster.kubectl(
        "get", "hpa", f"keda-hpa-{NAME}", "-n", NAMESPACE, "-o", "json", check=False
    )
    if found.returncode != 0:
        return []
    status = yaml.safe_load(found.stdout).get("status") or {}
    return [m for m in status.get("currentMetrics") or [] if m.get("type") == "External"]


ZERO = "keda-zero"
IDLE_SECONDS = 30  # scaleToZero.idleSeconds' least: KEDA's cooldownPeriod
HELD_CLIENTS = 2


def held(metrics_url: str) -> int:
    """Requests the router holds now (every model)."""
    values = re.findall(r"^tpuserve_router_held_requests\{[^}]*\} (\S+)$", read(metrics_url), re.M)
    return int(sum(float(v) for v in values))


@pytest.mark.timeout(600)  # two KEDA cooldowns, each after Prometheus's one-minute rate window
def test_keda_takes_an_idle_server_to_zero_and_back_on_held_requests(
    keda_cluster: Cluster,
) -> None:
    cluster = keda_cluster
    prometheus = f"http://127.0.0.1:{cluster.ports.prometheus}"
    install_chart(cluster, f"keda.prometheusUrl={prometheus}", verb="upgrade")
    manifest = server(ZERO)
    manifest["spec"]["autoscaling"] |= {"minReplicas": 0,
                                        "scaleToZero": {"idleSeconds": IDLE_SECONDS}}  # fmt: skip
    del manifest["spec"]["autoscaling"]["keda"]["predictiveFloor"]
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(manifest))
    scaled = wait("the ScaledObject", lambda: get(cluster, "scaledobject", ZERO, "-n", NAMESPACE))
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["cooldownPeriod"] == IDLE_SECONDS
    leaders = f"app.kubernetes.io/instance={ZERO},serving.tpuserve.dev/role=leader"

    def replicas() -> int:
        return int(get(cluster, "tpumodelserver", ZERO, "-n", NAMESPACE)["spec"].get("replicas", 1))

    def at_zero() -> bool:
        return replicas() == 0 and not pods(cluster, leaders)

    timeline: dict[str, float] = {}
    t0 = time.monotonic()
    wait("KEDA taking the idle server to zero", at_zero, SCALE_TIMEOUT_SECONDS)
    timeline["idle server at zero"] = time.monotonic() - t0
    base_url = wait("the router's local address", lambda: local_base_url(cluster, ZERO))
    metrics_url = base_url.rsplit(":", 1)[0] + ":9000/metrics"
    wait("the router Ready at zero", lambda: read(base_url + "/readiness") != "")
    model = get(cluster, "tpumodelserver", ZERO, "-n", NAMESPACE)["status"]["servedName"]
    load = Load(base_url, model, timeout_seconds=SCALE_TIMEOUT_SECONDS)
    t1 = time.monotonic()
    most_held = 0
    try:
        load.run(HELD_CLIENTS, 20, max_tokens=16)
        timeline["first requests arrive (at zero)"] = time.monotonic() - t0
        most_held = wait("the router holding them", lambda: held(metrics_url) or None) or 0
        timeline["held by the router"] = time.monotonic() - t0
        wait("KEDA activating: spec.replicas 1", lambda: replicas() == 1, SCALE_TIMEOUT_SECONDS)
        timeline["KEDA sets replicas 1"] = time.monotonic() - t0
        wait("the held requests answered", lambda: load.ok >= HELD_CLIENTS, SCALE_TIMEOUT_SECONDS)
        first = min(o.finished for o in load.outcomes if o.ok)
        timeline["first answer"] = first - t0
        timeline["first held request's wait"] = first - t1
        served = load.ok
        wait("steady load served after activation", lambda: load.ok > served + 5)
    finally:
        load.halt()
    timeline["load stops"] = time.monotonic() - t0
    wait("KEDA taking it back to zero", at_zero, SCALE_TIMEOUT_SECONDS)
    timeline["back at zero"] = time.monotonic() - t0
    report = ", ".join(f"{k} {v:.1f} s" for k, v in timeline.items())
    print(f"\nKEDA zero timeline: {report}; most held {most_held}; "
          f"{load.ok} requests ok, {len(load.failed)} failed")  # fmt: skip
    assert most_held >= 1
    assert load.failed == [], load.failed[:5]
    assert load.ok > HELD_CLIENTS
