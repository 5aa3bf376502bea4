"""Converge one TPUModelServer: validate, render, apply what changed, roll groups, report.

One pass (`converge`) is idempotent and reads only the object, the in-memory view of its
children and pods (`ObservedCache`, filled from watch events) and what the operator remembers
about it (`ServerState`). The kopf handlers run one loop per TPUModelServer (`run`) that
converges, then sleeps until a watch event about the server, one of its children or pods
wakes it, or until a recheck is due (a group partly up waiting for its Degraded bound, a
failed apply, the periodic resync).

A pass:

1. validate and render (`render.validate_server`, `render.render`); an invalid spec sets
   `Valid=False` with the field-named message, posts an Event and changes nothing else;
2. plan groups (`rollout_plan`) from observed group states (`status.report_group`);
3. server-side apply shared children and the groups the plan allows, skipping children
   whose applied hash and generation say nothing changed (`children`, `drift`; autoscaled
   roles' TPUModelServerRoles are created first, `role_scales`);
4. on the StatefulSet path, restart groups as one: the stale pods of groups being updated,
   and the other pods of a group one of whose hosts restarted (`restarts`); on both paths,
   move the groups on nodes GKE is taking away (`node_signals`, fed by the node watch);
5. delete children this server no longer wants (scale-down, surge groups, router off);
   scale an idle server to zero and back on demand (`zero_scaler`);
6. write status and post Events for condition transitions (`status_writer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve_operator import conditions, disaggregation, gateway, labels, launch_contract
from tpuserve_operator.api import CompileCacheStatus, TPUModelServerStatus
from tpuserve_operator.children import Children
from tpuserve_operator.cold_starts import (
    LeaderStart,
    ReportReader,
    cache_location,
    compile_cache_status,
)
from tpuserve_operator.errors import InvalidSpec, Problem
from tpuserve_operator.floor_status import floor_statuses
from tpuserve_operator.gateway_reconciler import fronted_by_gateway
from tpuserve_operator.kube import EventSink, KubeApi, error_summary
from tpuserve_operator.metrics import OperatorMetrics, ReplicaRow, ServerPodsRow
from tpuserve_operator.node_signals import (
    NodeSignal,
    NodeSignals,
    PodPlacement,
    affected_groups,
    by_urgency,
    parse_time,
)
from tpuserve_operator.observed import (
    ChildView,
    ObservedCache,
    PodView,
    ServerKey,
    child_view,
    pod_view,
    server_key_of,
)
from tpuserve_operator.render import (
    RenderConfig,
    Rendered,
    ValidServer,
    render,
    validate_server,
)
from tpuserve_operator.render.autoscaler import KEDA_API_VERSION, KEDA_KIND, KEDA_PLURAL
from tpuserve_operator.render.demand import (
    GATEWAY_NEEDED,
    demand_lease_name,
    needs_gateway,
    scales_to_zero,
)
from tpuserve_operator.render.inference_pool import GROUP_VERSION as INFERENCE_GROUP_VERSION
from tpuserve_operator.render.inference_pool import KIND as INFERENCE_POOL
from tpuserve_operator.restarts import GroupRestarts
from tpuserve_operator.role_scales import RoleScales
from tpuserve_operator.rollout_plan import plan_groups
from tpuserve_operator.router_secrets import RouterSecrets
from tpuserve_operator.server_state import RenderKey, ServedModel, ServerState
from tpuserve_operator.status import (
    DEFAULT_PARTIAL_GROUP_SECONDS,
    acknowledged,
    decide,
    observe_groups,
    report_group,
)
from tpuserve_operator.status_writer import ServerGone, StatusWriter, build_status
from tpuserve_operator.zero_scaler import ZeroScaler

log = logging.getLogger(__name__)

LWS_GROUP_VERSION = "leaderworkerset.x-k8s.io/v1"
MONITORING_GROUP_VERSION = "monitoring.coreos.com/v1"
ERROR_BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
CHILD_KINDS = (
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "ServiceAccount"),
    ("v1", "Pod"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
    ("policy/v1", "PodDisruptionBudget"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    (KEDA_API_VERSION, KEDA_KIND),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("coordination.k8s.io/v1", "Lease"),
    (LWS_GROUP_VERSION, "LeaderWorkerSet"),
    (MONITORING_GROUP_VERSION, "PodMonitor"),
    (MONITORING_GROUP_VERSION, "ServiceMonitor"),
    (INFERENCE_GROUP_VERSION, INFERENCE_POOL),
    (labels.API_VERSION, labels.ROLE_KIND),
)


WORKLOADS = ("auto", "leaderworkerset", "statefulset")


@dataclass(frozen=True, slots=True)
class ReconcilerSettings:
    render: RenderConfig = dataclasses.field(default_factory=RenderConfig)
    # one of WORKLOADS; auto: LeaderWorkerSet when its CRD is installed, else StatefulSets
    workload: str = "auto"
    partial_group_seconds: float = DEFAULT_PARTIAL_GROUP_SECONDS
    resync_seconds: float = 60.0
    # Re-list a server's children and pods this often: watches can miss deletions (apiserver
    # restarts, expired resourceVersions), and kopf does not report relists to handlers.
    relist_seconds: float = 300.0
    max_concurrent: int = 16
    # Do not read Ready leaders' cold starts from their /server_info (status.compileCache): for
    # clusters whose pod IPs must not be dialled (the e2e tests' kwok clusters: fake pod IPs).
    skip_cold_start_reports: bool = False


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _backoff_seconds(state: ServerState) -> float:
    """The wait after a failed pass (the failure already counted)."""
    return ERROR_BACKOFF_SECONDS[min(state.failures, len(ERROR_BACKOFF_SECONDS)) - 1]


class Reconciler:
    """Every TPUModelServer's loop: what it remembers of each (`ServerState`), the watch-fed
    view of their children and pods, and the passes that converge them."""

    def __init__(
        self,
        kube: KubeApi,
        settings: ReconcilerSettings,
        metrics: OperatorMetrics,
        emit_event: EventSink,
        clock: Callable[[], datetime.datetime] = _utcnow,
        read_cold_start: ReportReader | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.cache = ObservedCache()
        self.nodes = NodeSignals()
        self._clock = clock
        self._servers: dict[ServerKey, ServerState] = {}
        self._wakers: dict[ServerKey, asyncio.Event] = {}  # one per running loop
        self._semaphore = asyncio.Semaphore(settings.max_concurrent)
        self._emit_event = emit_event
        self._children = Children(kube, self.cache, metrics)
        self._restarts = GroupRestarts(kube, self.cache, emit_event)
        self._status = StatusWriter(kube, emit_event)
        self._roles = RoleScales(kube, self.cache)
        self._secrets = RouterSecrets(kube)
        self._zero = ZeroScaler(kube, emit_event)
        self._read_cold_start = read_cold_start  # None: leaders' reports are not read

    def _state(self, key: ServerKey) -> ServerState:
        state = self._servers.get(key)
        if state is None:
            state = self._servers[key] = ServerState()
        return state

    # -- event intake (kopf handlers) ----------------------------------------------------------

    def trigger(self, key: ServerKey) -> None:
        event = self._wakers.get(key)
        if event is not None:
            event.set()

    def on_server_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Wake a server's loop when its spec, restart annotation or deletion changes
        (status-only changes, such as our own status patches, do not wake it)."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if event_type == "DELETED":
            self.forget(key)
            return
        marker = (
            meta.get("uid"),
            meta.get("generation"),
            (meta.get("annotations") or {}).get(labels.RESTARTED_AT),
            meta.get("deletionTimestamp"),
        )
        state = self._state(key)
        if state.seen != marker:
            state.seen = marker
            self.trigger(key)

    def on_child_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = server_key_of(body)
        if key is None or (body.get("apiVersion"), body.get("kind")) not in CHILD_KINDS:
            return  # not a child it watches (its peering Secret is made once, never observed)
        view = child_view(body)
        if event_type == "DELETED":
            self.cache.drop_child(key, view.kind, view.name)
        else:
            before = self.cache.children(key).get((view.kind, view.name))
            renewal = before is not None and view.renewed not in (None, before.renewed)
            if view.kind == "Lease" and renewal:
                # A router renewed the demand Lease: when, by this operator's clock (its
                # renewTime is the router's); the first sighting, after a restart, is not.
                self._state(key).demand_seen = self._clock()
            self.cache.put_child(key, view)
        self.trigger(key)

    def on_pod_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = server_key_of(body)
        if key is None:
            return
        view = pod_view(body)
        if event_type == "DELETED":
            before = next((p for p in self.cache.pods(key) if p.name == view.name), None)
            self.cache.drop_pod(key, view.name)
            cut_off = (  # running, not draining, when its node went
                before is not None
                and not before.deleting
                and view.replica is not None
                and self.nodes.vanished_recently(view.node, self._clock())
            )
            if cut_off and view.replica is not None:
                self._state(key).lost.setdefault(view.node, set()).add(view.replica)
        else:
            self.cache.put_pod(key, view)
        self.trigger(key)

    def on_node_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A node's disruption signals changed: wake every server (cheap: one pass each)."""
        deleted = event_type == "DELETED"
        changed = self.nodes.update(body, self._clock(), deleted=deleted)
        if deleted:
            node = str((body.get("metadata") or {}).get("name", ""))
            for key in self.cache.servers():
                for pod in self.cache.pods(key):
                    if pod.node == node and pod.replica is not None and not pod.deleting:
                        self._state(key).lost.setdefault(node, set()).add(pod.replica)
        if changed or deleted:
            for key in list(self._wakers):
                self.trigger(key)

    def displaced_groups(self, key: ServerKey) -> dict[int, NodeSignal]:
        """This server's groups on nodes GKE is taking away (see `node_signals`)."""
        placements = (
            PodPlacement(p.replica, p.node, parse_time(p.created)) for p in self.cache.pods(key)
        )
        return affected_groups(placements, self.nodes)

    def forget(self, key: ServerKey) -> None:
        """Drop what is remembered about a server (its loop, if running, keeps its waker)."""
        self._servers.pop(key, None)

    # -- the per-server loop (a kopf daemon) ---------------------------------------------------

    async def run(self, key: ServerKey, body: Mapping[str, Any], stopped: Any) -> None:
        """Converge until `stopped`; `body` is kopf's live view of the object."""
        wake = self._wakers.setdefault(key, asyncio.Event())
        try:
            while not stopped:
                wake.clear()
                delay = await self.converge(key, body)
                if delay is None:
                    log.info("%s/%s no longer exists; its loop ends", *key)
                    self.forget(key)
                    self.cache.forget(key)
                    break
                if stopped:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=delay)
        finally:
            self._wakers.pop(key, None)

    # -- one pass ------------------------------------------------------------------------------

    async def converge(self, key: ServerKey, body: Mapping[str, Any]) -> float | None:
        """Run one pass; returns seconds until the next one is due without events, or None
        when the server is gone."""
        await self._acknowledge(key, body)
        async with self._semaphore:
            started = time.monotonic()
            state = self._state(key)
            try:
                await self._relist_if_due(key, state)
                delay, result = await self._converge(key, state, body)
            except ServerGone:
                return None
            except Exception as err:  # an API failure: report, back off, retry
                state.failures += 1
                log.warning("reconcile %s/%s failed: %s", *key, error_summary(err))
                delay, result = _backoff_seconds(state), "error"
                state.relisted_at = None  # the watches may have missed something too
            took = time.monotonic() - started
            self.metrics.reconciles.labels(result).inc()
            self.metrics.reconcile_duration.observe(took)
            log.debug("reconciled %s/%s in %.3f s: %s", *key, took, result)
            return delay

    async def _converge(
        self, key: ServerKey, state: ServerState, body: Mapping[str, Any]
    ) -> tuple[float, str]:
        meta = dict(body.get("metadata") or {})
        if meta.get("deletionTimestamp"):
            return self.settings.resync_seconds, "ok"
        previous = self._status.previous(state, body)
        config = await self._config(previous)
        now = self._clock()
        try:
            if needs_gateway(body.get("spec") or {}) and not await fronted_by_gateway(
                self.kube, key[0], meta.get("labels") or {}
            ):
                raise InvalidSpec([Problem("spec.autoscaling.minReplicas", GATEWAY_NEEDED)])
            rendered = self._render(state, meta, body, config)
        except InvalidSpec as err:
            await self._report_invalid(key, state, body, previous, err, now)
            return self.settings.resync_seconds, "invalid"

        server = rendered.server
        children = self.cache.children(key)
        groups = observe_groups(rendered, children, self.cache.pods(key))
        previous_groups = {disaggregation.group_key(g.role, g.index): g for g in previous.groups}
        reports = {
            k: report_group(
                obs,
                hosts=rendered.group_hosts(k),
                revision=rendered.group_revision(k),
                previous=previous_groups.get(k),
                now=now,
                partial_group_seconds=self.settings.partial_group_seconds,
            )
            for k, obs in groups.items()
        }
        rollout_spec = server.valid.spec.rollout
        displaced = self.displaced_groups(key)
        moving, urgent = by_urgency(displaced)
        plan = plan_groups(
            rendered,
            {k: r.rollout_state() for k, r in reports.items()},
            max_unavailable=rollout_spec.max_unavailable,
            max_surge=rollout_spec.max_surge,
            moving=moving,
            urgent=urgent,
        )
        await self._secrets.ensure_peering_secret(state, rendered)
        await self._secrets.ensure_picker_secret(state, rendered)
        # an InferencePool of the server's name that someone else made is left alone
        pool_ref = (INFERENCE_POOL, server.name)
        foreign = await gateway.foreign_pool(
            self.kube, rendered, children, pool_ref in state.applied
        )
        ours = rendered
        if foreign is not None:
            ours = dataclasses.replace(rendered, shared=gateway.without_pool(rendered))
        await self._roles.seed_role_scales(key, rendered, children)
        apply_error = await self._children.apply(key, state, ours, plan, reports, children)
        if apply_error is None:
            await self._restarts.replace_stale_pods(key, rendered, plan)
            await self._restarts.move_groups(key, body, plan, displaced)
            await self._restarts.restart_broken_groups(key, state, body, rendered, plan, groups)
            await self._children.prune(key, state, ours, plan, children)
        lease = children.get(("Lease", demand_lease_name(server)))
        zero_recheck = await self._zero.scale_to_zero(
            key, state, body, rendered, lease, now, any(r.ready for r in reports.values())
        )
        decided = decide(
            replicas=rendered.replicas,
            reports=list(reports.values()),
            plan=plan,
            invalid=None,
            router_enabled=server.valid.spec.router.enabled,
            router_ready_replicas=self._router_ready(children, rendered),
            apply_error=apply_error,
            displaced=displaced,
            activating=state.activating and rendered.replicas > 0,
            scales_to_zero=scales_to_zero(server),
            main_keys=rendered.group_keys,
        )
        status = build_status(
            previous,
            decided,
            now=now,
            generation=meta.get("generation"),
            observed=True,
            rendered=rendered,
            reports=reports,
            compile_cache=await self._compile_cache(key, state, rendered, previous),
        )
        await self._roles.write_role_scales(key, status.roles)
        pool = gateway.pool_status(rendered, self.cache.children(key), foreign)
        if pool is not None or previous.inference_pool is not None:
            status = status.model_copy(update={"inference_pool": pool})
        floors = floor_statuses(rendered, self.cache.children(key))
        if floors or previous.predictive_floor:
            status = status.model_copy(update={"predictive_floor": floors})
        await self._status.write(key, state, body, status, decided)
        self._report_lost_nodes(state, body)
        state.served = ServedModel(
            model_name=server.valid.served_name,
            generation=server.valid.spec.tpu.generation,
            topology=server.valid.spec.tpu.topology,
            chips=server.valid.shape.chips,
            ready=any(c.type == conditions.READY and c.status == "True" for c in decided),
        )
        if apply_error is not None:
            state.failures += 1
            return _backoff_seconds(state), "error"
        state.failures = 0
        rechecks = [r.recheck_seconds for r in reports.values() if r.recheck_seconds is not None]
        if zero_recheck is not None:
            rechecks.append(zero_recheck)
        return min([self.settings.resync_seconds, *(s + 1.0 for s in rechecks)]), "ok"

    def _report_lost_nodes(self, state: ServerState, body: Mapping[str, Any]) -> None:
        """One Warning per node that vanished under this server's groups (no notice), once:
        the node's DELETED event and its pods' (the pod GC's) both tell of it."""
        now = self._clock()
        for node, groups in sorted(state.lost.items()):
            reported = state.lost_reported.setdefault(node, set())
            fresh = groups - reported
            if not fresh:
                continue
            reported |= fresh
            listed = ", ".join(disaggregation.describe(k) for k in sorted(fresh))
            self._emit_event(
                body,
                "Warning",
                str(conditions.Reason.NODE_LOST),
                f"node {node} vanished without notice with replica group(s) {listed}; "
                "recreating them on other nodes",
            )
        state.lost.clear()
        state.lost_reported = {
            n: g for n, g in state.lost_reported.items() if self.nodes.vanished_recently(n, now)
        }

    async def _compile_cache(
        self,
        key: ServerKey,
        state: ServerState,
        rendered: Rendered,
        previous: TPUModelServerStatus,
    ) -> CompileCacheStatus:
        """The compile cache key, with the cold starts of leaders that became Ready."""
        starts: list[LeaderStart] = []
        if self._read_cold_start is not None:
            starts = await state.cold_starts.new_starts(
                self.cache.pods(key),
                launch_contract.HTTP_PORT,
                self._read_cold_start,
                lambda: self._list_pods(key),
            )
        location = cache_location(rendered.server.valid.spec.engine.compile_cache)
        return compile_cache_status(
            previous.compile_cache, rendered.server.contract, location, starts
        )

    async def _list_pods(self, key: ServerKey) -> list[PodView] | None:
        """A server's pods, listed now from the API."""
        items = await self.kube.list("v1", "Pod", key[0], _children_selector(key))
        return None if items is None else [pod_view(item) for item in items]

    async def _relist_if_due(self, key: ServerKey, state: ServerState) -> None:
        now = time.monotonic()
        if state.relisted_at is None:
            state.relisted_at = now  # the watches just delivered everything
            return
        if now - state.relisted_at < self.settings.relist_seconds:
            return
        children: list[ChildView] = []
        pods: list[PodView] = []
        for api_version, kind in CHILD_KINDS:
            items = await self.kube.list(api_version, kind, key[0], _children_selector(key))
            for item in items or []:
                if kind == "Pod":
                    pods.append(pod_view(item))
                else:
                    children.append(child_view(item))
        self.cache.replace(key, children, pods)
        state.relisted_at = time.monotonic()
        log.debug("re-listed %s/%s: %d children, %d pods", *key, len(children), len(pods))

    async def _acknowledge(self, key: ServerKey, body: Mapping[str, Any]) -> None:
        """A new generation: say at once that it is valid and being rolled out, before
        waiting for a reconcile slot, so a burst of new servers all show Progressing fast.
        Failures are left to the full pass."""
        meta = body.get("metadata") or {}
        state = self._state(key)
        previous = self._status.previous(state, body)
        if meta.get("deletionTimestamp") or previous.observed_generation == meta.get("generation"):
            return
        if any(
            c.type == conditions.PROGRESSING and c.reason == conditions.Reason.RECONCILING
            for c in previous.conditions
        ):
            return
        try:
            rendered = self._render(state, meta, body, await self._config(previous))
            decided = acknowledged(meta.get("generation"))
            status = build_status(
                previous,
                decided,
                now=self._clock(),
                generation=meta.get("generation"),
                observed=False,
                rendered=rendered,
            )
            await self._status.write(key, state, body, status, decided)
        except Exception as err:
            log.debug("acknowledging %s/%s deferred: %s", *key, err)

    def _render(
        self,
        state: ServerState,
        meta: Mapping[str, Any],
        body: Mapping[str, Any],
        config: RenderConfig,
    ) -> Rendered:
        """Render, or reuse the last rendering of this generation (spec changes bump it) and
        of its autoscaled roles' counts."""
        key = (str(meta.get("namespace")), str(meta.get("name")))
        scaled = self._roles.observed_role_replicas(key)
        marker: RenderKey = (
            meta.get("uid"),
            meta.get("generation"),
            (meta.get("annotations") or {}).get(labels.RESTARTED_AT),
            config.leaderworkerset,
            config.prometheus_operator,
            config.inference_pool,
            config.role_scales,
            config.keda,
            scaled,
        )
        if state.rendering is not None and state.rendering[0] == marker:
            if isinstance(state.rendering[1], InvalidSpec):
                raise state.rendering[1]
            return state.rendering[1]
        try:
            rendered = render(self._validate(meta, dict(body.get("spec") or {}), config, scaled))
        except InvalidSpec as err:
            state.rendering = (marker, err)
            raise
        state.rendering = (marker, rendered)
        return rendered

    @staticmethod
    def _validate(
        meta: Mapping[str, Any],
        spec: dict[str, Any],
        config: RenderConfig,
        scaled: tuple[tuple[str, int | None], ...],
    ) -> ValidServer:
        """`validate_server` of ``spec`` with each autoscaled role's replicas replaced by its
        TPUModelServerRole's (before it has one: the role's replicas within min..max), so
        rendering stays pure and renders the count the role's HPA set."""
        server = validate_server(meta, spec, config, cel_rules=False)
        valid = server.valid.spec
        observed = dict(scaled)
        counts = {}
        for role in disaggregation.autoscaled_roles(valid):
            part = disaggregation.role_of(valid, role)
            count = observed.get(role)
            counts[role] = disaggregation.seed_replicas(part) if count is None else count
        if all(disaggregation.role_of(valid, r).replicas == n for r, n in counts.items()):
            return server
        spec = disaggregation.with_role_replicas(spec, counts)
        return validate_server(meta, spec, config, cel_rules=False)

    async def _config(self, previous: TPUModelServerStatus) -> RenderConfig:
        """Cluster capabilities; the workload kind sticks once a server has one."""
        if previous.plan is not None:
            lws = previous.plan.workload == "LeaderWorkerSet"
        elif self.settings.workload != "auto":
            lws = self.settings.workload == "leaderworkerset"
        else:
            lws = await self.kube.has_group_version(LWS_GROUP_VERSION)
        monitoring = await self.kube.has_group_version(MONITORING_GROUP_VERSION)
        pools = await self.kube.has_group_version(INFERENCE_GROUP_VERSION)
        role_scales = await self.kube.has_resource(labels.API_VERSION, labels.ROLE_PLURAL)
        keda = await self.kube.has_resource(KEDA_API_VERSION, KEDA_PLURAL)
        return dataclasses.replace(
            self.settings.render,
            leaderworkerset=lws,
            prometheus_operator=monitoring,
            inference_pool=pools,
            role_scales=role_scales,
            keda=keda,
        )

    @staticmethod
    def _router_ready(children: Mapping[tuple[str, str], ChildView], rendered: Rendered) -> int:
        router = children.get(("Deployment", rendered.server.router_name))
        return router.ready_replicas if router is not None else 0

    async def _report_invalid(
        self,
        key: ServerKey,
        state: ServerState,
        body: Mapping[str, Any],
        previous: TPUModelServerStatus,
        err: InvalidSpec,
        now: datetime.datetime,
    ) -> None:
        meta = body.get("metadata") or {}
        decided = decide(
            replicas=int((body.get("spec") or {}).get("replicas") or 0),
            reports=[],
            plan=None,
            invalid=str(err),
            invalid_reason=err.reason,
            router_enabled=True,
            router_ready_replicas=0,
        )
        status = build_status(
            previous, decided, now=now, generation=meta.get("generation"), observed=True
        )
        await self._status.write(key, state, body, status, decided)
        state.served = None

    # -- metrics -------------------------------------------------------------------------------

    def _served(self) -> list[tuple[ServerKey, ServedModel]]:
        return [(k, s.served) for k, s in list(self._servers.items()) if s.served is not None]

    def replica_rows(self) -> list[ReplicaRow]:
        rows = []
        for key, served in self._served():
            for pod in self.cache.pods(key):
                if pod.role == labels.ROLE_LEADER and not pod.deleting:
                    rows.append(
                        ReplicaRow(
                            namespace=key[0],
                            pod=pod.name,
                            model_name=served.model_name,
                            tpu_generation=served.generation,
                            tpu_topology=served.topology,
                            chips=served.chips,
                        )
                    )
        return rows

    def server_readiness(self) -> list[bool]:
        return [served.ready for _, served in self._served()]

    def unschedulable_rows(self) -> list[ServerPodsRow]:
        return [
            ServerPodsRow(
                namespace=key[0],
                tpumodelserver=key[1],
                tpu_generation=served.generation,
                tpu_topology=served.topology,
                unschedulable_pods=sum(
                    1 for p in self.cache.pods(key) if p.unschedulable and not p.deleting
                ),
            )
            for key, served in self._served()
        ]


def _children_selector(key: ServerKey) -> str:
    """The label selector of a server's children and pods, as `kubectl -l` spells it."""
    return f"{labels.INSTANCE}={key[1]},{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
