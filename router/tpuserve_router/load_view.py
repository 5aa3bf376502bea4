"""The load every router replica sees: its own in-flight requests plus the engine's polled load.

Several router replicas behind one Service each count only the requests they sent, so each
sees 1/N of every worker's load and N of them pile onto the same worker at once. The engines
know their real load: SGLang 0.5.23's ``GET /v1/loads`` gives, per data-parallel rank,
``num_running_reqs``, ``num_waiting_reqs`` and ``num_waiting_uncached_tokens`` (the prompt
tokens waiting for prefill compute: each waiting request's tokens past its cached prefix,
plus what the chunked request has left). A replica polls it every ``--load-poll-interval``
and keeps, per worker, what the *others* put there as of that poll:

    peer_in_flight       = max(0, engine requests          - own in-flight at the poll)
    peer_prefill_tokens  = max(0, engine uncached waiting  - own booked prefill at the poll)

and the policy sees ``own now + peer as of the last poll``. Its own part is exact at every
instant (it changes with every request it sends or ends); only the others' part is as old as
the last poll. With one replica the peer part is only the gap between the engine's count and
the router's (requests of other clients, or counted a moment apart). An estimate older than
`STALE_POLLS` intervals (the engine stopped answering) is dropped, so a replica falls back to
its own counts rather than steering by a frozen number.

`set_peer_load` is the one rule; the router's `engine_loads.LoadPoller` and the routing
benchmark's ``--router-replicas`` model both call it, so the simulator measures what runs.
"""

from __future__ import annotations

from typing import Final, Protocol

STALE_POLLS: Final = 3
"""Poll intervals after which a worker's peer estimate is dropped."""


class PeerLoad(Protocol):
    """A worker's load as one router replica keeps it (the router's `Worker`, the sim's view).

    ``in_flight`` is what policies read: the replica's own in-flight requests plus
    ``peer_in_flight``; the proxy adds and removes its own requests on ``in_flight`` directly.
    """

    in_flight: int
    peer_in_flight: int
    peer_prefill_tokens: int


def set_peer_load(
    worker: PeerLoad, engine_requests: int, engine_prefill_tokens: int, own_prefill_tokens: int
) -> None:
    """Take one poll of the worker's engine: what the other replicas put there now.

    ``engine_requests`` is running plus waiting over every DP rank, ``engine_prefill_tokens``
    the engine's uncached waiting prompt tokens, ``own_prefill_tokens`` the prefill this replica
    has booked on the worker and not seen finish (its policy's `PrefillQueues`)."""
    own = worker.in_flight - worker.peer_in_flight
    peer = max(0, engine_requests - own)
    worker.in_flight = own + peer
    worker.peer_in_flight = peer
    worker.peer_prefill_tokens = max(0, engine_prefill_tokens - own_prefill_tokens)


def clear_peer_load(worker: PeerLoad) -> None:
    """Forget the other replicas' load on the worker (its polls stopped answering)."""
    worker.in_flight -= worker.peer_in_flight
    worker.peer_in_flight = 0
    worker.peer_prefill_tokens = 0
