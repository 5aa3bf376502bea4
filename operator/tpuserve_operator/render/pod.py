"""The engine pod template: one host of a replica group's slice.

TPU facts come from the topology catalog (node selectors, the google.com/tpu toleration,
`google.com/tpu` = chips of one host on every host pod); the launch contract comes from
`launch_contract`. Only the leader (host 0) serves HTTP, so only it has ports and probes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sglang_tpu.contract.group_contract import GroupContract
from sglang_tpu.contract.pod_env import FieldRef
from sglang_tpu.model_source import parse_model_source, pvc_mount_path
from sglang_tpu.topology import (
    NODE_POOL_LABEL,
    RESERVATION_LABEL,
    SPOT_LABEL,
    TPU_RESOURCE,
    TPU_TAINT_EFFECT,
    TPU_TAINT_KEY,
)
from tpuserve_operator import labels, launch_contract, node_signals
from tpuserve_operator.api import TPU_ENGINE_TYPES, CompileCacheSpec
from tpuserve_operator.engine_resources import engine_requirements
from tpuserve_operator.errors import InvalidSpec, Problem
from tpuserve_operator.render.context import RUN_AS_USER, Manifest, Server

ENGINE_CONTAINER = "engine"
ENGINE_COMMAND = ["tpuserve", "engine", "launch"]
HEALTH_PATH = "/health"
# TorchTPU's handshake on the leader (MASTER_ADDR), pinned by the launch contract.
TORCH_TPU_HANDSHAKE_PORT = int(GroupContract.model_fields["torch_tpu_handshake_port"].default)

# GKE's Cloud Storage FUSE CSI driver: its name, and the pod annotation that has GKE inject
# its sidecar (cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver).
GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCS_FUSE_ANNOTATION = "gke-gcsfuse/volumes"

CACHE_ROOT = "/var/cache/tpuserve"
WEIGHTS_DIR = f"{CACHE_ROOT}/weights"
COMPILE_CACHE_DIR = f"{CACHE_ROOT}/xla"


@dataclass(frozen=True, slots=True)
class Termination:
    """How a pod stops: preStop pause (routers drop the terminating leader first), engine
    drain (requests in flight finish), kill deadline. One source: router.maxRequestSeconds.

    A Spot VM gets 30 s notice of preemption and the kubelet's graceful node shutdown caps
    every pod's grace then (docs/operator.md, "Maintenance and spot"), so a long grace costs
    nothing there; spot pods pause shorter to leave more of that window for the drain.
    """

    grace_seconds: int
    pre_stop_seconds: int
    drain_seconds: float


PRE_STOP_SECONDS = {"on-demand": 5, "spot": 2}
KILL_MARGIN_SECONDS = 5


# How long a leader may take to become healthy before Kubernetes restarts it: weights
# download plus XLA compilation (10-30 minutes on a first compile; 1-3 with a cache).
STARTUP_BUDGET_SECONDS = {"compiled": 3600, "eager": 1800, "simulated": 600}
STARTUP_PERIOD_SECONDS = 10


def termination(server: Server) -> Termination:
    spec = server.valid.spec
    pause = PRE_STOP_SECONDS["spot" if spec.tpu.spot else "on-demand"]
    drain = spec.router.max_request_seconds
    return Termination(pause + drain + KILL_MARGIN_SECONDS, pause, float(drain))


def startup_budget_seconds(server: Server) -> int:
    spec = server.valid.spec
    if spec.engine.type == "simulated":
        return STARTUP_BUDGET_SECONDS["simulated"]
    return STARTUP_BUDGET_SECONDS[
        "compiled" if spec.engine.execution_mode == "compiled" else "eager"
    ]


def engine_image(server: Server) -> str:
    spec = server.valid.spec
    if spec.engine.image:
        return spec.engine.image
    return {
        "sglang": server.config.engine_image,
        "sglang-jax": server.config.sglang_jax_engine_image,
    }.get(spec.engine.type, server.config.router_image)


def pod_labels(server: Server, replica: int, role: str, revision: str) -> dict[str, str]:
    spec = server.valid.spec
    return {
        **spec.template.labels,
        **labels.common(server.name, labels.COMPONENT_MODEL_SERVER),
        labels.MODEL: server.valid.served_name,
        labels.TPU_GENERATION: spec.tpu.generation,
        labels.TPU_TOPOLOGY: spec.tpu.topology,
        labels.REPLICA: str(replica),
        labels.SLICE_GROUP: server.group_name(replica),
        labels.ROLE: role,
        labels.REVISION: revision,
    }


def pod_annotations(server: Server) -> dict[str, str]:
    annotations = dict(server.valid.spec.template.annotations)
    cache = server.valid.spec.engine.compile_cache
    if cache is not None and cache.gcs is not None:
        annotations[GCS_FUSE_ANNOTATION] = "true"  # GKE injects the FUSE sidecar
    if server.restarted_at:
        annotations[labels.RESTARTED_AT] = server.restarted_at
    return annotations


def _node_placement(server: Server) -> tuple[dict[str, str], list[dict[str, Any]]]:
    spec = server.valid.spec
    selector: dict[str, str] = {}
    tolerations: list[dict[str, Any]] = []
    if spec.engine.type in TPU_ENGINE_TYPES:
        selector |= server.valid.shape.node_selector()
        # Exists, not Equal: GKE's taint value is not part of any contract we rely on.
        tolerations.append({"key": TPU_TAINT_KEY, "operator": "Exists", "effect": TPU_TAINT_EFFECT})
        if spec.tpu.spot:
            selector[SPOT_LABEL] = "true"
            tolerations.append({"key": SPOT_LABEL, "operator": "Exists", "effect": "NoSchedule"})
        if spec.tpu.reservation:
            selector[RESERVATION_LABEL] = spec.tpu.reservation
    selector |= spec.template.node_selector
    tolerations += spec.template.tolerations
    return selector, tolerations


def _avoid_maintenance(affinity: dict[str, Any]) -> dict[str, Any]:
    """Prefer nodes without announced maintenance, so a group moved off one (`node_signals`)
    lands elsewhere when it can; preferred, not required, so a fleet whose every node has
    maintenance scheduled still runs."""
    avoid = {
        "weight": 100,
        "preference": {
            "matchExpressions": [
                {"key": node_signals.MAINTENANCE_TIME_LABEL, "operator": "DoesNotExist"},
                {"key": node_signals.ACTIVE_MAINTENANCE_LABEL, "operator": "DoesNotExist"},
            ]
        },
    }
    out = dict(affinity)
    section = dict(out.get("nodeAffinity") or {})
    preferred = list(section.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    section["preferredDuringSchedulingIgnoredDuringExecution"] = [*preferred, avoid]
    out["nodeAffinity"] = section
    return out


def _affinity(server: Server, replica: int) -> dict[str, Any]:
    """A multi-host group is one slice, and a GKE slice is one node pool: require every pod
    of the group in the same pool, and no pod of another group there (the user's affinity
    terms are kept beside these). Every engine pod avoids nodes with announced maintenance."""
    spec = server.valid.spec
    user = _avoid_maintenance(dict(spec.template.affinity or {}))
    if spec.engine.type not in TPU_ENGINE_TYPES or not server.valid.shape.multi_host:
        return user
    group = server.group_name(replica)
    together = {
        "labelSelector": {
            "matchExpressions": [{"key": labels.SLICE_GROUP, "operator": "In", "values": [group]}]
        },
        "topologyKey": NODE_POOL_LABEL,
    }
    alone = {
        "labelSelector": {
            "matchExpressions": [
                {"key": labels.SLICE_GROUP, "operator": "Exists"},
                {"key": labels.SLICE_GROUP, "operator": "NotIn", "values": [group]},
            ]
        },
        "topologyKey": NODE_POOL_LABEL,
    }
    out = dict(user)
    for kind, term in (("podAffinity", together), ("podAntiAffinity", alone)):
        section = dict(out.get(kind) or {})
        required = list(section.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        section["requiredDuringSchedulingIgnoredDuringExecution"] = [*required, term]
        out[kind] = section
    return out


def _resources(server: Server) -> dict[str, Any]:
    """google.com/tpu = the chips of one host; cpu and memory from `engine_resources`."""
    spec = server.valid.spec
    on_tpu = spec.engine.type in TPU_ENGINE_TYPES
    machine = server.valid.shape.machine if on_tpu else None
    requests, limits = engine_requirements(spec.engine.resources, machine)
    if on_tpu:
        chips = str(server.valid.shape.chips_per_host)
        requests[TPU_RESOURCE] = chips
        limits[TPU_RESOURCE] = chips
    out: dict[str, Any] = {
        k: v for k, v in spec.engine.resources.items() if k not in ("requests", "limits")
    }
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _volumes(server: Server) -> tuple[list[Manifest], list[Manifest]]:
    """Writable scratch (the root filesystem is read-only), caches and model volumes."""
    spec = server.valid.spec
    volumes: list[Manifest] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "weights", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[Manifest] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "weights", "mountPath": WEIGHTS_DIR},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    if spec.engine.compile_cache is not None:
        volumes.append({"name": "compile-cache", **compile_cache_volume(spec.engine.compile_cache)})
        mounts.append({"name": "compile-cache", "mountPath": COMPILE_CACHE_DIR})
    claims = []
    for text in (
        spec.model.source,
        spec.engine.speculative and spec.engine.speculative.draft_model,
        *(adapter.source for adapter in spec.model.lora_adapters),
    ):
        if text:
            source = parse_model_source(text)
            if source.scheme == "pvc" and source.location not in claims:
                claims.append(source.location)
    for i, claim in enumerate(claims):
        volumes.append(
            {
                "name": f"model-{i}",
                "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
            }
        )
        mounts.append({"name": f"model-{i}", "mountPath": pvc_mount_path(claim), "readOnly": True})
    return volumes, mounts


def compile_cache_volume(cache: CompileCacheSpec) -> Manifest:
    """The compile cache's volume source: the claim, or the gs:// prefix through GKE's Cloud
    Storage FUSE CSI driver (an ephemeral inline volume; `only-dir` mounts the prefix)."""
    if cache.persistent_volume_claim is not None:
        return {"persistentVolumeClaim": {"claimName": cache.persistent_volume_claim}}
    if cache.gcs is None:  # the CRD's rule, which the operator does not evaluate again
        raise InvalidSpec(
            [
                Problem(
                    "spec.engine.compileCache",
                    "{} is not allowed; allowed: exactly one of persistentVolumeClaim and gcs",
                )
            ]
        )
    source = parse_model_source(cache.gcs)
    options = "implicit-dirs" + (f",only-dir={source.path}" if source.path else "")
    return {
        "csi": {
            "driver": GCS_FUSE_DRIVER,
            "volumeAttributes": {"bucketName": source.location, "mountOptions": options},
        }
    }


def pod_paths(server: Server) -> launch_contract.PodPaths:
    has_cache = server.valid.spec.engine.compile_cache is not None
    return launch_contract.PodPaths(
        weights_cache_dir=WEIGHTS_DIR,
        compile_cache_dir=COMPILE_CACHE_DIR if has_cache else None,
    )


def _probes(server: Server) -> dict[str, Any]:
    http = {"path": HEALTH_PATH, "port": "http"}
    budget = startup_budget_seconds(server)
    return {
        "startupProbe": {
            "httpGet": http,
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(budget / STARTUP_PERIOD_SECONDS),
        },
        "readinessProbe": {
            "httpGet": http,
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        # A busy engine answers /health slowly: restart only after two minutes of silence.
        "livenessProbe": {
            "httpGet": http,
            "periodSeconds": 15,
            "timeoutSeconds": 10,
            "failureThreshold": 8,
        },
    }


def engine_pod_template(
    server: Server,
    *,
    replica: int,
    role: str,
    revision: str,
    contract_env: list[dict[str, Any]],
) -> Manifest:
    """The pod template of one role (leader or worker) of replica group `replica`."""
    spec = server.valid.spec
    stop = termination(server)
    volumes, mounts = _volumes(server)
    env = list(contract_env)
    if spec.model.token_secret_ref is not None:
        env.append(
            {
                "name": launch_contract.HF_TOKEN_ENV,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": spec.model.token_secret_ref.name,
                        "key": spec.model.token_secret_ref.key,
                    }
                },
            }
        )
    env.append({"name": "HOME", "value": "/tmp"})
    env += spec.engine.env
    container: Manifest = {
        "name": ENGINE_CONTAINER,
        "image": engine_image(server),
        "command": ENGINE_COMMAND,
        "env": env,
        "resources": _resources(server),
        "volumeMounts": mounts,
        # The launcher's pre-flight writes its reasons there; a crash that writes nothing
        # shows the end of its log instead (the operator reads both from the pod's status).
        "terminationMessagePath": launch_contract.TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "lifecycle": {"preStop": {"sleep": {"seconds": stop.pre_stop_seconds}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.engine.image_pull_policy:
        container["imagePullPolicy"] = spec.engine.image_pull_policy
    if role == labels.ROLE_LEADER:
        container["ports"] = [
            {"name": "http", "containerPort": launch_contract.HTTP_PORT, "protocol": "TCP"},
            {
                "name": "kv-events",
                "containerPort": launch_contract.KV_EVENTS_PORT,
                "protocol": "TCP",
            },
            {
                "name": "kv-replay",
                "containerPort": launch_contract.KV_REPLAY_PORT,
                "protocol": "TCP",
            },
        ]
        if spec.engine.type == "sglang":  # TorchTPU's handshake (not SGLang-JAX's)
            container["ports"].append(
                {
                    "name": "tpu-handshake",
                    "containerPort": TORCH_TPU_HANDSHAKE_PORT,
                    "protocol": "TCP",
                }
            )
        container |= _probes(server)
    selector, tolerations = _node_placement(server)
    pod_spec: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": stop.grace_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if selector:
        pod_spec["nodeSelector"] = selector
    if tolerations:
        pod_spec["tolerations"] = tolerations
    overrides = spec.template
    pod_spec["affinity"] = _affinity(server, replica)
    if overrides.priority_class_name:
        pod_spec["priorityClassName"] = overrides.priority_class_name
    if overrides.service_account_name:
        pod_spec["serviceAccountName"] = overrides.service_account_name
    if overrides.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in overrides.image_pull_secrets]
    template: Manifest = {
        "metadata": {"labels": pod_labels(server, replica, role, revision)},
        "spec": pod_spec,
    }
    annotations = pod_annotations(server)
    if annotations:
        template["metadata"]["annotations"] = annotations
    return template


def host_index_source(server: Server, role: str) -> FieldRef | int:
    """Host 0 is the leader; a worker reads its index from the workload's pod label."""
    if role == labels.ROLE_LEADER:
        return 0
    if server.config.leaderworkerset:
        return launch_contract.LWS_WORKER_INDEX
    return launch_contract.STATEFULSET_POD_INDEX
