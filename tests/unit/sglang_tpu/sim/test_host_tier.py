"""The twin's host tier does what SGLang 0.5.23's HiCache does (docs/host-kv-tier.md): what each
write policy copies to host and when, demotion, load back, host LRU, and the KV events with
SGLang's `medium` for each step."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from sglang_tpu.kv_events import (
    MEDIUM_GPU,
    MEDIUM_HOST,
    BlockRemoved,
    BlockStored,
    KVEvent,
    block_hashes,
)
from sglang_tpu.perf_model import StepTimer, get_profile
from sglang_tpu.sim.cli import build_settings, configure
from sglang_tpu.sim.engine import EngineConfig, EngineCore
from sglang_tpu.sim.output_text import OutputPalette
from sglang_tpu.sim.radix_cache import RadixCache
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.virtual_clock import VirtualEngine
from sglang_tpu.tokenizer import load_tokenizer
from sglang_tpu.topology import lookup

pytestmark = pytest.mark.unit

PAGE = 4


def tiered(host_tokens: int = 64, policy: str = "write_through") -> RadixCache:
    return RadixCache(PAGE, emit_events=True, host_tokens=host_tokens, write_policy=policy)


def summary(events: list[KVEvent]) -> list[tuple[str, str | None, int]]:
    """(event type, medium, pages) of each event."""
    out: list[tuple[str, str | None, int]] = []
    for e in events:
        if isinstance(e, BlockStored):
            out.append(("stored", e.medium, len(e.block_hashes)))
        elif isinstance(e, BlockRemoved):
            out.append(("removed", e.medium, len(e.block_hashes)))
    return out


def test_write_through_copies_on_insert_and_demotion_keeps_the_host_copy() -> None:
    cache = tiered()
    tokens = list(range(8))  # two pages
    cache.insert(tokens)
    assert (
        summary(cache.take_events())
        == [("stored", MEDIUM_GPU, 1)] * 2 + [("stored", MEDIUM_HOST, 1)] * 2
    )
    assert (cache.total_size, cache.host_size) == (8, 8)
    assert cache.evict(8) == 8
    assert summary(cache.take_events()) == [("removed", MEDIUM_GPU, 1)] * 2  # one per page
    assert cache.total_size == 0
    assert cache.peek_prefix_length(tokens) == 8  # the host still holds it
    device, host, node = cache.match_prefix_tiers(tokens)
    assert (device, host) == (0, 8)
    cache.inc_lock_ref(node)
    assert cache.load_back(node) == 8
    stored = cache.take_events()
    assert summary(stored) == [("stored", MEDIUM_GPU, 1)] * 2
    assert [e.block_hashes[0] for e in stored if isinstance(e, BlockStored)] == block_hashes(
        tokens, PAGE
    )
    assert (cache.protected_size, cache.host_size) == (8, 8)  # the host copy stays
    cache.dec_lock_ref(node)
    assert cache.match_prefix_tiers(tokens)[:2] == (8, 0)


def test_write_back_copies_only_when_the_device_evicts() -> None:
    cache = tiered(policy="write_back")
    cache.insert(list(range(8)))
    assert summary(cache.take_events()) == [("stored", MEDIUM_GPU, 1)] * 2
    assert cache.host_size == 0
    cache.evict(8)
    assert summary(cache.take_events()) == [
        ("stored", MEDIUM_HOST, 1),
        ("stored", MEDIUM_HOST, 1),
        ("removed", MEDIUM_GPU, 1),
        ("removed", MEDIUM_GPU, 1),
    ]
    assert cache.host_size == 8
    assert cache.peek_prefix_length(list(range(8))) == 8


def test_write_through_selective_copies_on_the_second_hit() -> None:
    cache = tiered(policy="write_through_selective")
    cache.insert(list(range(8)))
    cache.take_events()
    assert cache.host_size == 0
    cache.match_prefix_tiers(list(range(8)))
    assert summary(cache.take_events()) == [("stored", MEDIUM_HOST, 1)] * 2
    assert cache.host_size == 8


def test_the_host_tier_evicts_its_least_recently_used_leaf() -> None:
    cache = tiered(host_tokens=8)  # room for two of the three 4-token prompts
    a, b, c = [list(range(s, s + 4)) for s in (100, 200, 300)]
    for tokens in (a, b):
        cache.insert(tokens)
    cache.evict(8)  # both demoted
    cache.match_prefix_tiers(a)  # a is now more recent than b
    cache.take_events()
    cache.insert(c)  # its write-through needs room: b goes
    events = cache.take_events()
    assert ("removed", MEDIUM_HOST, 1) in summary(events)
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert removed[0].block_hashes == block_hashes(b, PAGE)
    assert cache.peek_prefix_length(b) == 0
    assert cache.peek_prefix_length(a) == 4
    assert cache.host_size == 8


def test_a_device_page_without_a_host_copy_is_dropped() -> None:
    cache = tiered(host_tokens=4)  # the second prompt finds the host full of a duplicate
    a, b = list(range(100, 104)), list(range(200, 204))
    cache.insert(a)
    _, _, node = cache.match_prefix_tiers(a)
    cache.inc_lock_ref(node)  # a stays on the device, its host copy cannot go
    cache.insert(b)
    cache.take_events()
    assert cache.host_size == 4
    assert cache.evict(4) == 4
    assert summary(cache.take_events()) == [("removed", MEDIUM_GPU, 1)]
    assert cache.peek_prefix_length(b) == 0


def test_recomputing_a_host_only_page_puts_it_back_on_the_device() -> None:
    cache = tiered()
    cache.insert(list(range(8)))
    cache.evict(8)
    cache.take_events()
    cache.insert(list(range(12)))
    assert summary(cache.take_events()) == [
        ("stored", MEDIUM_GPU, 1),
        ("stored", MEDIUM_GPU, 1),  # the two host-only pages, recomputed
        ("stored", MEDIUM_GPU, 1),
        ("stored", MEDIUM_HOST, 1),
    ]
    assert cache.total_size == 12


# --- the engine: a host hit is loaded back before prefill, and counted as cached -----------

PALETTE = OutputPalette(load_tokenizer())


def make_core(**overrides: Any) -> EngineCore:
    config = dataclasses.replace(
        EngineConfig(cache_tokens=4096, page_size=16, emit_kv_events=True), **overrides
    )
    timer = StepTimer(lookup("v5e", "1x1"), get_profile("llama-3.1-8b"))
    return EngineCore(config, timer, PALETTE)


def prompt(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


def run_turns(core: EngineCore, first: int = 2000) -> tuple[Request, Any]:
    """A `first`-token prompt, two of 2,000 tokens that push it out of the 4,096-token pool,
    then the first again; returns its second request and the prefill step that served it."""
    sim = VirtualEngine(core)
    steps: list[Any] = []
    original = core.finish_step

    def record(step: Any, now: float) -> list[Request]:
        steps.append(step)
        return original(step, now)

    core.finish_step = record  # type: ignore[method-assign]
    for i, (n, start) in enumerate(((first, 10_000), (2000, 20_000), (2000, 30_000))):
        sim.submit(Request(f"r{i}", prompt(n, start), 4), at=float(i))
    again = Request("again", prompt(first, 10_000), 4)
    sim.submit(again, at=10.0)
    sim.run_to_completion()
    (served,) = [s for s in steps if s.kind == "prefill" and any(r is again for r, _ in s.prefill)]
    return again, served


def test_a_host_hit_is_loaded_back_at_the_catalogs_bandwidth_and_counted_as_cached() -> None:
    core = make_core(host_cache_tokens=8192)
    again, step = run_turns(core)
    assert again.cached_tokens == 1984  # 1,999 matchable tokens in whole pages
    assert again.cached_host_tokens == 1984
    assert step.prefill_host_tokens == 1984
    assert step.load_back_seconds == pytest.approx(core.timer.load_back_seconds(1984))
    assert step.load_back_seconds > 0
    assert step.prefill_compute_tokens == 16
    hbm_only = make_core()
    missed, _ = run_turns(hbm_only)
    assert missed.cached_tokens == 0
    assert again.first_token_time is not None
    assert missed.first_token_time is not None
    # loading back beats computing the prefill again
    assert again.first_token_time - again.arrival_time < missed.first_token_time - 10.0


def test_sglang_jax_loads_a_host_hit_back_only_into_free_slots() -> None:
    """SGLang-JAX's rule (`load_back_free_only`, the twin's sglang-jax flavour): the 1,984-token
    host hit does not fit the ~100 free slots the two other prompts leave, so it is computed
    again (nothing cached, no load back) and put back on the device; a host hit that fits
    the free slots is loaded back as SGLang does."""
    core = make_core(host_cache_tokens=8192, load_back_free_only=True)
    again, step = run_turns(core)
    assert (again.cached_tokens, again.cached_host_tokens) == (0, 0)
    assert (step.prefill_host_tokens, step.load_back_seconds) == (0, 0.0)
    assert step.prefill_compute_tokens == 2000
    assert core.cache.match_prefix_tiers(prompt(2000, 10_000)[:1999])[:2] == (1984, 0)
    # the third prompt evicts a 96-token first one and leaves room for its 80-token host
    # hit; a 128-token first one's 112 do not fit (SGLang, evicting for it, loads them back)
    small = make_core(host_cache_tokens=8192, load_back_free_only=True)
    loaded, step = run_turns(small, first=96)
    assert (loaded.cached_tokens, loaded.cached_host_tokens) == (80, 80)
    assert step.load_back_seconds > 0
    past = make_core(host_cache_tokens=8192, load_back_free_only=True)
    assert run_turns(past, first=128)[0].cached_tokens == 0
    assert run_turns(make_core(host_cache_tokens=8192), first=128)[0].cached_host_tokens == 112


def test_the_sglang_jax_flavour_has_its_load_back_rule() -> None:
    def engine(*flags: str) -> EngineConfig:
        parser = argparse.ArgumentParser()
        configure(parser)
        args = parser.parse_args(["--time-scale", "0", "--cache-tokens", "4096", *flags])
        return build_settings(args).engine

    assert engine("--flavor", "sglang-jax").load_back_free_only
    assert not engine().load_back_free_only
