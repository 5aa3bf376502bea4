"""A namespace gateway's per-model demand: each model's requests renew its own Lease only.

Against a stand-in API server on loopback that records which Lease each renewal patched."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from tests.fakes import LoopbackApp
from tests.waiting import eventually_async
from tpuserve_router.config import RouterConfig
from tpuserve_router.config_checks import problems as config_problems
from tpuserve_router.engines.discovery.kubernetes import ApiServer
from tpuserve_router.metrics import create_router_metrics
from tpuserve_router.tenancy.hold import HoldQueues
from tpuserve_router.tenancy.model_shares import ModelFlights, demand_signals

pytestmark = pytest.mark.component

LEASES = "/apis/coordination.k8s.io/v1/namespaces/ml/leases/{name}"


class LeasesApi(LoopbackApp):
    """Answers PATCH of any Lease of namespace ml; records the names patched, in order."""

    def __init__(self) -> None:
        self.patched: list[str] = []
        app = web.Application()
        app.add_routes([web.patch(LEASES.format(name="{name}"), self._patch)])
        super().__init__(app)

    async def _patch(self, request: web.Request) -> web.Response:
        orjson.loads(await request.read())
        self.patched.append(request.match_info["name"])
        return web.json_response({})


async def test_each_models_requests_renew_its_own_lease_and_no_other() -> None:
    api = LeasesApi()
    url = await api.start()
    config = RouterConfig(
        discovery="kubernetes",
        selector={"app": "x"},
        hold_models=("llama", "qwen", "gemma"),
        demand_leases=("llama=llama-demand", "qwen=qwen-demand"),
        demand_interval_seconds=3600.0,  # only "at once" (a held request) can write
    )
    metrics = create_router_metrics(CollectorRegistry())
    holds = HoldQueues(8, 60.0, metrics)
    pipeline = SimpleNamespace(flights=ModelFlights(None), in_flight=0)
    demand = demand_signals(
        ApiServer(url, {}, False, None), "ml", config, metrics, holds, lambda: pipeline
    )
    assert demand is not None
    assert demand.every is None
    demand.start()
    try:
        demand.arrived(True, "qwen")  # held: qwen's Lease at once
        await eventually_async(lambda: api.patched == ["qwen-demand"], what="qwen renewed")
        demand.arrived(True, "gemma")  # a model without a Lease (never at zero): none
        demand.arrived(True, "other")  # an unknown model's label: none
        demand.arrived(True, "qwen")  # fresh already
        demand.arrived(True, "llama")
        await eventually_async(
            lambda: api.patched == ["qwen-demand", "llama-demand"], what="llama renewed"
        )
        # a model is busy while its own requests are in flight, not another's
        busy = {m: lease.busy() for m, lease in demand.leases.items()}
        assert busy == {"llama": False, "qwen": False}
        pipeline.flights.enter("qwen")
        assert {m: lease.busy() for m, lease in demand.leases.items()} == {
            "llama": False,
            "qwen": True,
        }
    finally:
        await demand.stop()
        await api.stop()


def test_malformed_or_repeated_model_leases_are_refused_naming_the_entry() -> None:
    def problems(**settings: object) -> str:
        return "\n".join(config_problems(RouterConfig(**settings)))  # type: ignore[arg-type]

    kube = {"discovery": "kubernetes", "selector": {"app": "x"}}
    for entries in (("qwen",), ("=x",), ("qwen=Bad_Name",), ("qwen=a", "qwen=b")):
        found = problems(**kube, demand_leases=entries)
        assert f"demand_leases: {entries[-1]!r}: allowed MODEL=LEASE" in found, found
    workers = {"workers": ("http://127.0.0.1:1",)}
    assert "needs discovery=kubernetes" in problems(**workers, demand_leases=("q=q-d",))
    assert "hold_model_share=0.0: allowed" in problems(**workers, hold_model_share=0.0)
    assert "max_in_flight_per_model=5000: allowed 1 to" in problems(
        **workers, max_in_flight_per_model=5000
    )
