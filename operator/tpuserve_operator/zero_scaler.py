"""Scale an idle server to zero replicas and back, as `scale_to_zero` decides.

The operator owns 0 <-> 1 for a server with `autoscaling.minReplicas: 0` and engine hpa (the
HPA stands aside at zero): it patches the scale subresource when the router's demand Lease
shows requests at zero (activate) or none for `scaleToZero.idleSeconds` (zero), and posts an
Event each time. With engine keda, KEDA owns it and this does nothing.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from tpuserve_operator import conditions, labels
from tpuserve_operator.kube import EventSink, KubeApi
from tpuserve_operator.node_signals import parse_time
from tpuserve_operator.observed import ChildView, ServerKey
from tpuserve_operator.render import Rendered
from tpuserve_operator.render.demand import scales_to_zero
from tpuserve_operator.render.pod import startup_budget_seconds
from tpuserve_operator.scale_to_zero import decide_zero
from tpuserve_operator.server_state import ServerState

log = logging.getLogger(__name__)


class ZeroScaler:
    """A server's replicas set to 0 when idle and back to 1 on demand (`scale_to_zero`)."""

    def __init__(self, kube: KubeApi, emit_event: EventSink) -> None:
        self.kube = kube
        self._emit_event = emit_event

    async def scale_to_zero(
        self,
        key: ServerKey,
        state: ServerState,
        body: Mapping[str, Any],
        rendered: Rendered,
        lease: ChildView | None,
        now: datetime.datetime,
        ready: bool,
    ) -> float | None:
        """Activate an idle-at-zero server on demand, or scale an idle one to zero
        (`scale_to_zero`); returns when the idle period would end, if it runs. ``ready``:
        a group is Ready now; ``lease``: the server's demand Lease as observed (None: none)."""
        server = rendered.server
        autoscaling = server.valid.spec.autoscaling
        if ready and state.activating:
            state.activating = False
            state.active_since = now  # the idle clock starts at the first Ready group
        replicas = server.valid.spec.replicas
        if autoscaling is not None and autoscaling.engine == "keda":
            # KEDA owns 0 <-> 1 through its activation (the ScaledObject's router-demand
            # trigger, `render.autoscaler`): the operator does not scale it
            state.active_since = state.zeroed_at = state.replicas_set = None
            state.activating = False
            return None
        if autoscaling is None or not scales_to_zero(server):
            state.active_since = state.zeroed_at = state.replicas_set = None
            state.activating = False
            annotations = (body.get("metadata") or {}).get("annotations") or {}
            if replicas == 0 and annotations.get(labels.SCALED_TO_ZERO) == "true":
                # Scale to zero was turned off while the operator held the server at zero;
                # the HPA stands aside at 0, so bring it back up.
                least = max(1, autoscaling.min_replicas if autoscaling else 1)
                await self.kube.patch_replicas(key[0], key[1], least)
                log.info("%s/%s: scale to zero is off: replicas 0 -> %d", *key, least)
            return None
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        if state.replicas_set is not None:
            patched_on, target = state.replicas_set
            if replicas != target and generation <= patched_on:
                return None  # our own change has not come back on the watch yet
            state.replicas_set = None  # seen, or someone else's later write
        if replicas == 0:
            state.active_since = None
        elif state.active_since is None:
            state.active_since = now
        created = parse_time(lease.created) if lease is not None else None
        marks = [t for t in (created, state.active_since) if t is not None]
        starting_until = None
        if state.activating and state.active_since is not None:
            budget = datetime.timedelta(seconds=startup_budget_seconds(server))
            starting_until = state.active_since + budget
        decision = decide_zero(
            replicas=replicas,
            idle_seconds=autoscaling.scale_to_zero.idle_seconds,
            now=now,
            renewed=state.demand_seen if lease is not None else None,
            active_since=max(marks) if marks else None,
            zeroed_at=state.zeroed_at,
            starting_until=starting_until,
        )
        if decision.action is None:
            return decision.recheck_seconds
        target = 1 if decision.action == "activate" else 0
        await self.kube.patch_replicas(key[0], key[1], target)
        state.replicas_set = (generation, target)
        if target:
            state.activating = True
            state.active_since = now
            reason = conditions.Reason.ACTIVATING
        else:
            state.activating = False
            state.zeroed_at = now
            reason = conditions.Reason.SCALED_TO_ZERO
        log.info("%s/%s: %s", *key, decision.message)
        self._emit_event(body, "Normal", str(reason), decision.message)
        return None
