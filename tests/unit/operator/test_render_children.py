"""Render: the children of one server, their wiring (selectors, owners, secrets, security),
and validity against the Kubernetes schemas."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from sglang_tpu.metric_names import restore_sglang_colon_relabeling
from tests.unit.operator.conftest import RenderFn, SpecWith, by_kind, one, pod_templates
from tpuserve_operator import labels
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import RenderConfig, render, validate_server
from tpuserve_operator.render.context import DEFAULT_METRICS_FROM

pytestmark = pytest.mark.unit


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
