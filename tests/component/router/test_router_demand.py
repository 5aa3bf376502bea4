"""The demand Lease: a held request renews it at once with a merge patch of renewTime; a
refused write is counted and retried, never fatal. Against a stand-in API server on loopback."""

from __future__ import annotations

import datetime
from collections.abc import Callable

import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from tests.fakes import LoopbackApp
from tests.waiting import eventually_async
from tpuserve_router.engines.discovery.kubernetes import ApiServer
from tpuserve_router.metrics import RouterMetrics, create_router_metrics
from tpuserve_router.tenancy.demand import MERGE_PATCH, DemandLease

pytestmark = pytest.mark.component

LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/ml/leases/qwen-demand"


class LeaseApi(LoopbackApp):
    """Answers PATCH of one Lease with ``status``; records what it was sent."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.patches: list[tuple[str, dict[str, object]]] = []  # content type, body
        app = web.Application()
        app.add_routes([web.patch(LEASE_PATH, self._patch)])
        super().__init__(app)

    async def _patch(self, request: web.Request) -> web.Response:
        self.patches.append((request.content_type, orjson.loads(await request.read())))
        return web.json_response({}, status=self.status)


def sample(metrics: RouterMetrics, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "tpuserve_router_demand_signals_total", {"result": result}
    )
    return value or 0.0


async def lease_against(
    api: LeaseApi, token: Callable[[], str | None] | None = None
) -> tuple[DemandLease, RouterMetrics]:
    url = await api.start()
    metrics = create_router_metrics(CollectorRegistry())
    lease = DemandLease(
        ApiServer(url, {}, False, token), "ml", "qwen-demand", 3600.0, metrics, busy=lambda: False
    )
    lease.start()
    return lease, metrics


async def test_a_held_request_renews_the_lease_at_once() -> None:
    api = LeaseApi()
    lease, metrics = await lease_against(api)
    try:
        lease.arrived(held=True)  # the interval is an hour: only "at once" can write
        await eventually_async(lambda: len(api.patches) == 1, what="one renewal")
        content_type, body = api.patches[0]
        assert content_type == MERGE_PATCH
        spec = body["spec"]
        assert isinstance(spec, dict)
        renewed = datetime.datetime.fromisoformat(str(spec["renewTime"]).replace("Z", "+00:00"))
        assert abs((datetime.datetime.now(datetime.UTC) - renewed).total_seconds()) < 3600
        assert sample(metrics, "ok") == 1
        lease.arrived(held=True)  # fresh now: no second write for the next held request
        lease.arrived(held=False)
        assert not lease._urgent.is_set()
    finally:
        await lease.stop()
        await api.stop()


async def test_a_refused_renewal_is_counted_and_the_router_carries_on() -> None:
    api = LeaseApi(status=403)
    lease, metrics = await lease_against(api)
    try:
        lease.arrived(held=True)
        await eventually_async(lambda: sample(metrics, "failed") == 1, what="the failure counted")
        assert lease.written_at is None  # not fresh: the next held request tries again
        lease.arrived(held=True)
        await eventually_async(lambda: sample(metrics, "failed") == 2, what="tried again")
    finally:
        await lease.stop()
        await api.stop()


async def test_an_unexpected_error_is_counted_and_the_renewals_go_on() -> None:
    failures = iter([OSError("token file gone")])

    def token() -> str | None:  # the token file cannot be read, once
        for err in failures:
            raise err
        return None

    api = LeaseApi()
    lease, metrics = await lease_against(api, token)
    try:
        lease.arrived(held=True)
        await eventually_async(lambda: sample(metrics, "failed") == 1, what="the failure counted")
        lease.arrived(held=True)
        await eventually_async(lambda: sample(metrics, "ok") == 1, what="renewed after it")
    finally:
        await lease.stop()
        await api.stop()
