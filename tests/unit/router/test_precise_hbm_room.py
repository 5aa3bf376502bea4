"""`precise` in a fleet with a host tier checks HBM room (step 5 of its docstring): a prefix's
holder keeps the request while its HBM has room for the part it does not hold there; without
room the request goes to the worker with room whose cache saves the most. Fleets without a host
tier route as before."""

from __future__ import annotations

import pytest

from sglang_tpu.kv_events import MEDIUM_GPU, MEDIUM_HOST, block_hashes
from tests.fakes import FakeWorker, fake_request, fake_worker
from tpuserve_router.policies import make_policy
from tpuserve_router.policies.base import Decision
from tpuserve_router.policies.precise import PrecisePolicy, room_move

pytestmark = pytest.mark.unit

PAGE = 4
POOL_BLOCKS = 16  # each worker's HBM pool: 64 tokens
PROMPT = list(range(1000, 1000 + 8 * PAGE))  # 8 pages, half the pool


def tiered_policy() -> tuple[PrecisePolicy, list[FakeWorker]]:
    policy = make_policy("precise", page_size=PAGE, host_hit_weight=0.5)
    assert isinstance(policy, PrecisePolicy)
    workers = [fake_worker("a"), fake_worker("b"), fake_worker("c")]
    for w in workers:
        policy.block_index.set_worker_limit(w.name, POOL_BLOCKS)
    return policy, workers


def store(policy: PrecisePolicy, worker: str, tokens: list[int], medium: str) -> None:
    policy.block_index.store(worker, block_hashes(tokens, PAGE), None, tokens, PAGE, 0, medium)


def demote(policy: PrecisePolicy, worker: str, tokens: list[int]) -> None:
    """Write-through then HBM eviction: the blocks stay only in the worker's host memory."""
    store(policy, worker, tokens, MEDIUM_GPU)
    store(policy, worker, tokens, MEDIUM_HOST)
    policy.block_index.remove(worker, block_hashes(tokens, PAGE), 0, MEDIUM_GPU)


def peer_request(
    policy: PrecisePolicy, worker: FakeWorker, tokens: list[int]
) -> Decision[FakeWorker]:
    """Another router replica announces a request of ``tokens`` on ``worker``."""
    decision: Decision[FakeWorker] = Decision(worker, "load_only")
    policy.apply_peer_route(decision, None, policy.block_index.keys(tokens))
    return decision


def test_a_host_held_prefix_goes_to_its_holder_while_its_hbm_has_room() -> None:
    policy, workers = tiered_policy()
    demote(policy, "b", PROMPT)
    decision = policy.choose(fake_request(token_ids=[*PROMPT, 7]), workers)
    assert (decision.worker.name, decision.outcome) == ("b", "prefix_hit")
    assert decision.predicted_host_ratio == pytest.approx(32 / 33)
    assert policy.room.tokens("b") == 33  # its whole prompt is held in HBM while it runs


def test_a_holder_without_hbm_room_gives_the_request_to_a_worker_with_room() -> None:
    policy, workers = tiered_policy()
    b = workers[1]
    demote(policy, "b", PROMPT)
    filler = peer_request(policy, b, list(range(5000, 5000 + 10 * PAGE)))  # 40 of b's 64
    assert policy.room.tokens("b") == 40
    request = fake_request(token_ids=[*PROMPT, 7])  # needs 33 tokens of room on b
    away = policy.choose(request, workers)
    assert (away.worker.name, away.outcome) == ("a", "balanced_away")  # a and c tie: first
    index = policy.block_index
    keys = index.keys(PROMPT)
    assert index.device_match(keys, ["a", "b"]) == [8, 0]  # predicted where it went only
    policy.on_request_done(away, True)
    policy.on_request_done(filler, True)  # the peer's request ended: b has room again
    assert (policy.room.tokens("a"), policy.room.tokens("b")) == (0, 0)
    other = list(range(3000, 3000 + 8 * PAGE))  # another prefix b holds in host memory
    demote(policy, "b", other)
    back = policy.choose(fake_request(token_ids=[*other, 7]), workers)
    assert (back.worker.name, back.outcome) == ("b", "prefix_hit")


@pytest.mark.parametrize(("in_flight_pages", "goes_to"), [(11, "b"), (12, "a")])
def test_a_holder_needs_room_only_for_what_it_does_not_hold_in_hbm(
    in_flight_pages: int, goes_to: str
) -> None:
    """b holds the prompt's first 4 pages in HBM and all 8 in host memory: it needs room for
    33 - 16 = 17 tokens; 11 pages in flight leave it 20, 12 leave it 16."""
    policy, workers = tiered_policy()
    b = workers[1]
    demote(policy, "b", PROMPT)
    store(policy, "b", PROMPT[: 4 * PAGE], MEDIUM_GPU)  # loaded back, the first half
    peer_request(policy, b, list(range(5000, 5000 + in_flight_pages * PAGE)))
    decision = policy.choose(fake_request(token_ids=[*PROMPT, 7]), workers)
    assert decision.worker.name == goes_to


def test_a_prompt_held_in_hbm_stays_with_its_holder_however_full() -> None:
    """Only a request that would load back is moved for room: one whose holder has it in
    HBM already shares those blocks there."""
    policy, workers = tiered_policy()
    b = workers[1]
    store(policy, "b", PROMPT, MEDIUM_GPU)
    demote(policy, "a", list(range(9000, 9000 + 4 * PAGE)))  # the fleet has a host tier
    peer_request(policy, b, list(range(5000, 5000 + 16 * PAGE)))  # b's pool, all of it
    decision = policy.choose(fake_request(token_ids=[*PROMPT, *range(7, 7 + 40)]), workers)
    assert (decision.worker.name, decision.outcome) == ("b", "prefix_hit")


def test_a_fleet_without_a_host_tier_routes_as_before() -> None:
    policy, workers = tiered_policy()
    _, b, _ = workers
    store(policy, "b", PROMPT, MEDIUM_GPU)
    peer_request(policy, b, list(range(5000, 5000 + 16 * PAGE)))  # b's pool, all of it
    assert policy.block_index.host_only_blocks == 0
    decision = policy.choose(fake_request(token_ids=[*PROMPT, *range(7, 7 + 40)]), workers)
    assert (decision.worker.name, decision.outcome) == ("b", "prefix_hit")


def test_set_aside_and_departed_workers_give_their_room_back() -> None:
    policy, workers = tiered_policy()
    demote(policy, "b", PROMPT)
    decision = policy.choose(fake_request(token_ids=PROMPT), workers)
    assert policy.room.tokens("b") == 32
    policy.on_set_aside(decision)
    assert policy.room.tokens("b") == 0
    policy.choose(fake_request(token_ids=PROMPT), workers)
    policy.on_workers_changed(["a", "c"])
    assert policy.room.tokens("b") == 0


def test_room_move_follows_the_documented_rule() -> None:
    """Three workers: 0 holds 8 blocks of 4 tokens in HBM, 1 the same 8 in host memory, 2
    nothing; the prompt is 33 tokens. A worker needs room for the prompt less its HBM part."""
    depths, device, loads = [8, 8, 0], [8, 0, 0], [5, 2, 1]

    def move(chosen: int, room: list[float], weight: float = 0.5) -> int:
        return room_move(depths, device, PAGE, 33, chosen, room, loads, weight)

    assert move(0, [1, 0, 0]) == 0  # it needs 1 token of room and has it
    assert move(1, [0, 33, 0]) == 1
    assert move(1, [1, 32, 33]) == 0  # no room on the host holder: the HBM holder (needs 1)
    assert move(0, [0, 33, 33]) == 1  # the HBM holder is full: the host holder saves more
    assert move(0, [0, 33, 33], weight=0.0) == 2  # host blocks worth nothing: least loaded
    assert move(0, [0, 32, 32]) == 0  # room nowhere: the request waits where it was sent


def test_room_move_does_not_give_a_busy_worker_its_host_blocks_worth() -> None:
    """As in the tiered choice, host blocks count only on a worker within the load bound
    (`prefix_routing.bounded`): the host holder with 9 of 12 in flight is over it (with the
    request 10 > ceil(1.25 x 13 / 3) = 6), so the full HBM holder's request goes to the least
    loaded worker with room."""
    depths, device = [8, 8, 0], [8, 0, 0]
    assert room_move(depths, device, PAGE, 33, 0, [0, 33, 33], [2, 9, 1], 0.5) == 2
    assert room_move(depths, device, PAGE, 33, 0, [0, 33, 33], [2, 2, 1], 0.5) == 1
    assert room_move(depths, device, PAGE, 33, 0, [0, 33, 33], [2, 9, 1], 0.5, 1e9) == 1
