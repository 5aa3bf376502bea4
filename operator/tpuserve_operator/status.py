"""From observed groups, pods and router to group states, conditions and `status`. Pure.

Group states (status.groups[].state):

- Pending: not every host has a running pod; reason Unschedulable when the scheduler
  refused one (the message names what was missing, e.g. `google.com/tpu`), PartiallyUp
  when some hosts run and others do not, Creating otherwise;
- Starting: every host runs, the leader is not serving yet (weights, XLA compilation);
- Ready: every host ready, the leader serving;
- Degraded: a container is crash-looping (CrashLoop), pods are unschedulable
  (Unschedulable), or the group has been partly up for longer than the bound
  (GroupPartiallyUp; the bound is the operator's --partial-group-seconds);
- Terminating: the group is being deleted.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpuserve_operator import conditions
from tpuserve_operator.conditions import Condition
from tpuserve_operator.observed import PodView
from tpuserve_operator.rollout import GroupState, Plan

PARTIAL_REASONS = ("PartiallyUp", "GroupPartiallyUp")
DEFAULT_PARTIAL_GROUP_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class GroupObservation:
    """One replica group: its workload(s) and its pods."""

    index: int
    name: str
    exists: bool
    deleting: bool
    workload_revision: str | None
    pods: Sequence[PodView] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class GroupReport:
    index: int
    name: str
    state: str
    reason: str
    message: str
    since: str
    hosts: int
    ready_hosts: int
    updated: bool
    ready: bool
    exists: bool
    # When the group's current state should be looked at again (seconds), if ever.
    recheck_seconds: float | None = None

    def as_status(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "state": self.state,
            "hosts": self.hosts,
            "readyHosts": self.ready_hosts,
            "updated": self.updated,
            "reason": self.reason,
            "message": self.message,
            "since": self.since,
        }

    def rollout_state(self) -> GroupState:
        return GroupState(exists=self.exists, updated=self.updated, ready=self.ready)


def timestamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(text: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    except (TypeError, ValueError):
        return None


def report_group(
    obs: GroupObservation,
    *,
    hosts: int,
    revision: str,
    previous: Mapping[str, Any] | None,
    now: datetime.datetime,
    partial_group_seconds: float = DEFAULT_PARTIAL_GROUP_SECONDS,
) -> GroupReport:
    live = [p for p in obs.pods if not p.deleting]
    running = [p for p in live if p.running]
    ready_pods = [p for p in running if p.ready]
    leader_ready = any(p.role == "leader" and p.ready for p in ready_pods)
    # Updated: the workload and every pod that exists run this revision (pods still being
    # created are starting, not stale).
    updated = (
        obs.exists
        and obs.workload_revision == revision
        and all(p.revision == revision for p in live)
    )
    ready = obs.exists and len(ready_pods) == hosts and leader_ready
    unschedulable = next((p for p in live if p.unschedulable), None)
    crash = next((p for p in live if p.crash_loop), None)

    state, reason, message = "Pending", "Creating", f"{len(running)} of {hosts} hosts running"
    if obs.deleting or not obs.exists:
        state, reason = ("Terminating", "Deleting") if obs.deleting else ("Pending", "Creating")
        message = (
            "the group is being deleted"
            if obs.deleting
            else "the group's workload is being created"
        )
    elif crash is not None:
        state, reason, message = "Degraded", "CrashLoop", f"pod {crash.name}: {crash.crash_loop}"
    elif unschedulable is not None:
        state, reason = "Degraded", "Unschedulable"
        message = f"pod {unschedulable.name}: {unschedulable.unschedulable}"
    elif ready:
        state, reason, message = "Ready", "Serving", f"all {hosts} hosts ready"
    elif len(running) == hosts:
        state, reason = "Starting", "Starting"
        message = f"all {hosts} hosts running; waiting for the leader to serve"
    elif running:
        state, reason = "Pending", "PartiallyUp"
        message = f"{len(running)} of {hosts} hosts running"

    prev_reason = previous.get("reason") if previous else None
    prev_since = _parse(str(previous.get("since"))) if previous else None
    continuing = (
        previous is not None
        and prev_since is not None
        and (
            (prev_reason == reason and previous.get("state") == state)
            or (reason == "PartiallyUp" and prev_reason in PARTIAL_REASONS)
        )
    )
    since = prev_since if continuing and prev_since is not None else now
    recheck = None
    if reason == "PartiallyUp":
        waited = (now - since).total_seconds()
        if waited >= partial_group_seconds:
            state, reason = "Degraded", "GroupPartiallyUp"
            message = (
                f"only {len(running)} of {hosts} hosts running for {int(waited)} s "
                f"(bound {int(partial_group_seconds)} s)"
            )
        else:
            recheck = partial_group_seconds - waited
    return GroupReport(
        index=obs.index,
        name=obs.name,
        state=state,
        reason=reason,
        message=message,
        since=timestamp(since),
        hosts=hosts,
        ready_hosts=len(ready_pods),
        updated=updated,
        ready=ready,
        exists=obs.exists and not obs.deleting,
        recheck_seconds=recheck,
    )


def decide(
    *,
    replicas: int,
    reports: Sequence[GroupReport],
    plan: Plan | None,
    invalid: str | None,
    invalid_reason: str = "InvalidSpec",
    router_enabled: bool,
    router_ready_replicas: int,
    apply_error: str | None = None,
) -> list[Condition]:
    """The four conditions, in order Valid, Progressing, Ready, Degraded."""
    of = Condition.of
    ready_groups = sum(1 for r in reports if r.ready)
    main = [r for r in reports if r.index < replicas]
    updated = sum(1 for r in main if r.updated)
    out: list[Condition] = []

    if invalid is not None:
        out.append(of(conditions.VALID, False, invalid_reason, invalid))
        out.append(
            of(
                conditions.PROGRESSING,
                False,
                "InvalidSpec",
                "nothing is rolled out while the spec is invalid",
            )
        )
    else:
        out.append(of(conditions.VALID, True, "SpecValid", "the spec is valid"))
        if apply_error is not None:
            out.append(of(conditions.PROGRESSING, False, "ApplyFailed", apply_error))
        elif plan is not None and plan.scaling_up:
            existing = sum(1 for r in main if r.exists)
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    "ScalingUp",
                    f"{existing} of {replicas} replica groups exist",
                )
            )
        elif plan is not None and plan.rolling:
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    "RollingUpdate",
                    f"{updated} of {replicas} replica groups on the current revision",
                )
            )
        elif plan is not None and plan.scaling_down:
            extra = len(plan.delete)
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    "ScalingDown",
                    f"removing {extra} replica group(s)",
                )
            )
        elif any(not r.ready for r in main):
            ready_main = sum(1 for r in main if r.ready)
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    "GroupsStarting",
                    f"{ready_main} of {replicas} replica groups ready",
                )
            )
        else:
            out.append(
                of(
                    conditions.PROGRESSING,
                    False,
                    "Complete",
                    f"{replicas} replica groups ready on the current revision",
                )
            )

    if ready_groups and (not router_enabled or router_ready_replicas > 0):
        if router_enabled:
            out.append(
                of(
                    conditions.READY,
                    True,
                    "RouterReady",
                    f"the router has {ready_groups} routable replica group(s)",
                )
            )
        else:
            out.append(
                of(
                    conditions.READY,
                    True,
                    "LeadersReady",
                    f"{ready_groups} replica group(s) serving",
                )
            )
    elif invalid is not None:
        out.append(
            of(
                conditions.READY,
                False,
                "InvalidSpec",
                "the spec is invalid; see the Valid condition",
            )
        )
    elif replicas == 0:
        out.append(of(conditions.READY, False, "ScaledToZero", "spec.replicas is 0"))
    elif not ready_groups:
        out.append(
            of(conditions.READY, False, "NoReadyReplicas", f"0 of {replicas} replica groups ready")
        )
    else:
        out.append(
            of(
                conditions.READY,
                False,
                "RouterNotReady",
                "replica groups are ready but no router pod is",
            )
        )

    degraded = next((r for r in reports if r.state == "Degraded"), None)
    if apply_error is not None:
        out.append(of(conditions.DEGRADED, True, "ApplyFailed", apply_error))
    elif degraded is not None:
        out.append(
            of(
                conditions.DEGRADED,
                True,
                degraded.reason,
                f"replica group {degraded.index}: {degraded.message}",
            )
        )
    elif invalid is not None:
        out.append(
            of(
                conditions.DEGRADED,
                False,
                "InvalidSpec",
                "the spec is invalid; see the Valid condition",
            )
        )
    else:
        out.append(of(conditions.DEGRADED, False, "AsExpected", "nothing is wrong"))
    return out
