"""Per-model demand and shares: what a namespace gateway keeps apart for each model.

A router in front of several models (the operator's `TPUGateway`, docs/gateway.md, "A gateway
for a namespace") must keep one model from taking what another needs:

- **demand**, one Lease per model (``--demand-leases MODEL=LEASE,...``): a request renews
  only its own model's Lease (`ModelDemand`), so a model at zero replicas is woken by its own
  requests and by no other model's; each Lease is renewed while its model has requests
  arriving, in flight or held, exactly as the one Lease of a per-server router
  (`tpuserve_router.tenancy.demand`);
- **requests in flight**, ``--max-in-flight-per-model``: past it a model's requests get 429,
  while the router-wide ``--max-in-flight`` keeps room for the others (`ModelFlights`);
- **held bodies**, ``--hold-model-share``: one model's hold queue takes at most that share of
  the held requests' byte budget (`tenancy.hold`); each model's queue has its own
  ``--hold-max-requests`` slots already.

Models are counted by their served name (a bounded set: what the workers serve or the flags
name), never by what a client sends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the Leases' module (aiohttp, the API client) loads with discovery only
    from tpuserve_router.engines.discovery.kubernetes import ApiServer
    from tpuserve_router.metrics import RouterMetrics
    from tpuserve_router.tenancy.demand import DemandLease
    from tpuserve_router.tenancy.hold import HoldQueues


def demand_lease_map(entries: tuple[str, ...]) -> dict[str, str]:
    """``MODEL=LEASE`` entries (checked by `RouterConfig`) as model -> Lease name."""
    pairs = (entry.split("=", 1) for entry in entries)
    return {model: lease for model, lease in pairs}


class ModelFlights:
    """Requests in flight per served model (admitted, not yet answered)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.counts: dict[str, int] = {}

    def of(self, model: str) -> int:
        return self.counts.get(model, 0)

    def full(self, model: str) -> bool:
        return self.limit is not None and self.counts.get(model, 0) >= self.limit

    def enter(self, model: str) -> None:
        counts = self.counts  # on every request's path: no call to `of`
        counts[model] = counts.get(model, 0) + 1

    def leave(self, model: str) -> None:
        left = self.counts.get(model, 0) - 1
        if left > 0:
            self.counts[model] = left
        else:
            self.counts.pop(model, None)


class ModelDemand:
    """The router's demand Leases: ``every``, renewed by any model's requests (a per-server
    router's ``--demand-lease``), and one per model (``--demand-leases``), renewed only by its
    own model's."""

    def __init__(self, leases: Mapping[str, DemandLease], every: DemandLease | None = None) -> None:
        self.leases = dict(leases)
        self.every = every

    def all(self) -> list[DemandLease]:
        return [*self.leases.values(), *([self.every] if self.every is not None else [])]

    def arrived(self, held: bool, model: str) -> None:
        """A request for ``model`` (a served name, or a bounded label) arrived; ``held``: it
        waits for a worker."""
        if self.every is not None:
            self.every.arrived(held)
        lease = self.leases.get(model)
        if lease is not None:
            lease.arrived(held)

    def start(self) -> None:
        for lease in self.all():
            lease.start()

    async def stop(self) -> None:
        for lease in self.all():
            await lease.stop()


def demand_signals(
    api: ApiServer,
    namespace: str,
    config: Any,
    metrics: RouterMetrics,
    holds: HoldQueues,
    pipeline: Callable[[], Any],
) -> ModelDemand | None:
    """The Leases the flags name, or None. A model's Lease is renewed while its own
    requests are in flight or held (``pipeline()``: the router's pipeline, made after this)."""
    from tpuserve_router.tenancy.demand import DemandLease

    def lease(name: str, busy: Callable[[], bool]) -> DemandLease:
        interval = config.demand_interval_seconds
        return DemandLease(api, namespace, name, interval, metrics, busy)

    def model_busy(model: str) -> Callable[[], bool]:
        return lambda: pipeline().flights.of(model) > 0 or holds.held(model) > 0

    every = None
    if config.demand_lease is not None:
        every = lease(config.demand_lease, lambda: pipeline().in_flight > 0 or holds.total > 0)
    leases = {
        model: lease(name, model_busy(model))
        for model, name in demand_lease_map(config.demand_leases).items()
    }
    if every is None and not leases:
        return None
    return ModelDemand(leases, every)
