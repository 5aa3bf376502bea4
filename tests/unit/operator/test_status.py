"""Group states and conditions from observed pods: Ready only with a routable replica behind a
ready router; Degraded for unschedulable pods, crash loops and groups partly up too long."""

from __future__ import annotations

import datetime

import pytest

from tests.fakes import make_pod
from tpuserve_operator import conditions
from tpuserve_operator.api import GroupStatus
from tpuserve_operator.conditions import Reason
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


def test_ready_needs_a_ready_router_and_a_ready_group() -> None:
    reports = _reports((True, True), (False, True))
    p = plan(2, {r.index: r.rollout_state() for r in reports}, max_unavailable=1, max_surge=0)
    ready = _by_type(
        decide(
            replicas=2,
            reports=reports,
            plan=p,
            invalid=None,
            router_enabled=True,
            router_ready_replicas=1,
        )
    )
    assert ready[conditions.READY] == ("True", "RouterReady")
    assert ready[conditions.PROGRESSING] == ("True", "GroupsStarting")
    no_router = _by_type(
        decide(
            replicas=2,
            reports=reports,
            plan=p,
            invalid=None,
            router_enabled=True,
            router_ready_replicas=0,
        )
    )
    assert no_router[conditions.READY] == ("False", "RouterNotReady")


def test_no_ready_group_is_not_ready() -> None:
    reports = _reports((False, True))
    got = _by_type(
        decide(
            replicas=1,
            reports=reports,
            plan=None,
            invalid=None,
            router_enabled=True,
            router_ready_replicas=1,
        )
    )
    assert got[conditions.READY] == ("False", "NoReadyReplicas")


def test_router_disabled_is_ready_on_leaders() -> None:
    got = _by_type(
        decide(
            replicas=1,
            reports=_reports((True, True)),
            plan=None,
            invalid=None,
            router_enabled=False,
            router_ready_replicas=0,
        )
    )
    assert got[conditions.READY] == ("True", "LeadersReady")


def test_complete_when_all_groups_updated_and_ready() -> None:
    reports = _reports((True, True), (True, True))
    p = plan(2, {r.index: r.rollout_state() for r in reports}, max_unavailable=1, max_surge=0)
    got = _by_type(
        decide(
            replicas=2,
            reports=reports,
            plan=p,
            invalid=None,
            router_enabled=True,
            router_ready_replicas=1,
        )
    )
    assert got[conditions.PROGRESSING] == ("False", "Complete")
    assert got[conditions.DEGRADED] == ("False", "AsExpected")
    assert got[conditions.VALID] == ("True", "SpecValid")


def test_rolling_update_is_progressing() -> None:
    reports = _reports((True, False), (True, False))
    p = plan(2, {r.index: r.rollout_state() for r in reports}, max_unavailable=1, max_surge=0)
    got = _by_type(
        decide(
            replicas=2,
            reports=reports,
            plan=p,
            invalid=None,
            router_enabled=True,
            router_ready_replicas=1,
        )
    )
    assert got[conditions.PROGRESSING] == ("True", "RollingUpdate")


def test_invalid_spec_sets_valid_false_with_its_reason() -> None:
    got = _by_type(
        decide(
            replicas=1,
            reports=[],
            plan=None,
            invalid="spec.tpu.topology: ...",
            invalid_reason=Reason.UNSUPPORTED_TOPOLOGY,
            router_enabled=True,
            router_ready_replicas=0,
        )
    )
    assert got[conditions.VALID] == ("False", "UnsupportedTopology")
    assert got[conditions.READY] == ("False", "InvalidSpec")
    assert got[conditions.PROGRESSING] == ("False", "InvalidSpec")


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
    (degraded,) = [c for c in got if c.type == conditions.DEGRADED]
    assert (degraded.status, degraded.reason) == ("True", "Unschedulable")
    assert "no tpu" in degraded.message


def test_apply_errors_are_reported() -> None:
    got = _by_type(
        decide(
            replicas=1,
            reports=[],
            plan=None,
            invalid=None,
            router_enabled=True,
            router_ready_replicas=0,
            apply_error="StatefulSet qwen-r0: forbidden",
        )
    )
    assert got[conditions.PROGRESSING] == ("False", "ApplyFailed")
    assert got[conditions.DEGRADED] == ("True", "ApplyFailed")


def test_every_reason_the_operator_writes_is_documented() -> None:
    documented = {(r.type, r.status, r.reason) for r in conditions.REASONS}
    cases = [
        decide(
            replicas=n,
            reports=reports,
            plan=plan(
                n, {r.index: r.rollout_state() for r in reports}, max_unavailable=1, max_surge=0
            ),
            invalid=inv,
            router_enabled=router,
            router_ready_replicas=rr,
            apply_error=err,
        )
        for n in (0, 1, 2)
        for reports in (_reports(), _reports((True, True)), _reports((False, False), (True, False)))
        for inv in (None, "bad")
        for router in (True, False)
        for rr in (0, 1)
        for err in (None, "boom")
    ]
    for decided in cases:
        for c in decided:
            assert (c.type, c.status, c.reason) in documented, c


def test_merge_keeps_transition_time_while_status_holds() -> None:
    first = conditions.merge(
        [],
        [conditions.Condition.of("Ready", False, Reason.NO_READY_REPLICAS, "x")],
        now="t1",
        generation=1,
    )
    same = conditions.merge(
        first,
        [conditions.Condition.of("Ready", False, Reason.ROUTER_NOT_READY, "y")],
        now="t2",
        generation=2,
    )
    assert same[0].last_transition_time == "t1"
    assert same[0].observed_generation == 2
    assert same[0].reason == "RouterNotReady"
    flipped = conditions.merge(
        same,
        [conditions.Condition.of("Ready", True, Reason.ROUTER_READY, "z")],
        now="t3",
        generation=2,
    )
    assert flipped[0].last_transition_time == "t3"


def test_merge_sets_observed_generation_only_when_given() -> None:
    (acknowledged,) = conditions.merge(
        [],
        [conditions.Condition.of("Ready", False, Reason.NO_READY_REPLICAS, "x")],
        now="t",
        generation=None,
    )
    assert acknowledged.model_dump(by_alias=True, exclude_unset=True) == {
        "type": "Ready",
        "status": "False",
        "reason": "NoReadyReplicas",
        "message": "x",
        "lastTransitionTime": "t",
    }


def test_transitions_flag_warnings() -> None:
    old = conditions.merge(
        [],
        [conditions.Condition.of("Ready", True, Reason.ROUTER_READY, "x")],
        now="t",
        generation=1,
    )
    (t,) = conditions.transitions(
        old, [conditions.Condition.of("Ready", False, Reason.NO_READY_REPLICAS, "y")]
    )
    assert t.warning
    (d,) = conditions.transitions(
        [], [conditions.Condition.of("Degraded", False, Reason.AS_EXPECTED, "")]
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
