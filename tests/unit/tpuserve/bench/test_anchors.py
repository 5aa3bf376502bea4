"""Anchors route as their published code does, on hand-worked examples (router.md §3-§4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from sglang_tpu.perf_model import StepTimer, get_profile
from sglang_tpu.topology import lookup
from tpuserve.bench.anchors import ANCHORS, AnchorContext, make_bench_policy, policy_names
from tpuserve.bench.anchors.base import AnchorUnavailable
from tpuserve.bench.anchors.dynamo_cost import DynamoCost
from tpuserve.bench.anchors.gie_approx import GieApprox
from tpuserve.bench.anchors.oracle import Oracle
from tpuserve.bench.anchors.sglang_cache_aware import (
    CLI_DEFAULTS,
    STRUCT_DEFAULTS,
    SglangCacheAware,
    SglangDefaults,
)
from tpuserve.bench.anchors.sglang_tree import EMPTY, SglangTree
from tpuserve_router.policies.base import NoHealthyWorker, RouteRequest

pytestmark = pytest.mark.unit


@dataclass
class W:
    name: str
    in_flight: int = 0
    healthy: bool = True
    peer_prefill_tokens: int = 0


@dataclass
class FakeEngine:
    num_running: int = 0
    num_waiting: int = 0
    token_usage: float = 0.0
    cached: int = 0

    def match_prefix_length(self, token_ids: Sequence[int]) -> int:
        return min(self.cached, len(token_ids))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ctx(clock: Clock | None = None, engines: dict[str, FakeEngine] | None = None) -> AnchorContext:
    timer = StepTimer(lookup("v6e", "1x1"), get_profile("llama-3.1-8b"))
    return AnchorContext(
        clock=clock or Clock(), seed=0, timer=timer, page_size=16, engines=engines,
        cache_tokens=100_000,
    )  # fmt: skip


# ------------------------------------------------------------------ the sglang tree


def test_tree_cold_start_and_exact_matches_as_in_tree_rs() -> None:
    tree = SglangTree()
    assert tree.prefix_match("hello", 0) == (0, EMPTY)
    tree.insert("hello", "tenant1", 1)
    tree.insert("apple", "tenant2", 2)
    tree.insert("banana", "tenant3", 3)
    assert tree.prefix_match("hello", 4) == (5, "tenant1")
    assert tree.prefix_match("apple", 5) == (5, "tenant2")
    assert tree.prefix_match("banana", 6) == (6, "tenant3")


def test_tree_partial_edge_match_stops_on_that_node_and_returns_its_first_tenant() -> None:
    tree = SglangTree()
    tree.insert("apple", "a", 1)
    tree.insert("apple", "b", 2)
    assert tree.prefix_match("applesauce", 3) == (5, "a")  # first key of the deepest node
    assert tree.prefix_match("apricot", 4) == (2, "a")  # partial edge "ap|ple"


def test_tree_smallest_tenant_and_char_counts_as_in_tree_rs() -> None:
    tree = SglangTree()
    assert tree.get_smallest_tenant() == EMPTY
    tree.insert("ap", "tenant1", 1)
    tree.insert("icot", "tenant1", 1)
    tree.insert("cat", "tenant2", 1)
    assert tree.get_smallest_tenant() == "tenant2"
    tree.insert("do", "tenant3", 1)
    tree.insert("hi", "tenant4", 1)
    tree.insert("hello", "tenant4", 1)
    assert tree.get_smallest_tenant() == "tenant3"
    assert tree.tenant_char_count == {"tenant1": 6, "tenant2": 3, "tenant3": 2, "tenant4": 6}


def test_tree_eviction_trims_each_tenant_oldest_leaves_first() -> None:
    tree = SglangTree()
    tree.insert("aaaa", "t", 1)
    tree.insert("bbbb", "t", 2)
    tree.insert("cccc", "t", 3)
    tree.insert("zz", "u", 1)
    tree.evict_tenant_by_size(8)
    assert tree.tenant_char_count == {"t": 8, "u": 2}
    assert tree.prefix_match("aaaa", 9) == (0, "t")  # evicted (root still lists t)
    assert tree.prefix_match("cccc", 9) == (4, "t")


def test_tree_remove_tenant_forgets_its_text() -> None:
    tree = SglangTree()
    tree.insert("shared", "a", 1)
    tree.insert("shared", "b", 2)
    tree.remove_tenant("a")
    assert tree.prefix_match("shared", 3) == (6, "b")
    assert "a" not in tree.tenant_char_count


# ------------------------------------------------------------------ sglang cache_aware v1 / v2


def _sglang(miss_path: str, defaults: SglangDefaults = CLI_DEFAULTS) -> SglangCacheAware:
    return SglangCacheAware("x", miss_path, defaults, Clock())


def test_hit_above_threshold_follows_affinity() -> None:
    policy = _sglang("least_load")
    workers = [W("a"), W("b")]
    first = policy.choose(RouteRequest(text="system prompt " * 10 + "q1"), workers)
    first.worker.in_flight += 10
    again = policy.choose(RouteRequest(text="system prompt " * 10 + "q2"), workers)
    assert again.worker is first.worker
    assert again.outcome == "prefix_hit"


def test_v1_sends_misses_to_the_smallest_tree_even_when_it_is_overloaded() -> None:
    """The death spiral of sglang#14305: v1 sends every miss to the worker with least text."""
    for miss_path, expected in (("smallest_tree", "a"), ("least_load", "b")):
        policy = _sglang(miss_path)
        a, b = W("a", in_flight=60), W("b", in_flight=0)
        policy.choose(RouteRequest(text="x" * 10), [a, b])  # registers both tenants
        policy.tree.insert("y" * 500, "b", 0)  # b holds more text
        decision = policy.choose(RouteRequest(text="unrelated prompt"), [a, b])
        assert decision.worker.name == expected, miss_path
        assert decision.outcome == "miss"


def test_imbalance_uses_all_workers_and_goes_to_the_least_loaded_healthy_one() -> None:
    policy = _sglang("least_load")
    dead = W("dead", in_flight=0, healthy=False)
    busy = W("busy", in_flight=70)
    idle = W("idle", in_flight=30)
    policy.tree.insert("prompt text", "busy", 0)
    # CLI set: 70 - 0 > 64 and 70 > 1.5 x 0 (the dead worker counts) -> imbalanced
    decision = policy.choose(RouteRequest(text="prompt text"), [dead, busy, idle])
    assert decision.worker.name == "idle"
    assert decision.outcome == "balanced_away"
    # struct set is stricter: 32 / 1.1 -> imbalanced at 40 vs 5 without the dead worker
    strict = _sglang("least_load", STRUCT_DEFAULTS)
    strict.tree.insert("prompt text", "busy", 0)
    busy.in_flight, idle.in_flight = 40, 5
    assert strict.choose(RouteRequest(text="prompt text"), [busy, idle]).worker.name == "idle"
    relaxed = _sglang("least_load", CLI_DEFAULTS)
    relaxed.choose(RouteRequest(text="z"), [busy, idle])
    relaxed.tree.insert("prompt text", "busy", 0)
    assert relaxed.choose(RouteRequest(text="prompt text"), [busy, idle]).worker.name == "busy"


def test_struct_defaults_evict_every_30_seconds_to_10000_chars() -> None:
    clock = Clock()
    policy = SglangCacheAware("x", "least_load", STRUCT_DEFAULTS, clock)
    workers = [W("a")]
    policy.choose(RouteRequest(text="q" * 30_000), workers)
    assert policy.tree.tenant_char_count["a"] == 30_000
    clock.now += 31
    policy.choose(RouteRequest(text="r" * 10), workers)
    assert policy.tree.tenant_char_count["a"] <= 10_000 + 10


# ------------------------------------------------------------------ llm-d, Dynamo, Preble, oracle


def test_gie_weights_prefix_3_queue_2_kv_2() -> None:
    engines = {"a": FakeEngine(num_waiting=0, token_usage=0.5),
               "b": FakeEngine(num_waiting=4, token_usage=0.0)}  # fmt: skip
    policy = GieApprox(engines, seed=0)
    text = "x" * 640  # 10 blocks of 64 characters
    # a: queue 1 x 2 + kv 0.5 x 2 + prefix 0 = 3; b: 0 + 2 + 0 = 2 -> a
    assert policy.choose(RouteRequest(text=text), [W("a"), W("b")]).worker.name == "a"
    # now a holds the prompt: 2 + 1 + 3 = 6 beats b's 2
    assert policy.choose(RouteRequest(text=text), [W("a"), W("b")]).worker.name == "a"
    engines["a"].num_waiting = 10
    # a: queue 0 + kv 1 + prefix 3 = 4; b: queue 1 x 2 + kv 2 + prefix 0 = 4: a random tie
    # (b then holds the prompt too, so clear it each time to keep the tie)
    picks = set()
    for _ in range(20):
        policy.lru.pop("b", None)
        picks.add(policy.choose(RouteRequest(text=text), [W("a"), W("b")]).worker.name)
    assert picks == {"a", "b"}


def test_dynamo_cost_trades_overlap_against_active_blocks() -> None:
    clock = Clock()
    policy = make_bench_policy("dynamo_cost", ctx(clock))
    assert isinstance(policy, DynamoCost)
    index = policy.block_index
    tokens = list(range(160))  # 10 blocks
    index.mark_event_feed("a")
    index.store("a", list(range(1, 9)), None, tokens[:128], 16)  # a holds 8 of 10 blocks
    a, b = W("a"), W("b")
    first = policy.choose(RouteRequest(token_ids=tokens), [a, b])
    assert first.worker is a  # cost a = 2, b = 10
    # a now has 10 active blocks: a = 2 + 10 + 2 (its own prefill in flight) = 14 > b = 10
    second = policy.choose(RouteRequest(token_ids=tokens), [a, b])
    assert second.worker is b
    policy.on_request_done(first, True)
    policy.on_request_done(second, True)
    w0 = make_bench_policy("dynamo_cost_w0", ctx(clock))
    # weight 0 ignores the prefix: ties at random, never an error
    assert w0.choose(RouteRequest(token_ids=tokens), [a, b]).worker in (a, b)


def test_oracle_prefers_the_true_cache_until_its_queue_costs_more() -> None:
    engines = {"a": FakeEngine(cached=4000), "b": FakeEngine()}
    policy = make_bench_policy("oracle", ctx(engines=engines))
    assert isinstance(policy, Oracle)
    tokens = list(range(4096))
    a, b = W("a"), W("b")
    d1 = policy.choose(RouteRequest(token_ids=tokens), [a, b])
    assert d1.worker is a
    assert d1.outcome == "prefix_hit"
    for _ in range(40):  # book a long prefill queue on a
        policy._queued["a"] = 60_000
    d2 = policy.choose(RouteRequest(token_ids=tokens), [a, b])
    assert d2.worker is b
    assert d2.outcome == "balanced_away"


def test_preble_exploits_a_long_cached_prefix_and_explores_otherwise() -> None:
    policy = make_bench_policy("preble_e2", ctx())
    a, b = W("a"), W("b")
    doc = list(range(3200))
    first = policy.choose(RouteRequest(token_ids=doc + [1] * 32), [a, b])
    again = policy.choose(RouteRequest(token_ids=doc + [2] * 32), [a, b])
    assert again.worker is first.worker
    assert again.outcome == "prefix_hit"
    fresh = policy.choose(RouteRequest(token_ids=list(range(10_000, 13_200))), [a, b])
    assert fresh.worker is not first.worker  # explore: the other GPU has no load yet


def test_engine_reading_anchors_refuse_to_run_without_engines() -> None:
    for name in ("oracle", "gie_approx"):
        with pytest.raises(AnchorUnavailable, match="sim mode only"):
            make_bench_policy(name, ctx(engines=None))


@pytest.mark.parametrize("name", list(ANCHORS))
def test_every_anchor_skips_unhealthy_workers_and_raises_when_none_is_healthy(name: str) -> None:
    engines = {"sick": FakeEngine(), "ok": FakeEngine()}
    policy = make_bench_policy(name, ctx(engines=engines))
    request = RouteRequest(text="hello " * 50, token_ids=list(range(300)))
    sick, ok = W("sick", healthy=False), W("ok", in_flight=3)
    for _ in range(3):
        assert policy.choose(request, [sick, ok]).worker is ok
    with pytest.raises(NoHealthyWorker):
        policy.choose(request, [sick])


def test_policy_names_lists_tpuserve_policies_then_anchors_and_refuses_others() -> None:
    names = policy_names()
    assert names.index("round_robin") < names.index("sglang_cache_aware_v2")
    assert "oracle" in names
    with pytest.raises(ValueError, match="allowed: cache_aware"):
        make_bench_policy("nope", ctx())
