"""The engine core on the virtual clock: batching, caching, chunking, limits and timing."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sglang_tpu.kv_events import KVEvent
from sglang_tpu.perf_model import StepTimer, get_profile
from sglang_tpu.sim.engine import EngineConfig, EngineCore, QueueFull
from sglang_tpu.sim.output_text import OutputPalette, output_text
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.virtual_clock import VirtualEngine
from sglang_tpu.tokenizer import load_tokenizer
from sglang_tpu.topology import lookup

pytestmark = pytest.mark.unit

TOKENIZER = load_tokenizer()
PALETTE = OutputPalette(TOKENIZER)


BASE_CONFIG = EngineConfig(cache_tokens=100_000, page_size=16)


def make_core(**overrides: Any) -> EngineCore:
    """A core on BASE_CONFIG with `overrides` (EngineConfig fields, as `dataclasses.replace`)."""
    config = dataclasses.replace(BASE_CONFIG, **overrides)
    timer = StepTimer(lookup("v6e", "1x1"), get_profile("llama-3.1-8b"))
    return EngineCore(config, timer, PALETTE)


def prompt(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


def test_a_request_gets_exactly_its_tokens_and_sane_timings() -> None:
    sim = VirtualEngine(make_core())
    sim.submit(Request("a", prompt(100), 10), at=1.0)
    (done,) = sim.run_to_completion()
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens) == (100, 10, 0)
    assert done.arrival_time == 1.0
    assert 0 < done.ttft < done.e2e
    assert done.finish_reason == {"type": "length", "length": 10}


def test_second_identical_prompt_hits_the_cache_in_whole_pages() -> None:
    sim = VirtualEngine(make_core())
    sim.submit(Request("a", prompt(4000), 4), at=0.0)
    sim.submit(Request("b", prompt(4000), 4), at=5.0)
    first, second = sim.run_to_completion()
    assert first.cached_tokens == 0
    assert second.cached_tokens == 3984  # 3999 matchable tokens, cut to whole 16-token pages
    assert second.ttft < first.ttft


def test_output_is_deterministic_for_the_same_prompt_and_seed() -> None:
    outs = []
    for _ in range(2):
        core = make_core()
        sim = VirtualEngine(core)
        req = Request("a", prompt(50), 20)
        sim.submit(req, at=0.0)
        sim.run_to_completion()
        outs.append((req.output_ids, output_text(req, PALETTE)))
    assert outs[0] == outs[1]
    assert outs[0][1].startswith(" ")


def test_a_greedy_answer_continues_from_its_prompt_plus_what_it_generated() -> None:
    """A greedy request's next token is a function of its whole sequence so far, as a
    language model's greedy decoding: the prompt plus the first k tokens of an answer, sent
    again, generate that answer's remaining tokens (a router migrating a stream relies on it);
    a seeded request does not (its seed, not its prefix, drives it)."""

    def run(ids: list[int], n: int, seed: int | None = None) -> list[int]:
        sim = VirtualEngine(make_core())
        req = Request("a", ids, n, sampling_seed=seed)
        sim.submit(req, at=0.0)
        sim.run_to_completion()
        return list(req.output_ids)

    whole = run(prompt(50), 20)
    for k in (1, 7, 19):
        assert run(prompt(50) + whole[:k], 20 - k) == whole[k:]
    assert len(set(whole)) > 1  # not one word repeated
    seeded = run(prompt(50), 20, seed=7)
    assert run(prompt(50) + seeded[:5], 15, seed=7) != seeded[5:]


def test_continuous_batching_decodes_requests_together() -> None:
    core = make_core()
    sim = VirtualEngine(core)
    for i in range(8):
        sim.submit(Request(f"r{i}", prompt(64, start=i * 1000), 50), at=0.0)
    done = sim.run_to_completion()
    assert len(done) == 8
    serial = make_core()
    one = VirtualEngine(serial)
    one.submit(Request("x", prompt(64), 50), at=0.0)
    (alone,) = one.run_to_completion()
    assert max(d.e2e for d in done) < 8 * alone.e2e / 2


def test_max_running_requests_bounds_the_batch() -> None:
    core = make_core(max_running_requests=2)
    sim = VirtualEngine(core)
    for i in range(5):
        sim.submit(Request(f"r{i}", prompt(32, start=i * 100), 30), at=0.0)
    sim.run_until(0.001)
    assert core.num_running <= 2
    assert core.num_waiting == 3
    assert len(sim.run_to_completion()) == 5


def test_long_prompts_are_chunk_prefilled() -> None:
    core = make_core(chunked_prefill_size=256)
    sim = VirtualEngine(core)
    sim.submit(Request("long", prompt(1000), 2), at=0.0)
    steps = 0
    while not sim.idle:
        sim.run_until(sim.now + 1e-3)
        steps += 1
    assert core.cache.total_size >= 992
    assert core.num_running == 0
    assert steps > 3


def test_waiting_queue_bound_raises_queue_full() -> None:
    core = make_core(max_queued_requests=2)
    core.add_request(Request("a", prompt(10), 1), 0.0)
    core.add_request(Request("b", prompt(10), 1), 0.0)
    with pytest.raises(QueueFull, match="max-queued-requests 2"):
        core.add_request(Request("c", prompt(10), 1), 0.0)


def test_small_pool_evicts_and_still_finishes_everything() -> None:
    core = make_core(cache_tokens=2048, context_length=2048)
    sim = VirtualEngine(core)
    for i in range(40):
        sim.submit(Request(f"r{i}", prompt(300, start=i * 1000), 100), at=i * 0.01)
    done = sim.run_to_completion()
    assert len(done) == 40
    assert core.cache.evicted_tokens_total > 0
    assert core.num_used_tokens == 0
    assert core.private_tokens == 0


def test_stop_strings_end_the_request_and_trim_the_text() -> None:
    core = make_core()
    sim = VirtualEngine(core)
    probe = Request("p", prompt(20), 30)
    sim.submit(probe, at=0.0)
    sim.run_to_completion()
    full = output_text(probe, PALETTE)
    stop = full.split(" ")[3]
    again = make_core()
    sim2 = VirtualEngine(again)
    req = Request("q", prompt(20), 30, stop_strings=[" " + stop])
    sim2.submit(req, at=0.0)
    (done,) = sim2.run_to_completion()
    assert done.finish_reason == {"type": "stop", "matched": " " + stop}
    assert full.startswith(output_text(req, PALETTE))
    assert (" " + stop) not in output_text(req, PALETTE)


def test_kv_events_reach_the_sink_every_step() -> None:
    batches: list[list[KVEvent]] = []
    core = make_core(emit_kv_events=True)
    core.kv_event_sink = batches.append
    sim = VirtualEngine(core)
    sim.submit(Request("a", prompt(64), 3), at=0.0)
    sim.run_to_completion()
    assert batches
    assert core.flush_cache()
    assert type(batches[-1][-1]).__name__ == "AllBlocksCleared"


def test_flush_is_refused_while_requests_run() -> None:
    core = make_core()
    core.add_request(Request("a", prompt(10), 5), 0.0)
    assert not core.flush_cache()


def test_oracle_sees_the_cache_without_changing_it() -> None:
    core = make_core()
    sim = VirtualEngine(core)
    sim.submit(Request("a", prompt(64), 2), at=0.0)
    sim.run_to_completion()
    before = core.cache.total_size
    assert core.match_prefix_length(prompt(64)) == 64
    assert core.cache.total_size == before


def test_abort_frees_everything() -> None:
    core = make_core()
    req = Request("a", prompt(100), 50)
    core.add_request(req, 0.0)
    step = core.begin_step(0.0)
    assert step is not None
    core.finish_step(step, step.duration)
    assert core.abort(req, 1.0)
    assert core.num_running == 0
    assert core.num_used_tokens == 0


def test_waiting_uncached_tokens_count_past_the_cached_prefix_and_the_chunk_left() -> None:
    """As SGLang 0.5.23's ``num_waiting_uncached_tokens`` (/v1/loads): each waiting request's
    tokens past the prefix the cache holds, plus what the chunked request has left."""
    core = make_core(chunked_prefill_size=256)
    sim = VirtualEngine(core)
    sim.submit(Request("warm", prompt(320), 1), at=0.0)
    sim.run_to_completion()
    cached = core.match_prefix_length(prompt(400))
    assert cached == 320  # the warm prompt, in whole pages
    core.add_request(Request("long", prompt(1000, start=50_000), 1), sim.now)
    core.add_request(Request("shares", prompt(400), 1), sim.now)
    assert core.waiting_uncached_tokens == 1000 + (400 - cached)
    while core.chunked is None or not core.chunked.prefilled:  # its first chunk is done
        sim.run_until(sim.now + 1e-3)
    assert core.chunked.prefilled == 256
    assert core.waiting_uncached_tokens == (1000 - 256) + (400 - cached)
