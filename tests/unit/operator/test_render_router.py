"""Render: the router of one server: its command line and config (which the router itself
accepts), resources and buffer budget, the peering secret, its replicas (spread, peering,
catch-up, the pod network they dial) and the API keys' secret."""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.unit.operator.conftest import RenderFn, SpecWith, by_kind, one
from tpuserve_operator import labels
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.render import RenderConfig
from tpuserve_operator.render.context import DEFAULT_ROUTER_RESOURCES

pytestmark = pytest.mark.unit


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
