"""spec.inferencePool: the InferencePool and its picker Service as rendered, the router's picker
flag and port, the network policies; refused without the router or the CRD (operator and
admission policy, naming the field); and, against an in-memory apiserver, a pool someone else
made is left alone while the status reports what the gateways say of the operator's own."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.fake_kube import FakeKube
from tests.unit.operator.conftest import RenderFn, SpecWith
from tpuserve_operator import labels, launch_contract
from tpuserve_operator.api import (
    GATEWAY_FROM_RULE,
    GATEWAY_NAMED_RULE,
    GATEWAY_ONE_WAY_RULE,
    GATEWAY_POD_LABEL,
    TOKEN_AUTH_RULE,
)
from tpuserve_operator.build import admission
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.metrics import create_operator_metrics
from tpuserve_operator.reconciler import Reconciler, ReconcilerSettings
from tpuserve_operator.render import RenderConfig, Rendered
from tpuserve_operator.render import inference_pool as pools
from tpuserve_operator.render.context import ROUTER_PORT

pytestmark = pytest.mark.unit

NAMESPACE = "ml"
GATEWAY = "inference-gateway"
POOL: dict[str, Any] = {"gatewayName": GATEWAY}
"""The least spec.inferencePool: the gateway named (its pods, by label, are admitted)."""
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def child(rendered: Rendered, kind: str, name: str) -> dict[str, Any]:
    return next(m for m in rendered.children if m["kind"] == kind and m["metadata"]["name"] == name)


def test_the_pool_selects_serving_leaders_on_the_engine_port_and_names_the_picker(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    out = rendered(
        spec_with(inferencePool={**POOL, "failureMode": "FailOpen"}), inference_pool=True
    )
    pool = child(out, "InferencePool", "qwen")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert pool["spec"] == {
        "selector": {"matchLabels": labels.leader_selector("qwen")},
        "targetPorts": [{"number": launch_contract.HTTP_PORT}],
        "endpointPickerRef": {
            "group": "",
            "kind": "Service",
            "name": "qwen-picker",
            "port": {"number": pools.PICKER_PORT},
            "failureMode": "FailOpen",
        },
    }
    assert pool["spec"]["selector"]["matchLabels"][labels.ROLE] == labels.ROLE_LEADER
    service = child(out, "Service", "qwen-picker")
    assert service["spec"]["selector"] == labels.router_selector("qwen")
    (port,) = service["spec"]["ports"]
    assert port["port"] == pools.PICKER_PORT
    assert port["targetPort"] == pools.PICKER_PORT_NAME
    assert port["appProtocol"] == "http2"  # as the reference picker's Service
    router = child(out, "Deployment", "qwen-router")["spec"]["template"]["spec"]["containers"][0]
    assert f"--picker-port={pools.PICKER_PORT}" in router["args"]
    assert "--picker-tls" in router["args"]
    assert {"name": "picker", "containerPort": pools.PICKER_PORT, "protocol": "TCP"} in router[
        "ports"
    ]


def test_the_pool_passes_the_released_crds_schema(rendered: RenderFn, spec_with: SpecWith) -> None:
    """Against the InferencePool CRD of GIE v1.6.0 (tests/e2e/crds; its CEL rules aside)."""
    from pathlib import Path

    import jsonschema
    import yaml

    path = (
        Path(__file__).resolve().parents[2]
        / "e2e/crds/inference.networking.k8s.io_inferencepools.yaml"
    )
    crd = yaml.safe_load(path.read_text())
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    out = rendered(
        spec_with(inferencePool={**POOL, "failureMode": "FailOpen"}), inference_pool=True
    )
    pool = child(out, "InferencePool", "qwen")
    jsonschema.validate(pool, schema)
    assert crd["spec"]["group"] == pools.GROUP
    assert version["name"] == pools.VERSION
    assert crd["spec"]["names"]["plural"] == pools.PLURAL


def test_failure_mode_defaults_to_fail_close_and_no_pool_means_no_picker(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    out = rendered(spec_with(inferencePool=POOL), inference_pool=True)
    pool = child(out, "InferencePool", "qwen")
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    plain = rendered(spec_with(), inference_pool=True)
    assert not [m for m in plain.children if m["kind"] == "InferencePool"]
    assert not [m for m in plain.children if m["metadata"]["name"] == "qwen-picker"]
    router = child(plain, "Deployment", "qwen-router")["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in router["args"] if a.startswith("--picker-port")]


def test_the_gateways_token_is_a_secret_mounted_read_only_for_the_picker(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    """Issue 57 item 2: with tokenSecretRef the router's pods mount that Secret key alone,
    read-only, and run the picker with --picker-token-file naming it; issue 68: without it,
    the Secret the operator creates (a token by default); no token only with the explicit
    pickerAuth NetworkPolicyOnly, which renders --picker-no-token."""
    ref = {"name": "gateway-token", "key": "bearer"}
    out = rendered(spec_with(inferencePool={**POOL, "tokenSecretRef": ref}), inference_pool=True)
    pod = child(out, "Deployment", "qwen-router")["spec"]["template"]["spec"]
    (router,) = pod["containers"]
    assert f"--picker-token-file={pools.PICKER_TOKEN_DIR}/bearer" in router["args"]
    assert {"name": "picker-token", "mountPath": pools.PICKER_TOKEN_DIR, "readOnly": True} in (
        router["volumeMounts"]
    )
    assert {
        "name": "picker-token",
        "secret": {"secretName": "gateway-token", "items": [{"key": "bearer", "path": "bearer"}]},
    } in pod["volumes"]
    plain = rendered(spec_with(inferencePool=POOL), inference_pool=True)
    pod = child(plain, "Deployment", "qwen-router")["spec"]["template"]["spec"]
    assert f"--picker-token-file={pools.PICKER_TOKEN_DIR}/token" in pod["containers"][0]["args"]
    assert {
        "name": "picker-token",
        "secret": {
            "secretName": "qwen-router-picker",
            "items": [{"key": "token", "path": "token"}],
        },
    } in pod["volumes"]
    opted_out = {**POOL, "pickerAuth": "NetworkPolicyOnly"}
    open_pod = child(
        rendered(spec_with(inferencePool=opted_out), inference_pool=True),
        "Deployment",
        "qwen-router",
    )["spec"]["template"]["spec"]
    args = open_pod["containers"][0]["args"]
    assert "--picker-no-token" in args
    assert not [a for a in args if a.startswith("--picker-token-file")]
    assert not [v for v in open_pod.get("volumes", []) if v["name"] == "picker-token"]


def test_the_rendered_token_flag_is_one_the_router_takes(
    rendered: RenderFn, spec_with: SpecWith, tmp_path: Any
) -> None:
    """The router's own parser reads the rendered picker flags, the token file at the path
    the Secret is mounted at (here a file of the same name)."""
    from tpuserve_router.cli import build_config, configure
    from tpuserve_router.validation import validate

    ref = {"name": "gateway-token"}
    out = rendered(spec_with(inferencePool={**POOL, "tokenSecretRef": ref}), inference_pool=True)
    router = child(out, "Deployment", "qwen-router")["spec"]["template"]["spec"]["containers"][0]
    token = tmp_path / "token"
    token.write_text("a-gateway-token-0123456789\n")
    args = [a for a in router["args"] if a.startswith("--picker")]
    args = [a.replace(f"{pools.PICKER_TOKEN_DIR}/token", str(token)) for a in args]
    import argparse

    parser = argparse.ArgumentParser()
    configure(parser)
    config = validate(build_config(parser.parse_args(args), environ={}))
    assert config.picker_token_file == str(token)
    assert config.picker_port == pools.PICKER_PORT


def gateway_pods(namespace: str) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": {GATEWAY_POD_LABEL: GATEWAY}},
    }


GATEWAY_PEER = {"ipBlock": {"cidr": "10.129.0.0/23"}}  # e.g. GKE's proxy-only subnet


@pytest.mark.parametrize(
    ("section", "peers"),
    [
        # issue 57 item 6: unset used to render no "from" at all, any source; issue 68: then
        # every pod of the gateway's namespace, now the gateway's own pods, by label
        (POOL, [gateway_pods(NAMESPACE)]),
        ({**POOL, "gatewayNamespace": "gateway"}, [gateway_pods("gateway")]),
        ({"gatewayFrom": [GATEWAY_PEER]}, [GATEWAY_PEER]),
    ],
)
def test_the_gateway_and_only_it_reaches_the_leaders_and_the_picker(
    rendered: RenderFn,
    spec_with: SpecWith,
    section: dict[str, Any],
    peers: list[dict[str, Any]],
) -> None:
    """The rendered NetworkPolicies of a server with an InferencePool: the engines' admits
    the gateway to the HTTP port, the router's to the picker port, from ``peers`` only."""
    out = rendered(spec_with(inferencePool=section), inference_pool=True)
    engines = child(out, "NetworkPolicy", "qwen-engines")["spec"]["ingress"]
    router = child(out, "NetworkPolicy", "qwen-router")["spec"]["ingress"]
    assert engines[-1] == {
        "from": peers,
        "ports": [{"protocol": "TCP", "port": launch_contract.HTTP_PORT}],
    }
    assert router[-1] == {"from": peers, "ports": [{"protocol": "TCP", "port": pools.PICKER_PORT}]}
    for rule in (*engines, *router[1:]):  # the router's first rule: its HTTP and metrics ports
        assert rule.get("from"), rule  # no engine or picker port open to any source


def admits(policy: dict[str, Any], namespace: str, pod: dict[str, str], port: int) -> bool:
    """Whether a NetworkPolicy's ingress rules admit a pod (its namespace and labels) to
    ``port``, as Kubernetes reads them: any rule whose peers (none: any source) and ports
    (none: every port) match; a peer's selectors match by labels, the namespace by its
    ``kubernetes.io/metadata.name`` label; an ``ipBlock`` matches no pod here."""

    def matches(selector: dict[str, Any] | None, labels_: dict[str, str]) -> bool:
        wanted = (selector or {}).get("matchLabels", {})
        return all(labels_.get(k) == v for k, v in wanted.items())

    def peer_matches(peer: dict[str, Any]) -> bool:
        if "ipBlock" in peer:
            return False
        if "namespaceSelector" in peer:
            if not matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}):
                return False
        elif namespace != NAMESPACE:  # a podSelector alone: the policy's own namespace
            return False
        return matches(peer.get("podSelector"), pod)

    for rule in policy["spec"]["ingress"]:
        peers, ports = rule.get("from"), rule.get("ports")
        if peers is not None and not any(peer_matches(p) for p in peers):
            continue
        if ports is None or any(p["port"] == port for p in ports):
            return True
    return False


ROUTER_POD = labels.router_selector("qwen")
SOURCES = {
    "the gateway": ("gateway", {"app": "gateway-proxy", GATEWAY_POD_LABEL: GATEWAY}),
    "a client pod in the gateway's namespace": ("gateway", {"app": "client"}),
    "a client pod in the server's namespace": (NAMESPACE, {"app": "client"}),
    "a client pod elsewhere": ("apps", {"app": "client"}),
    "the server's router": (NAMESPACE, ROUTER_POD),
}


def test_what_the_policies_of_a_pool_admit_and_refuse(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    """Issue 57 item 4, with the gateway in its own namespace: the engines' HTTP port (no
    keys; abort_all, flush_cache) and the picker port are reached from the gateway's
    namespace only; every other source is refused there, the server's own router aside
    (it dials the engines and their KV events, never the picker), and the engines' KV-event
    ports are the router's alone. The router's HTTP port stays open to clients."""
    out = rendered(
        spec_with(inferencePool={**POOL, "gatewayNamespace": "gateway"}), inference_pool=True
    )
    engines = child(out, "NetworkPolicy", "qwen-engines")
    router = child(out, "NetworkPolicy", "qwen-router")
    http, kv = launch_contract.HTTP_PORT, launch_contract.KV_EVENTS_PORT
    admitted = {
        source: (
            admits(engines, *where, http),
            admits(engines, *where, kv),
            admits(router, *where, pools.PICKER_PORT),
            admits(router, *where, ROUTER_PORT),
        )
        for source, where in SOURCES.items()
    }
    assert admitted == {
        # engines' HTTP, KV events, the picker, the router's HTTP port
        "the gateway": (True, False, True, True),
        # issue 68: every pod of the gateway's namespace was admitted; its own pods only now
        "a client pod in the gateway's namespace": (False, False, False, True),
        "a client pod in the server's namespace": (False, False, False, True),
        "a client pod elsewhere": (False, False, False, True),
        "the server's router": (True, True, False, True),
    }


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"gatewayFrom": []}, GATEWAY_FROM_RULE[1]),
        ({"gatewayFrom": [GATEWAY_PEER, {}]}, GATEWAY_FROM_RULE[1]),
        # issue 68: a namespaceSelector alone admits every pod of the namespace
        ({"gatewayFrom": [{"namespaceSelector": {}}]}, GATEWAY_FROM_RULE[1]),
        ({"gatewayFrom": [GATEWAY_PEER], "gatewayNamespace": "gateway"}, GATEWAY_ONE_WAY_RULE[1]),
        ({}, GATEWAY_NAMED_RULE[1]),  # issue 68: no gateway named (was: the whole namespace)
        ({**POOL, "gatewayFrom": [GATEWAY_PEER]}, GATEWAY_NAMED_RULE[1]),
        (
            {**POOL, "pickerAuth": "NetworkPolicyOnly", "tokenSecretRef": {"name": "t"}},
            TOKEN_AUTH_RULE[1],
        ),
    ],
)
def test_a_gateway_peer_that_admits_any_source_is_refused_naming_the_field(
    rendered: RenderFn, spec_with: SpecWith, section: dict[str, Any], message: str
) -> None:
    """The CRD's rule (the apiserver's CEL, evaluated offline by the operator: one message)."""
    with pytest.raises(InvalidSpec) as caught:
        rendered(spec_with(inferencePool=section), inference_pool=True)
    assert str(caught.value) == f"spec.inferencePool: {message}"


def test_a_pool_without_the_crd_or_the_router_is_invalid_naming_the_field(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    with pytest.raises(InvalidSpec) as caught:
        rendered(spec_with(inferencePool=POOL))
    assert str(caught.value) == f"spec.inferencePool: {pools.NO_CRD}"
    assert "inference.networking.k8s.io/v1 InferencePool" in str(caught.value)
    with pytest.raises(InvalidSpec) as caught:
        rendered(spec_with(inferencePool=POOL, router={"enabled": False}), inference_pool=True)
    assert str(caught.value) == f"spec.inferencePool: {pools.NEEDS_ROUTER}"


PD = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}


def test_a_pool_of_a_disaggregated_server_is_invalid_naming_both_fields(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    """A pool would select prefill and decode engines, and the gateway would send a request
    to one of them alone: refused, naming spec.inferencePool and spec.disaggregation."""
    spec = spec_with(inferencePool=POOL, engine={"type": "simulated"}, disaggregation=PD)
    with pytest.raises(InvalidSpec) as caught:
        rendered(spec, inference_pool=True)
    assert str(caught.value) == f"spec.inferencePool: {pools.WITH_DISAGGREGATION}"
    assert "spec.disaggregation" in str(caught.value)
    without_pool = {k: v for k, v in spec.items() if k != "inferencePool"}
    assert rendered(without_pool, inference_pool=True).children  # each alone is valid


def _admission_problems(spec: dict[str, Any], params: dict[str, str]) -> list[str]:
    """The admission policy's poolProblems variable, evaluated with cel-python."""
    import celpy
    from celpy.adapter import json_to_cel

    expression = dict(admission.VARIABLES)["poolProblems"]
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    activation = {
        "object": json_to_cel({"spec": spec}),
        "params": json_to_cel({"data": params}),
    }
    result = program.evaluate(activation)
    assert isinstance(result, list), result
    return [str(p) for p in result]


@pytest.mark.parametrize(
    ("spec", "served", "expected"),
    [
        ({"inferencePool": {}}, "false", [f"spec.inferencePool: {pools.NO_CRD}"]),
        ({"inferencePool": {}}, "true", []),
        ({"inferencePool": {}}, None, []),  # no parameter (a render without the chart): allowed
        ({}, "false", []),
        (
            {"inferencePool": {}, "router": {"enabled": False}},
            "true",
            [f"spec.inferencePool: {pools.NEEDS_ROUTER}"],
        ),
        (
            {"inferencePool": {}, "disaggregation": PD},
            "true",
            [f"spec.inferencePool: {pools.WITH_DISAGGREGATION}"],
        ),
        ({"disaggregation": PD}, "true", []),
    ],
)
def test_admission_refuses_what_the_operator_would(
    spec: dict[str, Any], served: str | None, expected: list[str]
) -> None:
    params = {} if served is None else {pools.CLUSTER_PARAM: served}
    assert _admission_problems(spec, params) == expected


def test_the_whole_policy_denies_a_pool_on_a_cluster_without_the_crd() -> None:
    from celpy.adapter import json_to_cel

    from tests.fake_kube import tms_object
    from tests.unit.operator.test_admission_policy import Policy

    policy = Policy()
    policy.params = json_to_cel({"data": {**admission.parameters(), pools.CLUSTER_PARAM: "false"}})
    obj = tms_object()
    assert policy.denies(obj) is None
    obj["spec"]["inferencePool"] = {"failureMode": "FailOpen"}
    assert policy.denies(obj) == f"spec.inferencePool: {pools.NO_CRD}"


def test_the_docs_example_of_a_disaggregated_pool_is_denied_by_the_whole_policy() -> None:
    """docs/pd.md's `# refused: spec.inferencePool` example (which the e2e suite applies)."""
    import re
    from pathlib import Path

    import yaml
    from celpy.adapter import json_to_cel

    from tests.unit.operator.test_admission_policy import Policy

    docs = (Path(__file__).resolve().parents[3] / "docs/pd.md").read_text()
    found = re.search(r"```yaml\n(# refused: spec\.inferencePool .*?)```", docs, re.DOTALL)
    assert found is not None
    obj = yaml.safe_load(found.group(1))
    policy = Policy()
    policy.params = json_to_cel({"data": {**admission.parameters(), pools.CLUSTER_PARAM: "true"}})
    assert policy.denies(obj) == f"spec.inferencePool: {pools.WITH_DISAGGREGATION}"
    del obj["spec"]["inferencePool"]
    assert policy.denies(obj) is None


def test_the_chart_tells_the_policy_whether_the_cluster_serves_pools() -> None:
    from pathlib import Path

    template = (
        Path(__file__).resolve().parents[3] / "charts/tpuserve/templates/admission-policy.yaml"
    ).read_text()
    assert pools.CLUSTER_PARAM in template
    assert f'"{pools.GROUP_VERSION}/{pools.KIND}"' in template


# ---- against an in-memory apiserver -------------------------------------------------------


SPEC = {
    "model": {"source": "hf://Qwen/Qwen3-8B"},
    "tpu": {"generation": "v6e", "topology": "2x4"},
    "replicas": 1,
    "engine": {"type": "simulated"},
    "inferencePool": {"gatewayName": "inference-gateway"},
}


def reconciler_for(kube: FakeKube) -> Reconciler:
    reconciler = Reconciler(
        kube,
        ReconcilerSettings(render=RenderConfig(), resync_seconds=60.0),
        create_operator_metrics(CollectorRegistry()),
        lambda body, kind, reason, message: None,
        clock=lambda: NOW,
        read_cold_start=None,
    )

    def deliver(event_type: str, body: Any) -> None:
        if body["kind"] == labels.KIND:
            reconciler.on_server_event(event_type, body)
        elif body["kind"] == "Pod":
            reconciler.on_pod_event(event_type, body)
        else:
            reconciler.on_child_event(event_type, body)

    kube.watch(deliver)
    return reconciler


def put_server(kube: FakeKube) -> tuple[str, str]:
    kube.put(
        {
            "apiVersion": labels.API_VERSION,
            "kind": labels.KIND,
            "metadata": {
                "name": "qwen",
                "namespace": NAMESPACE,
                "uid": "qwen-uid",
                "generation": 1,
            },
            "spec": copy.deepcopy(SPEC),
        }
    )
    return (NAMESPACE, "qwen")


async def converge(kube: FakeKube, reconciler: Reconciler, key: tuple[str, str]) -> dict[str, Any]:
    body = kube.get_object(labels.API_VERSION, labels.KIND, *key)
    await reconciler.converge(key, body)
    status: dict[str, Any] = kube.get_object(labels.API_VERSION, labels.KIND, *key)["status"]
    return status


def accepted_by(gateway: str, status: str, reason: str) -> dict[str, Any]:
    return {
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gateway},
        "controllerName": "example.net/gateway",
        "conditions": [{"type": "Accepted", "status": status, "reason": reason, "message": ""}],
    }


async def test_the_pool_is_applied_and_its_gateway_acceptance_reported() -> None:
    kube = FakeKube(group_versions=[pools.GROUP_VERSION])
    reconciler = reconciler_for(kube)
    key = put_server(kube)
    status = await converge(kube, reconciler, key)
    assert ("InferencePool", "qwen") in kube.applied
    assert ("Service", "qwen-picker") in kube.applied
    assert status["inferencePool"] == {
        "name": "qwen",
        "managed": True,
        "accepted": False,
        "parents": [],
    }
    pool = kube.get_object(pools.GROUP_VERSION, pools.KIND, NAMESPACE, "qwen")
    pool["status"] = {
        "parents": [
            accepted_by("gw", "True", "Accepted"),
            accepted_by("other", "False", "NotSupportedByParent"),
        ]
    }
    kube.put(pool)  # the gateway's status write, as its controller makes it
    status = await converge(kube, reconciler, key)
    assert status["inferencePool"]["accepted"] is True
    assert status["inferencePool"]["parents"] == [
        {"gateway": "ml/gw", "accepted": True, "reason": "Accepted", "message": ""},
        {"gateway": "ml/other", "accepted": False, "reason": "NotSupportedByParent", "message": ""},
    ]


async def test_the_gateways_token_secret_is_created_once_and_kept() -> None:
    """Issue 68: a pool's picker requires a token by default; the operator creates it (a
    random value it never reads back) once, owned by the server, and mounts it."""
    import base64

    kube = FakeKube(group_versions=[pools.GROUP_VERSION])
    reconciler = reconciler_for(kube)
    key = put_server(kube)
    await converge(kube, reconciler, key)
    secret = kube.get_object("v1", "Secret", NAMESPACE, "qwen-router-picker")
    token = base64.b64decode(secret["data"]["token"])
    assert 16 <= len(token) <= 4096  # what --picker-token-file takes
    assert secret["metadata"]["ownerReferences"][0]["name"] == "qwen"
    await converge(kube, reconciler, key)
    assert kube.get_object("v1", "Secret", NAMESPACE, "qwen-router-picker") == secret
    assert ("Secret", "qwen-router-picker") not in kube.deleted


async def test_a_pool_someone_else_made_is_left_alone() -> None:
    kube = FakeKube(group_versions=[pools.GROUP_VERSION])
    theirs = {
        "apiVersion": pools.GROUP_VERSION,
        "kind": pools.KIND,
        "metadata": {"name": "qwen", "namespace": NAMESPACE},
        "spec": {"selector": {"matchLabels": {"app": "theirs"}}, "targetPorts": [{"number": 1}]},
        "status": {"parents": [accepted_by("gw", "True", "Accepted")]},
    }
    kube.put(theirs)
    reconciler = reconciler_for(kube)
    key = put_server(kube)
    status = await converge(kube, reconciler, key)
    assert ("InferencePool", "qwen") not in kube.applied
    assert ("Service", "qwen-picker") in kube.applied  # the rest is still made
    pool = kube.get_object(pools.GROUP_VERSION, pools.KIND, NAMESPACE, "qwen")
    assert pool["spec"] == theirs["spec"]
    assert status["inferencePool"]["managed"] is False
    assert status["inferencePool"]["accepted"] is True
    await converge(kube, reconciler, key)
    assert ("InferencePool", "qwen") not in kube.deleted


async def test_without_the_crd_the_server_is_invalid_and_nothing_is_applied() -> None:
    kube = FakeKube()
    reconciler = reconciler_for(kube)
    key = put_server(kube)
    status = await converge(kube, reconciler, key)
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert valid["status"] == "False"
    assert valid["message"].startswith("spec.inferencePool: the cluster does not serve")
    assert kube.applied == []
