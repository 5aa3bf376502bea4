"""Group states and conditions from observed pods: Ready only with a routable replica behind a
ready router; Degraded for unschedulable pods, crash loops and groups partly up too long."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest

from tests.fake_kube import make_pod
from tpuserve_operator import api, conditions
from tpuserve_operator.api import GroupStatus
from tpuserve_operator.conditions import DEGRADED, PROGRESSING, READY, VALID, Reason
from tpuserve_operator.observed import PodView, child_view, pod_view
from tpuserve_operator.rollout import plan
from tpuserve_operator.status import GroupObservation, GroupReport, decide, report_group, timestamp

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2025, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)
REV = "rev1"


def pod(
    name: str,
    *,
    role: str = "worker",
    running: bool = True,
    ready: bool = True,
    revision: str = REV,
    unschedulable: str | None = None,
    crash: str | None = None,
) -> PodView:
    return make_pod(
        name,
        role=role,
        running=running,
        ready=ready and running,
        revision=revision,
        unschedulable=unschedulable,
        crash_loop=crash,
    )


def group(*pods: PodView, revision: str = REV) -> GroupObservation:
    return GroupObservation(
        index=0, name="qwen-r0", exists=True, deleting=False, workload_revision=revision, pods=pods
    )


def report(
    obs: GroupObservation,
    previous: GroupStatus | None = None,
    now: datetime.datetime = NOW,
    hosts: int = 2,
) -> GroupReport:
    return report_group(
        obs, hosts=hosts, revision=REV, previous=previous, now=now, partial_group_seconds=600
    )


def test_all_hosts_ready_is_ready_and_updated() -> None:
    r = report(group(pod("a", role="leader"), pod("b")))
    assert (r.state, r.ready, r.updated, r.ready_hosts) == ("Ready", True, True, 2)


def test_leader_not_serving_yet_is_starting() -> None:
    r = report(group(pod("a", role="leader", ready=False), pod("b")))
    assert (r.state, r.reason, r.ready) == ("Starting", "Starting", False)


def test_missing_pods_are_pending() -> None:
    r = report(group(pod("a", role="leader", running=False, ready=False)))
    assert (r.state, r.reason) == ("Pending", "Creating")


def test_unschedulable_pods_degrade_the_group_with_the_scheduler_message() -> None:
    msg = "0/6 nodes are available: 6 Insufficient google.com/tpu."
    r = report(
        group(pod("a", role="leader", running=False, unschedulable=msg), pod("b", running=False))
    )
    assert (r.state, r.reason) == ("Degraded", "Unschedulable")
    assert "Insufficient google.com/tpu" in r.message


def test_crash_loop_degrades_the_group() -> None:
    r = report(group(pod("a", role="leader", ready=False, crash="engine: back-off 5m0s"), pod("b")))
    assert (r.state, r.reason) == ("Degraded", "CrashLoop")


def test_old_revision_pods_are_not_updated() -> None:
    r = report(
        group(pod("a", role="leader", revision="old"), pod("b", revision="old"), revision=REV)
    )
    assert r.ready
    assert not r.updated


def test_a_partly_up_group_degrades_only_after_the_bound() -> None:
    obs = group(pod("a", role="leader", ready=False), pod("b", running=False, ready=False))
    first = report(obs)
    assert (first.state, first.reason) == ("Pending", "PartiallyUp")
    assert first.recheck_seconds == 600
    later = report(obs, previous=first.as_status(), now=NOW + datetime.timedelta(seconds=599))
    assert later.state == "Pending"
    assert later.since == timestamp(NOW)
    after = report(obs, previous=later.as_status(), now=NOW + datetime.timedelta(seconds=601))
    assert (after.state, after.reason) == ("Degraded", "GroupPartiallyUp")
    still = report(obs, previous=after.as_status(), now=NOW + datetime.timedelta(seconds=900))
    assert (still.state, still.since) == ("Degraded", timestamp(NOW))


def test_since_is_kept_while_the_state_holds() -> None:
    obs = group(pod("a", role="leader"), pod("b"))
    first = report(obs)
    again = report(obs, previous=first.as_status(), now=NOW + datetime.timedelta(hours=1))
    assert again.since == first.since


def _reports(*states: tuple[bool, bool]) -> list[GroupReport]:
    """(ready, updated) per group index."""
    return [
        GroupReport(
            index=i,
            name=f"g{i}",
            state="Ready" if ready else "Starting",
            reason=Reason.SERVING if ready else Reason.STARTING,
            message="",
            since="",
            hosts=1,
            ready_hosts=int(ready),
            updated=updated,
            ready=ready,
            exists=True,
        )
        for i, (ready, updated) in enumerate(states)
    ]


def _by_type(decided: list[conditions.Condition]) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in decided}


def _decide(
    groups: tuple[tuple[bool, bool], ...],
    *,
    replicas: int | None = None,
    planned: bool = False,
    router_enabled: bool = True,
    router_ready_replicas: int = 1,
    invalid: str | None = None,
    invalid_reason: Reason = Reason.INVALID_SPEC,
    apply_error: str | None = None,
) -> dict[str, tuple[str, str]]:
    """`decide` over groups given as (ready, updated), with a rollout plan over them when
    `planned`; `replicas` defaults to the number of groups."""
    reports = _reports(*groups)
    n = len(reports) if replicas is None else replicas
    states = {r.index: r.rollout_state() for r in reports}
    return _by_type(
        decide(
            replicas=n,
            reports=reports,
            plan=plan(n, states, max_unavailable=1, max_surge=0) if planned else None,
            invalid=invalid,
            invalid_reason=invalid_reason,
            router_enabled=router_enabled,
            router_ready_replicas=router_ready_replicas,
            apply_error=apply_error,
        )
    )


# Groups as (ready, updated).
SERVING, STARTING, OUTDATED = (True, True), (False, True), (True, False)


@pytest.mark.parametrize(
    ("groups", "settings", "expected"),
    [
        pytest.param(
            (SERVING, STARTING),
            {"planned": True},
            {READY: ("True", "RouterReady"), PROGRESSING: ("True", "GroupsStarting")},
            id="ready-router-and-group",
        ),
        pytest.param(
            (SERVING, STARTING),
            {"planned": True, "router_ready_replicas": 0},
            {READY: ("False", "RouterNotReady")},
            id="no-ready-router",
        ),
        pytest.param((STARTING,), {}, {READY: ("False", "NoReadyReplicas")}, id="no-ready-group"),
        pytest.param(
            (SERVING,),
            {"router_enabled": False, "router_ready_replicas": 0},
            {READY: ("True", "LeadersReady")},
            id="router-disabled-ready-on-leaders",
        ),
        pytest.param(
            (SERVING, SERVING),
            {"planned": True},
            {
                PROGRESSING: ("False", "Complete"),
                DEGRADED: ("False", "AsExpected"),
                VALID: ("True", "SpecValid"),
            },
            id="complete-when-all-updated-and-ready",
        ),
        pytest.param(
            (OUTDATED, OUTDATED),
            {"planned": True},
            {PROGRESSING: ("True", "RollingUpdate")},
            id="rolling-update",
        ),
        pytest.param(
            (),
            {
                "replicas": 1,
                "router_ready_replicas": 0,
                "invalid": "spec.tpu.topology: ...",
                "invalid_reason": Reason.UNSUPPORTED_TOPOLOGY,
            },
            {
                VALID: ("False", "UnsupportedTopology"),
                READY: ("False", "InvalidSpec"),
                PROGRESSING: ("False", "InvalidSpec"),
            },
            id="invalid-spec-with-its-reason",
        ),
        pytest.param(
            (),
            {
                "replicas": 1,
                "router_ready_replicas": 0,
                "apply_error": "StatefulSet qwen-r0: forbidden",
            },
            {PROGRESSING: ("False", "ApplyFailed"), DEGRADED: ("True", "ApplyFailed")},
            id="apply-error",
        ),
    ],
)
def test_server_conditions(
    groups: tuple[tuple[bool, bool], ...],
    settings: dict[str, Any],
    expected: dict[str, tuple[str, str]],
) -> None:
    got = _decide(groups, **settings)
    assert {t: got[t] for t in expected} == expected


def test_a_degraded_group_degrades_the_server() -> None:
    reports = [
        GroupReport(
            index=0,
            name="g0",
            state="Degraded",
            reason=Reason.UNSCHEDULABLE,
            message="pod x: no tpu",
            since="",
            hosts=4,
            ready_hosts=0,
            updated=True,
            ready=False,
            exists=True,
        )
    ]
    got = decide(
        replicas=1,
        reports=reports,
        plan=None,
        invalid=None,
        router_enabled=True,
        router_ready_replicas=1,
    )
    (degraded,) = [c for c in got if c.type == DEGRADED]
    assert (degraded.status, degraded.reason) == ("True", "Unschedulable")
    assert "no tpu" in degraded.message


def test_every_reason_the_operator_writes_is_documented() -> None:
    documented = {(r.type, r.status, r.reason) for r in conditions.REASONS}
    for n in (0, 1, 2):
        for groups in ((), (SERVING,), ((False, False), OUTDATED)):
            for inv, router, rr, err in itertools.product(
                (None, "bad"), (True, False), (0, 1), (None, "boom")
            ):
                decided = _decide(
                    groups,
                    replicas=n,
                    planned=True,
                    invalid=inv,
                    router_enabled=router,
                    router_ready_replicas=rr,
                    apply_error=err,
                )
                for type_, (status, reason) in decided.items():
                    assert (type_, status, reason) in documented, (type_, status, reason)


def _ready(ok: bool, reason: Reason, message: str = "") -> conditions.Condition:
    return conditions.Condition.of(READY, ok, reason, message)


def _merge_ready(
    existing: list[api.Condition],
    ok: bool,
    reason: Reason,
    *,
    now: str,
    generation: int | None,
) -> list[api.Condition]:
    return conditions.merge(existing, [_ready(ok, reason, "x")], now=now, generation=generation)


def test_merge_keeps_transition_time_while_status_holds() -> None:
    first = _merge_ready([], False, Reason.NO_READY_REPLICAS, now="t1", generation=1)
    same = _merge_ready(first, False, Reason.ROUTER_NOT_READY, now="t2", generation=2)
    assert same[0].last_transition_time == "t1"
    assert same[0].observed_generation == 2
    assert same[0].reason == "RouterNotReady"
    flipped = _merge_ready(same, True, Reason.ROUTER_READY, now="t3", generation=2)
    assert flipped[0].last_transition_time == "t3"


def test_merge_sets_observed_generation_only_when_given() -> None:
    (acknowledged,) = _merge_ready([], False, Reason.NO_READY_REPLICAS, now="t", generation=None)
    assert acknowledged.model_dump(by_alias=True, exclude_unset=True) == {
        "type": "Ready",
        "status": "False",
        "reason": "NoReadyReplicas",
        "message": "x",
        "lastTransitionTime": "t",
    }


def test_transitions_flag_warnings() -> None:
    old = _merge_ready([], True, Reason.ROUTER_READY, now="t", generation=1)
    (t,) = conditions.transitions(old, [_ready(False, Reason.NO_READY_REPLICAS)])
    assert t.warning
    (d,) = conditions.transitions(
        [], [conditions.Condition.of(DEGRADED, False, Reason.AS_EXPECTED, "")]
    )
    assert not d.warning


def test_pod_view_reads_scheduling_and_crash_loops() -> None:
    view = pod_view(
        {
            "metadata": {
                "name": "p",
                "labels": {
                    "serving.tpuserve.dev/replica": "2",
                    "serving.tpuserve.dev/role": "leader",
                    "serving.tpuserve.dev/revision": "r",
                },
            },
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "no tpu",
                    }
                ],
                "containerStatuses": [
                    {
                        "name": "engine",
                        "restartCount": 3,
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                    }
                ],
            },
        }
    )
    assert (view.replica, view.role, view.revision) == (2, "leader", "r")
    assert view.unschedulable == "no tpu"
    assert view.crash_loop == "engine: back-off"
    assert view.restarts == 3
    assert not view.running


def test_child_view_reads_owner_hash_and_readiness() -> None:
    view = child_view(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "d",
                "uid": "u",
                "generation": 4,
                "resourceVersion": "9",
                "annotations": {"serving.tpuserve.dev/spec-hash": "h"},
                "ownerReferences": [{"uid": "owner", "controller": True}],
            },
            "status": {"readyReplicas": 2},
        }
    )
    assert (view.owner_uid, view.generation, view.spec_hash, view.ready_replicas) == (
        "owner",
        4,
        "h",
        2,
    )
