"""Cached chat tokenization gives exactly the engine's token ids, and pays once per piece."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tpuserve_router.pipeline.token_cache import ChatTokenCache

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


def test_the_cache_is_bounded_by_bytes() -> None:
    cache = ChatTokenCache(TOKENIZER, max_bytes=1000)
    for i in range(100):
        cache.encode_chat([{"role": "user", "content": f"{i} " * 50}])
    assert 0 < cache.cached_bytes <= 1000


def test_a_piece_in_use_outlives_pieces_read_once() -> None:
    """Eviction approximates least recently used (the clock: a piece read since the hand
    last passed it gets a second chance): a system prompt read by every request stays cached
    while the cache turns over many times with questions read once."""
    cache = ChatTokenCache(TOKENIZER, max_bytes=2000)
    system = {"role": "system", "content": "You are helpful. " * 10}
    for i in range(200):
        cache.encode_chat([system, {"role": "user", "content": f"question {i} " * 20}])
        assert 0 < cache.cached_bytes <= 2000
    assert cache.misses == 1 + 200 + 1  # the system piece once, each question, the prompt
    assert cache.hits == 199 + 199
    again = cache.misses
    cache.encode_chat([{"role": "user", "content": "question 0 " * 20}])
    assert cache.misses == again + 1  # the first questions went long ago


def test_the_compiled_encoding_equals_the_specification() -> None:
    """The router's compiled encoding of the built-in scheme gives the ids of
    `sglang_tpu.tokenizer` (the engine twin's) on random text: specials whole and cut short,
    letter and digit runs of every length, spaces before them or not, multi-byte
    characters."""
    rng = random.Random(11)
    cache = ChatTokenCache(TOKENIZER)
    pieces = [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|reserved_15|>", "<|im_sta", "<|",
        " ", "  ", "a", "Zz", "abcdefg", "0", "12", "0071234", "\n", "\t", "é", "漢字", "🙂",
        "\u00a0", "٣", "x1", "_", "<",
    ]  # fmt: skip
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        ids = cache.encode(text)
        assert ids == TOKENIZER.encode(text), text
        assert len(ids) == len(TOKENIZER.encode(text))


def test_token_ids_read_as_a_sequence() -> None:
    ids = ChatTokenCache(TOKENIZER).encode("hello world 42")
    expected = TOKENIZER.encode("hello world 42")
    assert list(ids) == expected == ids.tolist()
    assert ids[0] == expected[0]
    assert ids[-1] == expected[-1]
    assert ids[1:3] == expected[1:3]
    assert len(ids) == len(expected)
    assert bool(ids)
    with pytest.raises(IndexError):
        ids[len(expected)]


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


def test_a_hugging_face_tokenizer_encodes_through_the_cache(tmp_path: Path) -> None:
    """Other tokenizers are called from the compiled cache: whole prompts (never chunked),
    chat pieces cut at ``<|im_start|>`` and cached."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2, "hello": 3, "world": 4, "user": 5}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens([AddedToken("<|im_start|>"), AddedToken("<|im_end|>")])
    hf.save(str(tmp_path / "tokenizer.json"))
    tokenizer = load_tokenizer(str(tmp_path / "tokenizer.json"))
    cache = ChatTokenCache(tokenizer)
    assert not cache.chunked
    text = "hello world " * 100
    assert cache.encode(text) == tokenizer.encode(text)
    messages = [{"role": "user", "content": "hello world"}]
    expected = tokenizer.encode(tokenizer.apply_chat_template(messages))
    assert cache.encode_chat(messages) == expected
    assert cache.encode_chat(messages) == expected
    assert cache.hits == 2
    assert cache.misses == 2
