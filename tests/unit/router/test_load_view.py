"""The shared load view: a replica's own load plus the others' from the engine's /v1/loads."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes import FakeWorker, VirtualClock, fake_worker
from tpuserve_router.engines.engine_loads import LoadAnswerError, LoadPoller, parse_engine_load
from tpuserve_router.engines.load_view import (
    QUIET_POLL_FACTOR,
    STALE_POLLS,
    announce_peer_request,
    clear_peer_load,
    next_poll_gap,
    set_peer_load,
)
from tpuserve_router.engines.workers import WorkerRegistry, WorkerSpec

pytestmark = pytest.mark.unit


def loads(*ranks: dict[str, Any]) -> dict[str, Any]:
    """A `/v1/loads` answer with these DP-rank snapshots (other fields as SGLang sends)."""
    return {"timestamp": "2026-12-01T00:00:00+00:00", "version": "0.5.23", "loads": list(ranks)}


def rank(running: int, waiting: int, uncached: int) -> dict[str, Any]:
    return {
        "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": uncached, "num_used_tokens": 7, "token_usage": 0.1,
    }  # fmt: skip


def test_the_engine_load_sums_every_dp_rank() -> None:
    load = parse_engine_load(loads(rank(3, 2, 100), rank(1, 0, 20)))
    assert (load.requests, load.waiting_uncached_tokens) == (6, 120)


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ([], "'loads' must be a non-empty list"),
        ({"loads": []}, "'loads' must be a non-empty list"),
        ({"loads": [7]}, r"loads\[0\] must be an object"),
        (loads(rank(1, 0, 0), {**rank(1, 0, 0), "num_waiting_reqs": -1}),
         r"loads\[1\].num_waiting_reqs is -1; allowed: an integer >= 0"),
        (loads({**rank(1, 0, 0), "num_running_reqs": "3"}), r"num_running_reqs is '3'"),
        (loads({**rank(1, 0, 0), "num_running_reqs": True}), r"num_running_reqs is True"),
        (loads({"num_running_reqs": 1, "num_waiting_reqs": 0}),
         r"num_waiting_uncached_tokens is None"),
    ],
)  # fmt: skip
def test_an_unusable_load_answer_names_the_field(document: object, problem: str) -> None:
    with pytest.raises(LoadAnswerError, match=problem):
        parse_engine_load(document)


def test_a_poll_adds_what_the_others_sent_to_the_replicas_own_count() -> None:
    worker = fake_worker("a", in_flight=2)  # this replica sent 2
    set_peer_load(worker, engine_requests=7, engine_prefill_tokens=900, booked_prefill_tokens=300)
    assert (worker.in_flight, worker.peer_in_flight, worker.peer_prefill_tokens) == (7, 5, 600)
    worker.in_flight += 1  # the replica's own requests move its count at once
    worker.in_flight -= 2
    set_peer_load(worker, engine_requests=4, engine_prefill_tokens=0, booked_prefill_tokens=50)
    # own is now 1; the engine holds 4, so the others hold 3; own prefill above the engine's
    # (counted a moment apart) is no negative peer load
    assert (worker.in_flight, worker.peer_in_flight, worker.peer_prefill_tokens) == (4, 3, 0)


def test_an_engine_that_counts_less_than_the_replica_sent_gives_no_peer_load() -> None:
    worker = fake_worker("a", in_flight=5)
    assert not set_peer_load(
        worker, engine_requests=3, engine_prefill_tokens=0, booked_prefill_tokens=0
    )
    assert (worker.in_flight, worker.peer_in_flight) == (5, 0)


@pytest.mark.parametrize(
    ("requests", "prefill", "announced", "news"),
    [
        (2, 100, 0, False),  # the engine holds what this replica sent and booked
        (3, 100, 0, True),  # a request of someone else's
        (2, 101, 0, True),  # prefill this replica did not book
        (3, 100, 1, False),  # the other request is a peer's, announced
    ],
)
def test_a_poll_is_news_only_when_the_engine_holds_more_than_the_replica_knows(
    requests: int, prefill: int, announced: int, news: bool
) -> None:
    worker = fake_worker("a", in_flight=2)
    for _ in range(announced):
        announce_peer_request(worker, +1)
    assert set_peer_load(worker, requests, prefill, booked_prefill_tokens=100) is news


def test_quiet_polls_wait_longer_up_to_a_bound_and_news_brings_the_interval_back() -> None:
    gaps = [0.1]
    for _ in range(6):
        gaps.append(next_poll_gap(gaps[-1], 0.1, news=False))
    assert gaps == pytest.approx([0.1, 0.2, 0.4, 0.8, 0.8, 0.8, 0.8])
    assert max(gaps) == pytest.approx(QUIET_POLL_FACTOR * 0.1)
    assert next_poll_gap(0.8, 0.1, news=True) == 0.1


def test_clearing_the_peer_load_leaves_the_replicas_own_count() -> None:
    worker = fake_worker("a", in_flight=2)
    set_peer_load(worker, engine_requests=9, engine_prefill_tokens=500, booked_prefill_tokens=0)
    clear_peer_load(worker)
    assert (worker.in_flight, worker.peer_in_flight, worker.peer_prefill_tokens) == (2, 0, 0)


def test_estimates_not_refreshed_for_stale_polls_intervals_are_dropped() -> None:
    clock = VirtualClock()
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec("http://127.0.0.1:1"))
    poller = LoadPoller(
        registry, lambda _: 0, interval_seconds=0.1, timeout_seconds=1.0, clock=clock
    )
    set_peer_load(worker, engine_requests=6, engine_prefill_tokens=40, booked_prefill_tokens=0)
    poller.polled_at[worker.name] = clock()
    clock.advance(STALE_POLLS * 0.1 - 0.01)
    poller.expire()
    assert worker.peer_in_flight == 6
    clock.advance(0.02)
    poller.expire()
    assert (worker.in_flight, worker.peer_in_flight, worker.peer_prefill_tokens) == (0, 0, 0)
    registry.remove(worker.name)
    assert worker.name not in poller.polled_at


def test_a_quiet_pollers_longer_wait_keeps_no_estimate_longer() -> None:
    """An engine that stopped answering after it showed others' load loses that estimate
    after `STALE_POLLS` intervals, however long the poller's wait has grown."""
    clock = VirtualClock()
    registry = WorkerRegistry()
    worker = registry.add(WorkerSpec("http://127.0.0.1:1"))
    poller = LoadPoller(
        registry, lambda _: 0, interval_seconds=0.1, timeout_seconds=1.0, clock=clock
    )
    poller.gap = QUIET_POLL_FACTOR * 0.1
    set_peer_load(worker, engine_requests=6, engine_prefill_tokens=40, booked_prefill_tokens=0)
    poller.polled_at[worker.name] = clock()
    clock.advance(STALE_POLLS * 0.1 + 0.01)
    poller.expire()
    assert (worker.in_flight, worker.peer_in_flight, worker.peer_prefill_tokens) == (0, 0, 0)


def test_the_registry_worker_and_the_fakes_keep_the_view_fields() -> None:
    worker = WorkerRegistry().add(WorkerSpec("http://127.0.0.1:1"))
    worker.in_flight = 3
    set_peer_load(worker, engine_requests=5, engine_prefill_tokens=0, booked_prefill_tokens=0)
    assert (worker.own_in_flight, worker.describe()["peer_in_flight"]) == (3, 2)
    assert worker.describe()["in_flight"] == 3
    assert FakeWorker("f").peer_prefill_tokens == 0
