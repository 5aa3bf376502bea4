"""The TPUGateway: what the operator renders for it, and its reconciler's passes against the
in-memory apiserver (selection, per-model Leases and RBAC, pools per model, pruning, status)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fake_kube import FakeKube
from tests.fakes import VirtualClock
from tpuserve_operator import labels
from tpuserve_operator.gateway_api import TPUGatewaySpec
from tpuserve_operator.gateway_reconciler import (
    RESYNC_SECONDS,
    GatewayReconciler,
    fronted_by_gateway,
)
from tpuserve_operator.render.context import RenderConfig
from tpuserve_operator.render.gateway import Gateway, gateway_children, gateway_models
from tpuserve_operator.render.inference_pool import GROUP_VERSION as POOL_API

pytestmark = pytest.mark.unit

NAMESPACE = "ml"


def server(name: str, served: str, *, zero: bool = False, tier: str = "shared") -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"source": "hf://Qwen/Qwen3-8B"}}
    if zero:
        spec["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2}
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"tier": tier}},
        "spec": spec,
        "status": {"servedName": served},
    }


def gateway_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.GATEWAY_KIND,
        "metadata": {"name": "models", "namespace": NAMESPACE, "uid": "g", "generation": 1},
        "spec": {"serverSelector": {"matchLabels": {"tier": "shared"}}, **spec},
    }


def args_of(children: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [c for c in children if c["kind"] == "Deployment"]
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_each_selected_model_is_held_and_only_those_at_zero_get_a_lease() -> None:
    servers = [
        server("llama", "llama"),
        server("qwen", "qwen", zero=True),
        server("gemma", "gemma", tier="private"),  # not selected
        server("qwen-b", "qwen"),  # the same model again: left out, reported
    ]
    models, duplicates = gateway_models({"tier": "shared"}, servers)
    assert [(m.server, m.model, m.lease) for m in models] == [
        ("llama", "llama", None),
        ("qwen", "qwen", "qwen-demand"),
    ]
    assert duplicates == ["qwen-b"]
    spec = TPUGatewaySpec.model_validate({"hold": {"maxRequests": 4, "modelShare": 0.5}})
    children = gateway_children(Gateway("models", NAMESPACE, spec, RenderConfig(), models))
    args = args_of(children)
    assert "--hold-models=llama,qwen" in args
    assert "--hold-models-only" in args
    assert "--demand-leases=qwen=qwen-demand" in args
    assert "--hold-max-requests=4" in args
    assert "--hold-model-share=0.5" in args
    assert "--max-in-flight-per-model=1024" in args
    (role,) = [c for c in children if c["kind"] == "Role"]
    lease_rules = [r for r in role["rules"] if r["resources"] == ["leases"]]
    assert lease_rules == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["qwen-demand"],
            "verbs": ["get", "patch"],
        }
    ]
    (deployment,) = [c for c in children if c["kind"] == "Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    # every server's engine NetworkPolicy admits shared routers
    assert pod_labels[labels.SHARED_ROUTER] == "true"
    assert pod_labels[labels.COMPONENT] == labels.COMPONENT_ROUTER
    assert labels.MANAGED_BY not in pod_labels  # not taken for a server's child
    assert not [c for c in children if c["kind"] == "InferencePool"]


def test_the_gateway_mode_renders_one_pool_per_model_with_the_gateway_as_picker() -> None:
    models, _ = gateway_models({}, [server("llama", "llama"), server("qwen", "qwen", zero=True)])
    spec = TPUGatewaySpec.model_validate({"inferencePool": {"gatewayName": "inference"}})
    children = gateway_children(Gateway("models", NAMESPACE, spec, RenderConfig(), models))
    pools = [c for c in children if c["kind"] == "InferencePool"]
    assert [p["metadata"]["name"] for p in pools] == ["models-llama", "models-qwen"]
    assert pools[1]["spec"]["selector"]["matchLabels"] == labels.leader_selector("qwen")
    assert {p["spec"]["endpointPickerRef"]["name"] for p in pools} == {"models-gateway-picker"}
    assert "--picker-port=9002" in args_of(children)
    policies = {c["metadata"]["name"]: c for c in children if c["kind"] == "NetworkPolicy"}
    engines = policies["models-gateway-engines"]["spec"]
    assert engines["podSelector"]["matchExpressions"][0]["values"] == ["llama", "qwen"]
    assert engines["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": {"gateway.networking.k8s.io/gateway-name": "inference"}}}
    ]


async def test_a_pass_applies_reports_and_prunes_the_pool_of_a_model_no_longer_selected() -> None:
    kube = FakeKube(group_versions=[POOL_API])
    for body in (server("llama", "llama"), server("qwen", "qwen", zero=True)):
        kube.put(body)
    kube.put(gateway_body(inferencePool={"gatewayName": "inference"}))
    clock = VirtualClock(0.0)
    reconciler = GatewayReconciler(kube, RenderConfig(), clock)  # type: ignore[arg-type]

    def gateway() -> dict[str, Any]:
        return kube.get_object(labels.API_VERSION, labels.GATEWAY_KIND, NAMESPACE, "models")

    await reconciler.converge(gateway())
    assert kube.names("InferencePool") == ["models-llama", "models-qwen"]
    assert kube.names("Secret") == ["models-gateway-peering"]
    status = gateway()["status"]
    assert status["endpoint"] == "http://models-gateway.ml.svc:8000"
    assert status["models"] == [
        {"server": "llama", "model": "llama", "scalesToZero": False},
        {"server": "qwen", "model": "qwen", "scalesToZero": True},
    ]
    deployment = kube.get_object("apps/v1", "Deployment", NAMESPACE, "models-gateway")
    owner = deployment["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == (labels.GATEWAY_KIND, "g")

    llama = kube.get_object(labels.API_VERSION, labels.KIND, NAMESPACE, "llama")
    llama["metadata"]["labels"] = {"tier": "private"}
    kube.put(llama)
    await reconciler.converge(gateway())
    assert kube.names("InferencePool") == ["models-qwen"]
    assert [m["model"] for m in gateway()["status"]["models"]] == ["qwen"]
    assert "--hold-models=qwen" in args_of(
        [kube.get_object("apps/v1", "Deployment", NAMESPACE, "models-gateway")]
    )

    await kube.delete("apps/v1", "Deployment", NAMESPACE, "models-gateway")  # by hand
    await reconciler.converge(gateway())
    assert "models-gateway" not in kube.names("Deployment")  # unchanged rendering: not applied
    clock.advance(RESYNC_SECONDS)
    await reconciler.converge(gateway())
    assert "models-gateway" in kube.names("Deployment")  # the periodic full pass restores it


async def test_a_server_is_fronted_only_by_a_gateway_whose_selector_matches_it() -> None:
    kube = FakeKube()
    assert not await fronted_by_gateway(kube, NAMESPACE, {"tier": "shared"})
    kube.put(gateway_body())
    assert await fronted_by_gateway(kube, NAMESPACE, {"tier": "shared", "team": "a"})
    assert not await fronted_by_gateway(kube, NAMESPACE, {"tier": "private"})
    assert not await fronted_by_gateway(kube, "elsewhere", {"tier": "shared"})
