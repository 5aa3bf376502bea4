"""The hold queue: requests that arrive while their model has no routable worker wait here.

With ``--hold-max-requests`` above 0, a generation request whose model has no routable worker
(scaled to zero, or every replica starting) is not refused: it waits in its model's bounded
queue, and the router signals demand (`tpuserve_router.tenancy.demand`) so the fleet scales up. A
request that arrives while others of its model wait queues with them even if a worker is
routable by then.

Who leaves first. Each held request belongs to a tenant (its API key's, or its client's
address without keys) and a priority class (its key's, `auth.PRIORITIES`). The next to leave
is always from the most important class waiting; within a class tenants take turns (round
robin: a tenant whose request left goes to the back of its class), and each tenant's own
requests leave in arrival order. So at wake-up a tenant with 256 requests held and one with 2
leave alternately, and a ``critical`` request held behind 256 ``low`` ones leaves first.

How fast. The next request leaves only through the admission live traffic passes: its model
has a routable worker (``routable()``) and the router has room for its class under
``--max-in-flight`` (``admissible()``: the shed thresholds of `quotas.in_flight_limits`), and
its model has room under ``--max-in-flight-per-model``.
A released request is counted in flight before the next is considered, so a wake-up never
takes the router past its limit, and a held ``low`` request waits (held, not refused) while
the router has no room for ``low`` traffic. The next one looks again when a request leaves
the router (`announce`), when the workers change, and every `RECHECK_SECONDS` anyway.

Bounds, and who gives way. Each model's queue holds at most ``max_requests`` requests, and
the requests held in all queues at most ``max_bytes`` bytes of bodies (half of
``--max-buffered-bytes``, so held requests never take what live traffic needs), one model's
at most ``model_share`` of them (``--hold-model-share``: behind a namespace gateway one
model's flood leaves the other models their room). A newcomer
that does not fit takes the place of the newest request of the tenant holding most in the
least important class waiting, if that class is below its own, or if it is its own and that
tenant would still hold at least as much as the newcomer's tenant with it (in requests for
the count, in bytes for the bytes); that request is refused
(``preempted``). Otherwise the newcomer is refused (``queue_full``). So a ``critical``
request is never refused while ``low`` ones wait, and one tenant cannot keep more than its
share of a full queue from the others of its class.

Refusals are immediate and always carry ``Retry-After``: ``queue_full`` and ``preempted``
above; a request held ``--hold-max-seconds`` leaves with 503 (``timeout``); a router stopping
refuses every held request (``shutdown``, `refuse_all`) rather than dropping its connection.
A client that goes away is removed from its queue (``client_gone``). Queues are keyed by a
bounded model label (`hold_label`): the model when the router knows it, else ``other``, so
neither memory nor metric labels grow with what clients send.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Final

from tpuserve_router.metrics import HOLD_OUTCOMES, RouterMetrics
from tpuserve_router.tenancy.auth import DEFAULT_PRIORITY, PRIORITIES

HoldOutcome = str
"""One of `HOLD_OUTCOMES` (dispatched, queue_full, preempted, timeout, client_gone,
shutdown)."""
OTHER_MODEL: Final = "other"
"""The queue (and label) of requests for a model the router does not know yet."""
RECHECK_SECONDS: Final = 1.0
"""How often a held request looks for its turn by itself, should a change not have been
announced (an outlier ejection ending, say)."""
UNBOUNDED_BYTES: Final = 1 << 62
_RANK: Final = {name: rank for rank, name in enumerate(PRIORITIES)}
"""A priority class's rank: 0 for the most important."""


class HoldRefused(Exception):
    """A held request must be answered 503 with Retry-After; ``outcome`` says why."""

    def __init__(self, outcome: HoldOutcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


def hold_label(model: str, known: Collection[str]) -> str:
    """The queue (and metric label) of ``model``: itself if known, else `OTHER_MODEL`."""
    return model if model and model in known else OTHER_MODEL


def _always() -> bool:
    return True


@dataclass(eq=False, slots=True)
class _Entry:
    wake: asyncio.Future[None]
    label: str  # its queue's
    tenant: str
    rank: int  # its priority class's rank (0: critical)
    size: int  # bytes of its body
    seq: int  # arrival order, router-wide
    refusal: tuple[HoldOutcome, str] | None = None  # set when it must leave refused
    queued: bool = False  # in its queue (and counted in the totals)


class _Queue:
    """One model's held requests: by class, then tenant (in turn order), then arrival."""

    __slots__ = ("bytes", "classes", "count")

    def __init__(self) -> None:
        # classes[rank]: tenant -> its requests, oldest first; dict order is the turn order
        self.classes: list[dict[str, deque[_Entry]]] = [{} for _ in PRIORITIES]
        self.count = 0
        self.bytes = 0  # its requests' bodies

    def add(self, entry: _Entry) -> None:
        self.classes[entry.rank].setdefault(entry.tenant, deque()).append(entry)
        self.count += 1
        self.bytes += entry.size

    def remove(self, entry: _Entry, *, took_turn: bool) -> None:
        """Take ``entry`` out; ``took_turn`` (it left to a worker): its tenant goes to the
        back of its class."""
        tenants = self.classes[entry.rank]
        mine = tenants[entry.tenant]
        mine.remove(entry)
        self.count -= 1
        self.bytes -= entry.size
        if took_turn or not mine:
            del tenants[entry.tenant]
            if mine:
                tenants[entry.tenant] = mine

    def next(self) -> _Entry | None:
        """The request whose turn it is: the first tenant's oldest, of the first class."""
        for tenants in self.classes:
            for mine in tenants.values():
                return mine[0]
        return None

    def entries(self) -> Iterable[_Entry]:
        for tenants in self.classes:
            for mine in tenants.values():
                yield from mine


def _victims(
    candidates: Iterable[_Entry],
    newcomer: _Entry,
    measure: Callable[[_Entry], int],
    excess: int,
    already: Collection[_Entry] = (),
) -> list[_Entry] | None:
    """The held requests to refuse so that ``newcomer`` fits, ``excess`` (in ``measure``'s
    unit) being what it lacks; None when the rule (module docstring) lets it take nobody's
    place, and then nobody is refused. Requests of ``already`` are gone already."""
    usage: dict[tuple[int, str], int] = {}
    newest: dict[tuple[int, str], list[_Entry]] = {}
    for entry in candidates:
        if entry in already:
            continue
        key = (entry.rank, entry.tenant)
        usage[key] = usage.get(key, 0) + measure(entry)
        newest.setdefault(key, []).append(entry)
    for entries in newest.values():
        entries.sort(key=lambda e: e.seq)
    mine = (newcomer.rank, newcomer.tenant)
    wanted = measure(newcomer)
    victims: list[_Entry] = []
    while excess > 0:
        worst = max((k[0] for k, used in usage.items() if used > 0), default=-1)
        if worst < newcomer.rank:
            return None
        heaviest = max(
            (k for k, used in usage.items() if k[0] == worst and used > 0), key=usage.__getitem__
        )
        victim = newest[heaviest][-1]
        if worst == newcomer.rank and (
            heaviest == mine or usage[heaviest] - measure(victim) < usage.get(mine, 0) + wanted
        ):
            return None  # its tenant would then hold more than the one it takes from
        newest[heaviest].pop()
        victims.append(victim)
        usage[heaviest] -= measure(victim)
        excess -= measure(victim)
    return victims


def _count(entry: _Entry) -> int:
    return 1


def _size(entry: _Entry) -> int:
    return entry.size


class HoldQueues:
    """Every model's hold queue. Each held request brings a ``routable()`` that says whether
    its model could be routed now, and an ``admissible()`` that says whether live traffic of
    its class would be admitted now; `announce` is called when either may have changed."""

    def __init__(
        self,
        max_requests: int,
        max_seconds: float,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_bytes: int = UNBOUNDED_BYTES,
        model_share: float = 1.0,
    ) -> None:
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.max_bytes = max_bytes
        # what one model's queue may hold of them (--hold-model-share): one model's flood
        # leaves the others their room
        self.model_max_bytes = max_bytes if model_share >= 1 else int(max_bytes * model_share)
        self.metrics = metrics
        self.clock = clock
        self._queues: dict[str, _Queue] = {}
        self.total = 0  # requests held in every queue
        self.held_bytes = 0  # their bodies' bytes
        self._seq = itertools.count()
        self._refusal: str | None = None  # set by `refuse_all`: every request is refused

    @property
    def enabled(self) -> bool:
        return self.max_requests > 0

    def held(self, label: str | None = None) -> int:
        """Requests waiting, in one queue or in all."""
        if label is None:
            return self.total
        queue = self._queues.get(label)
        return 0 if queue is None else queue.count

    def announce(self) -> None:
        """A worker may have become routable, or room for a class freed up: the request
        whose turn it is in every queue looks now."""
        for queue in self._queues.values():
            _wake(queue.next())

    def refuse_all(self, reason: str) -> None:
        """Refuse every held request, and any that comes from now on, with 503 and
        Retry-After saying ``reason`` (the router is stopping)."""
        self._refusal = reason
        for queue in self._queues.values():
            for entry in queue.entries():
                entry.refusal = ("shutdown", reason)
                _wake(entry)

    async def hold(
        self,
        label: str,
        arrived: float,
        routable: Callable[[], bool],
        *,
        tenant: str = "",
        priority: str = DEFAULT_PRIORITY,
        size: int = 0,
        admissible: Callable[[], bool] = _always,
    ) -> None:
        """Wait until this request's turn comes with a worker routable and room for its
        class; raises `HoldRefused` when it cannot be held (or is preempted) or the hold
        time passes. ``size`` is its body's bytes. Cancelling (the client left) removes the
        request from its queue."""
        outcomes = self.metrics.hold_outcomes
        if self._refusal is not None:
            outcomes.labels(label, "shutdown").inc()
            raise HoldRefused("shutdown", self._refusal)
        queue = self._queues.get(label) or _Queue()
        loop = asyncio.get_running_loop()
        entry = _Entry(loop.create_future(), label, tenant, _RANK[priority], size, next(self._seq))
        try:
            self._make_room(queue, entry)
        except HoldRefused:
            outcomes.labels(label, "queue_full").inc()
            raise
        queue = self._queues.setdefault(label, queue)  # the same (emptied by preemption, say)
        queue.add(entry)
        entry.queued = True
        self.total += 1
        self.held_bytes += size
        self.metrics.held_requests.labels(label).inc()
        deadline = arrived + self.max_seconds
        outcome: HoldOutcome = "client_gone"
        try:
            while True:
                if entry.refusal is not None:
                    outcome, message = entry.refusal
                    raise HoldRefused(outcome, message)
                if queue.next() is entry and routable() and admissible():
                    outcome = "dispatched"
                    return
                left = deadline - self.clock()
                if left <= 0:
                    outcome = "timeout"
                    raise HoldRefused(
                        "timeout",
                        f"model {label!r} had no routable worker within {self.max_seconds:g} s "
                        "(--hold-max-seconds); retry",
                    )
                if entry.wake.done():
                    entry.wake = loop.create_future()
                await asyncio.wait((entry.wake,), timeout=min(left, RECHECK_SECONDS))
        finally:
            if entry.queued:
                self._take_out(entry, took_turn=outcome == "dispatched")
            outcomes.labels(label, outcome).inc()
            self.metrics.hold_seconds.labels(label).observe(self.clock() - arrived)

    def _take_out(self, entry: _Entry, *, took_turn: bool) -> None:
        """Take ``entry`` out of its queue and the totals; the next one looks now."""
        queue = self._queues[entry.label]
        was_next = queue.next() is entry
        queue.remove(entry, took_turn=took_turn)
        entry.queued = False
        self.total -= 1
        self.held_bytes -= entry.size
        self.metrics.held_requests.labels(entry.label).inc(-1)
        if was_next:
            _wake(queue.next())
        if not queue.count:
            del self._queues[entry.label]

    def _make_room(self, queue: _Queue, newcomer: _Entry) -> None:
        """Refuse (preempt) the held requests ``newcomer`` takes the place of, if it must
        take any; raises `HoldRefused` (queue_full) when it may not be held."""
        label = newcomer.label
        if newcomer.size > self.max_bytes:
            raise HoldRefused(
                "queue_full",
                f"model {label!r} has no routable worker yet, and this request's body "
                f"({newcomer.size} bytes) is larger than held requests may take in all "
                f"({self.max_bytes} bytes, half of --max-buffered-bytes); retry",
            )
        victims: list[_Entry] = []
        excess = queue.count + 1 - self.max_requests
        if excess > 0:
            found = _victims(queue.entries(), newcomer, _count, excess)
            if found is None:
                raise HoldRefused(
                    "queue_full",
                    f"model {label!r} has no routable worker yet and {queue.count} requests "
                    f"already wait for one (--hold-max-requests {self.max_requests}), none "
                    "of a lower priority class nor of a tenant holding more than its share; "
                    "retry",
                )
            victims = found
        excess = queue.bytes - sum(v.size for v in victims) + newcomer.size - self.model_max_bytes
        if excess > 0:
            found = _victims(queue.entries(), newcomer, _size, excess, victims)
            if found is None:
                raise HoldRefused(
                    "queue_full",
                    f"model {label!r} has no routable worker yet and its held requests take "
                    f"{queue.bytes} bytes of bodies, the most one model may "
                    f"({self.model_max_bytes}, --hold-model-share of the held budget), none "
                    "of a lower priority class nor of a tenant holding more than its share; "
                    "retry",
                )
            victims += found
        excess = self.held_bytes - sum(v.size for v in victims) + newcomer.size - self.max_bytes
        if excess > 0:
            every = itertools.chain.from_iterable(q.entries() for q in self._queues.values())
            found = _victims(every, newcomer, _size, excess, victims)
            if found is None:
                raise HoldRefused(
                    "queue_full",
                    f"held requests already take {self.held_bytes} bytes of bodies, the most "
                    f"they may ({self.max_bytes}, half of --max-buffered-bytes), none of a "
                    "lower priority class nor of a tenant holding more than its share; retry",
                )
            victims += found
        for victim in victims:
            victim.refusal = (
                "preempted",
                "this request gave its place in the hold queue to one of a higher priority "
                "class, or of a tenant holding less than its share; retry",
            )
            self._take_out(victim, took_turn=False)
            _wake(victim)


def _wake(entry: _Entry | None) -> None:
    if entry is not None and not entry.wake.done():
        entry.wake.set_result(None)


def touch_hold_series(metrics: RouterMetrics, label: str) -> None:
    """A queue's series at zero, so `increase()` sees its first held request."""
    metrics.held_requests.labels(label)
    for outcome in HOLD_OUTCOMES:
        metrics.hold_outcomes.labels(label, outcome)
