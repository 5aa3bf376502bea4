"""The radix cache keeps SGLang's semantics: pages, locks, LRU leaves, and exact KV events."""

from __future__ import annotations

import pytest

from sglang_tpu.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, block_hashes
from sglang_tpu.sim.radix_cache import RadixCache

pytestmark = pytest.mark.unit


def test_insert_then_match_is_page_aligned() -> None:
    cache = RadixCache(page_size=4)
    assert cache.insert(list(range(10))) == 0
    assert cache.total_size == 8  # the partial page is not cached
    assert cache.peek_prefix_length(list(range(10))) == 8
    assert cache.peek_prefix_length([*range(6), 99, 99, 99]) == 4


def test_match_splits_a_node_without_changing_sizes() -> None:
    cache = RadixCache(page_size=1)
    cache.insert([1, 2, 3, 4])
    matched, node = cache.match_prefix([1, 2, 9])
    assert matched == 2
    assert node.key == [1, 2]
    assert cache.total_size == 4
    assert cache.insert([1, 2, 5]) == 2
    assert cache.total_size == 5


def test_locked_nodes_are_never_evicted_and_lru_leaves_go_first() -> None:
    cache = RadixCache(page_size=1)
    cache.insert([1, 1, 1])
    cache.insert([2, 2, 2])
    cache.insert([3, 3, 3])
    _, locked = cache.match_prefix([1, 1, 1])
    cache.inc_lock_ref(locked)
    cache.match_prefix([3, 3, 3])  # refresh: [2, 2, 2] is now the least recently used
    assert cache.evict(3) == 3
    assert cache.peek_prefix_length([2, 2, 2]) == 0
    assert cache.peek_prefix_length([3, 3, 3]) == 3
    assert cache.evict(100) == 3  # only [3,3,3] is evictable
    assert cache.peek_prefix_length([1, 1, 1]) == 3
    assert cache.protected_size == 3
    cache.dec_lock_ref(locked)
    assert cache.evictable_size == 3


def test_a_parent_becoming_a_leaf_is_evicted_in_the_same_pass() -> None:
    cache = RadixCache(page_size=1)
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    assert cache.evict(10) == 4
    assert cache.total_size == 0


def test_events_are_one_per_page_with_sglangs_chained_hashes() -> None:
    cache = RadixCache(page_size=2, emit_events=True)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6, 7])
    events = cache.take_events()
    h = block_hashes([1, 2, 3, 4], 2)
    h2 = block_hashes([1, 2, 5, 6], 2)
    assert events == [
        BlockStored([h[0]], None, [1, 2], 2, None, "GPU"),
        BlockStored([h[1]], h[0], [3, 4], 2, None, "GPU"),
        BlockStored([h2[1]], h[0], [5, 6], 2, None, "GPU"),  # the split emitted nothing
    ]
    cache.evict(2)
    removed = cache.take_events()
    assert len(removed) == 1
    assert isinstance(removed[0], BlockRemoved)
    cache.reset()
    assert cache.take_events() == [AllBlocksCleared()]
    assert cache.blocks() == []


def test_debug_blocks_match_what_the_events_built() -> None:
    cache = RadixCache(page_size=2, emit_events=True)
    for seq in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 9], [7, 8]):
        cache.insert(seq)
    cache.evict(2)
    rebuilt: dict[int, tuple[int | None, tuple[int, ...]]] = {}
    for event in cache.take_events():
        if isinstance(event, BlockStored):
            rebuilt[int(event.block_hashes[0])] = (
                None if event.parent_block_hash is None else int(event.parent_block_hash),
                tuple(event.token_ids),
            )
        elif isinstance(event, BlockRemoved):
            del rebuilt[int(event.block_hashes[0])]
    view = {b.block_hash: (b.parent_block_hash, b.token_ids) for b in cache.blocks()}
    assert rebuilt == view
