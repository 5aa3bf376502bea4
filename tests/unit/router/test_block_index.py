"""The block index mirrors the engines' KV events exactly and expires its predictions."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from tests.fakes import VirtualClock
from tpuserve_router.kv.block_index import ROOT_KEY, BlockIndex, BlockKeys, block_keys
from tpuserve_router.policies.precise import choose_worker
from tpuserve_router.policies.prefix_routing import AffinityParams

pytestmark = pytest.mark.unit

PAGE = 4


def engine_hash(tokens: list[int]) -> int:
    return hash(("engine", tuple(tokens)))


def store(
    index: BlockIndex, worker: str, tokens: list[int], from_page: int = 0, rank: int = 0
) -> None:
    """The BlockStored events an engine sends when it caches ``tokens`` page by page."""
    for i in range(from_page, len(tokens) // PAGE):
        parent = engine_hash(tokens[: i * PAGE]) if i else None
        page = tokens[i * PAGE : (i + 1) * PAGE]
        index.store(worker, [engine_hash(tokens[: (i + 1) * PAGE])], parent, page, PAGE, rank)


def test_block_keys_chain_full_pages_only() -> None:
    keys = block_keys(list(range(10)), 4)
    assert len(keys) == 2
    assert block_keys(list(range(8)), 4) == keys
    assert block_keys([9, 1, 2, 3, 4, 5, 6, 7], 4)[1] != keys[1]  # a different parent


def test_block_keys_are_cpythons_hash_of_parent_and_page() -> None:
    """The compiled keys equal the interpreter's ``hash((parent, page))``, which earlier
    (pure-Python) releases used: routers of both agree on a peer's snapshot and decisions."""
    rng = random.Random(7)
    for _ in range(500):
        top = 2**40 if rng.random() < 0.3 else 200_000
        tokens = [rng.randrange(top) for _ in range(rng.randrange(100))]
        page_size = rng.randrange(1, 20)
        expected, parent = [], ROOT_KEY
        for page in zip(*[iter(tokens)] * page_size, strict=False):
            parent = hash((parent, page))
            expected.append(parent)
        assert block_keys(tokens, page_size) == expected
    with pytest.raises(ValueError, match="page_size must be >= 1, got 0"):
        block_keys([1, 2], 0)


def test_a_prompts_keys_read_as_a_sequence_and_match_as_a_list_would() -> None:
    """`BlockIndex.keys` gives one native array (no Python int per key): it reads as the list
    `block_keys` gives, and `match` and `predict` take it or any sequence of ints alike."""
    tokens = list(range(4 * PAGE + 2))
    keys = BlockIndex(page_size=PAGE).keys(tokens)
    expected = block_keys(tokens, PAGE)
    assert isinstance(keys, BlockKeys)
    assert isinstance(keys, Sequence)
    assert list(keys) == expected == keys.tolist()
    assert keys == expected
    assert (keys[0], keys[-1], keys[1:3], len(keys)) == (
        expected[0], expected[-1], expected[1:3], len(expected)
    )  # fmt: skip
    assert keys.index(expected[2]) == 2
    assert keys.count(expected[2]) == 1
    with pytest.raises(IndexError, match="BlockKeys index out of range"):
        keys[len(expected)]
    with pytest.raises(TypeError, match="BlockKeys indices must be integers or slices"):
        keys["0"]  # type: ignore[call-overload]
    for given in (keys, expected, tuple(expected), BlockKeys(expected)):
        index = BlockIndex(page_size=PAGE)
        store(index, "a", tokens[: 2 * PAGE])
        index.predict("b", given)
        assert index.match(given, ("a", "b", "c")) == [2, 4, 0]
        assert index.match(given, ["c", "a"]) == [0, 2]
    with pytest.raises(TypeError):
        index.match(keys, "ab")  # names are a sequence of names, not one string
    with pytest.raises(TypeError):
        index.match(keys, ["a", 1])  # type: ignore[list-item]


def test_many_streams_spill_past_the_inline_bits() -> None:
    """Stream bits are a set of any width: 300 workers (more than the 128 kept inline) each
    hold their own prefix, and every one is found at its own depth."""
    index = BlockIndex(page_size=PAGE)
    names = [f"w{i}" for i in range(300)]
    for i, name in enumerate(names):
        store(index, name, [i] * PAGE + list(range(i % 3 * PAGE)))
    for i in range(len(names)):
        tokens = [i] * PAGE + list(range(2 * PAGE))
        depths = index.match(index.keys(tokens), names)
        assert depths[i] == 1 + i % 3
        assert sum(depths) == depths[i]
    index.forget("w299")
    assert index.match(index.keys([299] * PAGE), names)[299] == 0
    assert index.allocated_bits == 300


def test_unsigned_engine_hashes_are_taken() -> None:
    """SGLang's block hashes are signed 64-bit ints; unsigned ones are taken too."""
    index = BlockIndex(page_size=PAGE)
    index.store("a", [2**64 - 1], None, [1, 2, 3, 4], PAGE)
    assert index.engine_hashes("a") == {2**64 - 1}
    assert index.match(index.keys([1, 2, 3, 4]), ["a"]) == [1]
    index.remove("a", [2**64 - 1])
    assert index.worker_blocks("a") == 0


def test_route_is_keys_match_the_affinity_rule_and_the_queue_test_in_one_call() -> None:
    """`route` (the `precise` policy's one call per request) answers as `keys`, `match`,
    `choose_worker` (over `cached_blocks`, its cursor carried from call to call) and
    `queue_move`'s first test do, and predicts the keys on the chosen worker exactly when that
    test keeps it there: on two indexes given the same events, one routed with `route`, the
    other step by step, every answer and every later match agree."""
    rng = random.Random(5)
    names = ["a", "b", "c", "d"]
    stems = [[rng.randrange(1000) for _ in range(rng.randrange(0, 12) * PAGE)] for _ in range(4)]
    prompts = [stem + [rng.randrange(1000) for _ in range(rng.randrange(0, 40))] for stem in stems]
    clock = VirtualClock()
    fused, stepwise = (BlockIndex(page_size=PAGE, clock=clock) for _ in range(2))
    predicted_at_least_once = kept_off_at_least_once = rotated_at_least_once = False
    cursor = 0
    for _ in range(600):
        tokens = rng.choice(prompts)
        if rng.random() < 0.3:
            name = rng.choice(names)
            store(fused, name, tokens)
            store(stepwise, name, tokens)
            continue
        healthy = rng.sample(names, rng.randrange(1, 5))
        loads = [rng.randrange(6) for _ in healthy]
        queued = [float(rng.choice([0, 100, 5_000, 9_000, 20_000])) for _ in healthy]
        params = AffinityParams(
            cache_threshold=rng.choice([0.0, 0.3, 0.5]),
            balance_abs_threshold=rng.choice([0, 2, 64]),
            balance_rel_threshold=rng.choice([1.0, 1.5]),
        )
        margin, weight = rng.choice([0.0, 8192.0]), rng.choice([0.0, 2.0])
        fused.set_route_params(
            params.cache_threshold, params.balance_abs_threshold, params.balance_rel_threshold,
            margin, weight,
        )  # fmt: skip
        routed = tuple if rng.random() < 0.5 else list  # lists are read directly, not only
        keys, depths, target, outcome, predicted, page, last_key = fused.route(
            tokens, routed(healthy), routed(loads), routed(queued)
        )
        assert (page, last_key) == (PAGE, keys[-1] if keys else None)
        expected_keys = stepwise.keys(tokens)
        expected_depths = stepwise.match(expected_keys, healthy)
        blocks = [stepwise.cached_blocks(n) for n in healthy]
        target_, outcome_, next_cursor = choose_worker(
            expected_depths, len(expected_keys), loads, blocks, cursor, params
        )
        rotated_at_least_once |= next_cursor != cursor
        cursor = next_cursor
        choice = (target_, outcome_)
        stays = queued[choice[0]] <= margin + weight * PAGE * (
            expected_depths[choice[0]] - max(expected_depths)
        )
        assert (list(keys), depths, (target, outcome), predicted) == (
            list(expected_keys), expected_depths, choice, stays,
        )  # fmt: skip
        if stays:
            stepwise.predict(healthy[target], expected_keys)
        predicted_at_least_once |= stays
        kept_off_at_least_once |= not stays
        clock.advance(rng.choice([0.0, 0.5, 3.0]))
        for probe in rng.sample(prompts, 2):
            assert fused.match(fused.keys(probe), names) == stepwise.match(
                stepwise.keys(probe), names
            )
    assert predicted_at_least_once
    assert kept_off_at_least_once
    assert rotated_at_least_once
    with pytest.raises(ValueError, match="one load and one queue per name"):
        fused.route([1] * PAGE, ["a", "b"], [0], [0.0, 0.0])
    not_names: list[Any] = ["a", 7]
    with pytest.raises(TypeError):
        fused.route([1] * PAGE, not_names, [0, 0], [0.0, 0.0])
    with pytest.raises(TypeError):
        fused.route([1] * PAGE, "ab", [0, 0], [0.0, 0.0])  # one string is not two names


def test_route_needs_its_parameters_set_first() -> None:
    with pytest.raises(ValueError, match="set_route_params"):
        BlockIndex(page_size=PAGE).route([1] * PAGE, ["a"], [0], [0.0])


def test_match_is_the_longest_held_run_whatever_the_events_and_predictions() -> None:
    """Against a plain model (per worker, the keys its events stored and did not remove, and
    those it was routed and did not hold), on random long prompts sharing prefixes, with
    blocks removed from the middle of chains: `match` (which looks keys up in windows) is the
    length of the leading run each worker holds."""
    rng = random.Random(11)
    names = ["a", "b", "c", "d"]
    stems = [[rng.randrange(1000) for _ in range(rng.randrange(0, 30) * PAGE)] for _ in range(4)]
    prompts = [
        stem
        + [rng.randrange(1000) for _ in range(rng.randrange(0, 25) * PAGE + rng.randrange(PAGE))]
        for stem in stems
        for _ in range(6)
    ]
    index = BlockIndex(page_size=PAGE, clock=VirtualClock())
    confirmed: dict[str, set[int]] = {n: set() for n in names}
    predicted: dict[str, set[int]] = {n: set() for n in names}
    for _ in range(400):
        name, tokens = rng.choice(names), rng.choice(prompts)
        keys = block_keys(tokens, PAGE)
        action = rng.random()
        if action < 0.4:
            store(index, name, tokens)
            confirmed[name] |= set(keys)
            predicted[name] -= set(keys)
        elif action < 0.6 and keys:
            gone = rng.sample(range(len(keys)), rng.randrange(1, min(4, len(keys)) + 1))
            hashes = [engine_hash(tokens[: (i + 1) * PAGE]) for i in gone]
            index.remove(name, hashes)
            confirmed[name] -= {keys[i] for i in gone}
        else:
            index.predict(name, index.keys(tokens))
            predicted[name] |= set(keys) - confirmed[name]
        for probe in rng.sample(prompts, 3):
            probe_keys = block_keys(probe, PAGE)
            expected = []
            for n in names:
                held = confirmed[n] | predicted[n]
                run = 0
                while run < len(probe_keys) and probe_keys[run] in held:
                    run += 1
                expected.append(run)
            assert index.match(index.keys(probe), names) == expected


def test_store_then_match_counts_leading_blocks_per_worker() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(32))
    store(index, "a", prompt[:16])
    store(index, "b", prompt)
    assert index.match(index.keys(prompt), ["a", "b", "c"]) == [4, 8, 0]
    assert index.confirmed_blocks == 8
    assert index.worker_blocks("a") == 4


def test_a_gap_in_the_prompt_stops_the_match() -> None:
    index = BlockIndex(page_size=PAGE)
    store(index, "a", list(range(16)))
    other = [99, 99, 99, 99, *list(range(4, 16))]
    assert index.match(index.keys(other), ["a"]) == [0]


def test_events_with_several_blocks_per_event_are_split_by_block_size() -> None:
    index = BlockIndex(page_size=PAGE)
    tokens = list(range(12))
    index.store("a", [1, 2, 3], None, tokens, PAGE)
    assert index.match(index.keys(tokens), ["a"]) == [3]


def test_block_removed_and_all_blocks_cleared_are_applied() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(16))
    store(index, "a", prompt)
    store(index, "b", prompt)
    index.remove("a", [engine_hash(prompt[:16])])  # the last page is evicted
    assert index.match(index.keys(prompt), ["a", "b"]) == [3, 4]
    index.clear("b")
    assert index.match(index.keys(prompt), ["a", "b"]) == [3, 0]
    assert index.worker_blocks("b") == 0
    index.forget("a")
    assert index.confirmed_blocks == 0
    assert index.workers() == ["b"]


def test_engine_hashes_are_what_the_events_stored_minus_what_they_removed() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(16))
    store(index, "a", prompt)
    store(index, "a", prompt[:8], rank=1)
    index.remove("a", [engine_hash(prompt[:16])])
    page_hashes = [engine_hash(prompt[: (i + 1) * PAGE]) for i in range(4)]
    assert index.engine_hashes("a") == set(page_hashes[:3])
    assert index.engine_hashes("a", rank=1) == set(page_hashes[:2])
    assert index.engine_hashes("a", rank=7) == set()
    assert index.engine_hashes("unknown") == set()
    index.clear("a", rank=0)
    assert index.engine_hashes("a") == set(page_hashes[:2])


def test_blocks_whose_parent_was_never_seen_are_orphans_not_matches() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(16))
    store(index, "a", prompt, from_page=2)  # the first two pages' events were lost
    assert index.orphan_blocks == 2
    assert index.match(index.keys(prompt), ["a"]) == [0]
    index.clear("a")
    assert index.orphan_blocks == 0


def test_the_page_size_is_learned_from_the_first_event() -> None:
    index = BlockIndex(page_size=16)
    index.store("a", [1], None, list(range(8)), 8)
    assert index.page_size == 8
    assert index.match(index.keys(list(range(8))), ["a"]) == [1]


def test_predictions_expire_with_the_short_ttl_when_events_flow() -> None:
    clock = VirtualClock()
    index = BlockIndex(page_size=PAGE, predicted_ttl_seconds=2, clock=clock)
    index.mark_event_feed("a")
    keys = index.keys(list(range(16)))
    index.predict("a", keys)
    assert index.match(keys, ["a"]) == [4]
    clock.advance(1.9)
    assert index.match(keys, ["a"]) == [4]
    clock.advance(0.2)
    assert index.match(keys, ["a"]) == [0]
    assert index.predicted_blocks == 0


def test_predictions_last_longer_for_workers_without_events() -> None:
    clock = VirtualClock()
    index = BlockIndex(page_size=PAGE, approximate_ttl_seconds=120, clock=clock)
    keys = index.keys(list(range(16)))
    index.predict("a", keys)
    clock.advance(60)
    assert index.match(keys, ["a"]) == [4]
    clock.advance(61)
    assert index.match(keys, ["a"]) == [0]


def test_predictions_are_bounded_over_all_workers_each_keeping_an_equal_share() -> None:
    index = BlockIndex(page_size=PAGE, max_predicted_blocks=12)
    for start in range(0, 400, 16):
        index.predict("a", index.keys(list(range(start, start + 16))))
    assert index.predicted_blocks == 12  # alone, a worker may keep the whole bound
    latest = index.keys(list(range(384, 400)))
    index.predict("b", index.keys(list(range(1000, 1016))))  # a second worker: shares of 6
    assert index.predicted_blocks == 6 + 4
    assert index.match(latest, ["a"]) == [4]  # the oldest went first
    for start in range(2000, 2400, 16):
        index.predict("b", index.keys(list(range(start, start + 16))))
    assert index.predicted_blocks == 12


def test_a_confirmed_block_replaces_its_prediction() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(16))
    index.predict("a", index.keys(prompt))
    store(index, "a", prompt)
    assert index.predicted_blocks == 0
    assert index.match(index.keys(prompt), ["a"]) == [4]


def test_clear_drops_predictions_too() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(16))
    index.predict("a", index.keys(prompt))
    index.clear("a")
    assert index.match(index.keys(prompt), ["a"]) == [0]


def test_worker_bits_are_reused_after_forget() -> None:
    index = BlockIndex(page_size=PAGE)
    for i in range(100):
        store(index, f"w{i}", list(range(8)))
        index.forget(f"w{i}")
    assert index.allocated_bits <= 1


def test_old_predictions_get_the_short_ttl_once_events_flow() -> None:
    clock = VirtualClock()
    index = BlockIndex(page_size=PAGE, predicted_ttl_seconds=2, approximate_ttl_seconds=120,
                       clock=clock)  # fmt: skip
    keys = index.keys(list(range(16)))
    index.predict("a", keys)  # no events yet: 120 s
    index.mark_event_feed("a")
    clock.advance(2.5)
    assert index.match(keys, ["a"]) == [0]


# ---------------------------------------------------------------- data-parallel ranks


def test_a_worker_matches_as_deep_as_its_best_dp_rank() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(32))
    store(index, "dp", prompt[:8], rank=0)
    store(index, "dp", prompt[:24], rank=1)
    store(index, "b", prompt[:16])
    assert index.match(index.keys(prompt), ["dp", "b"]) == [6, 4]
    assert index.match(index.keys(prompt), ["b", "dp"]) == [4, 6]
    assert index.workers() == ["dp", "b"]  # ranks are not workers
    assert (index.worker_blocks("dp"), index.worker_blocks("dp", rank=1)) == (8, 6)


def test_ranks_with_the_same_engine_hashes_are_kept_apart() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(16))
    store(index, "dp", prompt, rank=0)
    store(index, "dp", prompt, rank=1)  # same tokens: same engine hashes on both ranks
    index.remove("dp", [engine_hash(prompt[:16])], rank=1)
    assert index.worker_blocks("dp", rank=1) == 3
    assert index.match(index.keys(prompt), ["dp"]) == [4]  # rank 0 still holds the last page
    index.remove("dp", [engine_hash(prompt[:16])], rank=0)
    assert index.match(index.keys(prompt), ["dp"]) == [3]


def test_one_ranks_clear_leaves_the_other_ranks_blocks() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(16))
    store(index, "dp", prompt[:8], rank=0)
    store(index, "dp", prompt, rank=2)
    index.clear("dp", rank=2)
    assert index.match(index.keys(prompt), ["dp"]) == [2]
    assert index.confirmed_blocks == 2
    index.clear("dp")
    assert index.confirmed_blocks == 0


def test_forget_frees_the_bits_of_every_rank() -> None:
    index = BlockIndex(page_size=PAGE)
    for i in range(50):
        for rank in range(3):
            store(index, f"w{i}", list(range(8)), rank=rank)
        index.forget(f"w{i}")
    assert index.allocated_bits == 3  # three streams' bits, reused by every later worker
    assert index.confirmed_blocks == 0


def test_a_prediction_is_not_written_for_a_block_another_rank_confirmed() -> None:
    index = BlockIndex(page_size=PAGE, predicted_ttl_seconds=60)
    prompt = list(range(16))
    store(index, "dp", prompt, rank=1)
    index.predict("dp", index.keys(prompt))
    assert index.predicted_blocks == 0


def test_a_streams_entries_loaded_elsewhere_match_as_their_events_would() -> None:
    """A peer's snapshot (`stream_blocks`) loaded into a fresh index (`load_stream`) matches
    prompts as the events did, and the events that follow chain onto it."""
    peer, late = BlockIndex(page_size=PAGE), BlockIndex(page_size=PAGE)
    tokens = list(range(40))
    store(peer, "w", tokens[:24], rank=1)
    late.predict("w", late.keys(tokens[:8]))
    late.load_stream("w", 1, peer.stream_blocks("w", 1))
    assert late.match(late.keys(tokens), ["w"]) == peer.match(peer.keys(tokens), ["w"]) == [6]
    assert late.predicted_blocks == 0  # confirmed now
    store(late, "w", tokens, from_page=6, rank=1)  # the next events chain onto the snapshot
    assert late.match(late.keys(tokens), ["w"]) == [10]
    assert late.engine_hashes("w", 1) >= peer.engine_hashes("w", 1)
    assert late.stream_blocks("w", 0) == []
    assert late.stream_blocks("x") == []


def test_rank_depths_count_each_dp_ranks_own_leading_blocks() -> None:
    index = BlockIndex(page_size=PAGE)
    prompt = list(range(16))
    store(index, "p", prompt[:8], rank=0)
    store(index, "p", prompt, rank=2)
    store(index, "p", list(range(100, 116)), rank=1)  # another prompt entirely
    keys = index.keys(prompt)
    assert index.rank_depths("p", keys) == [(0, 2), (1, 0), (2, 4)]
    index.predict("p", keys)  # a prediction is the worker's, not a rank's
    assert index.rank_depths("p", keys) == [(0, 2), (1, 0), (2, 4)]
    assert index.rank_depths("unknown", keys) == []


def test_unpredict_drops_a_set_aside_choices_predictions_not_confirmed_blocks() -> None:
    index = BlockIndex(page_size=PAGE, clock=VirtualClock())
    prompt = list(range(16))
    store(index, "a", prompt[:4])
    keys = index.keys(prompt)
    index.predict("a", keys)
    assert index.match(keys, ["a"]) == [4]
    index.unpredict("a", keys)
    assert index.match(keys, ["a"]) == [1]  # the page its events stored stays
    index.unpredict("unknown", keys)  # a worker the index does not know: nothing to drop


def test_a_stream_holds_no_more_blocks_than_its_workers_pool() -> None:
    """Issue 57 item 7: a stream's confirmed blocks are bounded by its worker's KV pool
    (`set_worker_limit`, from /server_info), else by ``max_stream_blocks``: 6 M fake blocks
    from one stream grew the router by 530 MB. Blocks past the bound are dropped, counted."""
    index = BlockIndex(page_size=PAGE, max_stream_blocks=8)
    index.set_worker_limit("pooled", 3)
    tokens = list(range(PAGE * 12))
    store(index, "pooled", tokens)
    store(index, "unknown", tokens)
    assert index.worker_blocks("pooled") == 3
    assert index.worker_blocks("unknown") == 8  # no pool known: the index's cap
    assert index.dropped_blocks == (12 - 3) + (12 - 8)
    assert index.match(index.keys(tokens), ["pooled", "unknown"]) == [3, 8]
    index.set_worker_limit("big", 1 << 40)  # a pool larger than the cap: the cap
    store(index, "big", tokens)
    assert index.worker_blocks("big") == 8


def test_one_stream_does_not_set_the_page_size_for_the_fleet() -> None:
    """Issue 57 item 7: the page size is learned per stream; prompts are keyed by the one
    most streams have, so a first stream claiming pages of one token does not unkey every
    other worker's blocks. A block of another size on a stream that has one is dropped."""
    index = BlockIndex(page_size=64)
    index.store("liar", [1], None, [7], 1)  # first, and alone in its page size
    assert index.page_size == 1
    tokens = list(range(PAGE * 2))
    store(index, "a", tokens)
    store(index, "b", tokens)
    assert index.page_size == PAGE
    assert index.match(index.keys(tokens), ["a", "b", "liar"]) == [2, 2, 0]
    index.store("a", [99], None, list(range(8)), 8)  # not a's page size
    assert index.dropped_blocks == 1
    assert index.worker_blocks("a") == 2
