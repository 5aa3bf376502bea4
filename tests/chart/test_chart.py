"""The chart lints strictly, renders valid Kubernetes objects for every supported mode, and
rejects bad values with a message naming the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sglang_tpu.metric_names import restore_sglang_colon_relabeling
from sglang_tpu.topology import generation_names
from tests.chart.chart_helpers import (
    ADMISSION_POLICY_API,
    CHART,
    MONITORING_APIS,
    VALUES_DIR,
    Render,
    run_helm,
)
from tests.chart.monitoring_schemas import SCHEMAS
from tpuserve_operator import labels
from tpuserve_operator.build import admission
from tpuserve_operator.render import inference_pool as pools

pytestmark = pytest.mark.component

KUBERNETES_VERSION = "1.35"
VALUES_FILES = sorted(VALUES_DIR.glob("*.yaml"))
MONITORING_KINDS = {kind for _, kind in SCHEMAS}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def operator_args(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = by_kind(objects, "Deployment")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_helm_lint_strict_passes(helm: Path, values: Path) -> None:
    done = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(values))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_every_rendered_object_validates(render: Render, values: Path) -> None:
    objects = render([values], include_crds=True)
    assert objects
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if key in SCHEMAS:
            jsonschema.validate(obj, SCHEMAS[key])
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_defaults_render_prometheus_operator_objects(render: Render) -> None:
    objects = render()
    kinds = [o["kind"] for o in objects]
    assert kinds.count("PodMonitor") == 3  # model servers, routers, TPU device plugin
    assert kinds.count("ServiceMonitor") == 1
    assert kinds.count("PrometheusRule") == 1
    assert not {"PodMonitoring", "ClusterPodMonitoring", "ClusterRules"} & set(kinds)
    model_monitor = next(
        o for o in by_kind(objects, "PodMonitor") if "model-server" in o["metadata"]["name"]
    )
    assert model_monitor["spec"]["namespaceSelector"] == {"any": True}
    assert model_monitor["spec"]["podTargetLabels"] == [
        labels.MODEL,
        labels.TPU_GENERATION,
        labels.TPU_TOPOLOGY,
    ]
    assert model_monitor["spec"]["selector"]["matchLabels"] == {
        labels.NAME: labels.PART_OF_VALUE,
        labels.COMPONENT: labels.COMPONENT_MODEL_SERVER,
        labels.ROLE: labels.ROLE_LEADER,
    }
    # SGLang's escaped `sglang_` names get their colon back first, as the one rule says.
    (endpoint,) = model_monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["metricRelabelings"] == [restore_sglang_colon_relabeling()]
    router_monitor = next(
        o for o in by_kind(objects, "PodMonitor") if "router" in o["metadata"]["name"]
    )
    assert "metricRelabelings" not in router_monitor["spec"]["podMetricsEndpoints"][0]


def test_user_metric_relabelings_come_after_the_sglang_colon_rule(
    render: Render, tmp_path: Path
) -> None:
    drop = {"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"monitoring": {"metricRelabelings": [drop]}}))
    objects = render([values])
    model_monitor = next(
        o for o in by_kind(objects, "PodMonitor") if "model-server" in o["metadata"]["name"]
    )
    endpoint = model_monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["metricRelabelings"] == [restore_sglang_colon_relabeling(), drop]
    router_monitor = next(
        o for o in by_kind(objects, "PodMonitor") if "router" in o["metadata"]["name"]
    )
    assert router_monitor["spec"]["podMetricsEndpoints"][0]["metricRelabelings"] == [drop]
    (operator_monitor,) = by_kind(objects, "ServiceMonitor")
    assert operator_monitor["spec"]["endpoints"][0]["honorLabels"] is True
    args = operator_args(objects)
    assert "--all-namespaces" in args
    assert "--standalone" in args
    assert not by_kind(objects, "Role")
    assert not by_kind(objects, "PodDisruptionBudget")


def test_prometheus_rule_holds_generated_groups_and_prices(render: Render) -> None:
    (rule,) = by_kind(render(), "PrometheusRule")
    groups = {g["name"]: g for g in rule["spec"]["groups"]}
    generated = yaml.safe_load((CHART / "rules" / "tpuserve.rules.yaml").read_text())["groups"]
    for group in generated:
        assert groups[group["name"]] == group
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    prices = {r["labels"]["tpu_generation"]: r["expr"] for r in groups["tpuserve.prices"]["rules"]}
    assert prices == {p["generation"]: f"vector({p['usdPerChipHour']})" for p in values["pricing"]}


def test_monitors_are_skipped_and_notes_warn_without_the_crds(helm: Path, render: Render) -> None:
    objects = render(api_versions=())
    assert not MONITORING_KINDS & {o["kind"] for o in objects}
    done = run_helm(helm, "install", "tpuserve", str(CHART), "--dry-run=client", "--namespace", "x")
    assert done.returncode == 0, done.stderr
    assert "NO monitors or rules were created" in done.stdout


def test_release_label_reaches_every_monitoring_object(render: Render) -> None:
    objects = render([VALUES_DIR / "namespaced.yaml"])
    monitoring = [o for o in objects if o["kind"] in MONITORING_KINDS]
    assert len(monitoring) == 5
    for obj in monitoring:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_namespace_scoped_mode_grants_roles_per_namespace_only(render: Render) -> None:
    objects = render([VALUES_DIR / "namespaced.yaml"])
    roles = by_kind(objects, "Role")
    assert sorted(
        r["metadata"]["namespace"] for r in roles if "operator" in r["metadata"]["name"]
    ) == ["team-a", "team-b"]
    (cluster_role,) = [
        r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("-operator")
    ]
    namespaced_resources = {res for rule in roles[0]["rules"] for res in rule["resources"]}
    cluster_resources = {res for rule in cluster_role["rules"] for res in rule["resources"]}
    assert not namespaced_resources & cluster_resources  # no cluster-wide access to workloads
    cluster_verbs = {verb for rule in cluster_role["rules"] for verb in rule["verbs"]}
    assert cluster_verbs <= {"get", "list", "watch"}  # no cluster-wide write at all
    (everywhere,) = [
        r for r in by_kind(render(), "ClusterRole") if r["metadata"]["name"].endswith("-operator")
    ]
    assert "clusterkopfpeerings" in {
        res for rule in everywhere["rules"] for res in rule["resources"]
    }
    assert "statefulsets" in namespaced_resources
    args = operator_args(objects)
    assert "--namespace=team-a" in args
    assert "--namespace=team-b" in args
    assert "--peering=tpuserve" in args
    assert "--all-namespaces" not in args
    (pdb,) = by_kind(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    monitor = next(o for o in by_kind(objects, "PodMonitor") if "router" in o["metadata"]["name"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_operator_pod_is_locked_down(render: Render) -> None:
    (deployment,) = by_kind(render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "health"
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]


def test_gmp_mode_renders_managed_prometheus_objects(render: Render) -> None:
    objects = render([VALUES_DIR / "gmp.yaml"])
    kinds = {o["kind"] for o in objects}
    assert {"ClusterPodMonitoring", "PodMonitoring", "ClusterRules"} <= kinds
    assert not {"PodMonitor", "ServiceMonitor", "PrometheusRule"} & kinds
    model = next(
        o
        for o in by_kind(objects, "ClusterPodMonitoring")
        if "model-server" in o["metadata"]["name"]
    )
    assert model["spec"]["targetLabels"]["fromPod"] == [
        {"from": "model", "to": "model"},
        {"from": "tpu-generation", "to": "tpu_generation"},
        {"from": "tpu-topology", "to": "tpu_topology"},
    ]
    (rules,) = by_kind(objects, "ClusterRules")
    alerts = [r for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    assert all(a["labels"]["team"] == "ml-platform" and a["labels"]["severity"] for a in alerts)


def test_dashboards_ship_as_labelled_configmaps(render: Render) -> None:
    objects = render([VALUES_DIR / "gmp.yaml"])
    maps = [o for o in by_kind(objects, "ConfigMap") if "-dashboard-" in o["metadata"]["name"]]
    files = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    assert sorted(k for m in maps for k in m["data"]) == files
    assert len(files) == 7
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
        (body,) = cm["data"].values()
        assert json.loads(body)["uid"]


def test_monitoring_off_renders_no_monitoring_objects(render: Render) -> None:
    objects = render([VALUES_DIR / "monitoring-off.yaml"])
    assert not MONITORING_KINDS & {o["kind"] for o in objects}
    assert not [o for o in by_kind(objects, "ConfigMap") if "-dashboard-" in o["metadata"]["name"]]


def test_crds_come_from_the_operator_and_the_test_hook_checks_routers(render: Render) -> None:
    objects = render(include_crds=True)
    crds = {o["metadata"]["name"] for o in by_kind(objects, "CustomResourceDefinition")}
    assert f"{labels.PLURAL}.{labels.GROUP}" in crds
    assert f"{labels.GATEWAY_PLURAL}.{labels.GROUP}" in crds
    (pod,) = by_kind(objects, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["containers"][0]["command"] == ["python", "/scripts/check_routers.py"]


def test_admission_policy_ships_the_generated_policy_bound_to_its_parameters(
    render: Render,
) -> None:
    objects = render(namespace="ml-system")
    (policy,) = by_kind(objects, "ValidatingAdmissionPolicy")
    (binding,) = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    (parameters,) = [
        o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-admission")
    ]
    assert policy["spec"] == admission.policy_spec()
    # and what the chart saw of the cluster: no InferencePool API (render/inference_pool.py)
    assert parameters["data"] == {**admission.parameters(), pools.CLUSTER_PARAM: "false"}
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["paramRef"] == {
        "name": parameters["metadata"]["name"],
        "namespace": "ml-system",
        "parameterNotFoundAction": "Allow",
    }


def test_admission_parameters_say_when_the_cluster_serves_inference_pools(
    render: Render,
) -> None:
    pool_api = f"{pools.GROUP_VERSION}/{pools.KIND}"
    objects = render(api_versions=(*MONITORING_APIS, ADMISSION_POLICY_API, pool_api))
    (parameters,) = [
        o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-admission")
    ]
    assert parameters["data"][pools.CLUSTER_PARAM] == "true"


@pytest.mark.parametrize(
    ("sets", "api_versions"),
    [(["admissionPolicy.enabled=false"], None), ([], MONITORING_APIS)],
    ids=["disabled", "api-not-served"],
)
def test_no_admission_policy_when_disabled_or_not_served(
    render: Render, sets: list[str], api_versions: tuple[str, ...] | None
) -> None:
    kwargs: dict[str, Any] = {"sets": sets}
    if api_versions is not None:
        kwargs["api_versions"] = api_versions
    kinds = {o["kind"] for o in render(**kwargs)}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


BAD_VALUES = [
    ("operator.replicas=0", "/operator/replicas"),
    ("monitoring.backend=prometheus", "/monitoring/backend"),
    ("monitoring.scrapeInterval=15 seconds", "/monitoring/scrapeInterval"),
    ("router.policy=fastest", "/router/policy"),
    ("operator.watchNamespaces[0]=Team_A", "/operator/watchNamespaces/0"),
    ("pricing[0].generation=v9", "/pricing/0/generation"),
    ("tests.routerUrls[0]=router:8000", "/tests/routerUrls/0"),
    ("router.workerNetworks[0]=pods", "/router/workerNetworks/0"),
    ("operator.replica=2", "additional properties 'replica' not allowed"),
]


@pytest.mark.parametrize(("setting", "named"), BAD_VALUES, ids=[s for s, _ in BAD_VALUES])
def test_bad_values_are_rejected_naming_the_value(helm: Path, setting: str, named: str) -> None:
    done = run_helm(helm, "template", "tpuserve", str(CHART), "--set", setting)
    assert done.returncode != 0
    assert named in done.stderr


def test_a_generation_priced_twice_is_rejected(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "prices.yaml"
    entry = {"generation": "v6e", "pricing": "on_demand", "usdPerChipHour": 2.7}
    values.write_text(yaml.safe_dump({"pricing": [entry, {**entry, "pricing": "spot"}]}))
    args = ["template", "tpuserve", str(CHART), "--values", str(values)]
    done = run_helm(helm, *args, "--api-versions", MONITORING_APIS[0])
    assert done.returncode != 0
    assert 'generation "v6e" is listed twice' in done.stderr


def test_schema_knows_exactly_the_catalog_generations() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["pricing"]["items"]["properties"]["generation"]["enum"]
    assert enum == generation_names()


def test_keda_prometheus_url_reaches_the_operator_and_it_may_manage_scaled_objects(
    render: Render, tmp_path: Path
) -> None:
    values = tmp_path / "keda.yaml"
    values.write_text(yaml.safe_dump({"keda": {"prometheusUrl": "http://prom.obs:9090"}}))
    objects = render([values])
    assert "--keda-prometheus-url=http://prom.obs:9090" in operator_args(objects)
    (role,) = [
        r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("-operator")
    ]
    (keda,) = [rule for rule in role["rules"] if rule["apiGroups"] == ["keda.sh"]]
    assert keda["resources"] == ["scaledobjects"]  # not ScaledJobs nor TriggerAuthentications
    default = operator_args(render())
    assert "--keda-prometheus-url=http://prometheus-operated.monitoring.svc:9090" in default


def test_the_pod_network_reaches_the_operator_for_its_routers(
    render: Render, tmp_path: Path
) -> None:
    """router.workerNetworks becomes the operator's --router-worker-networks (its routers'
    --worker-networks, issue 57 item 3); unset, no flag: the router's own default."""
    values = tmp_path / "networks.yaml"
    values.write_text(yaml.safe_dump({"router": {"workerNetworks": ["10.4.0.0/14", "fd00::/8"]}}))
    assert "--router-worker-networks=10.4.0.0/14,fd00::/8" in operator_args(render([values]))
    assert not [a for a in operator_args(render()) if a.startswith("--router-worker-networks")]
