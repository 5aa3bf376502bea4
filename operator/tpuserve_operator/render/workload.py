"""One replica group's workload: a LeaderWorkerSet, or StatefulSets plus a headless Service.

Each replica is its own workload object (`<name>-r<k>`; a disaggregated server's roles'
`<name>-p<k>` and `<name>-d<k>`, render/roles.py), so the operator rolls groups one at
a time and every pod's launch contract carries literal values for its group.

- LeaderWorkerSet (when its CRD is installed): one group of `hosts` pods; LWS names the
  leader `<g>-0` and workers `<g>-0-<i>`, creates the headless Service `<g>`, and recreates
  the whole group when any pod restarts.
- Otherwise: a leader StatefulSet `<g>` (1 pod, `<g>-0`) and a worker StatefulSet `<g>-w`
  (`hosts - 1` pods numbered from 1, `<g>-w-1` ...), both behind the headless Service `<g>`
  with unready addresses published, since hosts must resolve each other before any is
  ready. Both use `OnDelete`: the operator restarts a group's pods together on rollout.
"""

from __future__ import annotations

from sglang_tpu import disaggregation as pd
from sglang_tpu.contract.group_contract import GroupContract
from tpuserve_operator import labels, launch_contract
from tpuserve_operator.render.context import Manifest, Server, ValidServer
from tpuserve_operator.render.pod import (
    engine_image,
    engine_pod_template,
    host_index_source,
    pod_paths,
    termination,
)

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"


def group_hostnames(server: Server, replica: int) -> tuple[str, ...]:
    """The group's stable DNS names in host-index order (the first is the leader)."""
    group = server.group_name(replica)
    hosts = server.valid.shape.hosts
    if server.config.leaderworkerset:
        pods = [f"{group}-0"] + [f"{group}-0-{i}" for i in range(1, hosts)]
    else:
        pods = [f"{group}-0"] + [
            f"{server.worker_statefulset_name(replica)}-{i}" for i in range(1, hosts)
        ]
    return tuple(f"{pod}.{group}.{server.namespace}.svc" for pod in pods)


def check_group_contract(server: Server) -> GroupContract:
    """Replica group 0's launch contract, validated (InvalidSpec names what it refuses)."""
    return launch_contract.group_contract(
        server.valid.spec,
        served_name=server.valid.served_name,
        replica=0,
        hostnames=group_hostnames(server, 0),
        paths=pod_paths(server),
        drain_timeout_seconds=termination(server).drain_seconds,
        engine_version=engine_image(server),  # the compile cache key's engine part
    )


def _template(server: ValidServer, replica: int, role: str, revision: str) -> Manifest:
    group_key = launch_contract.LWS_GROUP_KEY if server.config.leaderworkerset else None
    env = launch_contract.engine_env(
        launch_contract.for_replica(server.contract, replica, group_hostnames(server, replica)),
        host_index=host_index_source(server, role),
        group_key=group_key,
    )
    return engine_pod_template(
        server, replica=replica, role=role, revision=revision, contract_env=env
    )


def group_labels(server: Server, replica: int) -> dict[str, str]:
    """The group's labels: its index, and its role on a disaggregated server."""
    if server.pd_role is None:
        return {labels.REPLICA: str(replica)}
    return {labels.REPLICA: str(replica), pd.PD_ROLE_LABEL: server.pd_role}


def group_selector(server: Server, replica: int) -> dict[str, str]:
    """All pods of one replica group (a role's group index alone is not unique)."""
    selector = labels.group_selector(server.name, replica)
    if server.pd_role is not None:
        selector[pd.PD_ROLE_LABEL] = server.pd_role
    return selector


def leaderworkerset(server: ValidServer, replica: int, revision: str) -> Manifest:
    hosts = server.valid.shape.hosts
    leader = _template(server, replica, labels.ROLE_LEADER, revision)
    # LWS requires a worker template even for one-host groups (it then creates no workers).
    worker = _template(server, replica, labels.ROLE_WORKER, revision) if hosts > 1 else leader
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": server.metadata(
            server.group_name(replica),
            labels.COMPONENT_MODEL_SERVER,
            group_labels(server, replica),
            {labels.REVISION: revision},
        ),
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "leaderWorkerTemplate": {
                "size": hosts,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def headless_service(server: Server, replica: int) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": server.metadata(
            server.group_name(replica), labels.COMPONENT_MODEL_SERVER, group_labels(server, replica)
        ),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": group_selector(server, replica),
            "ports": [{"name": "http", "port": launch_contract.HTTP_PORT, "targetPort": "http"}],
        },
    }


def _statefulset(
    server: ValidServer, replica: int, role: str, revision: str, name: str, pods: int, first: int
) -> Manifest:
    selector = {**group_selector(server, replica), labels.ROLE: role}
    spec: Manifest = {
        "replicas": pods,
        "serviceName": server.group_name(replica),
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "OnDelete"},
        "selector": {"matchLabels": selector},
        "template": _template(server, replica, role, revision),
    }
    if first:
        spec["ordinals"] = {"start": first}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": server.metadata(
            name,
            labels.COMPONENT_MODEL_SERVER,
            {**group_labels(server, replica), labels.ROLE: role},
            {labels.REVISION: revision},
        ),
        "spec": spec,
    }


def statefulsets(server: ValidServer, replica: int, revision: str) -> list[Manifest]:
    hosts = server.valid.shape.hosts
    out = [
        _statefulset(
            server, replica, labels.ROLE_LEADER, revision, server.group_name(replica), 1, 0
        )
    ]
    if hosts > 1:
        out.append(
            _statefulset(
                server,
                replica,
                labels.ROLE_WORKER,
                revision,
                server.worker_statefulset_name(replica),
                hosts - 1,
                1,
            )
        )
    return out


def group_children(server: ValidServer, replica: int, revision: str) -> list[Manifest]:
    """Every object of replica group `replica`, at pod-template revision `revision`."""
    if server.config.leaderworkerset:
        return [leaderworkerset(server, replica, revision)]
    return [headless_service(server, replica), *statefulsets(server, replica, revision)]


def engine_templates(server: ValidServer, replica: int) -> list[Manifest]:
    """The group's pod templates without a revision label: what the revision hashes."""
    roles = [labels.ROLE_LEADER] + ([labels.ROLE_WORKER] if server.valid.shape.hosts > 1 else [])
    return [_template(server, replica, role, revision="") for role in roles]
