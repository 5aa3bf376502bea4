"""Scale to zero and back: the operator owns 0 <-> 1, the HorizontalPodAutoscaler 1 <-> N. Pure.

A server with ``autoscaling.minReplicas: 0`` has a demand Lease its routers renew while
requests arrive, run or are held (`render.demand`). From when the operator saw a renewal
(its own clock, when the Lease's ``renewTime`` changed: the routers' clocks may be skewed;
a Lease first seen after an operator restart is not a renewal) and the time now:

- at ``replicas: 0``, a renewal newer than the last scale to zero and at most
  `FRESH_RENEWALS` intervals old is demand: **activate** (replicas 1). At zero every request
  is held, and a held request renews the Lease at once, so this is one watch event after the
  first request.
- at ``replicas >= 1``, no renewal (nor first Ready group after an activation, nor the
  Lease's creation, nor this operator first seeing the server up) for
  ``scaleToZero.idleSeconds``: **scale to zero**. Routers renew while anything is in flight
  or held, so an idle server is one with nothing arriving, running or waiting for that long.
  Otherwise the pass is due again when the idle period would end.
- after an activation, never while no group has been Ready yet (a cold compile takes
  10-30 min, longer than held requests wait), up to the server's startup budget (the
  startup probe's), so a server that never starts still goes to zero.

The HPA keeps ``minReplicas`` 1; when the operator sets 0 it stands aside (its condition
ScalingActive=False, reason ScalingDisabled) until the operator sets 1 again.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Literal

from tpuserve_operator.render.demand import DEMAND_INTERVAL_SECONDS, FRESH_RENEWALS

Action = Literal["activate", "scale_to_zero"]


@dataclass(frozen=True, slots=True)
class ZeroDecision:
    action: Action | None
    message: str
    recheck_seconds: float | None = None  # when the idle period would end, if it runs


def decide_zero(
    *,
    replicas: int,
    idle_seconds: float,
    now: datetime.datetime,
    renewed: datetime.datetime | None,
    active_since: datetime.datetime | None,
    zeroed_at: datetime.datetime | None,
    starting_until: datetime.datetime | None = None,
    interval_seconds: float = DEMAND_INTERVAL_SECONDS,
) -> ZeroDecision:
    """What to do now; ``active_since`` is the latest of the Lease's creation, the first
    Ready group after the last activation (the activation while none is) and when this
    operator first saw the server up, ``zeroed_at`` when it last scaled the server to zero
    (None: not since it started), ``starting_until`` the end of the startup budget of an
    activated server no group of which has been Ready yet (None: not starting)."""
    if replicas == 0:
        fresh = renewed is not None and (now - renewed).total_seconds() <= (
            interval_seconds * FRESH_RENEWALS
        )
        if fresh and renewed is not None and (zeroed_at is None or renewed > zeroed_at):
            return ZeroDecision("activate", "a router holds requests: scaling from zero to 1")
        return ZeroDecision(None, "at zero, no demand")
    if starting_until is not None and now < starting_until:
        return ZeroDecision(
            None, "starting", recheck_seconds=(starting_until - now).total_seconds()
        )
    marks = [t for t in (renewed, active_since) if t is not None]
    last = max(marks) if marks else now
    idle = (now - last).total_seconds()
    if idle >= idle_seconds:
        return ZeroDecision(
            "scale_to_zero",
            f"no request for {idle:.0f} s (scaleToZero.idleSeconds {idle_seconds:g}): "
            "scaling to zero",
        )
    return ZeroDecision(None, "serving", recheck_seconds=idle_seconds - idle)
