"""A real SGLang engine runs on loopback: it answers the native and OpenAI routes, reports
cached prefix tokens page by page, and publishes its KV cache as ZMQ events.

The KV events are decoded here with plain msgpack (a 0.5.23 batch is `[ts, [events], dp_rank]`
with each event a map tagged by "type"), independent of tpuserve's own decoder.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import msgpack
import openai
import pytest
import zmq

from sglang_tpu.tokenizer import load_tokenizer
from tests.real_sglang import RealEngine
from tests.waiting import eventually

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

SHARED_PREFIX_TOKENS = 192  # 12 pages of 16
FIRST_TOKEN_ID = 16  # below are the special tokens (sglang_tpu.tokenizer.SPECIAL_TOKENS)
VOCAB_SIZE = 2048
GREEDY = {"max_new_tokens": 4, "temperature": 0}


def random_ids(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN_ID, VOCAB_SIZE) for _ in range(count)]


def assert_page_aligned_prefix_cached(cached: int, page_size: int) -> None:
    full_pages = SHARED_PREFIX_TOKENS // page_size * page_size
    assert cached % page_size == 0, cached
    assert full_pages - page_size <= cached <= full_pages, cached


@pytest.fixture
def client(real_engine: RealEngine) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{real_engine.url}/v1", api_key="unused") as api:
        yield api


def test_generate_reports_a_shared_prefix_as_cached_tokens(real_engine: RealEngine) -> None:
    rng = random.Random(1)
    prefix = random_ids(rng, SHARED_PREFIX_TOKENS)
    answers = [
        real_engine.post_json(
            "/generate",
            {"input_ids": prefix + random_ids(rng, 20), "sampling_params": GREEDY},
        )
        for _ in range(2)
    ]
    first, second = (answer["meta_info"] for answer in answers)
    assert first["prompt_tokens"] == second["prompt_tokens"] == SHARED_PREFIX_TOKENS + 20
    assert first["cached_tokens"] == 0
    assert_page_aligned_prefix_cached(second["cached_tokens"], real_engine.page_size)
    assert second["completion_tokens"] >= 1
    assert isinstance(answers[1]["text"], str)


def test_openai_completions_answer_with_cached_tokens_in_usage(
    real_engine: RealEngine, client: openai.OpenAI
) -> None:
    rng = random.Random(2)
    prefix = random_ids(rng, SHARED_PREFIX_TOKENS)
    usages = []
    for _ in range(2):
        completion = client.completions.create(
            model=real_engine.model,
            prompt=prefix + random_ids(rng, 20),
            max_tokens=4,
            temperature=0,
        )
        assert completion.model == real_engine.model
        assert isinstance(completion.choices[0].text, str)
        assert completion.usage is not None
        usages.append(completion.usage)
    assert usages[0].prompt_tokens == SHARED_PREFIX_TOKENS + 20
    second = usages[1].prompt_tokens_details
    assert second is not None
    assert second.cached_tokens is not None
    assert_page_aligned_prefix_cached(second.cached_tokens, real_engine.page_size)


def test_text_prompts_are_tokenized_as_tpuserve_tokenizes_the_model(
    real_engine: RealEngine, client: openai.OpenAI
) -> None:
    text = "The router and the engine count 12345 tokens the same way, don't they?"
    completion = client.completions.create(model=real_engine.model, prompt=text, max_tokens=2)
    assert completion.usage is not None
    expected = len(load_tokenizer(str(real_engine.model_path)).encode(text))
    assert completion.usage.prompt_tokens == expected


def block_stored_events(frames: list[bytes], topic: str) -> list[dict[str, Any]]:
    """The BlockStored events of one `[topic, seq, payload]` message."""
    assert len(frames) == 3, frames
    assert frames[0] == topic.encode()
    assert len(frames[1]) == 8  # big-endian sequence number
    timestamp, events, dp_rank = msgpack.unpackb(frames[2])
    assert isinstance(timestamp, float)
    assert dp_rank == 0
    return [e for e in events if isinstance(e, dict) and e.get("type") == "BlockStored"]


def test_kv_events_publish_block_stored_for_a_new_prompt(real_engine: RealEngine) -> None:
    rng = random.Random(3)
    context = zmq.Context()
    try:
        sub = context.socket(zmq.SUB)
        sub.connect(real_engine.kv_events_endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, real_engine.kv_topic.encode())
        page = real_engine.page_size

        def stored_after_a_request() -> list[dict[str, Any]]:
            # A subscription takes effect asynchronously: send fresh prompts until one's blocks
            # arrive. Three full pages and one decoded token: the prompt's pages are stored.
            prompt = random_ids(rng, 3 * page)
            real_engine.post_json(
                "/generate",
                {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}},
            )
            while sub.poll(timeout=2000):
                for event in block_stored_events(sub.recv_multipart(), real_engine.kv_topic):
                    if event["token_ids"] == prompt:
                        return [event]
            return []

        (event,) = eventually(
            stored_after_a_request,
            what="a BlockStored event carrying a prompt's three pages",
            timeout_seconds=60,
            context=real_engine.log_tail,
        )
        assert event["block_size"] == page
        assert len(event["block_hashes"]) == 3
        assert all(isinstance(h, int) for h in event["block_hashes"])
        assert event["parent_block_hash"] is None  # a fresh prompt hangs off the root
    finally:
        context.destroy(linger=0)
