"""Cached chat tokenization gives exactly the engine's token ids, and pays once per piece."""

from __future__ import annotations

import random

import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tpuserve_router.token_cache import ChatTokenCache

pytestmark = pytest.mark.unit

TOKENIZER = load_tokenizer()
ALPHABET = "abcXYZ 0123456789.,;:!?\n\t-_'\"éü漢<>|"


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 80)))


def test_ids_equal_encoding_the_whole_rendered_chat() -> None:
    rng = random.Random(3)
    cache = ChatTokenCache(TOKENIZER)
    for _ in range(300):
        messages = [
            {"role": rng.choice(["system", "user", "assistant"]), "content": random_text(rng)}
            for _ in range(rng.randint(1, 4))
        ]
        expected = TOKENIZER.encode(TOKENIZER.apply_chat_template(messages))
        assert cache.encode_chat(messages) == expected


def test_a_shared_system_prompt_is_encoded_once() -> None:
    cache = ChatTokenCache(TOKENIZER)
    system = {"role": "system", "content": "You are helpful. " * 20}  # one chunk
    for i in range(10):
        cache.encode_chat([system, {"role": "user", "content": f"question {i}"}])
    assert cache.misses == 1 + 10 + 1  # the system piece, each question, the generation prompt
    assert cache.hits == 9 + 9


def test_the_cache_is_bounded_by_characters() -> None:
    cache = ChatTokenCache(TOKENIZER, max_chars=1000)
    for i in range(100):
        cache.encode_chat([{"role": "user", "content": f"{i} " * 50}])
    assert cache._chars <= 1000


def test_chunked_plain_prompts_equal_encoding_the_whole() -> None:
    rng = random.Random(5)
    cache = ChatTokenCache(TOKENIZER)
    assert cache.chunked
    alphabet = ALPHABET + "      "
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 3000)))
        assert cache.encode(text) == TOKENIZER.encode(text)
    messages = [{"role": "user", "content": "".join(rng.choice(alphabet) for _ in range(2000))}]
    assert cache.encode_chat(messages) == TOKENIZER.encode(TOKENIZER.apply_chat_template(messages))


def test_prompts_sharing_a_prefix_share_its_chunks() -> None:
    cache = ChatTokenCache(TOKENIZER)
    shared = "You are a careful assistant. " * 60
    cache.encode(shared + "first question")
    before = cache.misses
    cache.encode(shared + "second question")
    assert cache.misses - before <= 2  # only the chunks holding the new text
