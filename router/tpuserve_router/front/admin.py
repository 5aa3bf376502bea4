"""The admin API: list, add and remove workers, and flush every worker's cache.

- ``GET /workers``: the workers and their state, and the pods discovery rejected;
- ``POST /workers`` (or ``/add_worker``) with ``{"url": ..., "model": ...,
  "kv_events_endpoint": ..., "kv_replay_endpoint": ...}`` (or the same as query parameters):
  add a worker by hand, optionally saying which served model it belongs to (else read from
  its ``/v1/models``); addresses outside ``--worker-networks`` get 400;
- ``DELETE /workers`` (or ``POST /remove_worker``) with ``{"url": ...}`` or ``?url=``;
- ``POST /flush_cache``: sent to every worker; the policy forgets what each flushed one held.

Errors are counted in ``tpuserve_router_requests_total`` with ``route="admin"``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import orjson

from tpuserve_router.engines.health import HealthChecker
from tpuserve_router.engines.worker_networks import Network, endpoint_problem, url_problem
from tpuserve_router.engines.workers import (
    InvalidWorkerURL,
    Worker,
    WorkerRegistry,
    WorkerSpec,
    model_name_problem,
    normalize_worker_url,
)
from tpuserve_router.front.http_request import HttpRequest
from tpuserve_router.front.replies import reject
from tpuserve_router.metrics import RouterMetrics
from tpuserve_router.pipeline.client import JSON_HEADERS
from tpuserve_router.pipeline.request_body import ClientError, parse_json_object
from tpuserve_router.policies.base import Policy

if TYPE_CHECKING:
    from tpuserve_router.engines.discovery.kubernetes import RejectedPod

ROUTE = "admin"
"""The ``route`` label of admin requests in ``tpuserve_router_requests_total``."""


class AdminApi:
    """The admin endpoints' handlers; ``rejected`` gives the pods discovery refused."""

    def __init__(
        self,
        registry: WorkerRegistry,
        policy: Policy,
        health: HealthChecker,
        metrics: RouterMetrics,
        networks: Sequence[Network],
        rejected: Callable[[], Sequence[RejectedPod]],
    ) -> None:
        self.registry = registry
        self.policy = policy
        self.health = health
        self.metrics = metrics
        self.networks = networks
        self.rejected = rejected

    async def list_workers(self, request: HttpRequest) -> None:
        body = {
            "workers": [w.describe() for w in self.registry.workers],
            "rejected": [dataclasses.asdict(r) for r in self.rejected()],
        }
        request.respond(200, JSON_HEADERS, orjson.dumps(body))

    async def add_worker(self, request: HttpRequest) -> None:
        try:
            args = _admin_args(request)
            url = _worker_url(args)
            for key in ("kv_events_endpoint", "kv_replay_endpoint"):
                if args.get(key) is not None and not isinstance(args[key], str):
                    raise ClientError(
                        400, f"{key} must be a string like tcp://HOST:PORT", param=key
                    )
            model = args.get("model")
            problem = model_name_problem(model) if model is not None else None
            if problem:
                raise ClientError(400, f"{problem} (the served model the worker belongs to)",
                                  param="model")  # fmt: skip
            spec = WorkerSpec(
                url, args.get("kv_events_endpoint"), args.get("kv_replay_endpoint"), model
            )
            self._check_dialable(spec)
            worker = self.registry.add(spec, manual=True)
        except ClientError as err:
            reject(request, err, self.metrics, ROUTE)
            return
        request.respond(200, JSON_HEADERS, orjson.dumps({"worker": worker.describe()}))

    def _check_dialable(self, spec: WorkerSpec) -> None:
        """Refuse (400) a worker or KV-event endpoint outside ``--worker-networks``."""
        problem = url_problem(spec.url, self.networks)
        if problem:
            raise ClientError(400, problem, param="url")
        for key, endpoint in (
            ("kv_events_endpoint", spec.kv_events_endpoint),
            ("kv_replay_endpoint", spec.kv_replay_endpoint),
        ):
            problem = endpoint_problem(endpoint, self.networks) if endpoint else None
            if problem:
                raise ClientError(400, problem, param=key)

    async def remove_worker(self, request: HttpRequest) -> None:
        try:
            name = _worker_url(_admin_args(request))
        except ClientError as err:
            reject(request, err, self.metrics, ROUTE)
            return
        if self.registry.remove(name) is None:
            known = ", ".join(self.registry.names()) or "none"
            reject(
                request,
                ClientError(
                    404,
                    f"worker {name} is not registered; registered: {known}",
                    param="url",
                    error_type="not_found_error",
                ),
                self.metrics,
                ROUTE,
            )
            return
        request.respond(200, JSON_HEADERS, orjson.dumps({"removed": name}))

    async def flush_cache(self, request: HttpRequest) -> None:
        session = self.health.session
        workers = list(self.registry.workers)
        results: dict[str, Any] = {}

        async def flush(worker: Worker) -> None:
            try:
                assert session is not None
                async with session.post(worker.name + "/flush_cache") as response:
                    text = await response.text()
                    results[worker.name] = {"status": response.status, "message": text.strip()}
                    if response.status == 200:
                        self.policy.on_worker_reset(worker.name)
            except Exception as err:
                results[worker.name] = {"status": None, "message": str(err) or type(err).__name__}

        await asyncio.gather(*(flush(w) for w in workers))
        ok = all(r["status"] == 200 for r in results.values())
        request.respond(
            200 if ok else 502, JSON_HEADERS, orjson.dumps({"flushed": ok, "workers": results})
        )


def _admin_args(request: HttpRequest) -> dict[str, Any]:
    """The query parameters, overridden by the JSON body's fields."""
    args: dict[str, Any] = {k: v[-1] for k, v in parse_qs(request.query).items()}
    if request.body:
        args.update(parse_json_object(request.body))
    return args


def _worker_url(args: dict[str, Any]) -> str:
    """The worker's URL in its one spelling (`normalize_worker_url`); 400 naming ``url``."""
    url = args.get("url")
    if not isinstance(url, str) or not url:
        raise ClientError(400, "url is required: the worker's http://HOST:PORT", param="url")
    try:
        return normalize_worker_url(url, allow_unix=True)[0]
    except InvalidWorkerURL as err:
        raise ClientError(400, str(err), param="url") from None
