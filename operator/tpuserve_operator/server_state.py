"""What the operator remembers about one TPUModelServer between passes, in one object.

Nothing here survives an operator restart: the first pass after one re-applies every child
once and re-reads status from the object (see `drift`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from tpuserve_operator.cold_starts import ColdStartTracker
from tpuserve_operator.drift import AppliedRecord
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.group_restart import Epoch
from tpuserve_operator.render import Rendered

RenderKey = tuple[Any, ...]
"""What a rendering depends on: uid, generation, restart annotation, cluster capabilities."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """What a server serves, on which slice, and whether it is Ready: from its last full pass,
    for the per-replica and per-server metrics."""

    model_name: str
    generation: str
    topology: str
    chips: int
    ready: bool


@dataclass(slots=True)
class ServerState:
    """One TPUModelServer's memory: what was seen, rendered, applied, written and restarted."""

    # (uid, generation, restart annotation, deletion) of the last server event: a change wakes
    # the loop, our own status patches do not
    seen: RenderKey | None = None
    # the status last written (as sent), so an unchanged one is not patched again
    status: dict[str, Any] | None = None
    # the last rendering (or why the spec is invalid) and what it depended on
    rendering: tuple[RenderKey, Rendered | InvalidSpec] | None = None
    served: ServedModel | None = None  # None until a pass succeeds, or while the spec is invalid
    relisted_at: float | None = None  # time.monotonic() of the last full re-list
    failures: int = 0  # passes failed in a row, for the backoff
    # (kind, name) -> what the operator's last apply of that child returned
    applied: dict[tuple[str, str], AppliedRecord] = field(default_factory=dict)
    peering_secret: bool = False  # the router's peering Secret was created (or existed)
    picker_secret: bool = False  # the picker's token Secret was created (or existed)
    # StatefulSet path, per replica group: its pods while it runs as one, and the uids of
    # pods the operator deleted to restart it (group_restart)
    epochs: dict[int, Epoch] = field(default_factory=dict)
    condemned: dict[int, set[str]] = field(default_factory=dict)
    # node -> replica groups that lost pods with it (deleted without notice), to report
    lost: dict[str, set[int]] = field(default_factory=dict)
    lost_reported: dict[str, set[int]] = field(default_factory=dict)  # while remembered
    # the leader starts whose cold-start reports were read (status.compileCache)
    cold_starts: ColdStartTracker = field(default_factory=ColdStartTracker)
    # scale to zero (scale_to_zero): when this operator first saw the server up (or
    # activated it), when it last scaled it to zero, the spec.replicas it set and waits to
    # see, whether it activated it and no group is ready yet, and when (by its own clock) it
    # last saw a router renew the demand Lease
    active_since: datetime.datetime | None = None
    zeroed_at: datetime.datetime | None = None
    replicas_set: tuple[int, int] | None = None  # (generation patched, spec.replicas set)
    activating: bool = False
    demand_seen: datetime.datetime | None = None
