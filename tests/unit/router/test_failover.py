"""A lost worker's conversations go to one successor each, whatever the replica's load view
(`tpuserve_router.policies.failover`, `PrecisePolicy._successor`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fakes import FakeWorker, VirtualClock, fake_request, fake_worker
from tpuserve_router.policies import PolicyConfigError, make_policy
from tpuserve_router.policies.failover import Successors, name_hash, rendezvous
from tpuserve_router.policies.precise import PrecisePolicy

pytestmark = pytest.mark.unit

PAGE = 4
NAMES = ["http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"]


def conversation(i: int, pages: int = 8) -> list[int]:
    return [i * 1000 + t for t in range(pages * PAGE)]


def store(policy: PrecisePolicy, worker: str, tokens: list[int]) -> None:
    """The BlockStored events an engine sends for ``tokens``."""
    parent = None
    for p in range(len(tokens) // PAGE):
        engine_hash = hash(("engine", worker, tuple(tokens[: (p + 1) * PAGE])))
        policy.block_index.store(
            worker, [engine_hash], parent, tokens[p * PAGE : (p + 1) * PAGE], PAGE
        )
        parent = engine_hash


def replica(clock: VirtualClock) -> PrecisePolicy:
    policy = make_policy("precise", clock=clock, page_size=PAGE)
    assert isinstance(policy, PrecisePolicy)
    return policy


def fleet(policy: PrecisePolicy, conversations: int) -> None:
    """Conversation ``i`` held by worker ``i % 3``, as every replica's index has it."""
    for i in range(conversations):
        store(policy, NAMES[i % 3], conversation(i))


def next_turn(i: int) -> list[int]:
    return [*conversation(i), *range(900_000 + i * 10, 900_000 + i * 10 + 3 * PAGE)]


def test_the_successor_is_the_same_whatever_the_load_view() -> None:
    """Two replicas whose load views differ (each sees its own requests): the miss rule would
    send each conversation to each one's least loaded worker; the successor rule sends it to
    the same worker on both, and the lost worker's conversations spread over the live ones."""
    clock = VirtualClock()
    replicas = [replica(clock), replica(clock)]
    for policy in replicas:
        fleet(policy, 30)
        policy.remember_lost(NAMES[0])  # its engine died: the stream is dropped
        policy.block_index.clear(NAMES[0])
    views = [
        [fake_worker(NAMES[0], healthy=False), fake_worker(NAMES[1], 9), fake_worker(NAMES[2])],
        [fake_worker(NAMES[0], healthy=False), fake_worker(NAMES[1]), fake_worker(NAMES[2], 9)],
    ]
    lost = [i for i in range(30) if i % 3 == 0]
    chosen = [
        [policy.choose(fake_request(token_ids=next_turn(i)), view).worker.name for i in lost]
        for policy, view in zip(replicas, views, strict=True)
    ]
    assert chosen[0] == chosen[1]
    assert set(chosen[0]) == {NAMES[1], NAMES[2]}  # spread, each its own
    index = replicas[0].block_index
    expected = [NAMES[1:][rendezvous(index.keys(next_turn(i))[7], NAMES[1:])] for i in lost]
    assert chosen[0] == expected  # the deepest lost block's key decides
    assert all(p.successors.chosen == len(lost) for p in replicas)


def test_a_conversation_a_live_worker_holds_routes_as_before() -> None:
    clock = VirtualClock()
    policy = replica(clock)
    fleet(policy, 6)
    policy.remember_lost(NAMES[0])
    policy.block_index.clear(NAMES[0])
    workers = [fake_worker(NAMES[1]), fake_worker(NAMES[2])]
    decision = policy.choose(fake_request(token_ids=next_turn(1)), workers)
    assert decision.worker.name == NAMES[1]  # its holder: a prefix hit
    assert decision.outcome == "prefix_hit"
    assert policy.successors.chosen == 0


def test_a_draining_workers_conversations_go_to_their_successor_while_it_is_indexed() -> None:
    """Draining (or ejected by its probes): out of the candidates, its blocks still indexed."""
    clock = VirtualClock()
    policies = [replica(clock), replica(clock)]
    for policy in policies:
        fleet(policy, 12)
    draining = [
        fake_worker(NAMES[0], healthy=False),
        fake_worker(NAMES[1], 5),
        fake_worker(NAMES[2]),
    ]
    other_view = [
        fake_worker(NAMES[0], healthy=False),
        fake_worker(NAMES[1]),
        fake_worker(NAMES[2], 5),
    ]
    a = [policies[0].choose(fake_request(token_ids=next_turn(i)), draining).worker.name
         for i in (0, 3, 6, 9)]  # fmt: skip
    b = [policies[1].choose(fake_request(token_ids=next_turn(i)), other_view).worker.name
         for i in (0, 3, 6, 9)]  # fmt: skip
    assert a == b
    assert NAMES[0] not in a


def test_a_successor_is_forgotten_after_the_ttl_and_the_memory_is_bounded() -> None:
    clock = VirtualClock()
    successors = Successors(clock, ttl_seconds=60, max_keys=100)
    successors.remember(range(80))
    clock.advance(30)
    successors.remember([*range(80, 150), None])
    assert len(successors) == 100  # the oldest loss's first keys went first
    assert successors.depth(range(50, 60)) == 10
    assert successors.depth(range(10)) == 0
    clock.advance(31)
    successors.expire()
    assert len(successors) == 70  # the first loss's keys are past their time
    clock.advance(30)
    successors.expire()
    assert not successors.active


def test_removing_a_worker_moves_only_the_keys_it_was_successor_of() -> None:
    """Rendezvous hashing: the fleet losing another worker moves no other conversation."""
    keys = list(range(1, 2001))
    before = [rendezvous(k, NAMES) for k in keys]
    after = [rendezvous(k, [NAMES[0], NAMES[2]]) for k in keys]
    for b, a in zip(before, after, strict=True):
        if b != 1:
            assert NAMES[[0, 2][a]] == NAMES[b]
    shares = [before.count(i) / len(keys) for i in range(3)]
    assert all(0.28 < s < 0.39 for s in shares), shares


def test_name_hashes_are_the_same_in_every_process() -> None:
    """Not Python's salted ``hash(str)``: every replica computes the same successor."""
    code = (
        "from tpuserve_router.policies.failover import name_hash, rendezvous; "
        f"print(name_hash({NAMES[0]!r}), [rendezvous(k, {NAMES!r}) for k in range(50)])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }  # fmt: skip
    assert len(outputs) == 1
    assert outputs == {f"{name_hash(NAMES[0])} {[rendezvous(k, NAMES) for k in range(50)]}\n"}


def test_workers_that_leave_are_remembered() -> None:
    clock = VirtualClock()
    policy = replica(clock)
    fleet(policy, 6)
    policy.on_workers_changed(NAMES[1:])
    assert policy.successors.active
    workers: list[FakeWorker] = [fake_worker(NAMES[1]), fake_worker(NAMES[2])]
    decision = policy.choose(fake_request(token_ids=next_turn(3)), workers)
    key = policy.block_index.keys(next_turn(3))[7]
    assert decision.worker.name == NAMES[1:][rendezvous(key, NAMES[1:])]
    assert policy.successors.chosen == 1


def test_a_restarted_worker_does_not_take_back_the_conversations_it_lost() -> None:
    """Its return changes the live set: rendezvous over it could send a conversation whose
    successor no longer holds it (evicted) back to it; the worker that lost it is left out."""
    clock = VirtualClock()
    policy = replica(clock)
    fleet(policy, 30)
    policy.remember_lost(NAMES[0])
    policy.block_index.clear(NAMES[0])
    back = [fake_worker(name) for name in NAMES]  # the lost worker restarted, healthy again
    chosen = {policy.choose(fake_request(token_ids=next_turn(i)), back).worker.name
              for i in range(0, 30, 3)}  # fmt: skip
    assert NAMES[0] not in chosen
    assert chosen == {NAMES[1], NAMES[2]}


def test_a_lost_workers_keys_are_held_to_failover_max_keys() -> None:
    """The policy's bound (``failover_max_keys``) holds whatever the lost worker held, and
    the keys remembered are exported as an index size (``successor_keys``)."""
    policy = make_policy("precise", clock=VirtualClock(), page_size=PAGE, failover_max_keys=20)
    assert isinstance(policy, PrecisePolicy)
    for i in range(10):
        store(policy, NAMES[0], conversation(i))  # 80 blocks
    policy.remember_lost(NAMES[0])
    assert policy.index_sizes()["successor_keys"] == 20
    with pytest.raises(PolicyConfigError, match="failover_max_keys=0 must be >= 1"):
        make_policy("precise", failover_max_keys=0)
