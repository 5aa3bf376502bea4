"""Every registered policy honours the contract; each policy routes as its docstring says."""

from __future__ import annotations

import math
import random

import pytest

from tests.fakes import FakeWorker, VirtualClock, fake_request, fake_worker
from tpuserve_router.engines.load_view import set_peer_load
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.policies import (
    OUTCOMES,
    NoHealthyWorker,
    Policy,
    PolicyConfigError,
    make_policy,
    registered_policy_names,
)
from tpuserve_router.policies.base import Decision
from tpuserve_router.policies.cache_aware import CacheAwarePolicy
from tpuserve_router.policies.cost import CostPolicy
from tpuserve_router.policies.precise import PrecisePolicy
from tpuserve_router.policies.prefix_routing import (
    AffinityParams,
    PrefillQueues,
    QueueParams,
    choose_by_affinity,
    leave_long_queue,
)

pytestmark = pytest.mark.unit

LONG = "You are a helpful assistant. " * 20


def test_registry_lists_every_policy_module() -> None:
    assert registered_policy_names() == [
        "cache_aware",
        "cost",
        "least_load",
        "power_of_two",
        "precise",
        "random",
        "round_robin",
    ]


@pytest.mark.parametrize("policy_name", registered_policy_names())
def test_every_policy_has_its_registered_name_and_the_protocol(policy_name: str) -> None:
    policy = make_policy(policy_name, seed=1)
    assert policy.name == policy_name
    assert isinstance(policy, Policy)


@pytest.mark.parametrize("policy_name", registered_policy_names())
def test_every_policy_skips_unhealthy_workers(policy_name: str) -> None:
    policy = make_policy(policy_name, seed=1)
    workers = [fake_worker("sick", in_flight=0, healthy=False), fake_worker("ok", in_flight=9)]
    for _ in range(20):
        decision = policy.choose(fake_request(prompt=LONG), workers)
        assert decision.worker.name == "ok"
        assert decision.outcome in OUTCOMES
        policy.on_request_done(decision, True)


@pytest.mark.parametrize("policy_name", registered_policy_names())
def test_every_policy_raises_no_healthy_worker(policy_name: str) -> None:
    policy = make_policy(policy_name, seed=1)
    with pytest.raises(NoHealthyWorker, match="model 'm'"):
        policy.choose(fake_request(prompt="hi", model="m"), [fake_worker("a", healthy=False)])
    with pytest.raises(NoHealthyWorker):
        policy.choose(fake_request(prompt="hi"), [])


@pytest.mark.parametrize("policy_name", registered_policy_names())
def test_every_policy_handles_an_empty_prompt(policy_name: str) -> None:
    policy = make_policy(policy_name, seed=1)
    workers = [fake_worker("a"), fake_worker("b")]
    decision = policy.choose(fake_request(prompt=""), workers)
    assert decision.worker in workers


@pytest.mark.parametrize("policy_name", registered_policy_names())
def test_every_policy_rejects_unknown_parameters_by_name(policy_name: str) -> None:
    with pytest.raises(PolicyConfigError, match=r"unknown parameter\(s\) bogus; allowed"):
        make_policy(policy_name, bogus=1)


@pytest.mark.parametrize("policy_name", registered_policy_names())
def test_every_policy_forgets_departed_workers(policy_name: str) -> None:
    """A worker that leaves and comes back under the same name (a restarted pod) holds
    nothing: a policy that remembered what it held would call the prompt a prefix hit."""
    policy = make_policy(policy_name, seed=1, clock=VirtualClock())
    a, b = fake_worker("a"), fake_worker("b")
    policy.on_workers_changed(["a", "b"])
    for _ in range(5):  # only a is offered, so only a can learn the prompt
        policy.on_request_done(policy.choose(fake_request(prompt=LONG), [a]), True)
    policy.on_workers_changed(["b"])
    policy.on_workers_changed(["a", "b"])
    decision = policy.choose(fake_request(prompt=LONG), [a, b])
    assert decision.outcome != "prefix_hit"
    assert not decision.predicted_match_ratio


@pytest.mark.parametrize("policy_name", registered_policy_names())
def test_every_policy_is_deterministic_for_a_seed_and_clock(policy_name: str) -> None:
    def run() -> list[str]:
        clock = VirtualClock()
        policy = make_policy(policy_name, seed=7, clock=clock)
        workers = [fake_worker(f"w{i}") for i in range(4)]
        picks = []
        for i in range(40):
            decision = policy.choose(fake_request(prompt=f"{i % 5} " + LONG), workers)
            picks.append(decision.worker.name)
            clock.advance(0.01)
        return picks

    assert run() == run()


def test_unknown_policy_names_the_allowed_values() -> None:
    with pytest.raises(PolicyConfigError, match="policy: unknown value 'nope'; allowed: cache_a"):
        make_policy("nope")


def test_bad_parameter_values_are_named() -> None:
    with pytest.raises(PolicyConfigError, match=r"cache_threshold=1.5 must be within \[0, 1\]"):
        make_policy("cache_aware", cache_threshold=1.5)
    with pytest.raises(PolicyConfigError, match="balance_abs_threshold='x' is not a valid int"):
        make_policy("cache_aware", balance_abs_threshold="x")
    with pytest.raises(PolicyConfigError, match=r"load_factor=0\.5 must be >= 1"):
        make_policy("cost", load_factor="0.5")
    with pytest.raises(PolicyConfigError, match=r"saved_prefix_weight=-1\.0 must be >= 0"):
        make_policy("precise", saved_prefix_weight="-1")
    with pytest.raises(PolicyConfigError, match="queue_margin_tokens=-1 must be >= 0"):
        make_policy("precise", queue_margin_tokens=-1)


def test_parameters_given_as_strings_are_converted() -> None:
    policy = make_policy("cache_aware", cache_threshold="0.5", balance_abs_threshold="8")
    assert isinstance(policy, CacheAwarePolicy)
    assert policy.params.cache_threshold == 0.5
    assert policy.params.balance_abs_threshold == 8


# ---------------------------------------------------------------- load-only policies


def test_least_load_picks_fewest_in_flight_first_of_equals() -> None:
    workers = [fake_worker("a", 3), fake_worker("b", 1), fake_worker("c", 1)]
    assert make_policy("least_load").choose(fake_request(), workers).worker.name == "b"


def test_round_robin_cycles_over_healthy_workers() -> None:
    policy = make_policy("round_robin")
    workers = [fake_worker("a"), fake_worker("b"), fake_worker("c")]
    assert [policy.choose(fake_request(), workers).worker.name for _ in range(4)] == [
        "a",
        "b",
        "c",
        "a",
    ]


def test_power_of_two_never_picks_the_busiest_of_three() -> None:
    policy = make_policy("power_of_two", seed=3)
    workers = [fake_worker("idle", 0), fake_worker("mid", 5), fake_worker("busy", 50)]
    picks = {policy.choose(fake_request(), workers).worker.name for _ in range(200)}
    assert picks == {"idle", "mid"}


def test_random_spreads_over_all_healthy_workers() -> None:
    policy = make_policy("random", seed=3)
    workers = [fake_worker(n) for n in "abcd"]
    picks = {policy.choose(fake_request(), workers).worker.name for _ in range(200)}
    assert picks == set("abcd")


# ---------------------------------------------------------------- cache_aware


def test_cache_aware_keeps_a_prefix_on_its_worker_under_light_load() -> None:
    policy = make_policy("cache_aware")
    workers = [fake_worker("a"), fake_worker("b"), fake_worker("c")]
    first = policy.choose(fake_request(prompt=LONG + "question one"), workers)
    assert first.outcome == "miss"
    first.worker.in_flight += 1
    for i in range(10):
        decision = policy.choose(fake_request(prompt=LONG + f"question {i}"), workers)
        assert decision.worker is first.worker
        assert decision.outcome == "prefix_hit"
        assert decision.predicted_match_ratio is not None
        assert decision.predicted_match_ratio > 0.8


def test_cache_aware_misses_go_to_the_least_loaded_then_emptiest_worker() -> None:
    policy = make_policy("cache_aware")
    workers = [fake_worker("a", 2), fake_worker("b", 1), fake_worker("c", 1)]
    policy.choose(fake_request(prompt="x" * 100), [workers[2]])  # c now holds some text
    decision = policy.choose(fake_request(prompt="completely different"), workers)
    assert decision.worker.name == "b"
    assert decision.outcome == "miss"


def test_cache_aware_spreads_under_imbalance_beyond_both_thresholds() -> None:
    policy = make_policy("cache_aware", balance_abs_threshold=4, balance_rel_threshold=1.5)
    workers = [fake_worker("a"), fake_worker("b")]
    holder = policy.choose(fake_request(prompt=LONG), workers).worker
    other = workers[1] if holder is workers[0] else workers[0]
    holder.in_flight = 4
    assert policy.choose(fake_request(prompt=LONG), workers).worker is holder  # 4 - 0 is not > 4
    holder.in_flight = 5
    decision = policy.choose(fake_request(prompt=LONG), workers)
    assert decision.worker is other
    assert decision.outcome == "balanced_away"


def test_cache_aware_relative_threshold_also_has_to_trip() -> None:
    policy = make_policy("cache_aware", balance_abs_threshold=4, balance_rel_threshold=1.5)
    workers = [fake_worker("a"), fake_worker("b")]
    holder = policy.choose(fake_request(prompt=LONG), workers).worker
    other = workers[1] if holder is workers[0] else workers[0]
    holder.in_flight, other.in_flight = 30, 21
    # 30 - 21 > 4 but 30 <= 1.5 * 21: balanced, affinity wins
    assert policy.choose(fake_request(prompt=LONG), workers).worker is holder


def test_cache_aware_ignores_unhealthy_workers_in_the_imbalance_test() -> None:
    policy = make_policy("cache_aware", balance_abs_threshold=2)
    workers: list[FakeWorker] = [fake_worker("a"), fake_worker("b", healthy=False)]
    holder = policy.choose(fake_request(prompt=LONG), workers).worker
    assert holder.name == "a"
    workers[0].in_flight = 10
    assert policy.choose(fake_request(prompt=LONG), workers).outcome == "prefix_hit"


def test_cache_aware_below_threshold_is_a_miss() -> None:
    policy = make_policy("cache_aware", cache_threshold=0.5)
    workers = [fake_worker("a"), fake_worker("b")]
    policy.choose(fake_request(prompt="shared" + "x" * 10), [workers[0]])
    workers[0].in_flight = 1
    decision = policy.choose(fake_request(prompt="shared" + "y" * 10), workers)
    assert decision.outcome == "miss"
    assert decision.worker.name == "b"


def test_cache_aware_memory_is_bounded_per_worker() -> None:
    policy = make_policy("cache_aware", max_tree_size=10_000)
    workers = [fake_worker("a"), fake_worker("b")]
    for i in range(2_000):
        policy.choose(fake_request(prompt=f"{i:08d}" + "z" * 50), workers)
    assert isinstance(policy, CacheAwarePolicy)
    tree = policy.tree("")
    assert tree.tenant_chars("a") <= 10_000
    assert tree.tenant_chars("b") <= 10_000
    nodes_after_half = tree.node_count
    for i in range(2_000, 4_000):
        policy.choose(fake_request(prompt=f"{i:08d}" + "z" * 50), workers)
    assert tree.node_count <= 1.1 * nodes_after_half


# ---------------------------------------------------------------- precise


def page_tokens(n_pages: int, start: int = 0, page: int = 4) -> list[int]:
    return list(range(start, start + n_pages * page))


def index_of(policy: Policy) -> BlockIndex:
    index = policy.block_index
    assert index is not None, f"{policy.name} keeps no block index"
    return index


def store_prompt(policy: Policy, worker: str, tokens: list[int], page: int = 4) -> None:
    """Feed the index the BlockStored events an engine would send for ``tokens``."""
    index = index_of(policy)
    parent = None
    for i in range(len(tokens) // page):
        engine_hash = hash(("engine", tuple(tokens[: (i + 1) * page])))
        index.store(worker, [engine_hash], parent, tokens[i * page : (i + 1) * page], page)
        parent = engine_hash


def test_precise_routes_to_the_worker_whose_events_hold_the_prefix() -> None:
    clock = VirtualClock()
    policy = make_policy("precise", clock=clock, page_size=4)
    workers = [fake_worker("a"), fake_worker("b"), fake_worker("c")]
    tokens = page_tokens(8)
    store_prompt(policy, "b", tokens)
    decision = policy.choose(fake_request(token_ids=[*tokens, 999]), workers)
    assert decision.worker.name == "b"
    assert decision.outcome == "prefix_hit"
    assert decision.predicted_match_ratio == pytest.approx(32 / 33)


def test_precise_prefers_the_least_loaded_of_equal_holders() -> None:
    policy = make_policy("precise", page_size=4)
    workers = [fake_worker("a", 3), fake_worker("b", 1), fake_worker("c", 0)]
    tokens = page_tokens(8)
    store_prompt(policy, "a", tokens)
    store_prompt(policy, "b", tokens)
    assert policy.choose(fake_request(token_ids=tokens), workers).worker.name == "b"


def test_precise_predictions_keep_a_burst_together_until_they_expire() -> None:
    clock = VirtualClock()
    policy = make_policy("precise", clock=clock, page_size=4, predicted_ttl_seconds=2.0)
    index_of(policy).mark_event_feed("a")
    index_of(policy).mark_event_feed("b")
    workers = [fake_worker("a"), fake_worker("b")]
    tokens = page_tokens(8)
    first = policy.choose(fake_request(token_ids=tokens), workers)
    first.worker.in_flight += 1
    for _ in range(3):
        assert policy.choose(fake_request(token_ids=tokens), workers).worker is first.worker
    clock.advance(2.5)
    decision = policy.choose(fake_request(token_ids=tokens), workers)
    assert decision.outcome == "miss"
    assert decision.worker is not first.worker


def test_precise_forgets_a_worker_after_all_blocks_cleared() -> None:
    policy = make_policy("precise", page_size=4, predicted_ttl_seconds=0)
    workers = [fake_worker("a"), fake_worker("b", 1)]
    tokens = page_tokens(8)
    store_prompt(policy, "b", tokens)
    assert policy.choose(fake_request(token_ids=tokens), workers).worker.name == "b"
    index_of(policy).clear("b")
    decision = policy.choose(fake_request(token_ids=tokens), workers)
    assert (decision.worker.name, decision.outcome) == ("a", "miss")


def book_prefill(policy: Policy, worker: FakeWorker, tokens: int) -> Decision[FakeWorker]:
    """A request of ``tokens`` uncached prompt tokens routed to ``worker``, not prefilled yet."""
    assert isinstance(policy, PrecisePolicy)
    decision = Decision(worker, "miss")
    policy.queues.book(decision, tokens)
    return decision


def test_precise_leaves_a_prefix_holder_whose_prefill_queue_outweighs_the_prefix() -> None:
    clock = VirtualClock()
    policy = make_policy("precise", clock=clock, page_size=4, queue_margin_tokens=0)
    a, b = fake_worker("a"), fake_worker("b")
    index_of(policy).mark_event_feed("b")  # b's predicted blocks expire after 2 s
    prefix = page_tokens(64)  # 256 tokens held by a
    store_prompt(policy, "a", prefix)
    request = fake_request(token_ids=[*prefix, *range(9000, 9008)])
    long_prefill = book_prefill(policy, a, 10_000)
    decision = policy.choose(request, [a, b])
    assert (decision.worker.name, decision.outcome) == ("b", "balanced_away")
    assert decision.pending_units == 264  # b holds nothing: the whole prompt is queued there
    policy.on_request_done(decision, True)
    policy.on_prefill_done(long_prefill)  # the long prefill is done: a is cheap again
    clock.advance(3.0)
    decision = policy.choose(request, [a, b])
    assert (decision.worker.name, decision.outcome) == ("a", "prefix_hit")


def test_precise_keeps_affinity_while_the_holders_queue_is_short() -> None:
    policy = make_policy("precise", page_size=4)  # default margin: 8,192 tokens
    a, b = fake_worker("a"), fake_worker("b")
    prefix = page_tokens(64)
    store_prompt(policy, "a", prefix)
    request = fake_request(token_ids=[*prefix, *range(9000, 9008)])
    book_prefill(policy, a, 8000)  # avoids 8,000 queued, gives up 256 cached: 8,000 < 2 x 256
    assert policy.choose(request, [a, b]).worker.name == "a"  # + 8,192
    book_prefill(policy, a, 1000)  # 9,000 > 8,704
    assert policy.choose(request, [a, b]).worker.name == "b"


def test_released_prefills_leave_the_waiting_line_even_when_no_queue_is_read() -> None:
    # With short queues `precise` decides without reading any (`BlockIndex.route`), so the
    # prefills waiting for their last block must also be let go when the next one is booked.
    policy = make_policy("precise", page_size=4)
    assert isinstance(policy, PrecisePolicy)
    a = fake_worker("a")
    for i in range(500):
        decision = policy.choose(fake_request(token_ids=list(range(i * 100, i * 100 + 41))), [a])
        assert decision.pending_units > 0
        policy.on_prefill_done(decision)
    assert len(policy.queues._waiting["a"]) == 1  # the last one, released, until the next
    assert policy.queued_prefill_tokens("a") == 0


def test_leaving_a_long_queue_follows_the_documented_rule_for_any_queues() -> None:
    # leave_long_queue returns early when no move could pay off; whatever the queues, it must
    # decide as the full rule does: move to the worker with the least work when the queue it
    # avoids exceeds weight x the prefix given up + margin.
    rng = random.Random(3)
    for _ in range(2000):
        n = rng.randint(1, 5)
        workers = [fake_worker(f"w{i}", in_flight=rng.randint(0, 3)) for i in range(n)]
        queues = PrefillQueues()
        for worker in workers:
            if rng.random() < 0.7:
                queues.book(Decision(worker, "miss"), rng.choice([1, 500, 5000, 20_000]))
        prompt = rng.choice([0, 100, 3000, 30_000])
        unit = rng.choice([1, 16, 64])  # the page size: held in pages, cached in tokens
        held = [rng.randint(0, prompt // unit) for _ in workers]
        cached = [h * unit for h in held]
        chosen = rng.randrange(n)
        params = QueueParams(rng.choice([0.0, 1.0, 2.0, math.inf]), rng.choice([0, 1000, 8192]))
        queued = [queues.tokens(w.name) for w in workers]
        work = [q + prompt - c for q, c in zip(queued, cached, strict=True)]
        least = min(range(n), key=lambda i: (work[i], -cached[i], workers[i].in_flight))
        avoided = queued[chosen] - queued[least]
        threshold = params.saved_prefix_weight * (cached[chosen] - cached[least])
        expected = least if avoided > threshold + params.queue_margin_tokens else chosen
        assert leave_long_queue(workers, held, unit, prompt, chosen, queues, params) == expected


def test_the_affinity_rule_decides_as_documented_for_any_loads_and_matches() -> None:
    # The rule as prefix_routing's docstring states it, written plainly, against the
    # request path's single-pass version (ties: the first listed).
    rng = random.Random(5)
    for _ in range(3000):
        n = rng.randint(1, 5)
        workers = [fake_worker(f"w{i}", in_flight=rng.choice([0, 1, 2, 40, 100])) for i in range(n)]
        units = rng.choice([0, 1, 10, 64])
        held = [rng.randint(0, units) for _ in workers]
        params = AffinityParams(
            rng.choice([0.0, 0.3, 0.9]), rng.choice([0, 1, 64]), rng.choice([1.0, 1.5, 3.0])
        )
        loads = [w.in_flight for w in workers]
        best = max(held)
        hit = units > 0 and best / units > params.cache_threshold
        least = min(range(n), key=lambda i: loads[i])
        imbalanced = (
            n > 1
            and max(loads) - min(loads) > params.balance_abs_threshold
            and max(loads) > params.balance_rel_threshold * min(loads)
        )
        if imbalanced:
            outcome = (
                "miss" if not hit else "prefix_hit" if held[least] == best else "balanced_away"
            )
            expected = (least, outcome)
        elif hit:
            holders = [i for i in range(n) if held[i] == best]
            expected = (min(holders, key=lambda i: loads[i]), "prefix_hit")
        else:
            expected = (least, "miss")
        assert choose_by_affinity(workers, held, units, params) == expected


def test_precise_leaves_a_holder_whose_queue_other_replicas_filled() -> None:
    """The prefill another replica queued on the holder counts as if this one had sent it."""
    policy = make_policy("precise", page_size=4, queue_margin_tokens=0)
    a, b = fake_worker("a"), fake_worker("b")
    prefix = page_tokens(64)  # 256 tokens held by a
    store_prompt(policy, "a", prefix)
    request = fake_request(token_ids=[*prefix, *range(9000, 9008)])
    assert policy.choose(request, [a, b]).worker.name == "a"
    set_peer_load(a, engine_requests=1, engine_prefill_tokens=10_264, booked_prefill_tokens=8)
    assert a.peer_prefill_tokens == 10_256
    decision = policy.choose(request, [a, b])
    assert (decision.worker.name, decision.outcome) == ("b", "balanced_away")


def test_the_imbalance_rule_sees_the_other_replicas_requests() -> None:
    policy = make_policy("cache_aware")
    a, b = fake_worker("a"), fake_worker("b")
    set_peer_load(a, engine_requests=100, engine_prefill_tokens=0, booked_prefill_tokens=0)
    assert [policy.choose(fake_request("x" * 50), [a, b]).worker.name for _ in range(3)] == [
        "b",
        "b",
        "b",
    ]


def test_precise_counts_a_prefill_done_once_the_engine_reports_its_last_block() -> None:
    """A request that is not streamed sends its first byte at its end; the engine's KV events
    say much earlier that its prefill is over."""
    policy = make_policy("precise", page_size=4)
    assert isinstance(policy, PrecisePolicy)
    a, b = fake_worker("a"), fake_worker("b")
    first = policy.choose(fake_request(token_ids=page_tokens(10)), [a, b])
    a.in_flight += 1
    second = policy.choose(fake_request(token_ids=page_tokens(10, start=100)), [a, b])
    assert (first.worker, second.worker) == (a, b)
    assert policy.queues.tokens("a") == 40
    store_prompt(policy, "a", page_tokens(9))  # not the last block yet
    assert policy.queues.tokens("a") == 40
    store_prompt(policy, "a", page_tokens(10))
    assert policy.queues.tokens("a") == 0
    assert first.pending_units == 0
    policy.on_request_done(first, True)  # released once only
    assert (policy.queues.tokens("a"), policy.queues.tokens("b")) == (0, 40)


def test_precise_releases_queued_prefill_exactly_once() -> None:
    policy = make_policy("precise", page_size=4)
    assert isinstance(policy, PrecisePolicy)
    a = fake_worker("a")
    decision = policy.choose(fake_request(token_ids=page_tokens(10)), [a])
    assert policy.queues.tokens("a") == 40
    policy.on_prefill_done(decision)
    policy.on_request_done(decision, True)
    assert policy.queues.tokens("a") == 0
    book_prefill(policy, fake_worker("gone"), 100)
    policy.on_workers_changed(["a"])
    assert policy.queues.tokens("gone") == 0


# ---------------------------------------------------------------- cost


def test_cost_follows_the_cache_while_the_queue_is_short() -> None:
    policy = make_policy("cost", page_size=4)
    workers = [fake_worker("a"), fake_worker("b")]
    tokens = page_tokens(64)
    store_prompt(policy, "b", tokens)
    decision = policy.choose(fake_request(token_ids=[*tokens, 1, 2]), workers)
    assert (decision.worker.name, decision.outcome) == ("b", "prefix_hit")
    assert decision.pending_units == 2  # only the uncached tail is queued prefill


def test_cost_replicates_a_hot_prefix_instead_of_overloading_its_holder() -> None:
    policy = make_policy("cost", page_size=4)
    workers = [fake_worker("a"), fake_worker("b"), fake_worker("c"), fake_worker("d")]
    prefix = page_tokens(64)
    store_prompt(policy, "a", prefix)
    chosen: list[str] = []
    for i in range(40):
        decision = policy.choose(fake_request(token_ids=prefix + [10_000 + i] * 8), workers)
        decision.worker.in_flight += 1
        chosen.append(decision.worker.name)
    loads = [w.in_flight for w in workers]
    assert max(loads) <= 1.25 * (sum(loads) / len(loads)) + 1
    assert len(set(chosen)) >= 2  # the prefix was replicated
    assert chosen[0] == "a"


def test_cost_releases_queued_prefill_exactly_once() -> None:
    policy = make_policy("cost", page_size=4)
    workers = [fake_worker("a")]
    assert isinstance(policy, CostPolicy)
    decision = policy.choose(fake_request(token_ids=page_tokens(10)), workers)
    assert policy.queued_prefill_tokens("a") == 40
    policy.on_prefill_done(decision)
    policy.on_request_done(decision, True)
    assert policy.queued_prefill_tokens("a") == 0


def test_cost_bounded_load_keeps_one_prefix_from_taking_everything() -> None:
    policy = make_policy("cost", page_size=4, load_factor=1.25)
    workers = [fake_worker(n) for n in "abcd"]
    prefix = page_tokens(256)
    for _ in range(100):
        decision = policy.choose(fake_request(token_ids=prefix), workers)
        decision.worker.in_flight += 1
        policy.on_prefill_done(decision)
    loads = [w.in_flight for w in workers]
    assert max(loads) / (sum(loads) / 4) <= 1.3


@pytest.mark.parametrize("policy_name", ["cache_aware", "precise", "cost"])
def test_prefix_policies_forget_a_reset_worker(policy_name: str) -> None:
    policy = make_policy(policy_name, page_size=4) if policy_name != "cache_aware" else None
    policy = policy or make_policy(policy_name)
    workers = [fake_worker("a"), fake_worker("b")]
    first = policy.choose(fake_request(prompt=LONG), workers)
    first.worker.in_flight += 1
    policy.on_prefill_done(first)
    assert policy.choose(fake_request(prompt=LONG), workers).outcome == "prefix_hit"
    policy.on_worker_reset(first.worker.name)
    assert policy.choose(fake_request(prompt=LONG), workers).outcome == "miss"


@pytest.mark.parametrize("policy_name", ["precise", "cost"])
def test_a_choice_set_aside_leaves_no_prediction_and_no_queued_prefill(policy_name: str) -> None:
    """Conditional PD may set a colocated choice aside for a pair: that worker will not get
    the prompt, so the next request of the prefix must not see it as cached there."""
    policy = make_policy(policy_name, page_size=4)
    workers = [fake_worker("a"), fake_worker("b")]
    request = fake_request(token_ids=page_tokens(10))
    decision = policy.choose(request, workers)
    index = policy.block_index
    assert index is not None
    keys = index.keys(page_tokens(10))
    assert index.match(keys, [decision.worker.name]) == [10]  # predicted on choosing
    policy.on_set_aside(decision)
    assert index.match(keys, [decision.worker.name]) == [0]
    assert policy.queued_prefill_tokens(decision.worker.name) == 0
