"""From observed groups, pods and router to group states, conditions and `status`. Pure.

Group states (status.groups[].state):

- Pending: not every host has a running pod; reason Unschedulable when the scheduler
  refused one (the message names what was missing, e.g. `google.com/tpu`), PartiallyUp
  when some hosts run and others do not, Creating otherwise;
- Starting: every host runs, the leader is not serving yet (weights, XLA compilation);
- Ready: every host ready, the leader serving;
- Degraded: the launcher's pre-flight refused to start on a host (the pre-flight's reason,
  e.g. TPUStackIncompatible or AcceleratorMismatch, read from the container's termination
  message), a container is crash-looping (CrashLoop), pods are unschedulable
  (Unschedulable), or the group has been partly up for longer than the bound
  (GroupPartiallyUp; the bound is the operator's --partial-group-seconds);
- Terminating: the group is being deleted.

`observe_groups` gathers each group's workloads and pods, `report_group` gives its state and
`decide` the four conditions (`status_writer.build_status` turns them into the status).
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tpuserve_operator import conditions, disaggregation
from tpuserve_operator.api import GroupStatus
from tpuserve_operator.conditions import Condition, Reason
from tpuserve_operator.node_signals import NodeSignal
from tpuserve_operator.observed import ChildView, PodView
from tpuserve_operator.render import Rendered
from tpuserve_operator.rollout import GroupState, Plan

PARTIAL_REASONS = (Reason.PARTIALLY_UP, Reason.GROUP_PARTIALLY_UP)
DEFAULT_PARTIAL_GROUP_SECONDS = 600.0

SPEC_VALID = Condition.of(conditions.VALID, True, Reason.SPEC_VALID, "the spec is valid")

GroupStateName = Literal["Pending", "Starting", "Ready", "Degraded", "Terminating"]


@dataclass(frozen=True, slots=True)
class GroupObservation:
    """One replica group: its workload(s) and its pods."""

    index: int  # the group key (`disaggregation.group_key`), as in GroupReport
    name: str
    exists: bool
    deleting: bool
    workload_revision: str | None
    pods: Sequence[PodView] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class GroupReport:
    index: int  # the group key: a plain server's index, or a role's (`disaggregation`)
    name: str
    state: GroupStateName
    reason: Reason
    message: str
    since: str
    hosts: int
    ready_hosts: int
    updated: bool
    ready: bool
    exists: bool
    # When the group's current state should be looked at again (seconds), if ever.
    recheck_seconds: float | None = None
    contract: str = ""  # its leader's pairing contract (a disaggregated server's), if any

    def as_status(self) -> GroupStatus:
        role = disaggregation.key_role(self.index)
        status = GroupStatus(
            index=disaggregation.key_index(self.index),
            name=self.name,
            state=self.state,
            hosts=self.hosts,
            ready_hosts=self.ready_hosts,
            updated=self.updated,
            reason=str(self.reason),
            message=self.message,
            since=self.since,
        )
        # a plain server's groups carry no role field (the status is written as it is set)
        return status if role is None else status.model_copy(update={"role": role})

    def rollout_state(self) -> GroupState:
        return GroupState(
            exists=self.exists, updated=self.updated, ready=self.ready, contract=self.contract
        )


def observe_groups(
    rendered: Rendered, children: Mapping[tuple[str, str], ChildView], pods: Iterable[PodView]
) -> dict[int, GroupObservation]:
    """Every replica group the server wants or has: its workload(s) and its pods."""
    server = rendered.server
    kind = server.workload_kind
    workloads: dict[int, list[ChildView]] = {}
    for child in children.values():
        if child.kind == kind and child.replica is not None and child.owner_uid == server.uid:
            workloads.setdefault(child.replica, []).append(child)
    by_group: dict[int, list[PodView]] = {}
    for pod in pods:
        if pod.replica is not None:
            by_group.setdefault(pod.replica, []).append(pod)
    out: dict[int, GroupObservation] = {}
    for k in sorted(set(workloads) | set(rendered.group_keys)):
        # a StatefulSet group of several hosts is two workloads: leader and workers
        expected = 1 if kind == "LeaderWorkerSet" or rendered.group_hosts(k) == 1 else 2
        found = workloads.get(k, [])
        revisions = {w.revision for w in found}
        out[k] = GroupObservation(
            index=k,
            name=rendered.group_name(k),
            exists=len(found) == expected and not any(w.deleting for w in found),
            deleting=bool(found) and all(w.deleting for w in found),
            workload_revision=revisions.pop() if len(revisions) == 1 else None,
            pods=tuple(by_group.get(k, ())),
        )
    return out


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
    previous: GroupStatus | None,
    now: datetime.datetime,
    partial_group_seconds: float = DEFAULT_PARTIAL_GROUP_SECONDS,
) -> GroupReport:
    live = [p for p in obs.pods if not p.deleting]
    running = [p for p in live if p.running]
    ready_pods = [p for p in running if p.ready]
    leader_ready = any(p.role == "leader" and p.ready for p in ready_pods)
    leader = next((p for p in live if p.role == "leader"), None)
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
    refused = next((p for p in live if p.preflight_failure), None)

    state: GroupStateName = "Pending"
    reason, message = Reason.CREATING, f"{len(running)} of {hosts} hosts running"
    if obs.deleting or not obs.exists:
        state, reason = (
            ("Terminating", Reason.DELETING) if obs.deleting else ("Pending", Reason.CREATING)
        )
        message = (
            "the group is being deleted"
            if obs.deleting
            else "the group's workload is being created"
        )
    elif refused is not None and refused.preflight_failure is not None:
        state, reason = "Degraded", Reason(refused.preflight_failure[0])
        message = f"pod {refused.name}: {refused.preflight_failure[1]}"
    elif crash is not None:
        state, reason = "Degraded", Reason.CRASH_LOOP
        message = f"pod {crash.name}: {crash.crash_loop}"
    elif unschedulable is not None:
        state, reason = "Degraded", Reason.UNSCHEDULABLE
        message = f"pod {unschedulable.name}: {unschedulable.unschedulable}"
    elif ready:
        state, reason, message = "Ready", Reason.SERVING, f"all {hosts} hosts ready"
    elif len(running) == hosts:
        state, reason = "Starting", Reason.STARTING
        message = f"all {hosts} hosts running; waiting for the leader to serve"
    elif running:
        state, reason = "Pending", Reason.PARTIALLY_UP
        message = f"{len(running)} of {hosts} hosts running"

    prev_reason = previous.reason if previous else None
    prev_since = _parse(previous.since) if previous else None
    continuing = (
        previous is not None
        and prev_since is not None
        and (
            (prev_reason == reason and previous.state == state)
            or (reason == Reason.PARTIALLY_UP and prev_reason in PARTIAL_REASONS)
        )
    )
    since = prev_since if continuing and prev_since is not None else now
    recheck = None
    if reason == Reason.PARTIALLY_UP:
        waited = (now - since).total_seconds()
        if waited >= partial_group_seconds:
            state, reason = "Degraded", Reason.GROUP_PARTIALLY_UP
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
        contract=leader.pd_contract if leader is not None else "",
    )


def decide(
    *,
    replicas: int,
    reports: Sequence[GroupReport],
    plan: Plan | None,
    invalid: str | None,
    invalid_reason: Reason = Reason.INVALID_SPEC,
    router_enabled: bool,
    router_ready_replicas: int,
    apply_error: str | None = None,
    displaced: Mapping[int, NodeSignal] | None = None,
    activating: bool = False,
    scales_to_zero: bool = False,
    main_keys: Collection[int] | None = None,
) -> list[Condition]:
    """The four conditions, in order Valid, Progressing, Ready, Degraded. ``activating``:
    the operator scaled the server from zero on demand and no group is ready yet;
    ``scales_to_zero``: autoscaling.minReplicas is 0; ``main_keys``: the keys of the groups
    the spec wants (default: ``0 .. replicas-1``, a plain server's)."""
    of = Condition.of
    ready_groups = sum(1 for r in reports if r.ready)
    wanted = set(range(replicas) if main_keys is None else main_keys)
    main = [r for r in reports if r.index in wanted]
    updated = sum(1 for r in main if r.updated)
    out: list[Condition] = []

    if invalid is not None:
        out.append(of(conditions.VALID, False, invalid_reason, invalid))
        out.append(
            of(
                conditions.PROGRESSING,
                False,
                Reason.INVALID_SPEC,
                "nothing is rolled out while the spec is invalid",
            )
        )
    else:
        out.append(SPEC_VALID)
        if apply_error is not None:
            out.append(of(conditions.PROGRESSING, False, Reason.APPLY_FAILED, apply_error))
        elif activating and not ready_groups:
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    Reason.ACTIVATING,
                    f"scaling from zero on demand: 0 of {replicas} replica groups ready; "
                    "the router holds requests until one is",
                )
            )
        elif plan is not None and plan.scaling_up:
            existing = sum(1 for r in main if r.exists)
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    Reason.SCALING_UP,
                    f"{existing} of {replicas} replica groups exist",
                )
            )
        elif plan is not None and plan.rolling and displaced:
            k, signal = min(displaced.items())
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    signal.reason,
                    f"replica group {disaggregation.describe(k)} moves: {signal.message}"
                    + (f" (and {len(displaced) - 1} more group(s))" if len(displaced) > 1 else ""),
                )
            )
        elif plan is not None and plan.rolling:
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    Reason.ROLLING_UPDATE,
                    f"{updated} of {replicas} replica groups on the current revision",
                )
            )
        elif plan is not None and plan.scaling_down:
            extra = len(plan.delete)
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    Reason.SCALING_DOWN,
                    f"removing {extra} replica group(s)",
                )
            )
        elif any(not r.ready for r in main):
            ready_main = sum(1 for r in main if r.ready)
            out.append(
                of(
                    conditions.PROGRESSING,
                    True,
                    Reason.GROUPS_STARTING,
                    f"{ready_main} of {replicas} replica groups ready",
                )
            )
        else:
            out.append(
                of(
                    conditions.PROGRESSING,
                    False,
                    Reason.COMPLETE,
                    f"{replicas} replica groups ready on the current revision",
                )
            )

    if ready_groups and (not router_enabled or router_ready_replicas > 0):
        if router_enabled:
            out.append(
                of(
                    conditions.READY,
                    True,
                    Reason.ROUTER_READY,
                    f"the router has {ready_groups} routable replica group(s)",
                )
            )
        else:
            out.append(
                of(
                    conditions.READY,
                    True,
                    Reason.LEADERS_READY,
                    f"{ready_groups} replica group(s) serving",
                )
            )
    elif invalid is not None:
        out.append(
            of(
                conditions.READY,
                False,
                Reason.INVALID_SPEC,
                "the spec is invalid; see the Valid condition",
            )
        )
    elif replicas == 0:
        out.append(
            of(
                conditions.READY,
                False,
                Reason.SCALED_TO_ZERO,
                "scaled to zero while idle; the router holds the next request and it scales "
                "the server to 1"
                if scales_to_zero
                else "spec.replicas is 0",
            )
        )
    elif not ready_groups:
        out.append(
            of(
                conditions.READY,
                False,
                Reason.NO_READY_REPLICAS,
                f"0 of {replicas} replica groups ready",
            )
        )
    else:
        out.append(
            of(
                conditions.READY,
                False,
                Reason.ROUTER_NOT_READY,
                "replica groups are ready but no router pod is",
            )
        )

    degraded = next((r for r in reports if r.state == "Degraded"), None)
    if apply_error is not None:
        out.append(of(conditions.DEGRADED, True, Reason.APPLY_FAILED, apply_error))
    elif degraded is not None:
        out.append(
            of(
                conditions.DEGRADED,
                True,
                degraded.reason,
                f"replica group {disaggregation.describe(degraded.index)}: {degraded.message}",
            )
        )
    elif invalid is not None:
        out.append(
            of(
                conditions.DEGRADED,
                False,
                Reason.INVALID_SPEC,
                "the spec is invalid; see the Valid condition",
            )
        )
    else:
        out.append(of(conditions.DEGRADED, False, Reason.AS_EXPECTED, "nothing is wrong"))
    return out


def acknowledged(generation: int | None) -> list[Condition]:
    """What a new generation says at once, before its first full pass."""
    return [
        SPEC_VALID,
        Condition.of(
            conditions.PROGRESSING, True, Reason.RECONCILING, f"applying generation {generation}"
        ),
    ]
