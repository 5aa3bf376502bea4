"""Render: the children of one server, their wiring (selectors, owners, secrets, security),
and validity against the Kubernetes schemas."""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from sglang_tpu.metric_names import restore_sglang_colon_relabeling
from tpuserve_operator import labels
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import RenderConfig, Rendered, render, validate_server
from tpuserve_operator.render.context import DEFAULT_METRICS_FROM, DEFAULT_ROUTER_RESOURCES

pytestmark = pytest.mark.unit

RenderFn = Callable[..., Rendered]
SpecWith = Callable[..., dict[str, Any]]


def by_kind(children: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == kind]


def one(children: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [c for c in by_kind(children, kind) if c["metadata"]["name"] == name]
    return found


def pod_templates(children: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for c in children:
        if c["kind"] in ("StatefulSet", "Deployment"):
            yield c["spec"]["template"]
        elif c["kind"] == "LeaderWorkerSet":
            yield c["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
            yield c["spec"]["leaderWorkerTemplate"]["workerTemplate"]


def test_statefulset_path_objects(rendered: RenderFn) -> None:
    children = rendered().children
    names = sorted((c["kind"], c["metadata"]["name"]) for c in children)
    assert names == sorted(
        [
            ("Service", "qwen"),
            ("Service", "qwen-leaders"),
            ("PodDisruptionBudget", "qwen"),
            ("NetworkPolicy", "qwen-engines"),
            ("ServiceAccount", "qwen-router"),
            ("Role", "qwen-router"),
            ("RoleBinding", "qwen-router"),
            ("ConfigMap", "qwen-router"),
            ("Deployment", "qwen-router"),
            ("PodDisruptionBudget", "qwen-router"),
            ("Service", "qwen-router-peers"),
            ("NetworkPolicy", "qwen-router"),
            ("Service", "qwen-r0"),
            ("StatefulSet", "qwen-r0"),
            ("StatefulSet", "qwen-r0-w"),
            ("Service", "qwen-r1"),
            ("StatefulSet", "qwen-r1"),
            ("StatefulSet", "qwen-r1-w"),
        ]
    )


def test_leaderworkerset_path_has_one_lws_per_replica(rendered: RenderFn) -> None:
    children = rendered(leaderworkerset=True).children
    lws = by_kind(children, "LeaderWorkerSet")
    assert [x["metadata"]["name"] for x in lws] == ["qwen-r0", "qwen-r1"]
    assert not by_kind(children, "StatefulSet")
    for x in lws:
        assert x["spec"]["replicas"] == 1
        assert x["spec"]["leaderWorkerTemplate"]["size"] == 4
        assert x["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"


def test_lws_hostnames_are_lws_pod_names(rendered: RenderFn) -> None:
    (lws, _) = by_kind(rendered(leaderworkerset=True).children, "LeaderWorkerSet")
    env = {
        e["name"]: e.get("value")
        for e in lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0][
            "env"
        ]
    }
    pods = [n.split(".")[0] for n in env["TPUSERVE_WORKER_HOSTNAMES"].split(",")]
    assert pods == ["qwen-r0-0", "qwen-r0-0-1", "qwen-r0-0-2", "qwen-r0-0-3"]


def test_every_child_is_owned_by_the_server(rendered: RenderFn) -> None:
    for child in rendered().children:
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": labels.API_VERSION,
            "kind": labels.KIND,
            "name": "qwen",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert child["metadata"]["labels"][labels.MANAGED_BY] == labels.MANAGED_BY_VALUE
        assert child["metadata"]["namespace"] == "ml"


def test_without_a_uid_there_are_no_owner_references(rendered: RenderFn) -> None:
    assert all("ownerReferences" not in c["metadata"] for c in rendered(uid=None).children)


def test_one_selector_for_leaders_everywhere(rendered: RenderFn) -> None:
    result = rendered()
    selector = (
        "app.kubernetes.io/instance=qwen,app.kubernetes.io/component=model-server,"
        "serving.tpuserve.dev/role=leader"
    )
    assert result.selector == selector
    config = one(result.children, "ConfigMap", "qwen-router")
    assert config["data"]["TPUSERVE_ROUTER_SELECTOR"] == selector
    leaders = one(result.children, "Service", "qwen-leaders")
    assert labels.selector_string(leaders["spec"]["selector"]) == selector
    leader_pods = [
        t
        for t in pod_templates(result.children)
        if t["metadata"]["labels"].get(labels.ROLE) == "leader"
    ]
    assert len(leader_pods) == 2
    for template in leader_pods:
        assert all(
            template["metadata"]["labels"][k] == v
            for k, v in labels.leader_selector("qwen").items()
        )


def test_router_command_line(rendered: RenderFn, spec_with: SpecWith) -> None:
    spec = spec_with(router={"policy": "least_load", "kvEvents": True, "replicas": 3})
    deployment = one(rendered(spec).children, "Deployment", "qwen-router")
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tpuserve", "router"]
    assert container["args"] == [
        "--host=0.0.0.0",
        "--port=8000",
        "--metrics-port=9000",
        "--discovery=kubernetes",
        "--request-timeout=600",
        "--drain-seconds=600",
        "--admin-port=8002",  # the admin API on 127.0.0.1: a proxy in the pod cannot reach it
        "--max-buffered-bytes=536870912",  # a quarter of the 2Gi limit
        "--peer-port=5570",
        "--peers-from-dns=qwen-router-peers.ml.svc",
        "--peer-key-file=/etc/tpuserve/peering/key",
        "--kv-events",
    ]
    # stopping: a preStop pause (Services drop the pod first), then the drain, within the grace
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert pause > 0
    assert pause + 600 < grace
    assert container["envFrom"] == [{"configMapRef": {"name": "qwen-router"}}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert container["resources"] == DEFAULT_ROUTER_RESOURCES  # with no operator setting
    config = one(rendered(spec).children, "ConfigMap", "qwen-router")
    assert config["data"]["TPUSERVE_ROUTER_POLICY"] == "least_load"
    assert {p["name"] for p in container["ports"]} == {"http", "metrics", "peers", "peer-snapshot"}


@pytest.mark.parametrize(
    ("memory", "flags"),
    [
        ("1Gi", ["--max-buffered-bytes=268435456"]),
        ("4G", ["--max-buffered-bytes=1000000000"]),
        ("64Mi", ["--max-buffered-bytes=16777216", "--max-request-bytes=16777216"]),
        (None, []),  # no limit: the router's own default
        ("lots", []),  # not a quantity (the apiserver refuses the pod): the router's default
    ],
)
def test_the_routers_buffer_budget_is_a_quarter_of_its_memory_limit(
    rendered: RenderFn, spec_with: SpecWith, memory: str | None, flags: list[str]
) -> None:
    resources = {"limits": {"memory": memory}} if memory is not None else {}
    spec = spec_with(router={"resources": resources})
    (container,) = one(rendered(spec).children, "Deployment", "qwen-router")["spec"]["template"][
        "spec"
    ]["containers"]
    assert [a for a in container["args"] if a.startswith(("--max-buffered", "--max-request"))] == (
        flags
    )


def test_the_routers_peering_secret_is_mounted_not_rendered(rendered: RenderFn) -> None:
    children = rendered().children
    assert [c for c in children if c["kind"] == "Secret"] == []  # made once by the reconciler
    pod = one(children, "Deployment", "qwen-router")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["peering"]["secret"]["secretName"] == "qwen-router-peering"
    (container,) = pod["containers"]
    assert {"name": "peering", "mountPath": "/etc/tpuserve/peering", "readOnly": True} in (
        container["volumeMounts"]
    )


def test_router_defaults_come_from_the_operator(rendered: RenderFn) -> None:
    result = rendered(router_policy="power_of_two", router_replicas=2)
    assert (
        one(result.children, "ConfigMap", "qwen-router")["data"]["TPUSERVE_ROUTER_POLICY"]
        == "power_of_two"
    )
    assert one(result.children, "Deployment", "qwen-router")["spec"]["replicas"] == 2


def test_router_replicas_spread_over_nodes_and_drain_one_at_a_time(rendered: RenderFn) -> None:
    children = rendered().children
    deployment = one(children, "Deployment", "qwen-router")
    selector = deployment["spec"]["selector"]["matchLabels"]
    (preferred,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert preferred["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": selector},
        "topologyKey": "kubernetes.io/hostname",
    }
    budget = one(children, "PodDisruptionBudget", "qwen-router")
    assert budget["spec"]["selector"]["matchLabels"] == selector
    assert budget["spec"]["maxUnavailable"] == 1
    engines = one(children, "PodDisruptionBudget", "qwen")["spec"]["selector"]["matchLabels"]
    assert engines != selector  # each budget covers its own pods only


def test_router_config_change_rolls_the_router(rendered: RenderFn, spec_with: SpecWith) -> None:
    def config_hash(spec: dict[str, Any]) -> str:
        deployment = one(rendered(spec).children, "Deployment", "qwen-router")
        return str(
            deployment["spec"]["template"]["metadata"]["annotations"][
                "serving.tpuserve.dev/config-hash"
            ]
        )

    assert config_hash(spec_with()) != config_hash(spec_with(router={"policy": "random"}))


def test_router_disabled_points_the_endpoint_at_the_leaders(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    children = rendered(spec_with(router={"enabled": False})).children
    assert not by_kind(children, "Deployment")
    endpoint = one(children, "Service", "qwen")
    assert endpoint["spec"]["selector"] == labels.leader_selector("qwen")


def test_endpoint(rendered: RenderFn) -> None:
    assert rendered().endpoint == "http://qwen.ml.svc:8000"


def test_hf_token_only_by_secret_reference(rendered: RenderFn) -> None:
    for template in pod_templates(rendered().children):
        for container in template["spec"]["containers"]:
            for env in container.get("env", []):
                if env["name"] == "HF_TOKEN":
                    assert "value" not in env
                    assert env["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}


def test_pods_are_non_root_with_read_only_root_filesystems(rendered: RenderFn) -> None:
    templates = list(pod_templates(rendered(leaderworkerset=True).children)) + list(
        pod_templates(rendered().children)
    )
    for template in templates:
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert "/tmp" in mounts


def test_engine_pods_mount_no_api_token(rendered: RenderFn) -> None:
    for template in pod_templates(rendered().children):
        if template["metadata"]["labels"][labels.COMPONENT] == labels.COMPONENT_MODEL_SERVER:
            assert template["spec"]["automountServiceAccountToken"] is False


def test_only_leaders_have_probes_and_ports(rendered: RenderFn) -> None:
    for template in pod_templates(rendered().children):
        if template["metadata"]["labels"][labels.COMPONENT] != labels.COMPONENT_MODEL_SERVER:
            continue
        (engine,) = template["spec"]["containers"]
        leader = template["metadata"]["labels"][labels.ROLE] == "leader"
        assert ("startupProbe" in engine) is leader
        assert ("ports" in engine) is leader


def test_leaders_publish_kv_events_with_a_replay_socket(rendered: RenderFn) -> None:
    children = rendered().children
    leader = one(children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    (engine,) = leader["containers"]
    ports = {p["name"]: p["containerPort"] for p in engine["ports"]}
    assert ports == {"http": 30000, "kv-events": 5557, "kv-replay": 5558, "tpu-handshake": 36423}
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert (env["TPUSERVE_KV_EVENTS_PORT"], env["TPUSERVE_KV_REPLAY_PORT"]) == ("5557", "5558")
    service = one(children, "Service", "qwen-leaders")
    assert {p["name"] for p in service["spec"]["ports"]} == {"http", "kv-events", "kv-replay"}


def test_engines_pin_the_torch_tpu_handshake_port_and_mount_a_memory_dev_shm(
    rendered: RenderFn,
) -> None:
    """TorchTPU's handshake port is the contract's and declared; its tier-2 cache needs a
    memory-backed /dev/shm."""
    pod = one(rendered().children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    declared = {p["name"]: p["containerPort"] for p in engine["ports"]}
    assert declared["tpu-handshake"] == int(env["TPUSERVE_TORCH_TPU_HANDSHAKE_PORT"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}


def test_startup_probe_allows_an_hour_for_a_first_compile(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    def budget(spec: dict[str, Any]) -> int:
        sts = one(rendered(spec).children, "StatefulSet", "qwen-r0")
        probe = sts["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
        return int(probe["periodSeconds"] * probe["failureThreshold"])

    assert budget(spec_with()) == 3600
    assert budget(spec_with(engine={"executionMode": "eager"})) == 1800
    assert budget(spec_with(engine={"type": "simulated"})) == 600


def test_spot_pods_pause_shorter_and_drain_within_their_grace(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(tpu={"generation": "v6e", "topology": "4x4", "spot": True})
    pod = one(rendered(spec).children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    on_demand = one(rendered().children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    spot_pause = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spot_pause < on_demand["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    (engine,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    drain = float(env["TPUSERVE_DRAIN_TIMEOUT_SECONDS"])
    pause = engine["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pause + drain < pod["terminationGracePeriodSeconds"]


def test_on_demand_drain_fits_the_grace_period(rendered: RenderFn) -> None:
    pod = one(rendered().children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    pause = engine["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert (
        pause + float(env["TPUSERVE_DRAIN_TIMEOUT_SECONDS"]) < pod["terminationGracePeriodSeconds"]
    )


def test_the_grace_period_and_router_timeout_come_from_max_request_seconds(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    children = rendered(spec_with(router={"maxRequestSeconds": 120})).children
    pod = one(children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert float(env["TPUSERVE_DRAIN_TIMEOUT_SECONDS"]) == 120
    assert pod["terminationGracePeriodSeconds"] == 120 + 5 + 5
    router = next(c for c in children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "--request-timeout=120" in router["containers"][0]["args"]
    assert router["terminationGracePeriodSeconds"] == 120 + 5 + 5  # requests through it finish
    longest = rendered(spec_with(router={"maxRequestSeconds": 3590})).children
    pod = one(longest, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 3600  # GKE's drain cap
    with pytest.raises(InvalidSpec, match=r"spec\.router\.maxRequestSeconds"):
        rendered(spec_with(router={"maxRequestSeconds": 3591}))


def test_engine_pods_prefer_nodes_without_announced_maintenance(rendered: RenderFn) -> None:
    pod = one(rendered().children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"]: e["operator"] for e in term["preference"]["matchExpressions"]}
    assert keys == {
        "cloud.google.com/scheduled-maintenance-time": "DoesNotExist",
        "cloud.google.com/active-node-maintenance": "DoesNotExist",
    }


def test_compile_cache_and_pvc_model_are_mounted(rendered: RenderFn, spec_with: SpecWith) -> None:
    spec = spec_with(
        model={"source": "pvc://weights/qwen3-8b"},
        engine={"compileCache": {"persistentVolumeClaim": "xla-cache"}},
    )
    pod = one(rendered(spec).children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    claims = {
        v["persistentVolumeClaim"]["claimName"]: v
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims["weights"]["persistentVolumeClaim"]["readOnly"] is True
    assert "xla-cache" in claims
    (engine,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    assert env["TPUSERVE_COMPILE_CACHE_DIR"] in mounts
    assert mounts["/mnt/tpuserve/pvc/weights"]["readOnly"] is True


def test_a_gcs_compile_cache_is_a_cloud_storage_fuse_volume_on_every_host(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    spec = spec_with(engine={"compileCache": {"gcs": "gs://my-models/xla/qwen"}})
    template = one(rendered(spec).children, "StatefulSet", "qwen-r0")["spec"]["template"]
    assert template["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "compile-cache"]
    assert volume["csi"] == {
        "driver": "gcsfuse.csi.storage.gke.io",
        "volumeAttributes": {
            "bucketName": "my-models",
            "mountOptions": "implicit-dirs,only-dir=xla/qwen",
        },
    }
    (engine,) = template["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in engine["env"]}
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    assert mounts[env["TPUSERVE_COMPILE_CACHE_DIR"]] == "compile-cache"


@pytest.mark.parametrize(
    "cache", [{}, {"persistentVolumeClaim": "xla", "gcs": "gs://bkt/x"}], ids=["none", "both"]
)
def test_a_compile_cache_needs_exactly_one_location(
    rendered: RenderFn, spec_with: SpecWith, cache: dict[str, str]
) -> None:
    with pytest.raises(InvalidSpec, match="exactly one of persistentVolumeClaim and gcs"):
        rendered(spec_with(engine={"compileCache": cache}))


def test_an_empty_compile_cache_the_apiserver_let_through_is_invalid_not_a_crash(
    spec_with: SpecWith,
) -> None:
    spec = spec_with(engine={"compileCache": {}})
    valid = validate_server(
        {"name": "qwen", "namespace": "ml"}, spec, RenderConfig(), cel_rules=False
    )
    with pytest.raises(InvalidSpec, match=r"spec\.engine\.compileCache: .*exactly one"):
        render(valid)


def test_reservation_and_template_overrides(rendered: RenderFn, spec_with: SpecWith) -> None:
    spec = spec_with(
        tpu={"generation": "v6e", "topology": "4x4", "reservation": "res-a"},
        template={
            "labels": {"team": "search"},
            "annotations": {"a": "b"},
            "nodeSelector": {"pool": "x"},
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "priorityClassName": "high",
            "serviceAccountName": "weights-reader",
            "imagePullSecrets": ["regcred"],
        },
    )
    template = one(rendered(spec).children, "StatefulSet", "qwen-r0")["spec"]["template"]
    pod = template["spec"]
    assert pod["nodeSelector"]["cloud.google.com/reservation-name"] == "res-a"
    assert pod["nodeSelector"]["pool"] == "x"
    assert {"key": "k", "operator": "Exists"} in pod["tolerations"]
    assert pod["priorityClassName"] == "high"
    assert pod["serviceAccountName"] == "weights-reader"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert template["metadata"]["labels"]["team"] == "search"
    assert template["metadata"]["annotations"]["a"] == "b"


def test_engine_cpu_and_memory_overrides_keep_the_rest_of_the_catalogs(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    """v6e 4x4 hosts are ct6e-standard-4t: 180 vCPUs, 720 GiB. A limit alone lowers the request
    with it; a request alone raises the limit; other keys pass through."""
    spec = spec_with(
        engine={
            "resources": {
                "limits": {"memory": "64Gi"},
                "requests": {"cpu": "170", "ephemeral-storage": "50Gi"},
            }
        }
    )
    pod = one(rendered(spec).children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"] == {"memory": "64Gi", "cpu": "170", "google.com/tpu": "4"}
    assert resources["requests"] == {
        "cpu": "170",
        "ephemeral-storage": "50Gi",
        "memory": "64Gi",
        "google.com/tpu": "4",
    }
    default = one(rendered().children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    assert default["containers"][0]["resources"]["limits"] == {
        "cpu": "161532m",  # 90% of 179.48 allocatable cores
        "memory": "643960Mi",  # 90% of 698.7 GiB allocatable
        "google.com/tpu": "4",
    }


def test_extra_sglang_flags_reach_the_contract(rendered: RenderFn, spec_with: SpecWith) -> None:
    spec = spec_with(
        engine={"args": {"mem-fraction-static": 0.8, "enable-mixed-chunk": True, "x": False}}
    )
    pod = one(rendered(spec).children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TPUSERVE_SGLANG_EXTRA_ARGS"] == "--mem-fraction-static 0.8 --enable-mixed-chunk"


def test_monitors_need_the_crd_and_the_flag(rendered: RenderFn, spec_with: SpecWith) -> None:
    on = spec_with(
        monitoring={"podMonitor": True, "serviceMonitor": True, "labels": {"release": "kps"}}
    )
    assert not by_kind(rendered(on).children, "PodMonitor")
    assert not by_kind(rendered(prometheus_operator=True).children, "PodMonitor")
    children = rendered(on, prometheus_operator=True).children
    (pm,) = by_kind(children, "PodMonitor")
    (sm,) = by_kind(children, "ServiceMonitor")
    assert pm["metadata"]["labels"]["release"] == "kps"
    assert pm["spec"]["podTargetLabels"] == ["model", "tpu-generation", "tpu-topology"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["metricRelabelings"] == [restore_sglang_colon_relabeling()]
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics"}]


def test_scale_to_zero_keeps_router_and_services(rendered: RenderFn, spec_with: SpecWith) -> None:
    children = rendered(spec_with(replicas=0)).children
    assert not by_kind(children, "StatefulSet")
    assert one(children, "Deployment", "qwen-router")


def test_revision_follows_pod_templates_not_replicas(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    base = rendered().revision
    assert rendered(spec_with(replicas=5)).revision == base
    assert rendered(spec_with(router={"policy": "random"})).revision == base
    assert rendered(spec_with(engine={"kvCacheDtype": "fp8"})).revision != base
    assert rendered(annotations={labels.RESTARTED_AT: "2025-01-01T00:00:00Z"}).revision != base
    assert rendered(leaderworkerset=True).revision != base


def test_group_pods_carry_model_and_tpu_labels(rendered: RenderFn) -> None:
    result = rendered()
    for template in pod_templates(result.children):
        meta = template["metadata"]["labels"]
        if meta[labels.COMPONENT] != labels.COMPONENT_MODEL_SERVER:
            continue
        assert meta[labels.MODEL] == "qwen3-8b"
        assert meta[labels.TPU_GENERATION] == "v6e"
        assert meta[labels.TPU_TOPOLOGY] == "4x4"
        assert meta[labels.REVISION] == result.revision


@pytest.mark.parametrize("lws", [False, True], ids=["statefulset", "leaderworkerset"])
def test_built_in_kinds_validate_against_kubernetes_schemas(
    rendered: RenderFn, spec_with: SpecWith, lws: bool
) -> None:
    spec = spec_with(
        model={"source": "pvc://weights/qwen3-8b"},
        engine={"compileCache": {"persistentVolumeClaim": "xla-cache"}},
        tpu={"generation": "v6e", "topology": "4x4", "spot": True},
    )
    checked = 0
    for child in rendered(spec, leaderworkerset=lws).children:
        if "." in child["apiVersion"].split("/")[0] and not child["apiVersion"].startswith(
            ("rbac.authorization.k8s.io", "policy", "networking.k8s.io")
        ):
            continue  # CRD kinds (LWS, monitors): not in the built-in schemas
        kubernetes_validate.validate(child, "1.33.0", strict=True)
        checked += 1
    assert checked >= 8


def test_lws_pod_templates_validate_as_pod_templates(rendered: RenderFn) -> None:
    for lws in by_kind(rendered(leaderworkerset=True).children, "LeaderWorkerSet"):
        for key in ("leaderTemplate", "workerTemplate"):
            template = lws["spec"]["leaderWorkerTemplate"][key]
            kubernetes_validate.validate(
                {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": "t"},
                    "template": template,
                },
                "1.33.0",
                strict=True,
            )


def test_the_router_accepts_the_rendered_command_line_and_config(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    """Contract with tpuserve_router: its own parser reads what the operator renders."""
    children = rendered(spec_with(router={"policy": "least_load", "kvEvents": True})).children
    config = router_config_of(children)
    assert config.discovery == "kubernetes"
    assert config.host == "0.0.0.0"
    assert config.namespace == "ml"
    assert config.policy == "least_load"
    assert config.kv_events is True
    assert config.selector == labels.leader_selector("qwen")
    assert config.leader_label == f"{labels.ROLE}={labels.ROLE_LEADER}"
    assert (config.peer_port, config.peers_from_dns) == (5570, "qwen-router-peers.ml.svc")


def router_config_of(children: list[dict[str, Any]]) -> Any:
    """What `tpuserve router` makes of the rendered args and ConfigMap (its own parser)."""
    import argparse

    from tpuserve_router import cli as router_cli

    (container,) = one(children, "Deployment", "qwen-router")["spec"]["template"]["spec"][
        "containers"
    ]
    parser = argparse.ArgumentParser()
    router_cli.configure(parser)
    with tempfile.TemporaryDirectory() as mounted:  # the peering Secret, as the pod mounts it
        key = Path(mounted) / "key"
        key.write_text(secrets.token_urlsafe(32))
        mount = "--peer-key-file=/etc/tpuserve/peering/key"
        assert mount in container["args"]
        flags = [f"--peer-key-file={key}" if a == mount else a for a in container["args"]]
        args = parser.parse_args(flags)
        env = one(children, "ConfigMap", "qwen-router")["data"]
        return router_cli.build_config(args, environ=dict(env))


def test_unset_policy_and_kv_events_are_left_to_the_router(rendered: RenderFn) -> None:
    """Neither the server nor the operator names a policy: the router's default applies, and
    with it the router's own choice to subscribe to KV events (never restated here)."""
    from tpuserve_router.config import DEFAULT_POLICY, kv_events_enabled
    from tpuserve_router.policies import make_policy

    children = rendered().children
    assert "TPUSERVE_ROUTER_POLICY" not in one(children, "ConfigMap", "qwen-router")["data"]
    config = router_config_of(children)
    assert (config.policy, config.kv_events) == (DEFAULT_POLICY, None)
    assert kv_events_enabled(config.kv_events, make_policy(config.policy))
    assert (
        "TPUSERVE_ROUTER_POLICY"
        not in one(rendered(router_policy="").children, "ConfigMap", "qwen-router")["data"]
    )


@pytest.mark.parametrize(("kv_events", "flag"), [(True, "--kv-events"), (False, "--no-kv-events")])
def test_kv_events_set_on_the_server_are_passed_on(
    rendered: RenderFn, spec_with: SpecWith, kv_events: bool, flag: str
) -> None:
    children = rendered(spec_with(router={"kvEvents": kv_events})).children
    (container,) = one(children, "Deployment", "qwen-router")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["args"][-1] == flag
    assert router_config_of(children).kv_events is kv_events


def test_kv_events_description_names_every_policy_that_uses_them() -> None:
    from tpuserve_operator.api import RouterSpec
    from tpuserve_router.policies import make_policy, registered_policy_names

    description = str(RouterSpec.model_fields["kv_events"].description)
    for name in registered_policy_names():
        assert (name in description) is make_policy(name).uses_kv_events, name


def test_a_multi_host_group_is_pinned_to_one_node_pool_of_its_own(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    user_term = {"labelSelector": {"matchLabels": {"x": "y"}}, "topologyKey": "zone"}
    spec = spec_with(
        template={
            "affinity": {
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [user_term]}
            }
        }
    )
    pod = one(rendered(spec).children, "StatefulSet", "qwen-r1-w")["spec"]["template"]
    assert pod["metadata"]["labels"][labels.SLICE_GROUP] == "qwen-r1"
    affinity = pod["spec"]["affinity"]
    together = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    alone = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert together[0] == user_term
    assert together[1]["topologyKey"] == "cloud.google.com/gke-nodepool"
    assert together[1]["labelSelector"]["matchExpressions"] == [
        {"key": labels.SLICE_GROUP, "operator": "In", "values": ["qwen-r1"]}
    ]
    assert alone[0]["topologyKey"] == "cloud.google.com/gke-nodepool"
    assert {"key": labels.SLICE_GROUP, "operator": "NotIn", "values": ["qwen-r1"]} in alone[0][
        "labelSelector"
    ]["matchExpressions"]


def test_single_host_and_simulated_groups_need_no_pool_affinity(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    single = spec_with(tpu={"generation": "v6e", "topology": "2x4"})
    simulated = spec_with(engine={"type": "simulated"})
    for spec in (single, simulated):
        pod = one(rendered(spec).children, "StatefulSet", "qwen-r0")["spec"]["template"]["spec"]
        assert "podAffinity" not in pod["affinity"]
        assert "podAntiAffinity" not in pod["affinity"]


def test_engines_are_fenced_to_their_routers_peers_prometheus_and_the_operator(
    rendered: RenderFn,
) -> None:
    policy = one(rendered().children, "NetworkPolicy", "qwen-engines")
    spec = policy["spec"]
    engines = labels.engine_selector("qwen")
    assert spec["podSelector"] == {"matchLabels": engines}
    assert spec["policyTypes"] == ["Ingress"]
    own, routers, prometheus = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": engines}}]}  # every port
    assert routers["from"] == [
        {"podSelector": {"matchLabels": labels.router_selector("qwen")}},
        {"podSelector": {"matchLabels": labels.shared_router_selector()}},  # docs/router.md
    ]
    assert [p["port"] for p in routers["ports"]] == [30000, 5557, 5558]
    assert prometheus["from"] == [dict(p) for p in DEFAULT_METRICS_FROM]  # no operator peer
    assert [p["port"] for p in prometheus["ports"]] == [30000]
    assert not by_kind(rendered(network_policy="none").children, "NetworkPolicy")


def test_no_engine_port_is_open_to_a_pod_label_in_any_namespace(rendered: RenderFn) -> None:
    """Issue 57 item 6: the default Prometheus peer is scoped to a namespace: a pod labelled
    prometheus is anyone's to make in their own namespace, and the engines' HTTP port has
    no keys (abort, flush_cache)."""
    ingress = one(rendered().children, "NetworkPolicy", "qwen-engines")["spec"]["ingress"]
    for rule in ingress:
        for peer in rule["from"]:
            assert peer.get("namespaceSelector") != {}, peer


def test_engines_admit_only_the_operator_pods_of_the_operator_namespace(
    rendered: RenderFn,
) -> None:
    policy = one(
        rendered(operator_namespace="tpuserve-system").children, "NetworkPolicy", "qwen-engines"
    )
    *_, readers = policy["spec"]["ingress"]
    operator = readers["from"][-1]
    assert operator == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tpuserve-system"}},
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "tpuserve",
                "app.kubernetes.io/component": "operator",
            }
        },
    }


def test_api_keys_come_from_a_mounted_secret(rendered: RenderFn, spec_with: SpecWith) -> None:
    spec = spec_with(router={"apiKeys": {"secretName": "qwen-keys"}})
    deployment = one(rendered(spec).children, "Deployment", "qwen-router")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--api-keys-file=/etc/tpuserve/api-keys/keys.json" in container["args"]
    assert {"name": "api-keys", "mountPath": "/etc/tpuserve/api-keys", "readOnly": True} in (
        container["volumeMounts"]
    )
    (volume,) = [v for v in pod["volumes"] if v["name"] == "api-keys"]
    assert volume["secret"] == {
        "secretName": "qwen-keys",
        "items": [{"key": "keys.json", "path": "keys.json"}],
    }


# --- several router replicas: defaults, peering, catch-up ---------------------------------


def router_container(children: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(children, "Deployment", "qwen-router")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def flag_values(container: dict[str, Any], flag: str) -> list[str]:
    prefix = f"{flag}="
    return [a.removeprefix(prefix) for a in container["args"] if a.startswith(prefix)]


def test_routers_default_to_several_replicas(rendered: RenderFn) -> None:
    default = RenderConfig().router_replicas
    assert default > 1  # issue 14: N peering replicas route as one does
    assert one(rendered().children, "Deployment", "qwen-router")["spec"]["replicas"] == default


def test_router_replicas_find_and_hear_each_other_on_the_peer_port(rendered: RenderFn) -> None:
    children = rendered().children
    container = router_container(children)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert flag_values(container, "--peer-port") == [str(ports["peers"])]
    assert ports["peer-snapshot"] == ports["peers"] + 1  # where the router answers snapshots
    peers = one(children, "Service", "qwen-router-peers")
    assert flag_values(container, "--peers-from-dns") == ["qwen-router-peers.ml.svc"]
    spec = peers["spec"]
    assert spec["clusterIP"] == "None"  # DNS answers with every pod's address
    assert spec["publishNotReadyAddresses"] is True  # a starting replica is heard at once
    deployment = one(children, "Deployment", "qwen-router")
    assert spec["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"].items() >= spec["selector"].items()
    assert spec["ports"] == [
        {"name": "peers", "port": ports["peers"], "targetPort": "peers", "protocol": "TCP"},
        {"name": "peer-snapshot", "port": ports["peer-snapshot"], "targetPort": "peer-snapshot",
         "protocol": "TCP"},
    ]  # fmt: skip


def test_routers_dial_only_the_pod_network_the_operator_is_given(rendered: RenderFn) -> None:
    """Issue 57 item 3: the operator's --router-worker-networks (chart value
    router.workerNetworks) reaches every router as --worker-networks, which the router's own
    parser takes; a bad network is refused at the operator's start, naming it."""
    import argparse

    from tpuserve_operator.flags import RENDER_FLAGS, add_flags
    from tpuserve_router.cli import build_config, configure
    from tpuserve_router.validation import validate

    parser = argparse.ArgumentParser()
    add_flags(parser, RENDER_FLAGS, RenderConfig())
    given = parser.parse_args(["--router-worker-networks", "10.4.0.0/14, fd00::/8"])
    assert given.router_worker_networks == ("10.4.0.0/14", "fd00::/8")
    with pytest.raises(SystemExit):
        parser.parse_args(["--router-worker-networks", "10.4.0.0/14,pods"])
    container = router_container(
        rendered(router_worker_networks=given.router_worker_networks).children
    )
    assert flag_values(container, "--worker-networks") == ["10.4.0.0/14,fd00::/8"]
    router = argparse.ArgumentParser()
    configure(router)
    flags = [a for a in container["args"] if a.startswith("--worker-networks")]
    config = validate(build_config(router.parse_args(flags), environ={}))
    assert config.worker_networks == ("10.4.0.0/14", "fd00::/8")
    assert not flag_values(router_container(rendered().children), "--worker-networks")


def test_router_replica_count_leaves_the_pod_template_alone(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    """Peering is rendered for one replica too: scaling never rolls the running ones."""

    def template(replicas: int) -> Any:
        spec = spec_with(router={"replicas": replicas})
        return one(rendered(spec).children, "Deployment", "qwen-router")["spec"]["template"]

    assert template(1) == template(4)


def test_only_the_servers_own_routers_reach_the_peer_and_snapshot_ports(rendered: RenderFn) -> None:
    policy = one(rendered().children, "NetworkPolicy", "qwen-router")
    routers = labels.router_selector("qwen")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": routers}
    assert spec["policyTypes"] == ["Ingress"]
    open_ports, peers = spec["ingress"]
    assert "from" not in open_ports  # clients, load balancers and Prometheus, as before
    assert [p["port"] for p in open_ports["ports"]] == [8000, 9000]
    assert peers["from"] == [{"podSelector": {"matchLabels": routers}}]
    assert [p["port"] for p in peers["ports"]] == [5570, 5571]
    assert routers != labels.shared_router_selector()
    assert not by_kind(rendered(network_policy="none").children, "NetworkPolicy")


def test_no_router_no_peering(rendered: RenderFn, spec_with: SpecWith) -> None:
    children = rendered(spec_with(router={"enabled": False})).children
    assert not [c for c in children if c["metadata"]["name"].startswith("qwen-router")]


def test_a_starting_router_takes_its_snapshot_over_peering_with_no_key(
    rendered: RenderFn, spec_with: SpecWith
) -> None:
    """Over peering (the port after the peer port, fenced to the server's routers), not the
    admin route: no key is rendered or mounted for it, with or without API keys."""
    for spec in (spec_with(), spec_with(router={"apiKeys": {"secretName": "qwen-keys"}})):
        children = rendered(spec).children
        assert "--kv-snapshot" not in " ".join(router_container(children)["args"])
        pod = one(children, "Deployment", "qwen-router")["spec"]["template"]["spec"]
        for volume in pod["volumes"]:
            if volume["name"] == "api-keys":
                assert volume["secret"]["items"] == [{"key": "keys.json", "path": "keys.json"}]


def test_the_admin_key_field_is_gone(rendered: RenderFn, spec_with: SpecWith) -> None:
    spec = spec_with(router={"apiKeys": {"secretName": "qwen-keys", "adminKey": "peer-key"}})
    with pytest.raises(InvalidSpec, match="adminKey"):
        rendered(spec)
