"""KEDA as the autoscaler, on the real apiserver (issue 60).

A spec asking for both autoscalers (KEDA's settings with `engine: hpa`) is refused at
`kubectl apply`, naming the field (a CEL rule of the CRD).
`spec.autoscaling.engine: keda` on a cluster that does not serve KEDA's API: the server is
Valid=False naming `spec.autoscaling.engine`, and no ScaledObject is made. With KEDA's
ScaledObject CRD applied (read from KEDA's Go module, `Toolchain.keda_crds`; KEDA itself does
not run here), the next pass makes the ScaledObject, accepted by the CRD's schema with strict
field validation, on the server's scale subresource, its Prometheus trigger dividing the
queued prefill tokens by the performance model's throughput for the model and slice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from sglang_tpu import perf_model
from sglang_tpu.topology import lookup
from tests.e2e.tms_harness import (
    OperatorProcess,
    apply,
    condition,
    get,
    server,
    tms,
    wait_condition,
    wait_until,
)
from tpuserve.cluster import Cluster, Toolchain, ToolchainMissing
from tpuserve_operator import labels
from tpuserve_operator.render.autoscaler import (
    KEDA_PLURAL,
    PREFILL_THROUGHPUT_ANNOTATION,
    QUEUED_PREFILL_TOKENS,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("operator", ["statefulset"], indirect=True),  # one operator
]

NAME = "keda"
CRD_NAME = f"{KEDA_PLURAL}.keda.sh"
# the operator caches whether a resource is served for 30 s (Kube.has_resource)
DISCOVERY_SECONDS = 120.0


@pytest.fixture
def no_keda(cluster: Cluster) -> Iterator[str]:
    """KEDA's CRD file, not applied yet; deleted after the test whatever happened."""
    try:
        (crd,) = Toolchain.keda_crds()
    except ToolchainMissing as err:
        pytest.skip(f"KEDA's module is not in the Go module cache and cannot be fetched: {err}")
    cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", "--wait=true")
    yield str(crd)
    cluster.kubectl("delete", "-f", str(crd), "--ignore-not-found", "--wait=false")


def test_a_keda_server_is_refused_without_keda_and_gets_its_scaled_object_once_installed(
    cluster: Cluster, namespace: str, operator: OperatorProcess, no_keda: str
) -> None:
    autoscaling = {
        "engine": "keda",
        "minReplicas": 1,
        "maxReplicas": 4,
        "metric": "backlogSeconds",
        "target": 1,
        "keda": {"pollingIntervalSeconds": 10},
    }
    # asking for both autoscalers (KEDA's settings with the HPA) is refused at `kubectl apply`
    # by the CRD's CEL rule, naming the field
    both = server(NAME, "v6e", "2x4", engine="simulated",
                  autoscaling={**autoscaling, "engine": "hpa", "metric": "queue"})  # fmt: skip
    refused = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(both), check=False
    )
    assert refused.returncode != 0
    assert "autoscaling.keda is set with autoscaling.engine hpa" in refused.stderr

    manifest = server(NAME, "v6e", "2x4", engine="simulated", autoscaling=autoscaling)
    del manifest["spec"]["replicas"]  # the autoscaler owns it
    apply(cluster, namespace, manifest)
    body = wait_condition(cluster, namespace, NAME, "Valid", "False", operator)
    message = condition(body, "Valid")["message"]
    assert "spec.autoscaling.engine: keda needs KEDA's ScaledObject API" in message

    cluster.kubectl("apply", "--server-side", "-f", no_keda)
    cluster.wait_crds_established([CRD_NAME])
    wait_condition(
        cluster, namespace, NAME, "Valid", "True", operator, timeout_seconds=DISCOVERY_SECONDS
    )

    def scaled_object() -> dict[str, Any]:
        found: dict[str, Any] = get(cluster, namespace, CRD_NAME, NAME)
        return found

    scaled = wait_until("the ScaledObject", scaled_object, operator)
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "name": NAME,
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (1, 4, 10)
    expected = round(
        perf_model.peak_prefill_tokens_per_second(
            lookup("v6e", "2x4"), perf_model.get_profile("qwen3-8b"), "fp8"
        )
    )
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["query"] == (
        f'sum({QUEUED_PREFILL_TOKENS}{{namespace="{namespace}", model_name="qwen3-8b"}}) '
        f"/ {expected}"
    )
    assert trigger["metadata"]["threshold"] == "1"
    assert scaled["metadata"]["annotations"][PREFILL_THROUGHPUT_ANNOTATION] == str(expected)
    assert scaled["metadata"]["ownerReferences"][0]["name"] == NAME
    # no HPA of the operator's beside it: KEDA makes its own
    hpas = get(cluster, namespace, "horizontalpodautoscalers")["items"]
    assert [h["metadata"]["name"] for h in hpas] == []
    # the apiserver kept every field: nothing was pruned by the CRD's structural schema
    assert "behavior" in spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert tms(cluster, namespace, NAME)["spec"]["autoscaling"]["engine"] == "keda"
