"""Deleting pods so replica groups restart as one.

- On a rollout: the plan's groups to restart lose every stale pod at once (their StatefulSets
  use `OnDelete`, so the whole slice comes back on the new revision together).
- When a group must leave a node GKE is taking away (`node_signals`) and the plan restarts
  it: all of its pods are deleted (both workload paths; LeaderWorkerSet recreates the group),
  each draining within its grace period, and a `GroupDraining` Event names the node; while
  one of its pods still terminates, the group is left alone (it is on its way).
- When one host of a running multi-host group restarts: the group's other pods are deleted
  too (LeaderWorkerSet's `RecreateGroupOnPodRestart`, done by hand; `group_restart.check`
  decides, with what the server's state remembers) and a `GroupRestarted` Warning is posted.
  On both workload paths: LeaderWorkerSet (v0.9.0, `handleRestartPolicy`) restarts a group
  only when its reconcile still sees the deleted worker with a `deletionTimestamp`, so a
  worker that is gone at once (force-deleted, or lost with its node) can come back without
  the rest of its group. Where LWS acts first the operator's deletes find nothing: each names
  the incarnation it means (a uid precondition), never a pod recreated under the same name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from tpuserve_operator import disaggregation, group_restart, rollout
from tpuserve_operator.conditions import Reason
from tpuserve_operator.kube import EventSink, KubeApi
from tpuserve_operator.node_signals import NodeSignal
from tpuserve_operator.observed import ObservedCache, ServerKey
from tpuserve_operator.render import Rendered
from tpuserve_operator.server_state import ServerState
from tpuserve_operator.status import GroupObservation


class GroupRestarts:
    """Deletes the pods that make a replica group restart as one."""

    def __init__(self, kube: KubeApi, cache: ObservedCache, emit_event: EventSink) -> None:
        self.kube = kube
        self.cache = cache
        self.emit_event = emit_event

    async def replace_stale_pods(
        self, key: ServerKey, rendered: Rendered, plan: rollout.Plan
    ) -> None:
        """Replace every stale pod of the groups the plan restarts, at once."""
        if rendered.server.config.leaderworkerset or not plan.restart:
            return
        stale = [
            p
            for p in self.cache.pods(key)
            if p.replica in plan.restart
            and p.revision != rendered.group_revision(p.replica)
            and not p.deleting
        ]
        found = await asyncio.gather(
            *(self.kube.delete("v1", "Pod", key[0], p.name) for p in stale)
        )
        for pod, existed in zip(stale, found, strict=True):
            if not existed:
                self.cache.drop_pod(key, pod.name)

    async def move_groups(
        self,
        key: ServerKey,
        body: Mapping[str, Any],
        plan: rollout.Plan,
        displaced: Mapping[int, NodeSignal],
    ) -> None:
        """Delete every pod of the displaced groups the plan restarts now; they are
        recreated on other nodes (the signalled one is tainted or avoided by affinity). A
        group with a pod still terminating is being moved already: its hosts recreated
        elsewhere are left alone, and its move is announced once."""
        for k in plan.restart:
            signal = displaced.get(k)
            if signal is None:
                continue
            pods = [p for p in self.cache.pods(key) if p.replica == k]
            if not pods or any(p.deleting for p in pods):
                continue
            await asyncio.gather(*(self.kube.delete("v1", "Pod", key[0], p.name) for p in pods))
            self.emit_event(
                body,
                "Normal",
                str(Reason.GROUP_DRAINING),
                f"replica group {disaggregation.describe(k)} drains and moves: {signal.message} "
                f"({signal.reason})",
            )

    async def restart_broken_groups(
        self,
        key: ServerKey,
        state: ServerState,
        body: Mapping[str, Any],
        rendered: Rendered,
        plan: rollout.Plan,
        groups: Mapping[int, GroupObservation],
    ) -> None:
        """When one pod of a running multi-host group restarted, restart the rest."""
        for k, group in groups.items():
            hosts = rendered.group_hosts(k)  # a role's slice when disaggregated
            if hosts == 1:
                continue
            if not group.exists or group.deleting or k in plan.restart or k in plan.delete:
                state.epochs.pop(k, None)  # being rolled, removed or made: not a restart
                continue
            verdict = group_restart.check(
                state.epochs.get(k), group.pods, hosts, state.condemned.get(k, ())
            )
            if verdict.epoch is None:
                state.epochs.pop(k, None)
            else:
                state.epochs[k] = verdict.epoch
                state.condemned.pop(k, None)
            if not verdict.delete:
                continue
            doomed = [p for p in group.pods if p.name in verdict.delete]
            state.condemned[k] = state.condemned.get(k, set()) | {p.uid for p in doomed}
            found = await asyncio.gather(
                *(self.kube.delete("v1", "Pod", key[0], p.name, uid=p.uid) for p in doomed)
            )
            if not any(found):
                continue  # all gone already: their workload restarted the group itself
            self.emit_event(
                body,
                "Warning",
                str(Reason.GROUP_RESTARTED),
                f"replica group {group.name}: pod {verdict.cause} restarted; restarting the "
                f"group's other {len(verdict.delete)} pods with it (a multi-host slice runs "
                "as one program)",
            )
