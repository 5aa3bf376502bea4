"""The block index keeps each block's tier per engine (the KV events' `medium`): a demoted block
stays routable, an HBM hit beats a host hit beats a miss, and the compiled and Python decoders
read the medium alike."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from sglang_tpu.kv_events import (
    MEDIUM_GPU,
    MEDIUM_HOST,
    BlockRemoved,
    BlockStored,
    EventBatch,
    block_hashes,
    decode_batch,
    encode_batch,
)
from tests.unit.sglang_tpu.test_kv_events_sglang import sglang_batch
from tpuserve_router.kv.block_index import BlockIndex
from tpuserve_router.policies.precise import PreciseParams, decide_tiered

pytestmark = pytest.mark.unit

PAGE = 4
A, B = "http://a", "http://b"
TOKENS = list(range(100, 100 + 4 * PAGE))


def stored(tokens: list[int], medium: str | None) -> BlockStored:
    hashes = block_hashes(tokens, PAGE)
    return BlockStored(hashes, None, tokens, PAGE, None, medium)


def store(index: BlockIndex, worker: str, medium: str | None, tokens: list[int] = TOKENS) -> None:
    index.store(worker, block_hashes(tokens, PAGE), None, tokens, PAGE, 0, medium)


def test_a_demoted_block_stays_held_in_host_memory_until_the_host_evicts_it() -> None:
    index = BlockIndex(page_size=PAGE)
    keys = index.keys(TOKENS)
    store(index, A, MEDIUM_GPU)
    store(index, A, MEDIUM_HOST)  # write-through
    assert (index.match(keys, [A]), index.device_match(keys, [A])) == ([4], [4])
    index.remove(A, block_hashes(TOKENS, PAGE), 0, MEDIUM_GPU)  # demoted
    assert (index.match(keys, [A]), index.device_match(keys, [A])) == ([4], [0])
    assert index.host_only_blocks == 4
    store(index, A, MEDIUM_GPU)  # loaded back
    assert index.device_match(keys, [A]) == [4]
    assert index.host_only_blocks == 0
    index.remove(A, block_hashes(TOKENS, PAGE), 0, MEDIUM_GPU)
    index.remove(A, block_hashes(TOKENS, PAGE), 0, MEDIUM_HOST)  # host LRU
    assert index.match(keys, [A]) == [0]
    assert (index.confirmed_blocks, index.host_only_blocks, index.worker_blocks(A)) == (0, 0, 0)


def test_events_without_a_medium_are_device_events() -> None:
    index = BlockIndex(page_size=PAGE)
    keys = index.keys(TOKENS)
    store(index, A, None)
    assert index.device_match(keys, [A]) == [4]
    index.remove(A, block_hashes(TOKENS, PAGE), 0, None)
    assert index.match(keys, [A]) == [0]


def route(index: BlockIndex, names: list[str]) -> tuple[str, str, list[int]]:
    _, depths, i, outcome, *_ = index.route(TOKENS, names, [0] * len(names), [0] * len(names))
    return names[i], outcome, depths


@pytest.mark.parametrize("weight", [0.0, 0.2, 1.0])
def test_a_prefix_held_only_in_host_memory_is_routed_to_its_engine(weight: float) -> None:
    index = BlockIndex(page_size=PAGE)
    index.set_route_params(0.3, 64, 1.5, 8192.0, 2.0, weight)
    store(index, B, MEDIUM_HOST)  # B, listed second, holds it in host memory only
    name, outcome, depths = route(index, [A, B])
    assert depths == [0, 4]  # counted as held
    if weight > 0:
        assert (name, outcome) == (B, "prefix_hit")  # never a miss while a tier holds it
    else:  # the host copy is worth nothing (loading back no faster than computing): a miss
        assert (name, outcome) == (A, "miss")


def test_an_hbm_hit_beats_a_host_hit_beats_a_miss() -> None:
    index = BlockIndex(page_size=PAGE)
    index.set_route_params(0.3, 64, 1.5, 8192.0, 2.0, 0.5)
    store(index, B, MEDIUM_HOST)
    store(index, A, MEDIUM_GPU)
    assert route(index, ["http://c", B, A])[:2] == (A, "prefix_hit")
    index.remove(A, block_hashes(TOKENS, PAGE), 0, MEDIUM_GPU)
    assert route(index, ["http://c", A, B])[:2] == (B, "prefix_hit")


def test_the_compiled_reader_reads_the_medium_as_python_does() -> None:
    events = [stored(TOKENS, MEDIUM_GPU), stored(TOKENS, MEDIUM_HOST)]
    removed = BlockRemoved(block_hashes(TOKENS, PAGE), MEDIUM_GPU)
    for payload in (
        msgspec.msgpack.encode(sglang_batch(EventBatch(1.0, [*events, removed], 0))),
        encode_batch(EventBatch(1.0, [*events, removed])),
    ):
        native, python = BlockIndex(page_size=PAGE), BlockIndex(page_size=PAGE)
        assert native.apply_batch(A, payload) == (2, 1)
        for event in decode_batch(payload).events:
            if isinstance(event, BlockStored):
                python.store(A, event.block_hashes, event.parent_block_hash, event.token_ids,
                             event.block_size, 0, event.medium)  # fmt: skip
            elif isinstance(event, BlockRemoved):
                python.remove(A, event.block_hashes, 0, event.medium)
        keys = native.keys(TOKENS)
        for index in (native, python):
            assert (index.match(keys, [A]), index.device_match(keys, [A])) == ([4], [0])
            assert index.host_only_blocks == 4


def test_a_tiered_stream_holds_more_blocks_than_its_hbm_pool() -> None:
    """`/server_info`'s pool is the HBM's: a stream that publishes a host tier is bounded by
    ``max_stream_blocks`` only, so its host blocks past the HBM pool stay routable (the
    limit still bounds a stream without tiers, and stays readable for `precise`'s HBM room)."""
    index = BlockIndex(page_size=PAGE, max_stream_blocks=64)
    index.set_worker_limit(A, 2)
    index.set_worker_limit(B, 2)
    keys = index.keys(TOKENS)
    store(index, A, MEDIUM_HOST)  # 4 blocks in host memory, twice the HBM pool
    store(index, B, MEDIUM_GPU)
    assert index.match(keys, [A, B]) == [4, 2]
    assert index.dropped_blocks == 2
    assert index.worker_limit(A) == 2


def test_a_host_hit_does_not_buy_a_worker_over_the_load_bound() -> None:
    """W1's regression (docs/host-kv-tier.md): a prefix held only in host memory of a busy
    worker went there whatever its load. Over the bound (`prefix_routing.bounded`: with this
    request more than ``host_load_factor`` x the mean load) its host blocks count for nothing,
    so the prompt is the miss it would be without the tier and goes to the least loaded; at
    or under the bound its holder keeps it. The fleet model's `decide_tiered` decides alike."""
    names = [A, B, "http://c"]
    params = PreciseParams(page_size=PAGE, host_hit_weight=0.8, host_load_factor=1.25)
    for loads, expected in (
        ([10, 20, 12], (0, "miss")),  # B with it: 21 > ceil(1.25 * 43 / 3) = 18
        ([10, 17, 12], (0, "miss")),  # 18 > ceil(1.25 * 40 / 3) = 17
        ([10, 16, 12], (1, "prefix_hit")),  # 17 <= ceil(1.25 * 39 / 3) = 17
        ([14, 15, 12], (1, "prefix_hit")),  # busier than the least loaded, within the bound
    ):
        index = BlockIndex(page_size=PAGE)  # new each time: route predicts on its choice
        index.set_route_params(0.3, 64, 1.5, 8192.0, 2.0, 0.8, 1.25)
        store(index, B, MEDIUM_HOST)
        _, depths, i, outcome, *_ = index.route(TOKENS, names, loads, [0, 0, 0])
        device = index.device_match(index.keys(TOKENS), names)
        tiered = decide_tiered(depths, device, PAGE, len(TOKENS), loads, [0, 4, 0], [0, 0, 0],
                               [math.inf] * 3, 0, params)  # fmt: skip
        assert (i, outcome) == tiered[:2] == expected, loads


def test_the_compiled_tiered_choice_agrees_with_decide_tiered() -> None:
    """`BlockIndex.route` (the router's fast path) and `decide_tiered` (its statement on plain
    numbers, what the fleet model runs) choose the same worker for the same reason, over
    seeded random fleets: blocks in HBM, in host memory or both, loads near and past the
    bound and past sglang-router's imbalance rule, short prefill queues (below
    ``queue_margin_tokens``, so neither moves for its queue)."""
    rng = random.Random(59)
    params = PreciseParams(page_size=PAGE, host_hit_weight=0.8, host_load_factor=1.25)
    names = [A, B, "http://c", "http://d"]
    agreed = {"prefix_hit": 0, "miss": 0, "balanced_away": 0}
    for _ in range(400):
        index = BlockIndex(page_size=PAGE)
        index.set_route_params(0.3, 64, 1.5, 8192.0, 2.0, 0.8, 1.25)
        for name in names:
            blocks = rng.randint(0, 4)
            if blocks:
                medium = rng.choice([MEDIUM_GPU, MEDIUM_HOST, "both"])
                part = TOKENS[: blocks * PAGE]
                if medium in (MEDIUM_HOST, "both"):
                    store(index, name, MEDIUM_HOST, part)
                if medium in (MEDIUM_GPU, "both"):
                    store(index, name, MEDIUM_GPU, part[: rng.randint(1, blocks) * PAGE])
        top = rng.choice([12, 12, 12, 150])  # sometimes imbalanced past sglang-router's rule
        loads = [rng.randint(0, top) for _ in names]
        queued = [rng.choice([0, 4, 8, 12, 13, 20, 40]) for _ in names]
        blocks_held = [index.cached_blocks(name) for name in names]
        keys = index.keys(TOKENS)
        device = index.device_match(keys, names)
        _, depths, i, outcome, *_ = index.route(TOKENS, names, loads, queued)
        tiered = decide_tiered(depths, device, PAGE, len(TOKENS), loads, blocks_held, queued,
                               [math.inf] * 4, 0, params)  # fmt: skip
        assert (i, outcome) == tiered[:2], (depths, device, loads, queued)
        agreed[outcome] += 1
    assert min(agreed.values()) > 0, agreed  # every kind of decision was compared


def test_a_host_tier_tag_lifts_a_streams_bound_only_to_a_multiple_of_its_pool() -> None:
    """Issue 68: one event tagged as host memory lifted a stream's bound from its worker's
    pool (6,760 blocks) to ``max_stream_blocks`` (1,048,576). A tiered stream now holds at
    most `HOST_TIER_FACTOR` (16) times its pool, HBM and host together."""
    index = BlockIndex(page_size=PAGE, max_stream_blocks=100_000)
    index.set_worker_limit(A, 2)
    tokens = list(range(PAGE * 100))
    index.store(A, block_hashes(tokens, PAGE), None, tokens, PAGE, 0, MEDIUM_HOST)
    assert index.worker_blocks(A) == 2 * 16
    assert index.dropped_blocks == 100 - 32
    assert index.worker_limit(A) == 2  # the HBM room `precise` reads is still the pool


def test_claimed_data_parallel_ranks_do_not_multiply_a_workers_bound() -> None:
    """Issue 68: a worker claiming 16 data-parallel ranks held 16 times ``max_stream_blocks``
    (16.8 M blocks, 2.7 GB of router memory). All of a worker's streams together hold at
    most ``max_stream_blocks``, whatever ranks and tiers they claim."""
    index = BlockIndex(page_size=PAGE, max_stream_blocks=8)
    for rank in range(16):
        tokens = list(range(rank * 1000, rank * 1000 + PAGE * 12))
        index.store(A, block_hashes(tokens, PAGE), None, tokens, PAGE, rank, MEDIUM_HOST)
    assert index.worker_blocks(A) == 8
    assert index.dropped_blocks == 16 * 12 - 8
    tokens = list(range(PAGE * 3))
    store(index, B, MEDIUM_GPU, tokens)  # another worker keeps its own bound
    assert index.worker_blocks(B) == 3
