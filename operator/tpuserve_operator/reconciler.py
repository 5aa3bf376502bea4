"""Converge one TPUModelServer: validate, render, apply what changed, roll groups, report.

One pass (`converge`) is idempotent and reads only the object and the in-memory view of its
children and pods (`ObservedCache`, filled from watch events). The kopf handlers run one
loop per TPUModelServer (`run`) that converges, then sleeps until a watch event about the
server, one of its children or pods wakes it, or until a recheck is due (a group partly up
waiting for its Degraded bound, a failed apply, the periodic resync).

A pass:

1. validate and render (`render.make_server`, `render.render`); an invalid spec sets
   `Valid=False` with the field-named message, posts an Event and changes nothing else;
2. plan groups (`rollout.plan`) from observed group states;
3. server-side apply shared children and the groups the plan allows, skipping children
   whose applied hash and generation say nothing changed (`drift.needs_apply`);
4. on the StatefulSet path, delete the stale pods of groups being updated (their
   StatefulSets use OnDelete, so the whole slice restarts together);
5. delete children this server no longer wants (scale-down, surge groups, router off);
6. write status and post Events for condition transitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuserve_operator import conditions, group_restart, labels, rollout
from tpuserve_operator.drift import AppliedRecord, needs_apply, record_of, stamp
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.kube import KubeApi, NotFoundError, error_summary
from tpuserve_operator.metrics import OperatorMetrics, ReplicaRow, ServerPodsRow
from tpuserve_operator.observed import (
    ChildView,
    ObservedCache,
    PodView,
    ServerKey,
    child_view,
    pod_view,
    server_key_of,
)
from tpuserve_operator.render import Manifest, RenderConfig, Rendered, make_server, render
from tpuserve_operator.status import (
    DEFAULT_PARTIAL_GROUP_SECONDS,
    GroupObservation,
    GroupReport,
    decide,
    report_group,
    timestamp,
)

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
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    (LWS_GROUP_VERSION, "LeaderWorkerSet"),
    (MONITORING_GROUP_VERSION, "PodMonitor"),
    (MONITORING_GROUP_VERSION, "ServiceMonitor"),
)

EventSink = Callable[[Mapping[str, Any], str, str, str], None]  # body, type, reason, message


@dataclass(frozen=True, slots=True)
class ReconcilerSettings:
    render: RenderConfig = dataclasses.field(default_factory=RenderConfig)
    # auto: LeaderWorkerSet when its CRD is installed, else StatefulSets
    workload: str = "auto"
    partial_group_seconds: float = DEFAULT_PARTIAL_GROUP_SECONDS
    resync_seconds: float = 60.0
    # Re-list a server's children and pods this often: watches can miss deletions (apiserver
    # restarts, expired resourceVersions), and kopf does not report relists to handlers.
    relist_seconds: float = 300.0
    max_concurrent: int = 16


@dataclass(frozen=True, slots=True)
class _Served:
    """What the replica metrics need from a server's last successful render."""

    model_name: str
    generation: str
    topology: str
    chips: int
    ready: bool


class ServerGone(Exception):
    """The TPUModelServer no longer exists (its deletion event may have been missed)."""


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Reconciler:
    def __init__(
        self,
        kube: KubeApi,
        settings: ReconcilerSettings,
        metrics: OperatorMetrics,
        emit_event: EventSink,
        clock: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.cache = ObservedCache()
        self._emit_event = emit_event
        self._clock = clock
        self._triggers: dict[ServerKey, asyncio.Event] = {}
        self._applied: dict[tuple[ServerKey, str, str], AppliedRecord] = {}
        self._last_status: dict[ServerKey, dict[str, Any]] = {}
        self._seen: dict[ServerKey, tuple[Any, ...]] = {}
        self._served: dict[ServerKey, _Served] = {}
        self._renders: dict[ServerKey, tuple[tuple[Any, ...], Rendered | InvalidSpec]] = {}
        self._relisted: dict[ServerKey, float] = {}
        self._errors: dict[ServerKey, int] = {}
        # StatefulSet path: each multi-host group's pods while it runs as one, and the pods
        # the operator deleted to restart it (group_restart)
        self._epochs: dict[tuple[ServerKey, int], group_restart.Epoch] = {}
        self._condemned: dict[tuple[ServerKey, int], set[str]] = {}
        self._semaphore = asyncio.Semaphore(settings.max_concurrent)

    # -- event intake (kopf handlers) ----------------------------------------------------------

    def trigger(self, key: ServerKey) -> None:
        event = self._triggers.get(key)
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
        if self._seen.get(key) != marker:
            self._seen[key] = marker
            self.trigger(key)

    def on_child_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = server_key_of(body)
        if key is None:
            return
        view = child_view(body)
        if event_type == "DELETED":
            self.cache.drop_child(key, view.kind, view.name)
        else:
            self.cache.put_child(key, view)
        self.trigger(key)

    def on_pod_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        key = server_key_of(body)
        if key is None:
            return
        view = pod_view(body)
        if event_type == "DELETED":
            self.cache.drop_pod(key, view.name)
        else:
            self.cache.put_pod(key, view)
        self.trigger(key)

    def forget(self, key: ServerKey) -> None:
        self._last_status.pop(key, None)
        self._seen.pop(key, None)
        self._served.pop(key, None)
        self._errors.pop(key, None)
        self._renders.pop(key, None)
        self._relisted.pop(key, None)
        for slot in [s for s in (*self._epochs, *self._condemned) if s[0] == key]:
            self._epochs.pop(slot, None)
            self._condemned.pop(slot, None)
        for record_key in [k for k in self._applied if k[0] == key]:
            del self._applied[record_key]

    # -- the per-server loop (a kopf daemon) ---------------------------------------------------

    async def run(self, key: ServerKey, body: Mapping[str, Any], stopped: Any) -> None:
        """Converge until `stopped`; `body` is kopf's live view of the object."""
        wake = self._triggers.setdefault(key, asyncio.Event())
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
            self._triggers.pop(key, None)

    # -- one pass ------------------------------------------------------------------------------

    async def converge(self, key: ServerKey, body: Mapping[str, Any]) -> float | None:
        """Run one pass; returns seconds until the next one is due without events, or None
        when the server is gone."""
        await self._acknowledge(key, body)
        async with self._semaphore:
            started = time.monotonic()
            try:
                await self._relist_if_due(key, body)
                delay, result = await self._converge(key, body)
            except ServerGone:
                return None
            except Exception as err:  # an API failure: report, back off, retry
                failures = self._errors.get(key, 0)
                self._errors[key] = failures + 1
                log.warning("reconcile %s/%s failed: %s", *key, error_summary(err))
                delay = ERROR_BACKOFF_SECONDS[min(failures, len(ERROR_BACKOFF_SECONDS) - 1)]
                result = "error"
                self._relisted.pop(key, None)  # the watches may have missed something too
            took = time.monotonic() - started
            self.metrics.reconciles.labels(result).inc()
            self.metrics.reconcile_duration.observe(took)
            log.debug("reconciled %s/%s in %.3f s: %s", *key, took, result)
            return delay

    async def _converge(self, key: ServerKey, body: Mapping[str, Any]) -> tuple[float, str]:
        meta = dict(body.get("metadata") or {})
        if meta.get("deletionTimestamp"):
            return self.settings.resync_seconds, "ok"
        previous = self._last_status.get(key) or dict(body.get("status") or {})
        config = await self._config(previous)
        now = self._clock()
        try:
            rendered = self._render(meta, body, config)
        except InvalidSpec as err:
            await self._report_invalid(key, body, previous, err, now)
            return self.settings.resync_seconds, "invalid"

        server = rendered.server
        children = self.cache.children(key)
        groups = self._observe_groups(key, rendered, children)
        previous_groups = {g.get("index"): g for g in previous.get("groups") or []}
        reports = {
            k: report_group(
                obs,
                hosts=server.valid.shape.hosts,
                revision=rendered.revision,
                previous=previous_groups.get(k),
                now=now,
                partial_group_seconds=self.settings.partial_group_seconds,
            )
            for k, obs in groups.items()
        }
        rollout_spec = server.valid.spec.rollout
        plan = rollout.plan(
            rendered.replicas,
            {k: r.rollout_state() for k, r in reports.items()},
            max_unavailable=rollout_spec.max_unavailable,
            max_surge=rollout_spec.max_surge,
        )
        apply_error = await self._apply(key, rendered, plan, reports, children)
        if apply_error is None:
            await self._restart_stale_pods(key, rendered, plan)
            await self._restart_broken_groups(key, body, rendered, plan, groups)
            await self._prune(key, rendered, plan, children)
        router_ready = self._router_ready(children, rendered)
        decided = decide(
            replicas=rendered.replicas,
            reports=list(reports.values()),
            plan=plan,
            invalid=None,
            router_enabled=server.valid.spec.router.enabled,
            router_ready_replicas=router_ready,
            apply_error=apply_error,
        )
        status = self._status(rendered, reports, previous, decided, meta, now)
        await self._write_status(key, body, previous, status, decided)
        ready = any(c.type == conditions.READY and c.status == "True" for c in decided)
        self._served[key] = _Served(
            model_name=server.valid.served_name,
            generation=server.valid.spec.tpu.generation,
            topology=server.valid.spec.tpu.topology,
            chips=server.valid.shape.chips,
            ready=ready,
        )
        if apply_error is not None:
            failures = self._errors.get(key, 0)
            self._errors[key] = failures + 1
            return ERROR_BACKOFF_SECONDS[min(failures, len(ERROR_BACKOFF_SECONDS) - 1)], "error"
        self._errors.pop(key, None)
        rechecks = [r.recheck_seconds for r in reports.values() if r.recheck_seconds is not None]
        return min([self.settings.resync_seconds, *(s + 1.0 for s in rechecks)]), "ok"

    async def _relist_if_due(self, key: ServerKey, body: Mapping[str, Any]) -> None:
        last = self._relisted.get(key)
        now = time.monotonic()
        if last is None:
            self._relisted[key] = now  # the watches just delivered everything
            return
        if now - last < self.settings.relist_seconds:
            return
        selector = f"{labels.INSTANCE}={key[1]},{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
        children: list[ChildView] = []
        pods: list[PodView] = []
        for api_version, kind in CHILD_KINDS:
            items = await self.kube.list(api_version, kind, key[0], selector)
            for item in items or []:
                if kind == "Pod":
                    pods.append(pod_view(item))
                else:
                    children.append(child_view(item))
        self.cache.replace(key, children, pods)
        self._relisted[key] = time.monotonic()
        log.debug("re-listed %s/%s: %d children, %d pods", *key, len(children), len(pods))

    async def _acknowledge(self, key: ServerKey, body: Mapping[str, Any]) -> None:
        """A new generation: say at once that it is valid and being rolled out, before
        waiting for a reconcile slot, so a burst of new servers all show Progressing fast.
        Failures are left to the full pass."""
        meta = body.get("metadata") or {}
        previous = self._last_status.get(key) or dict(body.get("status") or {})
        if meta.get("deletionTimestamp") or previous.get("observedGeneration") == meta.get(
            "generation"
        ):
            return
        if any(
            c.get("type") == conditions.PROGRESSING and c.get("reason") == "Reconciling"
            for c in previous.get("conditions") or []
        ):
            return
        try:
            rendered = self._render(meta, body, await self._config(previous))
            await self._report_started(key, body, previous, rendered, self._clock())
        except Exception as err:
            log.debug("acknowledging %s/%s deferred: %s", *key, err)

    def _render(
        self, meta: Mapping[str, Any], body: Mapping[str, Any], config: RenderConfig
    ) -> Rendered:
        """Render, or reuse the last rendering of this generation (spec changes bump it)."""
        marker = (
            meta.get("uid"),
            meta.get("generation"),
            (meta.get("annotations") or {}).get(labels.RESTARTED_AT),
            config.leaderworkerset,
            config.prometheus_operator,
        )
        key = (str(meta.get("namespace")), str(meta.get("name")))
        cached = self._renders.get(key)
        if cached is not None and cached[0] == marker:
            if isinstance(cached[1], InvalidSpec):
                raise cached[1]
            return cached[1]
        try:
            rendered = render(
                make_server(meta, dict(body.get("spec") or {}), config, cel_rules=False)
            )
        except InvalidSpec as err:
            self._renders[key] = (marker, err)
            raise
        self._renders[key] = (marker, rendered)
        return rendered

    async def _report_started(
        self,
        key: ServerKey,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        rendered: Rendered,
        now: datetime.datetime,
    ) -> dict[str, Any]:
        decided = [
            conditions.Condition.of(conditions.VALID, True, "SpecValid", "the spec is valid"),
            conditions.Condition.of(
                conditions.PROGRESSING,
                True,
                "Reconciling",
                f"applying generation {(body.get('metadata') or {}).get('generation')}",
            ),
        ]
        status = {
            **previous,
            "endpoint": rendered.endpoint,
            "servedName": rendered.server.valid.served_name,
            "selector": rendered.selector,
            "plan": rendered.plan.model_dump(by_alias=True),
            "conditions": conditions.merge(
                previous.get("conditions") or [], decided, now=timestamp(now), generation=None
            ),
        }
        await self._write_status(key, body, previous, status, decided)
        return status

    async def _config(self, previous: Mapping[str, Any]) -> RenderConfig:
        """Cluster capabilities; the workload kind sticks once a server has one."""
        plan = previous.get("plan") or {}
        if plan.get("workload") in ("LeaderWorkerSet", "StatefulSet"):
            lws = plan["workload"] == "LeaderWorkerSet"
        elif self.settings.workload != "auto":
            lws = self.settings.workload == "leaderworkerset"
        else:
            lws = await self.kube.has_group_version(LWS_GROUP_VERSION)
        monitoring = await self.kube.has_group_version(MONITORING_GROUP_VERSION)
        return dataclasses.replace(
            self.settings.render, leaderworkerset=lws, prometheus_operator=monitoring
        )

    def _observe_groups(
        self,
        key: ServerKey,
        rendered: Rendered,
        children: Mapping[tuple[str, str], ChildView],
    ) -> dict[int, GroupObservation]:
        server = rendered.server
        kind = server.workload_kind
        workloads: dict[int, list[ChildView]] = {}
        for child in children.values():
            if child.kind == kind and child.replica is not None and child.owner_uid == server.uid:
                workloads.setdefault(child.replica, []).append(child)
        pods: dict[int, list[Any]] = {}
        for pod in self.cache.pods(key):
            if pod.replica is not None:
                pods.setdefault(pod.replica, []).append(pod)
        expected = 1 if kind == "LeaderWorkerSet" or server.valid.shape.hosts == 1 else 2
        out: dict[int, GroupObservation] = {}
        for k in sorted(set(workloads) | set(range(rendered.replicas))):
            found = workloads.get(k, [])
            revisions = {w.revision for w in found}
            out[k] = GroupObservation(
                index=k,
                name=server.group_name(k),
                exists=len(found) == expected and not any(w.deleting for w in found),
                deleting=bool(found) and all(w.deleting for w in found),
                workload_revision=revisions.pop() if len(revisions) == 1 else None,
                pods=tuple(pods.get(k, ())),
            )
        return out

    async def _apply(
        self,
        key: ServerKey,
        rendered: Rendered,
        plan: rollout.Plan,
        reports: Mapping[int, GroupReport],
        children: Mapping[tuple[str, str], ChildView],
    ) -> str | None:
        """Apply what changed; returns a sentence naming the first refused child, or None."""
        wanted: list[Manifest] = list(rendered.shared)
        for k in plan.apply:
            wanted += rendered.group(k)
        # Groups already on this revision are re-applied when drifted (edited, deleted
        # parts); stale groups are left alone until the plan lets them roll.
        for k, report in reports.items():
            if k not in plan.apply and k not in plan.delete and report.updated:
                wanted += rendered.group(k)
        todo: list[tuple[dict[str, Any], str]] = []
        for manifest in wanted:
            stamped, digest = stamp(manifest)
            ref = (manifest["kind"], manifest["metadata"]["name"])
            record = self._applied.get((key, *ref))
            if needs_apply(digest, children.get(ref), record):
                todo.append((stamped, digest))
        results = await asyncio.gather(
            *(self._apply_one(key, m, d) for m, d in todo), return_exceptions=True
        )
        for (manifest, _), result in zip(todo, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                return f"{manifest['kind']} {manifest['metadata']['name']}: {error_summary(result)}"
        return None

    async def _apply_one(self, key: ServerKey, manifest: dict[str, Any], digest: str) -> None:
        applied = await self.kube.apply(manifest)
        ref = (manifest["kind"], manifest["metadata"]["name"])
        self._applied[(key, *ref)] = record_of(applied, digest)
        self.metrics.applies.labels(manifest["kind"]).inc()
        log.debug("applied %s %s/%s", manifest["kind"], key[0], ref[1])

    async def _restart_stale_pods(
        self, key: ServerKey, rendered: Rendered, plan: rollout.Plan
    ) -> None:
        """StatefulSet path: replace every stale pod of an updating group at once."""
        if rendered.server.config.leaderworkerset or not plan.restart:
            return
        stale = [
            p
            for p in self.cache.pods(key)
            if p.replica in plan.restart and p.revision != rendered.revision and not p.deleting
        ]
        found = await asyncio.gather(
            *(self.kube.delete("v1", "Pod", key[0], p.name) for p in stale)
        )
        for pod, existed in zip(stale, found, strict=True):
            if not existed:
                self.cache.drop_pod(key, pod.name)

    async def _restart_broken_groups(
        self,
        key: ServerKey,
        body: Mapping[str, Any],
        rendered: Rendered,
        plan: rollout.Plan,
        groups: Mapping[int, GroupObservation],
    ) -> None:
        """StatefulSet path: when one pod of a multi-host group restarts, restart the rest
        (LeaderWorkerSet's RecreateGroupOnPodRestart, done by hand; see group_restart)."""
        server = rendered.server
        hosts = server.valid.shape.hosts
        if server.config.leaderworkerset or hosts == 1:
            return
        for k, group in groups.items():
            slot = (key, k)
            if not group.exists or group.deleting or k in plan.restart or k in plan.delete:
                self._epochs.pop(slot, None)  # being rolled, removed or made: not a restart
                continue
            verdict = group_restart.check(
                self._epochs.get(slot), group.pods, hosts, self._condemned.get(slot, ())
            )
            if verdict.epoch is None:
                self._epochs.pop(slot, None)
            else:
                self._epochs[slot] = verdict.epoch
                self._condemned.pop(slot, None)
            if not verdict.delete:
                continue
            uids = {p.uid for p in group.pods if p.name in verdict.delete}
            self._condemned[slot] = self._condemned.get(slot, set()) | uids
            await asyncio.gather(
                *(self.kube.delete("v1", "Pod", key[0], name) for name in verdict.delete)
            )
            self._emit_event(
                body,
                "Warning",
                "GroupRestarted",
                f"replica group {group.name}: pod {verdict.cause} restarted; restarting the "
                f"group's other {len(verdict.delete)} pods with it (a multi-host slice runs "
                "as one program)",
            )

    def _desired_refs(self, rendered: Rendered, keep: Iterable[int]) -> set[tuple[str, str]]:
        refs = {(m["kind"], m["metadata"]["name"]) for m in rendered.shared}
        for k in keep:
            refs |= {(m["kind"], m["metadata"]["name"]) for m in rendered.group(k)}
        return refs

    async def _prune(
        self,
        key: ServerKey,
        rendered: Rendered,
        plan: rollout.Plan,
        children: Mapping[tuple[str, str], ChildView],
    ) -> None:
        existing_groups = {c.replica for c in children.values() if c.replica is not None}
        keep = (set(range(rendered.replicas)) | existing_groups) - set(plan.delete)
        wanted = self._desired_refs(rendered, keep)
        doomed = [
            c
            for c in children.values()
            if c.owner_uid == rendered.server.uid and c.ref not in wanted
        ]
        for child in doomed:
            if not child.deleting:
                log.info("deleting %s %s/%s: no longer wanted", child.kind, key[0], child.name)
        found = await asyncio.gather(
            *(self.kube.delete(c.api_version, c.kind, key[0], c.name, uid=c.uid) for c in doomed)
        )
        for child, existed in zip(doomed, found, strict=True):
            self._applied.pop((key, child.kind, child.name), None)
            if not existed:  # gone already; its deletion event was missed
                self.cache.drop_child(key, child.kind, child.name)

    @staticmethod
    def _router_ready(children: Mapping[tuple[str, str], ChildView], rendered: Rendered) -> int:
        router = children.get(("Deployment", rendered.server.router_name))
        return router.ready_replicas if router is not None else 0

    def _status(
        self,
        rendered: Rendered,
        reports: Mapping[int, GroupReport],
        previous: Mapping[str, Any],
        decided: list[conditions.Condition],
        meta: Mapping[str, Any],
        now: datetime.datetime,
    ) -> dict[str, Any]:
        generation = meta.get("generation")
        main = [r for r in reports.values() if r.index < rendered.replicas]
        return {
            "observedGeneration": generation,
            "replicas": sum(1 for r in reports.values() if r.exists),
            "readyReplicas": sum(1 for r in reports.values() if r.ready),
            "updatedReplicas": sum(1 for r in main if r.updated),
            "endpoint": rendered.endpoint,
            "servedName": rendered.server.valid.served_name,
            "selector": rendered.selector,
            "revision": rendered.revision,
            "plan": rendered.plan.model_dump(by_alias=True),
            "groups": [reports[k].as_status() for k in sorted(reports)],
            "conditions": conditions.merge(
                previous.get("conditions") or [], decided, now=timestamp(now), generation=generation
            ),
        }

    async def _report_invalid(
        self,
        key: ServerKey,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
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
        status = {
            **{k: v for k, v in previous.items() if k not in ("conditions", "observedGeneration")},
            "observedGeneration": meta.get("generation"),
            "conditions": conditions.merge(
                previous.get("conditions") or [],
                decided,
                now=timestamp(now),
                generation=meta.get("generation"),
            ),
        }
        await self._write_status(key, body, previous, status, decided)
        self._served.pop(key, None)

    async def _write_status(
        self,
        key: ServerKey,
        body: Mapping[str, Any],
        previous: Mapping[str, Any],
        status: dict[str, Any],
        decided: list[conditions.Condition],
    ) -> None:
        if status != previous:
            try:
                await self.kube.patch_status(key[0], key[1], status)
            except NotFoundError:
                raise ServerGone(key) from None
            self._last_status[key] = status
        for change in conditions.transitions(previous.get("conditions") or [], decided):
            c = change.condition
            if (
                change.previous_status is None
                and c.status == "False"
                and c.type != conditions.VALID
            ):
                continue  # a new object: only report what is true, and a bad spec
            kind = "Warning" if change.warning else "Normal"
            self._emit_event(body, kind, c.reason, f"{c.type}={c.status}: {c.message}")

    # -- metrics -------------------------------------------------------------------------------

    def replica_rows(self) -> list[ReplicaRow]:
        rows = []
        for key, served in list(self._served.items()):
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
        return [s.ready for s in self._served.values()]

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
            for key, served in list(self._served.items())
        ]
