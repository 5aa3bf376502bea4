"""The load every router replica sees: its own requests, its peers' announced ones, the polled rest.

Several router replicas behind one Service each count only the requests they sent, so each
sees 1/N of every worker's load and N of them pile onto the same worker at once. Two sources
tell a replica about the others, and one rule combines them:

- *peering* (``--peer-port``, `tpuserve_router.peering.peers`): every peer publishes each request it
  routes and ends, and this replica counts them on the worker as it hears them (a
  millisecond or so old): ``announced_in_flight``; the peer's predicted blocks and booked
  prefill go into this replica's policy as if it had routed them (`peer_view`);
- the *engine poll* (``--load-poll-interval``, `engine_loads`): SGLang 0.5.23's
  ``GET /v1/loads`` gives, per data-parallel rank, ``num_running_reqs``, ``num_waiting_reqs``
  and ``num_waiting_uncached_tokens`` (the prompt tokens waiting for prefill compute: each
  waiting request's tokens past its cached prefix, plus what the chunked request has left).

The rule: the others' part is what the peers announced, exact while peering is connected,
plus what the engine holds beyond everything this replica knows of, as of the last poll
(requests of routers outside the peer set, of other clients, of peers not heard yet):

    rest                 = max(0, engine requests - own in-flight - announced, at the poll)
    peer_in_flight       = announced (live) + rest (as of the poll)
    peer_prefill_tokens  = max(0, engine uncached waiting - booked prefill, at the poll)

where booked prefill is what this replica's policy holds booked on the worker: its own
requests' and its peers' announced ones (`PrefillQueues`). The policy sees
``in_flight = own + peer_in_flight`` and its queues plus ``peer_prefill_tokens``. Without
peering ``announced`` is 0 and this is the poll alone; with one replica and no other
clients the rest is about 0. An estimate older than `STALE_POLLS` intervals (the engine
stopped answering) is dropped (the rest only), so a replica falls back to what it knows
rather than steering by a frozen number.

While the polls find no rest and no unbooked prefill on any engine (one replica and no
other clients, or peers whose announcements cover everything), a replica polls less often:
each quiet pass doubles the wait, up to `QUIET_POLL_FACTOR` intervals (0.8 s at the default
0.1 s); the first poll that finds some (or fails, or is still under way at the next pass)
brings it back to the interval (`next_poll_gap`). Load from outside the replica's view is
then seen within that wait rather than within one interval; the engines answer 8x fewer
polls, and an idle router spends 8x less on them.

`set_peer_load`, `clear_peer_load` and `announce_peer_request` are the rule; the router
(`engine_loads.LoadPoller`, `peer_view.PeerView`) and the routing benchmark's
``--router-replicas`` model both call them, and the fleet model (`tpuserve.fleet.routers`)
calls `seen_load`, the same rule over the poll's numbers, so the simulators measure what
runs.
"""

from __future__ import annotations

from typing import Final, Protocol

STALE_POLLS: Final = 3
"""Poll intervals after which a worker's polled estimate is dropped."""
QUIET_POLL_FACTOR: Final = 8
"""A replica whose polls show nothing beyond what it knows waits up to this many intervals."""


class PeerLoad(Protocol):
    """A worker's load as one router replica keeps it (the router's `Worker`, the sim's view).

    ``in_flight`` is what policies read: the replica's own in-flight requests plus
    ``peer_in_flight``, of which ``announced_in_flight`` came from peering; the proxy adds and
    removes its own requests on ``in_flight`` directly.
    """

    in_flight: int
    peer_in_flight: int
    announced_in_flight: int
    peer_prefill_tokens: int


def set_peer_load(
    worker: PeerLoad, engine_requests: int, engine_prefill_tokens: int, booked_prefill_tokens: int
) -> bool:
    """Take one poll of the worker's engine: what neither this replica nor its peers'
    announcements account for. True when there is some (requests or prefill): the poll told
    the replica something its own counts did not (`next_poll_gap`).

    ``engine_requests`` is running plus waiting over every DP rank, ``engine_prefill_tokens``
    the engine's uncached waiting prompt tokens, ``booked_prefill_tokens`` the prefill this
    replica's policy has booked on the worker and not seen finish (its own and its peers')."""
    own = worker.in_flight - worker.peer_in_flight
    announced = worker.announced_in_flight
    rest = beyond_known(engine_requests, own + announced)
    peer = announced + rest
    worker.in_flight = own + peer
    worker.peer_in_flight = peer
    worker.peer_prefill_tokens = beyond_known(engine_prefill_tokens, booked_prefill_tokens)
    return rest > 0 or worker.peer_prefill_tokens > 0


def beyond_known(polled: int, known: int) -> int:
    """The rule's one step: what a poll shows beyond what the replica knew of when it polled,
    never below 0 (the rest of a worker's requests; its prefill tokens nobody booked)."""
    return polled - known if polled > known else 0


def seen_load(known_now: int, polled: int, known_at_poll: int) -> int:
    """What a policy sees between polls, as `set_peer_load` keeps it on a `Worker`: what the
    replica knows of now (its own and its peers' announced requests, or their booked
    prefill) plus what the last poll showed beyond what it knew then. For a model that keeps
    the poll's numbers rather than a `PeerLoad` per worker (the fleet model)."""
    return known_now + beyond_known(polled, known_at_poll)


def next_poll_gap(gap: float, interval: float, news: bool) -> float:
    """The wait before a replica's next load poll, ``gap`` being the last one: ``interval``
    after a poll that showed load beyond the replica's own counts and its peers'
    announcements (``news``, `set_peer_load`'s answer, or a poll that failed), else twice
    the last wait, up to `QUIET_POLL_FACTOR` intervals."""
    return interval if news else min(2.0 * gap, QUIET_POLL_FACTOR * interval)


def clear_peer_load(worker: PeerLoad) -> None:
    """Forget the polled part of the others' load on the worker (its polls stopped
    answering); what peers announced stays."""
    rest = worker.peer_in_flight - worker.announced_in_flight
    worker.in_flight -= rest
    worker.peer_in_flight -= rest
    worker.peer_prefill_tokens = 0


def announce_peer_request(worker: PeerLoad, delta: int) -> None:
    """A peer announced a request on the worker (``delta`` +1) or its end (-1)."""
    worker.announced_in_flight += delta
    worker.peer_in_flight += delta
    worker.in_flight += delta
