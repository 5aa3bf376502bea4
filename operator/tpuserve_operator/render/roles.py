"""A disaggregated server's replica groups (`tpuserve_operator.disaggregation`): each
group rendered from its role's spec, its pods labelled with the role, the prefill's
bootstrap port advertised, both roles preferring one zone; and the TPUModelServerRole of each
autoscaled role (`role_scale`), the object its HorizontalPodAutoscaler scales."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sglang_tpu import disaggregation as pd
from sglang_tpu.topology import lookup
from tpuserve_operator import disaggregation, labels
from tpuserve_operator.errors import Problem
from tpuserve_operator.render.context import Manifest, RenderConfig, Server, ValidServer
from tpuserve_operator.render.pod import ENGINE_CONTAINER
from tpuserve_operator.render.workload import check_group_contract, engine_templates, group_children
from tpuserve_operator.validation import ValidSpec

ZONE_KEY = "topology.kubernetes.io/zone"
BOOTSTRAP_PORT_NAME = "pd-bootstrap"


def role_server(server: Server, role: str) -> ValidServer:
    """The server as one role's replica groups see it: the role's spec and slice, and the
    launch contract that gives (InvalidSpec when the contract refuses it)."""
    spec = disaggregation.role_spec(server.valid.spec, role)
    shape = lookup(spec.tpu.generation, spec.tpu.topology)
    valid = ValidSpec(spec=spec, shape=shape, served_name=server.valid.served_name)
    base = Server(
        name=server.name, namespace=server.namespace, valid=valid, config=server.config,
        uid=server.uid, restarted_at=server.restarted_at, pd_role=role,
    )  # fmt: skip
    return ValidServer(
        name=base.name, namespace=base.namespace, valid=valid, config=base.config,
        uid=base.uid, restarted_at=base.restarted_at, pd_role=role,
        contract=check_group_contract(base),
    )  # fmt: skip


def templates(server: ValidServer, role: str) -> list[Manifest]:
    """One role's pod templates, as its group 0 has them (what the role's revision hashes)."""
    role_templates = engine_templates(role_server(server, role), 0)
    return [_marked(t, role, server.valid.spec, server.name) for t in role_templates]


def group(server: ValidServer, view: ValidServer, index: int, revision: str) -> list[Manifest]:
    """Group ``index`` of a role of a disaggregated server, as the role renders it
    (``view``: `role_server`'s view of the role)."""
    role = view.pd_role
    assert role is not None
    manifests = group_children(view, index, revision)
    for manifest in manifests:
        manifest["metadata"].setdefault("labels", {})[pd.PD_ROLE_LABEL] = role
        for template in _pod_templates(manifest):
            _marked(template, role, server.valid.spec, server.name)
    return manifests


def _pod_templates(manifest: Manifest) -> Iterator[Manifest]:
    spec = manifest.get("spec") or {}
    if manifest.get("kind") == "LeaderWorkerSet":
        lws = spec["leaderWorkerTemplate"]
        yield lws["leaderTemplate"]
        if lws["workerTemplate"] is not lws["leaderTemplate"]:
            yield lws["workerTemplate"]
    elif manifest.get("kind") == "StatefulSet":
        yield spec["template"]


def _marked(template: Manifest, role: str, spec: Any, name: str) -> Manifest:
    """``template`` with its role and pairing-contract labels, the prefill's bootstrap port
    (annotation, container port) and a preference for the zone of the server's other engine
    pods."""
    meta = template.setdefault("metadata", {})
    meta.setdefault("labels", {})[pd.PD_ROLE_LABEL] = role
    image = next(
        c["image"] for c in template["spec"]["containers"] if c["name"] == ENGINE_CONTAINER
    )
    meta["labels"][pd.PD_CONTRACT_LABEL] = disaggregation.pairing_contract(spec, image)
    leader = meta["labels"].get(labels.ROLE) == labels.ROLE_LEADER
    if role == disaggregation.PREFILL:
        port = spec.disaggregation.bootstrap_port
        if leader:
            meta.setdefault("annotations", {})[pd.BOOTSTRAP_PORT_ANNOTATION] = str(port)
        for container in template["spec"]["containers"]:
            if leader and container.get("ports"):
                container["ports"].append(
                    {"name": BOOTSTRAP_PORT_NAME, "containerPort": port, "protocol": "TCP"}
                )
    affinity = template["spec"].setdefault("affinity", {})
    preferred = affinity.setdefault("podAffinity", {}).setdefault(
        "preferredDuringSchedulingIgnoredDuringExecution", []
    )
    preferred.append(
        {
            "weight": 100,
            "podAffinityTerm": {
                "topologyKey": ZONE_KEY,
                "labelSelector": {"matchLabels": labels.engine_selector(name)},
            },
        }
    )
    return template


NO_ROLE_CRD = (
    f"needs the {labels.ROLE_KIND} API ({labels.ROLE_PLURAL}.{labels.GROUP}), which this "
    "cluster does not serve: `helm upgrade` does not install a chart's new CRDs; allowed: "
    "that CRD installed (`kubectl apply --server-side -f` the chart's crds/), or the role "
    "without autoscaling"
)


def role_scale_problems(spec: Any, config: RenderConfig) -> list[Problem]:
    """An autoscaled role on a cluster without the TPUModelServerRole CRD: its HPA would
    have no object to scale."""
    if config.role_scales:
        return []
    return [
        Problem(f"spec.disaggregation.{role}.autoscaling", NO_ROLE_CRD)
        for role in disaggregation.autoscaled_roles(spec)
    ]


def role_scale_name(server_name: str, role: str) -> str:
    """The TPUModelServerRole (and HorizontalPodAutoscaler) of an autoscaled role."""
    return f"{server_name}-{role}"


def role_selector(server_name: str, role: str) -> dict[str, str]:
    """The role's leader pods: the scale subresource's selector, so the HPA's Pods metrics
    average over that role's leaders only."""
    return {**labels.leader_selector(server_name), pd.PD_ROLE_LABEL: role}


def role_scales(server: Server) -> list[Manifest]:
    """A TPUModelServerRole per autoscaled role. Without spec.replicas: the operator sets it
    once, when it creates the object (`with_replicas`), then only its HPA (or kubectl scale)
    does, so applying this never takes the count back."""
    return [
        {
            "apiVersion": labels.API_VERSION,
            "kind": labels.ROLE_KIND,
            "metadata": server.metadata(
                role_scale_name(server.name, role),
                labels.COMPONENT_MODEL_SERVER,
                {pd.PD_ROLE_LABEL: role},
            ),
            "spec": {"role": role},
        }
        for role in disaggregation.autoscaled_roles(server.valid.spec)
    ]


def with_replicas(manifest: Manifest, replicas: int) -> Manifest:
    """A TPUModelServerRole manifest as the operator creates it: with its first count."""
    return {**manifest, "spec": {**manifest["spec"], "replicas": replicas}}
