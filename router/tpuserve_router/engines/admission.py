"""Worker admission: what happens when a worker joins, becomes routable, or leaves.

`Admission` subscribes to the `WorkerRegistry` and owns the `HealthChecker`. A worker that
joins gets its upstream connection pool and its error (and KV-event) series at zero, and
is probed. Once its probes pass, the router learns the models it serves (its
``/v1/models``) and, when the router subscribes to KV events, where it publishes them: the
endpoints it was registered with, or what its ``/server_info`` describes, one stream per DP
rank (`tpuserve_router.kv.kv_publishers`). Endpoints outside ``--worker-networks`` are not
dialled. A worker that leaves loses its
pool, its series and its KV-event subscription; the policy hears of every change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from sglang_tpu.tasks import cancel_and_wait
from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.engine_types import adapter
from tpuserve_router.engines.health import HealthChecker
from tpuserve_router.engines.proxy import UpstreamPool
from tpuserve_router.engines.worker_networks import (
    Network,
    advertised_endpoint_problem,
    endpoint_problem,
)
from tpuserve_router.engines.workers import Worker, WorkerRegistry, network_host
from tpuserve_router.kv.kv_events import KvEventHub
from tpuserve_router.kv.kv_publishers import (
    SERVER_INFO_PATHS,
    Endpoints,
    NoPublisher,
    discover_publisher,
    pool_pages,
)
from tpuserve_router.metrics import (
    RouterMetrics,
    remove_worker_series,
    touch_token_series,
    touch_worker_series,
)
from tpuserve_router.policies.base import Policy

log = logging.getLogger(__name__)


class Shared(Protocol):
    """What admission reads of the parts the router shares (its `core.RouterCore`)."""

    @property
    def config(self) -> RouterConfig: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def registry(self) -> WorkerRegistry: ...

    @property
    def metrics(self) -> RouterMetrics: ...


class Admission:
    """Keeps pools, series, health checks, KV-event subscriptions and the policy in step
    with the registry's workers."""

    def __init__(
        self,
        core: Shared,
        networks: Sequence[Network],
        kv: KvEventHub | None,
        on_routable: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_routable`` is told whenever a worker may have become routable (the hold
        queues listen): after the policy heard of a change of workers, and once a worker's
        models are known."""
        self.config = config = core.config
        self.policy = core.policy
        self.registry = registry = core.registry
        self.metrics = core.metrics
        self.networks = networks
        self.kv = kv
        self.health = HealthChecker(
            registry,
            interval_seconds=config.health_check_interval_seconds,
            timeout_seconds=config.health_check_timeout_seconds,
            failure_threshold=config.health_failure_threshold,
            success_threshold=config.health_success_threshold,
            on_admitted=self._admitted,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        self.on_routable = on_routable
        registry.on_added.append(self._worker_added)
        registry.on_removed.append(self._worker_removed)
        registry.on_changed.append(self._workers_changed)

    def start(self) -> None:
        """Start probing; workers added from now on are probed as they join."""
        self.health.start()
        self._started = True
        if self.config.models_refresh_seconds > 0:
            self._spawn(self._refresh_models())

    async def stop(self) -> None:
        """Stop probing, cancel and await pending unsubscriptions, close every pool."""
        await self.health.stop()
        await cancel_and_wait(list(self._tasks))
        for worker in self.registry.workers:
            if worker.pool is not None:
                worker.pool.close()
        self._started = False

    # ------------------------------------------------------------------ registry callbacks

    def _worker_added(self, worker: Worker) -> None:
        worker.pool = UpstreamPool(
            worker.host,
            worker.port,
            connect_timeout_seconds=self.config.connect_timeout_seconds,
            max_idle=self.config.max_idle_connections_per_worker,
            max_head_bytes=self.config.max_header_bytes,
            max_body_bytes=self.config.max_response_bytes,
        )
        self.metrics.workers_changed.labels("added").inc()
        touch_worker_series(self.metrics, worker.name, kv_events=self.kv is not None)
        if self._started:
            self.health.watch(worker)

    def _worker_removed(self, worker: Worker) -> None:
        worker.healthy = False
        if worker.pool is not None:
            worker.pool.close()
        self.metrics.workers_changed.labels("removed").inc()
        remove_worker_series(self.metrics, worker.name)
        if self.kv is not None:
            self._spawn(self.kv.unwatch(worker.name))

    def _workers_changed(self, registry: WorkerRegistry) -> None:
        self.policy.on_workers_changed(registry.names())
        self.on_routable()

    # ------------------------------------------------------------------ a worker turns routable

    async def _admitted(self, worker: Worker) -> None:
        """A worker became routable: learn its models and its KV-event endpoints."""
        await self._learn_models(worker)
        if self.registry.get(worker.name) is worker:
            for model in worker.models:  # token series exist at zero before the first answer
                touch_token_series(self.metrics, model, worker.name)
            self.on_routable()  # held requests go now that its models are known
        if self.kv is not None and self.registry.get(worker.name) is worker:
            if not adapter(self.config.engine_type).publishes_kv_events:
                log.info(
                    "worker %s runs %s, which publishes no KV events: its prefix routing is %s",
                    worker.name, self.config.engine_type,
                    adapter(self.config.engine_type).prefix_routing,
                )  # fmt: skip
                return
            endpoints = await self._kv_endpoints(worker)
            problem = self._kv_endpoints_problem(worker, endpoints) if endpoints else None
            if problem:
                log.warning("worker %s: not subscribing to KV events: %s", worker.name, problem)
            elif endpoints is not None:
                await self.kv.watch(worker.name, endpoints)
            else:
                log.warning(
                    "worker %s publishes no KV events; its routing stays approximate", worker.name
                )

    async def _learn_models(self, worker: Worker) -> None:
        """Read the worker's ``/v1/models``: SGLang lists its served model (with its context
        length, ``max_model_len``), then each loaded LoRA adapter with ``parent`` set to that
        model."""
        try:
            listing = await self.health.get_json(worker.name + "/v1/models")
        except Exception as err:  # an engine without /v1/models still serves any model
            log.info("worker %s: could not list models (%s)", worker.name, err)
            return
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list):
            return
        cards = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if self.registry.get(worker.name) is worker:
            contexts = [m.get("max_model_len") for m in cards if m.get("parent") is None]
            worker.context_tokens = next(
                (c for c in contexts if type(c) is int and c > 0), None
            )  # what a request's token reservation is capped by (`quotas`)
            self.registry.set_models(
                worker,
                [m["id"] for m in cards if m.get("parent") is None],
                [m["id"] for m in cards if m.get("parent") is not None],
            )

    async def _refresh_models(self) -> None:
        """Every ``--models-refresh-interval``: adapters are loaded and unloaded at run time."""
        while True:
            await asyncio.sleep(self.config.models_refresh_seconds)
            healthy = [w for w in self.registry.workers if w.healthy]
            try:
                await asyncio.gather(*(self._learn_models(w) for w in healthy))
            except Exception:  # a bug must not end the refreshes silently
                log.exception("refreshing the workers' models failed")

    def _kv_endpoints_problem(self, worker: Worker, streams: list[Endpoints]) -> str | None:
        """Why the worker's KV-event endpoints may not be dialled: one given with the worker
        must be inside ``--worker-networks``; one its ``/server_info`` named, at its own host
        or inside them (without the flag: `DEFAULT_NETWORKS`)."""
        given = bool(worker.kv_events_endpoint)
        for endpoints in streams:
            for endpoint in (endpoints.events, endpoints.replay):
                if not endpoint:
                    continue
                if given:
                    problem = endpoint_problem(endpoint, self.networks)
                else:
                    problem = advertised_endpoint_problem(
                        endpoint, network_host(worker.host), self.networks
                    )
                if problem:
                    return problem
        return None

    async def _kv_endpoints(self, worker: Worker) -> list[Endpoints] | None:
        """Where the worker publishes; from its ``/server_info`` also how many blocks each
        of its streams can hold (its pool's pages: `kv_publishers.pool_pages`), the bound
        its streams are believed to (without it, ``BlockIndex.max_stream_blocks``)."""
        if worker.kv_events_endpoint:
            # Endpoints given with the worker: its pool still bounds what its stream is
            # believed to hold (issue 68), when its /server_info says.
            with contextlib.suppress(Exception):
                pages = pool_pages(await self.health.get_json(worker.name + SERVER_INFO_PATHS[0]))
                if pages is not None and self.kv is not None:
                    self.kv.index.set_worker_limit(worker.name, pages)
            return [Endpoints(worker.kv_events_endpoint, worker.kv_replay_endpoint)]
        answers: list[object] = []

        async def get_json(url: str) -> object:
            answer = await self.health.get_json(url)
            answers.append(answer)
            return answer

        try:
            return await discover_publisher(get_json, worker.name, network_host(worker.host))
        except NoPublisher as err:
            log.info("worker %s: %s", worker.name, err)
            return None
        finally:
            pages = pool_pages(answers[-1]) if answers else None
            if pages is not None and self.kv is not None:
                self.kv.index.set_worker_limit(worker.name, pages)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
