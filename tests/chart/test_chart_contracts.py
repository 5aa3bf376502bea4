"""What the chart says about other parts is true of those parts: the operator's container
arguments parse with the real `tpuserve operator` command line, the chart's monitors select the
pods and ports the operator renders (`tpuserve render`), and the examples render."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import tpuserve_operator.cli as operator_cli
from tests.chart.chart_helpers import CHART, VALUES_DIR, Render
from tpuserve import cli
from tpuserve_operator import labels
from tpuserve_operator.render.context import (
    DEFAULT_METRICS_FROM,
    DEFAULT_ROUTER_RESOURCES,
    RenderConfig,
)
from tpuserve_router.config import DEFAULT_POLICY
from tpuserve_router.policies import registered_policy_names

pytestmark = pytest.mark.component

VALUES_FILES = sorted(VALUES_DIR.glob("*.yaml"))
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def parse_like_the_image(
    args: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    """Run the image's entrypoint (`tpuserve`, tpuserve.cli.main) on `args` up to the point
    where the subcommand would start, and return what it parsed."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parsed: list[argparse.Namespace] = []

    def capture(namespace: argparse.Namespace) -> int:
        parsed.append(namespace)
        return 0

    monkeypatch.setattr(operator_cli, "run", capture)
    assert cli.main(args) == 0
    (namespace,) = parsed
    return namespace


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_operator_arguments_parse_with_the_real_cli(
    render: Render, values: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render([values])
    container = operator_container(objects)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    args = parse_like_the_image(container["args"], env, monkeypatch)
    options = operator_cli.options_from(args)  # also checks the router resources JSON
    chart_values = yaml.safe_load(values.read_text()) or {}
    watched = (chart_values.get("operator") or {}).get("watchNamespaces") or []
    assert list(options.namespaces) == watched
    assert options.standalone is ((chart_values.get("operator") or {}).get("replicas", 1) == 1)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert options.metrics_port == ports["metrics"]
    assert options.liveness_port == ports["health"]
    assert options.reconciler.render.router_resources == json.loads(
        env[operator_cli.ROUTER_RESOURCES_ENV]
    )
    router_values = chart_values.get("router") or {}
    assert options.reconciler.render.router_policy == (router_values.get("policy") or None)
    assert options.reconciler.render.router_replicas == router_values.get(
        "replicas", RenderConfig().router_replicas
    )
    fence = chart_values.get("networkPolicy") or {}
    settings = options.reconciler.render
    assert settings.network_policy == ("engines" if fence.get("enabled", True) else "none")
    assert list(settings.metrics_from) == (fence.get("metricsFrom") or list(DEFAULT_METRICS_FROM))


def test_the_charts_router_defaults_are_the_operators() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["router"]["resources"] == DEFAULT_ROUTER_RESOURCES
    assert values["router"]["replicas"] == RenderConfig().router_replicas


def test_options_before_the_subcommand_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """The bug this file guards against: `tpuserve --log-level=info operator`."""
    assert cli.main(["--log-level=info", "operator"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_values_schema_offers_exactly_the_routers_policies() -> None:
    """Plus "" (the default): the router's own default policy."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["router"]["properties"]["policy"]["enum"]
    assert sorted(enum) == sorted(["", *registered_policy_names()])


def test_the_default_policy_is_the_routers_own() -> None:
    """The chart names no policy, so the operator renders none and the router's default
    applies; the values comment names that default, and this keeps it true."""
    values = (CHART / "values.yaml").read_text()
    assert (yaml.safe_load(values).get("router") or {}).get("policy") == ""
    prose = " ".join(values.replace("#", " ").split())
    assert f"Empty: the router's own default (`{DEFAULT_POLICY}`" in prose


def render_server(path: Path, *flags: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tpuserve", "render", "-f", str(path), *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def pod_templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod template the operator renders (StatefulSets, Deployments, LWS leader and
    worker templates)."""
    out = []
    for obj in objects:
        spec = obj.get("spec") or {}
        if "template" in spec:
            out.append(spec["template"])
        lws = spec.get("leaderWorkerTemplate") or {}
        out += [lws[k] for k in ("leaderTemplate", "workerTemplate") if k in lws]
    return out


def selected(templates: list[dict[str, Any]], match: dict[str, str]) -> list[dict[str, Any]]:
    return [t for t in templates if match.items() <= t["metadata"]["labels"].items()]


def port_names(template: dict[str, Any]) -> set[str]:
    return {p["name"] for c in template["spec"]["containers"] for p in c.get("ports") or []}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("workload", ["statefulset", "leaderworkerset"])
def test_chart_monitors_select_the_pods_and_ports_the_operator_renders(
    render: Render, example: Path, workload: str
) -> None:
    flags = ["--prometheus-operator"] + (["--leaderworkerset"] if workload != "statefulset" else [])
    rendered = render_server(example, *flags)
    templates = pod_templates(rendered)
    monitors = {
        o["metadata"]["name"].removeprefix("tpuserve-"): o["spec"]
        for o in render()
        if o["kind"] == "PodMonitor"
    }
    engine = monitors["model-server"]
    leaders = selected(templates, engine["selector"]["matchLabels"])
    assert leaders, "the model-server PodMonitor selects no pod the operator renders"
    for template in leaders:
        assert template["metadata"]["labels"][labels.ROLE] == labels.ROLE_LEADER
        assert engine["podMetricsEndpoints"][0]["port"] in port_names(template)
        for label in engine["podTargetLabels"]:
            assert template["metadata"]["labels"][label], label
    workers = [t for t in templates if t not in leaders]
    assert all(t["metadata"]["labels"].get(labels.ROLE) != labels.ROLE_LEADER for t in workers)
    router = monitors["router"]
    routers = selected(templates, router["selector"]["matchLabels"])
    assert routers, "the router PodMonitor selects no pod the operator renders"
    for template in routers:
        assert router["podMetricsEndpoints"][0]["port"] in port_names(template)
    # The operator's own per-server monitors default to off, so nothing is scraped twice.
    assert not [o for o in rendered if o["kind"] in ("PodMonitor", "ServiceMonitor")]


def test_the_operator_service_monitor_selects_the_operator_service(render: Render) -> None:
    objects = render()
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    service_labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    # The ServiceMonitor's job label is the Service name; dashboards select job=~".*operator".
    assert service["metadata"]["name"].endswith("operator")
    container = operator_container(objects)
    assert service["spec"]["selector"].items() <= (
        next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["metadata"][
            "labels"
        ].items()
    )
    assert "metrics" in {p["name"] for p in container["ports"]}


def test_the_examples_are_a_simulated_and_a_v6e_4x4_server() -> None:
    specs = {p.stem: yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES}
    assert specs["simulated"]["engine"]["type"] == "simulated"
    tpu = specs["v6e-4x4-qwen3-8b"]["tpu"]
    assert (tpu["generation"], tpu["topology"]) == ("v6e", "4x4")
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "examples/simulated.yaml" in notes


def test_a_simulated_example_requests_no_tpu() -> None:
    rendered = render_server(CHART / "examples" / "simulated.yaml")
    for template in pod_templates(rendered):
        for container in template["spec"]["containers"]:
            resources = container.get("resources") or {}
            assert "google.com/tpu" not in (resources.get("limits") or {})
        assert not template["spec"].get("nodeSelector")
