"""Peering's shared view: the wire format, and a replica applying its peers' decisions as its
own (load, predictions, booked prefill) until they end, expire, go silent or disconnect."""

from __future__ import annotations

import msgpack
import pytest

from tests.fakes import FakeWorker, VirtualClock, fake_request
from tpuserve_router.engines.load_view import clear_peer_load, set_peer_load
from tpuserve_router.peering import peer_view
from tpuserve_router.peering.peer_view import (
    FORMAT,
    PeerLink,
    PeerMessage,
    PeerView,
    decode,
    encode,
)
from tpuserve_router.policies import make_policy
from tpuserve_router.policies.base import Decision, Policy
from tpuserve_router.policies.prefix_routing import BlockIndexPolicy

pytestmark = pytest.mark.unit

TTL = 60.0
PROMPT = list(range(100, 164))  # 4 blocks of 16


class Replica:
    """One router replica: its policy, its workers, its link out and its view of the others."""

    def __init__(self, router: str, clock: VirtualClock, policy: str = "precise") -> None:
        self.policy: Policy = make_policy(policy, clock=clock)
        self.workers = {name: FakeWorker(name) for name in ("a", "b")}
        self.sent: list[PeerMessage] = []
        self.link = PeerLink(router, self.sent.append)
        self.view = PeerView(
            router, self.policy, self.workers.get, clock=clock, max_open_per_peer=3,
            open_ttl_seconds=TTL, silent_seconds=5.0,
        )  # fmt: skip

    def route(self, prompt: list[int] = PROMPT) -> Decision[FakeWorker]:
        decision = self.policy.choose(fake_request(token_ids=prompt), list(self.workers.values()))
        self.link.routed(decision)
        return decision

    def hear(self, other: Replica) -> None:
        """Take what ``other`` sent so far, through the wire format."""
        for message in other.sent:
            self.view.apply(decode(encode(message)))
        other.sent.clear()


def booked(replica: Replica, name: str) -> int:
    return replica.policy.queued_prefill_tokens(name)


def predicted_blocks(replica: Replica) -> int:
    return replica.policy.index_sizes()["predicted_blocks"]


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


def test_messages_survive_the_wire() -> None:
    keys = [-(2**63), -1, 0, 2**63 - 1]
    for message in (
        PeerMessage("route", "r1", 7, "http://10.0.0.1:30000", 48, keys[-1], keys),
        PeerMessage("route", "r1", 8, "http://10.0.0.1:30000", 0, None, ()),
        PeerMessage("first_byte", "r1", 7),
        PeerMessage("end", "r1", 7),
        PeerMessage("hello", "r1"),
    ):
        back = decode(encode(message))
        assert (back.kind, back.router, back.request, back.worker, back.booked_tokens) == (
            message.kind, message.router, message.request, message.worker, message.booked_tokens
        )  # fmt: skip
        assert (back.last_key, list(back.keys)) == (message.last_key, list(message.keys))


def test_a_long_prompt_sends_its_leading_keys_only() -> None:
    keys = list(range(peer_view.MAX_ROUTE_KEYS + 5))
    back = decode(encode(PeerMessage("route", "r", 1, "w", 0, keys[-1], keys)))
    assert list(back.keys) == keys[: peer_view.MAX_ROUTE_KEYS]
    assert back.last_key == keys[-1]


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb({"kind": "route"}), "expected an array"),
        (msgpack.packb([FORMAT + 1, "end", "r", 1]), "format 2; allowed: 1"),
        (msgpack.packb([FORMAT, "gossip", "r", 1]), "kind 'gossip'"),
        (msgpack.packb([FORMAT, "end", "", 1]), "router ''"),
        (msgpack.packb([FORMAT, "end", "r", "1"]), "request '1'"),
        (msgpack.packb([FORMAT, "route", "r", 1, "w", 0, None]), "route: 7 fields"),
        (msgpack.packb([FORMAT, "route", "r", 1, "w", -3, None, b""]), "booked tokens -3"),
        (msgpack.packb([FORMAT, "route", "r", 1, "w", 0, "k", b""]), "last key 'k'"),
        (msgpack.packb([FORMAT, "route", "r", 1, "w", 0, 2**63, b""]), "a 64-bit integer"),
        (msgpack.packb([FORMAT, "route", "r", 1, "w", 0, None, [1, 2]]), "expected binary"),
        (msgpack.packb([FORMAT, "route", "r", 1, "w", 0, None, b"1234"]), "4 bytes"),
        (b"\x00" * (peer_view.MAX_MESSAGE_BYTES + 1), "allowed: at most"),
    ],
)  # fmt: skip
def test_a_malformed_message_says_what_is_wrong(raw: bytes, problem: str) -> None:
    with pytest.raises(peer_view.PeerMessageError, match=problem):
        decode(raw)


def test_a_peers_decision_is_applied_as_if_routed_here(clock: VirtualClock) -> None:
    first, second = Replica("r1", clock), Replica("r2", clock)
    decision = first.route()
    name = decision.worker.name
    assert booked(first, name) == len(PROMPT)
    assert predicted_blocks(first) == 4
    second.hear(first)
    worker = second.workers[name]
    assert (worker.in_flight, worker.peer_in_flight, worker.announced_in_flight) == (1, 1, 1)
    assert booked(second, name) == len(PROMPT)
    assert predicted_blocks(second) == 4
    # the same prompt at the second replica now goes where the first sent it, as a hit
    again = second.policy.choose(fake_request(token_ids=PROMPT), list(second.workers.values()))
    assert (again.worker.name, again.outcome) == (name, "prefix_hit")
    first.link.prefill_done(decision)
    second.hear(first)
    assert booked(second, name) == 0
    assert worker.in_flight == 1
    first.link.ended(decision)
    first.link.ended(decision)  # once only
    assert len(first.sent) == 1
    second.hear(first)
    assert (worker.in_flight, worker.peer_in_flight, worker.announced_in_flight) == (0, 0, 0)
    assert second.view.open_requests() == 0


def test_an_end_without_a_first_byte_releases_the_booking_too(clock: VirtualClock) -> None:
    first, second = Replica("r1", clock), Replica("r2", clock)
    decision = first.route()
    first.link.ended(decision)
    first.link.prefill_done(decision)  # after its end: nothing to say
    second.hear(first)
    assert booked(second, decision.worker.name) == 0
    assert all(w.in_flight == 0 for w in second.workers.values())


def test_own_messages_unknown_workers_and_repeats_are_ignored(clock: VirtualClock) -> None:
    replica = Replica("r1", clock)
    replica.route()
    assert replica.view.apply(replica.sent[0]) is False
    assert replica.view.open_requests() == 0
    other = PeerMessage("route", "r2", 1, "http://elsewhere:1", 16, None, ())
    assert replica.view.apply(other) is True
    assert replica.view.open_requests() == 0
    known = PeerMessage("route", "r2", 2, "a", 16, None, ())
    replica.view.apply(known)
    replica.view.apply(known)
    assert replica.workers["a"].announced_in_flight == 1


def test_a_peer_keeps_at_most_its_cap_of_open_requests_oldest_dropped(
    clock: VirtualClock,
) -> None:
    replica = Replica("r1", clock)
    for request in range(1, 6):
        replica.view.apply(PeerMessage("route", "r2", request, "a", 10, None, ()))
    assert replica.view.open_requests("r2") == 3
    assert replica.workers["a"].announced_in_flight == 3
    assert booked(replica, "a") == 30
    replica.view.apply(PeerMessage("end", "r2", 1))  # dropped already: nothing happens
    assert replica.workers["a"].announced_in_flight == 3


def test_requests_past_their_time_to_live_and_silent_peers_are_dropped(
    clock: VirtualClock,
) -> None:
    replica = Replica("r1", clock)
    replica.view.apply(PeerMessage("route", "r2", 1, "a", 10, None, ()))
    for _ in range(int(TTL)):  # r2 keeps saying hello, its request never ends
        clock.advance(1.0)
        replica.view.apply(PeerMessage("hello", "r2"))
        assert replica.view.expire() == []
    assert replica.view.open_requests() == 0
    assert replica.workers["a"].in_flight == 0
    assert booked(replica, "a") == 0
    replica.view.apply(PeerMessage("route", "r3", 1, "b", 10, None, ()))
    clock.advance(5.5)  # r3 silent
    replica.view.apply(PeerMessage("hello", "r2"))
    assert replica.view.expire() == [("r3", 1)]
    assert replica.workers["b"].in_flight == 0
    assert "r2" in replica.view.peers


def test_a_disconnected_peers_requests_all_end_here(clock: VirtualClock) -> None:
    replica = Replica("r1", clock)
    for request, name in enumerate(("a", "b", "a"), start=1):
        replica.view.apply(PeerMessage("route", "r2", request, name, 10, None, ()))
    assert replica.view.drop("r2") == 3
    assert replica.view.drop("r2") == 0
    assert all(w.in_flight == 0 for w in replica.workers.values())
    assert booked(replica, "a") == booked(replica, "b") == 0


def test_a_hello_names_the_oldest_open_request_and_a_lost_end_drops_at_it(
    clock: VirtualClock,
) -> None:
    first, second = Replica("r1", clock), Replica("r2", clock)
    first.link.hello()
    assert first.sent.pop().request == 1  # nothing open: the next number
    decisions = [first.route(), first.route(), first.route()]
    second.hear(first)
    assert second.view.open_requests("r1") == 3
    first.link.ended(decisions[0])
    first.link.ended(decisions[1])
    first.sent[:] = [m for m in first.sent if m.request != 1]  # the first end is lost
    second.hear(first)
    assert second.view.open_requests("r1") == 2
    first.link.hello()
    assert first.sent[-1].request == 3  # the oldest still open
    second.hear(first)
    assert second.view.open_requests("r1") == 1
    workers = second.workers.values()
    assert sum(w.announced_in_flight for w in workers) == 1
    first.link.ended(decisions[2])
    first.sent.clear()  # this end is lost too
    first.link.hello()
    second.hear(first)
    assert second.view.open_requests() == 0
    assert all(w.in_flight == 0 for w in workers)


def test_an_approximate_policy_takes_the_load_but_not_the_prefix(clock: VirtualClock) -> None:
    replica = Replica("r1", clock, policy="cache_aware")
    assert not isinstance(replica.policy, BlockIndexPolicy)
    replica.view.apply(PeerMessage("route", "r2", 1, "a", 10, None, (1, 2)))
    assert replica.workers["a"].in_flight == 1
    assert replica.policy.index_sizes()["tree_chars"] == 0


def test_the_poll_counts_only_what_the_peers_did_not_announce() -> None:
    worker = FakeWorker("a", in_flight=2)  # this replica's own 2
    worker.in_flight += 3  # its peers announced 3
    worker.peer_in_flight = worker.announced_in_flight = 3
    set_peer_load(worker, engine_requests=7, engine_prefill_tokens=900, booked_prefill_tokens=500)
    # 7 at the engine: 2 own, 3 announced, 2 from routers outside the peer set
    assert (worker.in_flight, worker.peer_in_flight, worker.peer_prefill_tokens) == (7, 5, 400)
    clear_peer_load(worker)  # the polls stopped: the announced part stays
    assert (worker.in_flight, worker.peer_in_flight, worker.announced_in_flight) == (5, 3, 3)
