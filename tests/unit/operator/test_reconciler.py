"""`Reconciler.converge`, one pass against an in-memory apiserver: it applies what changed and
nothing else, prunes what is no longer wanted, restarts multi-host groups as one, writes
status and Events, and backs off while the apiserver refuses children."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.fake_kube import FakeKube, not_found, pod_object, refused
from tests.unit.operator.reconciler_harness import (
    FOUR_HOSTS,
    NAMESPACE,
    NOW,
    ONE_HOST,
    RESYNC_SECONDS,
    Operator,
    make_operator,
)
from tpuserve_operator import labels
from tpuserve_operator.metrics import create_operator_metrics
from tpuserve_operator.reconciler import ERROR_BACKOFF_SECONDS, Reconciler, ReconcilerSettings
from tpuserve_operator.render import RenderConfig

pytestmark = pytest.mark.unit


@pytest.fixture
def operator() -> Operator:
    return make_operator()


async def test_a_new_server_gets_every_child_and_says_it_is_scaling_up(
    operator: Operator,
) -> None:
    key = operator.create(ONE_HOST)
    assert await operator.converge(key) == RESYNC_SECONDS
    assert operator.kube.names("StatefulSet") == ["qwen-r0", "qwen-r1"]
    assert operator.kube.names("Deployment") == ["qwen-router"]
    assert ("Service", "qwen") in operator.kube.applied
    status = operator.status(key)
    assert status["observedGeneration"] == 1
    assert status["endpoint"] == "http://qwen.ml.svc:8000"
    assert status["plan"]["workload"] == "StatefulSet"
    assert [g["state"] for g in status["groups"]] == ["Pending", "Pending"]
    assert operator.conditions(key) == {
        "Valid": ("True", "SpecValid"),
        "Progressing": ("True", "ScalingUp"),
        "Ready": ("False", "NoReadyReplicas"),
        "Degraded": ("False", "AsExpected"),
    }
    # Reconciling is said at once, before the pass; a new object's False conditions are not.
    assert operator.reasons() == ["SpecValid", "Reconciling", "ScalingUp"]
    assert operator.reconciles("ok") == 1


async def test_the_routers_peering_secret_is_created_once_and_kept(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    await operator.converge(key)
    secret = operator.kube.get_object("v1", "Secret", "ml", "qwen-router-peering")
    value = base64.b64decode(secret["data"]["key"])
    assert len(value) >= 32  # random, the replicas' shared peering secret
    assert secret["metadata"]["ownerReferences"][0]["name"] == "qwen"  # collected with it
    await operator.converge(key)
    again = operator.kube.get_object("v1", "Secret", "ml", "qwen-router-peering")
    assert again["data"] == secret["data"]  # never replaced
    assert ("Secret", "qwen-router-peering") not in operator.kube.deleted  # nor pruned


async def test_a_pass_with_nothing_changed_applies_and_writes_nothing(
    operator: Operator,
) -> None:
    key = operator.create(ONE_HOST)
    await operator.converge(key)
    await operator.converge(key)  # sees its groups exist: GroupsStarting
    assert operator.conditions(key)["Progressing"] == ("True", "GroupsStarting")
    applied, patches = len(operator.kube.applied), len(operator.kube.status_patches)
    assert await operator.converge(key) == RESYNC_SECONDS
    assert len(operator.kube.applied) == applied
    assert len(operator.kube.status_patches) == patches


async def test_a_child_edited_by_hand_is_applied_again(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    await operator.converge(key)
    service = operator.kube.get_object("v1", "Service", NAMESPACE, "qwen")
    service["spec"]["ports"] = []
    service["metadata"]["generation"] += 1
    operator.kube.put(service)
    applied = len(operator.kube.applied)
    await operator.converge(key)
    assert operator.kube.applied[applied:] == [("Service", "qwen")]


async def test_an_invalid_spec_changes_nothing_but_status(operator: Operator) -> None:
    key = operator.create({**ONE_HOST, "tpu": {"generation": "v6e", "topology": "3x3"}})
    assert await operator.converge(key) == RESYNC_SECONDS
    assert operator.kube.applied == []
    assert operator.conditions(key)["Valid"] == ("False", "UnsupportedTopology")
    assert operator.status(key)["observedGeneration"] == 1
    kind, reason, message = operator.events[-1]
    assert (kind, reason) == ("Warning", "UnsupportedTopology")
    assert "spec.tpu.topology" in message
    assert operator.reconciles("invalid") == 1


async def test_refused_applies_back_off_then_recover(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    operator.kube.refuse_kinds["StatefulSet"] = refused("denied by policy")
    delays = [await operator.converge(key) for _ in range(len(ERROR_BACKOFF_SECONDS) + 1)]
    assert delays == [*ERROR_BACKOFF_SECONDS, ERROR_BACKOFF_SECONDS[-1]]
    assert operator.conditions(key)["Progressing"] == ("False", "ApplyFailed")
    assert operator.conditions(key)["Degraded"] == ("True", "ApplyFailed")
    message = next(
        c["message"] for c in operator.status(key)["conditions"] if c["type"] == "Degraded"
    )
    assert message.startswith("StatefulSet qwen-r0: ")
    assert "denied by policy" in message
    assert ("Warning", "ApplyFailed") in [(kind, reason) for kind, reason, _ in operator.events]
    assert operator.reconciles("error") == len(delays)
    assert operator.kube.names("StatefulSet") == []
    assert operator.kube.names("Deployment") == ["qwen-router"]  # the rest was applied

    del operator.kube.refuse_kinds["StatefulSet"]
    assert await operator.converge(key) == RESYNC_SECONDS
    assert operator.kube.names("StatefulSet") == ["qwen-r0", "qwen-r1"]
    assert operator.conditions(key)["Degraded"] == ("False", "AsExpected")

    operator.kube.refuse_kinds["Service"] = refused("denied again")
    operator.edit(key, router={"enabled": False})  # the endpoint Service changes
    assert await operator.converge(key) == ERROR_BACKOFF_SECONDS[0]  # the backoff starts over


async def test_api_failures_back_off_like_refused_applies(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    operator.kube.status_error = refused("etcd is slow")
    delays = [await operator.converge(key) for _ in range(3)]
    assert delays == list(ERROR_BACKOFF_SECONDS[:3])
    assert operator.reconciles("error") == 3
    operator.kube.status_error = None
    assert await operator.converge(key) == RESYNC_SECONDS
    assert operator.conditions(key)["Valid"] == ("True", "SpecValid")


async def test_a_server_that_is_gone_ends_its_loop(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    body = operator.body(key)
    operator.kube.status_error = not_found("qwen")
    assert await operator.reconciler.converge(key, body) is None


async def test_a_server_being_deleted_is_left_alone(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    body = operator.body(key)
    body["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    assert await operator.reconciler.converge(key, body) == RESYNC_SECONDS
    assert operator.kube.applied == []
    assert operator.kube.status_patches == []


async def test_scaling_down_deletes_the_highest_group(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    await operator.converge(key)
    operator.edit(key, replicas=1)
    await operator.converge(key)
    assert operator.kube.names("StatefulSet") == ["qwen-r0"]
    assert ("Service", "qwen-r1") in operator.kube.deleted
    assert operator.conditions(key)["Progressing"] == ("True", "ScalingDown")


async def test_turning_the_router_off_prunes_its_peering_too(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    await operator.converge(key)
    assert "qwen-router-peers" in operator.kube.names("Service")
    assert operator.kube.names("NetworkPolicy") == ["qwen-engines", "qwen-router"]
    operator.edit(key, router={"enabled": False})
    await operator.converge(key)
    assert operator.kube.names("Deployment") == []
    assert "qwen-router-peers" not in operator.kube.names("Service")
    assert operator.kube.names("NetworkPolicy") == ["qwen-engines"]


async def test_ready_groups_behind_a_ready_router_make_the_server_ready(
    operator: Operator,
) -> None:
    key = operator.create({**ONE_HOST, "replicas": 1})
    await operator.converge(key)
    revision = operator.status(key)["revision"]
    operator.kube.put(pod_object("qwen", "qwen-r0-0", revision=revision))
    router = operator.kube.get_object("apps/v1", "Deployment", NAMESPACE, "qwen-router")
    operator.kube.put({**router, "status": {"readyReplicas": 1}})
    await operator.converge(key)
    assert operator.conditions(key)["Ready"] == ("True", "RouterReady")
    assert operator.conditions(key)["Progressing"] == ("False", "Complete")
    assert operator.status(key)["readyReplicas"] == 1
    assert operator.reconciler.server_readiness() == [True]
    (row,) = operator.reconciler.replica_rows()
    assert (row.pod, row.model_name, row.chips) == ("qwen-r0-0", "qwen3-8b", 8)


async def test_a_leader_that_turns_ready_has_its_cold_start_counted_once(
    operator: Operator,
) -> None:
    key = operator.create({**ONE_HOST, "replicas": 1})
    await operator.converge(key)
    cache = operator.status(key)["compileCache"]
    assert cache["key"].startswith("v6e-2x4/hf_Qwen_Qwen3-8B/ghcr.io_tpuserve_tpuserve_")
    assert (cache["location"], cache["hits"], cache["misses"]) == ("", 0, 0)
    assert cache.get("lastColdStart") is None  # no leader Ready yet
    revision = operator.status(key)["revision"]
    operator.kube.put(pod_object("qwen", "qwen-r0-0", revision=revision, ip="127.244.0.7"))
    await operator.converge(key)
    await operator.converge(key)
    cache = operator.status(key)["compileCache"]
    assert (cache["hits"], cache["misses"]) == (0, 1)
    assert cache["lastColdStart"] == {
        "pod": "qwen-r0-0", "cacheResult": "miss", "pullSeconds": 0.0,
        "weightsSeconds": 13.7, "compileSeconds": 340.0, "warmupSeconds": 5.0,
    }  # fmt: skip


async def test_a_stale_pod_of_an_updating_group_is_replaced(operator: Operator) -> None:
    key = operator.create({**ONE_HOST, "replicas": 1})
    await operator.converge(key)
    operator.kube.put(pod_object("qwen", "qwen-r0-0", revision="an-old-revision"))
    await operator.converge(key)
    assert ("Pod", "qwen-r0-0") in operator.kube.deleted


async def test_a_restarted_host_restarts_its_whole_group(operator: Operator) -> None:
    key = operator.create(FOUR_HOSTS)
    await operator.converge(key)
    revision = operator.status(key)["revision"]
    names = ["qwen-r0-0", "qwen-r0-w-1", "qwen-r0-w-2", "qwen-r0-w-3"]
    for i, name in enumerate(names):
        role = labels.ROLE_LEADER if i == 0 else labels.ROLE_WORKER
        operator.kube.put(pod_object("qwen", name, role=role, revision=revision))
    await operator.converge(key)  # the group runs as one: the operator remembers its pods
    assert operator.kube.deleted == []

    operator.kube.put(
        pod_object("qwen", "qwen-r0-w-2", role=labels.ROLE_WORKER, revision=revision, restarts=1)
    )
    await operator.converge(key)
    assert sorted(name for kind, name in operator.kube.deleted if kind == "Pod") == [
        "qwen-r0-0",
        "qwen-r0-w-1",
        "qwen-r0-w-3",
    ]
    kind, reason, message = operator.events[-1]
    assert (kind, reason) == ("Warning", "GroupRestarted")
    assert "qwen-r0-w-2" in message


async def lws_group_running_as_one(operator: Operator) -> tuple[tuple[str, str], str]:
    """A four-host server on the LeaderWorkerSet path whose group runs as one."""
    operator.kube.group_versions.add("leaderworkerset.x-k8s.io/v1")
    key = operator.create(FOUR_HOSTS)
    await operator.converge(key)
    assert operator.status(key)["plan"]["workload"] == "LeaderWorkerSet"
    revision = str(operator.status(key)["revision"])
    for i, name in enumerate(LWS_HOSTS):
        role = labels.ROLE_LEADER if i == 0 else labels.ROLE_WORKER
        operator.kube.put(pod_object("qwen", name, role=role, revision=revision))
    await operator.converge(key)
    assert operator.kube.deleted == []
    return key, revision


LWS_HOSTS = ("qwen-r0-0", "qwen-r0-0-1", "qwen-r0-0-2", "qwen-r0-0-3")


async def test_a_worker_lws_recreated_alone_restarts_its_whole_group(operator: Operator) -> None:
    """LWS v0.9.0 restarts a group only if it sees the deleted worker terminating; a worker
    force-deleted (or lost with its node) comes back alone, and the operator restarts the rest."""
    key, revision = await lws_group_running_as_one(operator)
    operator.kube.objects.pop(("v1", "Pod", NAMESPACE, "qwen-r0-0-2"))  # gone at once
    operator.kube.put(pod_object("qwen", "qwen-r0-0-2", role=labels.ROLE_WORKER, revision=revision))
    await operator.converge(key)
    assert sorted(name for kind, name in operator.kube.deleted if kind == "Pod") == [
        "qwen-r0-0",
        "qwen-r0-0-1",
        "qwen-r0-0-3",
    ]
    kind, reason, message = operator.events[-1]
    assert (kind, reason) == ("Warning", "GroupRestarted")
    assert "qwen-r0-0-2" in message


async def test_a_group_lws_restarted_itself_is_not_restarted_again(operator: Operator) -> None:
    """Where LWS restarted the group first, the operator deletes no pod of the new one, even
    under the old names (its deletes name the old incarnations' uids)."""
    key, revision = await lws_group_running_as_one(operator)
    before = {
        name: operator.kube.get_object("v1", "Pod", NAMESPACE, name)["metadata"]["uid"]
        for name in LWS_HOSTS
    }
    for i, name in enumerate(LWS_HOSTS):  # the whole group recreated
        operator.kube.objects.pop(("v1", "Pod", NAMESPACE, name))
        role = labels.ROLE_LEADER if i == 0 else labels.ROLE_WORKER
        operator.kube.put(pod_object("qwen", name, role=role, revision=revision))
    await operator.converge(key)
    assert operator.kube.deleted == []
    assert all(
        operator.kube.get_object("v1", "Pod", NAMESPACE, name)["metadata"]["uid"] != uid
        for name, uid in before.items()
    )
    assert not [e for e in operator.events if e[1] == "GroupRestarted"]


async def test_a_new_generation_is_acknowledged_before_its_pass(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    await operator.converge(key)
    first = operator.kube.status_patches[0]
    assert "observedGeneration" not in first
    assert first["endpoint"] == "http://qwen.ml.svc:8000"
    assert [(c["type"], c["reason"]) for c in first["conditions"]] == [
        ("Valid", "SpecValid"),
        ("Progressing", "Reconciling"),
    ]
    assert "observedGeneration" not in first["conditions"][0]


async def test_an_invalid_edit_keeps_the_last_good_status_but_its_conditions(
    operator: Operator,
) -> None:
    key = operator.create(ONE_HOST)
    await operator.converge(key)
    before = operator.status(key)
    operator.edit(key, tpu={"generation": "v6e", "topology": "3x3"})
    await operator.converge(key)
    after = operator.status(key)
    assert after["observedGeneration"] == 2
    assert operator.conditions(key)["Valid"] == ("False", "UnsupportedTopology")
    assert {k: after[k] for k in ("endpoint", "plan", "groups", "revision")} == {
        k: before[k] for k in ("endpoint", "plan", "groups", "revision")
    }
    assert operator.reconciler.server_readiness() == []  # an invalid server is not counted


def test_every_child_kind_is_known_to_the_kube_client_and_watched() -> None:
    """The operator starts only if every kind it renders has a REST mapping (a new child
    kind without one made the handlers module fail at import)."""
    from tpuserve_operator.handlers import tpumodelserver
    from tpuserve_operator.kube import KINDS
    from tpuserve_operator.reconciler import CHILD_KINDS

    assert [k for k in CHILD_KINDS if k not in KINDS] == []
    watched = {(group, plural) for group, _, plural in tpumodelserver.CHILD_RESOURCES}
    assert ("networking.k8s.io", "networkpolicies") in watched


def placed(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """A pod object scheduled on `node`, created before the test's clock."""
    pod["spec"] = {**(pod.get("spec") or {}), "nodeName": node}
    pod["metadata"]["creationTimestamp"] = "2026-01-01T11:00:00Z"
    return pod


async def two_groups_on_nodes_a_and_b(operator: Operator, key: tuple[str, str]) -> str:
    """Groups 0 and 1 running on node-a and node-b; returns the revision."""
    await operator.converge(key)
    revision = str(operator.status(key)["revision"])
    for k, node in ((0, "node-a"), (1, "node-b")):
        pod = pod_object("qwen", f"qwen-r{k}-0", replica=k, revision=revision)
        operator.kube.put(placed(pod, node))
    await operator.converge(key)
    return revision


async def test_maintenance_on_a_node_surges_a_replacement_then_drains_the_group(
    operator: Operator,
) -> None:
    from tpuserve_operator.node_signals import MAINTENANCE_TIME_LABEL

    key = operator.create({**ONE_HOST, "rollout": {"maxUnavailable": 0, "maxSurge": 1}})
    revision = await two_groups_on_nodes_a_and_b(operator, key)
    assert operator.conditions(key)["Progressing"] == ("False", "Complete")

    node_a = {"metadata": {"name": "node-a", "labels": {MAINTENANCE_TIME_LABEL: "1798804800"}}}
    operator.reconciler.on_node_event("MODIFIED", node_a)
    await operator.converge(key)
    assert "qwen-r2" in operator.kube.names("StatefulSet")  # the replacement slice first
    assert not any(kind == "Pod" for kind, _ in operator.kube.deleted)
    assert operator.conditions(key)["Progressing"] == ("True", "NodeMaintenanceScheduled")

    operator.kube.put(placed(pod_object("qwen", "qwen-r2-0", replica=2, revision=revision), "c"))
    await operator.converge(key)
    assert ("Pod", "qwen-r0-0") in operator.kube.deleted  # now the old group drains
    assert ("Pod", "qwen-r1-0") not in operator.kube.deleted
    kind, _, message = next(e for e in operator.events if e[1] == "GroupDraining")
    assert kind == "Normal"
    assert "node-a" in message


async def test_a_moved_group_is_drained_once_while_its_old_pod_still_terminates(
    operator: Operator,
) -> None:
    from tpuserve_operator.node_signals import TERMINATION_TAINT

    key = operator.create(FOUR_HOSTS)
    await operator.converge(key)
    revision = str(operator.status(key)["revision"])
    for host in range(4):
        pod = pod_object("qwen", f"qwen-r0-{host}", replica=0, revision=revision)
        operator.kube.put(placed(pod, f"node-{host}"))
    await operator.converge(key)
    tainted = {"metadata": {"name": "node-0"}, "spec": {"taints": [{"key": TERMINATION_TAINT}]}}
    operator.reconciler.on_node_event("MODIFIED", tainted)
    await operator.converge(key)
    assert sorted(n for kind, n in operator.kube.deleted if kind == "Pod") == [
        f"qwen-r0-{host}" for host in range(4)
    ]

    # The old leader still terminates on node-0; its hosts came back elsewhere.
    old = placed(pod_object("qwen", "qwen-r0-0", replica=0, revision=revision), "node-0")
    old["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:01Z"
    operator.kube.put(old)
    for host in range(1, 4):
        fresh = pod_object("qwen", f"qwen-r0-{host}", replica=0, revision=revision)
        fresh = placed(fresh, f"node-{host + 10}")
        fresh["metadata"]["creationTimestamp"] = "2026-01-01T12:00:02Z"
        operator.kube.put(fresh)
    deleted = len(operator.kube.deleted)
    await operator.converge(key)
    await operator.converge(key)
    assert operator.kube.deleted[deleted:] == []  # the replacements are left alone
    assert operator.reasons().count("GroupDraining") == 1


async def test_a_node_vanishing_under_a_group_is_reported_once(operator: Operator) -> None:
    key = operator.create(ONE_HOST)
    await two_groups_on_nodes_a_and_b(operator, key)
    operator.reconciler.on_node_event("DELETED", {"metadata": {"name": "node-b"}})
    await operator.converge(key)
    lost = [(kind, message) for kind, reason, message in operator.events if reason == "NodeLost"]
    assert len(lost) == 1
    assert lost[0][0] == "Warning"
    assert "node-b" in lost[0][1]
    assert "replica group(s) 1;" in lost[0][1]
    await operator.converge(key)
    assert sum(1 for _, reason, _ in operator.events if reason == "NodeLost") == 1
    await operator.kube.delete("v1", "Pod", NAMESPACE, "qwen-r1-0")  # the pod GC follows
    await operator.converge(key)
    assert sum(1 for _, reason, _ in operator.events if reason == "NodeLost") == 1


def test_watch_handlers_run_on_the_event_loop() -> None:
    """kopf runs a sync handler in a thread; the handlers wake loops (asyncio.Event) and
    touch the caches, which only the event loop's thread may do."""
    import inspect

    from tpuserve_operator.handlers import tpumodelserver

    handlers = [tpumodelserver.on_server, tpumodelserver.on_child]
    handlers += [tpumodelserver.on_node, tpumodelserver.on_pod]
    assert all(inspect.iscoroutinefunction(h) for h in handlers)


class OverlappingKube(FakeKube):
    """Applies sent together overlap, as on a real apiserver; a RoleBinding whose Role does
    not exist yet is refused NotFound, as RBAC's escalation check refuses it (no `bind`)."""

    async def apply(self, manifest: Any) -> dict[str, Any]:
        if manifest["kind"] == "RoleBinding":
            role = manifest["roleRef"]["name"]
            if role not in self.names("Role"):
                raise not_found(f'roles.rbac.authorization.k8s.io "{role}"')
        await asyncio.sleep(0)  # every apply of a gather starts before any is stored
        return await super().apply(manifest)


async def test_a_role_binding_is_applied_after_its_role_and_workloads_after_both() -> None:
    kube = OverlappingKube()
    operator = Operator(
        kube,
        Reconciler(
            kube,
            ReconcilerSettings(render=RenderConfig(), resync_seconds=RESYNC_SECONDS),
            create_operator_metrics(CollectorRegistry()),
            lambda body, kind, reason, message: None,
            clock=lambda: NOW,
        ),
        CollectorRegistry(),
    )
    key = operator.create(ONE_HOST)
    await operator.converge(key)
    assert operator.conditions(key)["Degraded"] == ("False", "AsExpected")
    kinds = [kind for kind, _ in kube.applied]
    assert kinds.index("Role") < kinds.index("RoleBinding") < kinds.index("Deployment")
    assert kinds.index("ServiceAccount") < kinds.index("RoleBinding")
