"""Synthetic Mooncake-format traces reproduce the published statistics and the format's quirks."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tpuserve.bench import mooncake

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).resolve().parents[4] / "bench/traces/mooncake-conversation-small.jsonl"


def fixture_lines() -> list[mooncake.MooncakeLine]:
    """What bench/traces/mooncake-conversation-small.jsonl holds; regenerate the file with
    ``mooncake.write_lines(fixture_lines(), FIXTURE)`` when the generator changes."""
    shape = dataclasses.replace(mooncake.CONVERSATION, timestamp_quantum_ms=3000)
    return mooncake.generate_lines(shape, seed=0, requests=150)


@pytest.mark.parametrize("shape", list(mooncake.SHAPES.values()), ids=list(mooncake.SHAPES))
def test_shapes_reproduce_the_published_statistics(shape: mooncake.TraceShape) -> None:
    stats = mooncake.trace_stats(mooncake.generate_lines(shape, seed=0, requests=6000))
    published = shape.stats
    assert stats["mean_input_tokens"] == pytest.approx(published.mean_input_tokens, rel=0.1)
    assert stats["mean_output_tokens"] == pytest.approx(published.mean_output_tokens, rel=0.05)
    assert stats["reusable_share"] == pytest.approx(published.reusable_share, abs=0.05)
    if published.median_input_tokens is not None:
        assert stats["median_input_tokens"] == pytest.approx(published.median_input_tokens, rel=0.1)
    assert 1000 <= stats["max_input_tokens"] <= shape.max_input_tokens


def test_every_prompt_starts_with_the_shared_block_and_turns_extend_their_session() -> None:
    lines = mooncake.generate_lines(mooncake.CONVERSATION, seed=2, requests=400)
    assert all(line.hash_ids[0] == 0 for line in lines)
    block = mooncake.MOONCAKE_BLOCK_TOKENS
    by_session: dict[str, list[mooncake.MooncakeLine]] = {}
    for line in lines:
        assert len(line.hash_ids) == -(-line.input_length // block)  # ceil
        by_session.setdefault(line.session, []).append(line)
    multi = [turns for turns in by_session.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for earlier, later in itertools.pairwise(turns):
            whole = earlier.input_length // block
            assert later.hash_ids[:whole] == earlier.hash_ids[:whole]
            assert later.input_length > earlier.input_length


def test_hash_ids_are_numbered_in_order_of_first_appearance() -> None:
    lines = mooncake.generate_lines(mooncake.TOOL_AGENT, seed=0, requests=200)
    highest = -1
    for line in lines:
        for h in line.hash_ids:
            assert h <= highest + 1
            highest = max(highest, h)


def test_quantised_timestamps_repeat_as_in_the_published_trace() -> None:
    lines = fixture_lines()
    stamps = Counter(line.timestamp_ms for line in lines)
    assert all(ms % 3000 == 0 for ms in stamps)
    assert max(stamps.values()) >= 5


def test_checked_in_fixture_is_what_the_generator_writes() -> None:
    on_disk = [orjson.loads(raw) for raw in FIXTURE.read_bytes().splitlines()]
    assert on_disk == [line.to_json() for line in fixture_lines()]
    assert all(set(row) == {"timestamp", "input_length", "output_length", "hash_ids"}
               for row in on_disk)  # fmt: skip
