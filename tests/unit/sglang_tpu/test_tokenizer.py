"""The default tokenizer round-trips any text, is deterministic and knows the chat markers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import sglang_tpu.tokenizer as tokenizer_module
from sglang_tpu.tokenizer import (
    _PIECE_RE,
    _WORD_IDS,
    DEFAULT_TOKENIZER_NAME,
    DEFAULT_VOCAB_SIZE,
    DefaultTokenizer,
    TokenizerError,
    _WordIds,
    load_tokenizer,
)

pytestmark = pytest.mark.unit

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog 1234567 times.",
    "  leading and   multiple   spaces\n\tand tabs\n",
    "naïve café — 東京 🚀 emoji",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "x" * 1000,
    "9" * 10 + " 42 007",
]


@pytest.mark.parametrize("text", TEXTS)
def test_default_tokenizer_round_trips_text(text: str) -> None:
    tok = load_tokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)


def random_texts(count: int) -> list[str]:
    rng = random.Random(7)
    alphabet = ["a", "Zq", "7", "  ", " ", "\n", "\t", ",", "é", "東", "🚀", "<|im_start|>",
                "<|im_end|>", "<|reserved_13|>", "<|", "x" * 70, " " + "y" * 70, "0"]  # fmt: skip
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(60))) for _ in range(count)]


@pytest.mark.parametrize("text", TEXTS + random_texts(300))
def test_encoding_word_by_word_equals_one_scan_of_the_whole_text(text: str) -> None:
    tok = DefaultTokenizer()
    one_scan = [i for piece in _PIECE_RE.findall(text) for i in tok._encode_piece(piece)]
    assert tok.encode(text) == one_scan
    assert tok.encode(text) == one_scan  # again, from the word cache


def test_default_tokenizer_is_deterministic_across_instances() -> None:
    text = "A system prompt shared by many requests, 2048 tokens long."
    assert load_tokenizer().encode(text) == load_tokenizer().encode(text)
    assert load_tokenizer().name == DEFAULT_TOKENIZER_NAME
    assert load_tokenizer().vocab_size == DEFAULT_VOCAB_SIZE


def test_words_become_few_tokens_and_markers_one_token() -> None:
    tok = load_tokenizer()
    assert len(tok.encode(" the")) == 1
    assert len(tok.encode(" hello")) == 2
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|endoftext|>") == [tok.eos_token_id]


def test_prefix_text_gives_prefix_ids_at_word_boundaries() -> None:
    tok = load_tokenizer()
    system = "You are a helpful assistant."
    assert tok.encode(system + " Question one?")[: len(tok.encode(system))] == tok.encode(system)


def test_chat_template_is_chatml_with_generation_prompt() -> None:
    tok = load_tokenizer()
    rendered = tok.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ]
    )
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_decode_rejects_ids_outside_the_vocabulary() -> None:
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        load_tokenizer().decode([DEFAULT_VOCAB_SIZE])


def test_missing_tokenizer_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="--tokenizer"):
        load_tokenizer(str(tmp_path / "nope.json"))


def test_hf_tokenizer_json_is_wrapped(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<|endoftext|>": 1, "hello": 2, "world": 3}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    tok = load_tokenizer(str(path))
    assert tok.encode("hello world") == [2, 3]
    assert tok.eos_token_id == 1
    assert tok.vocab_size == 4
    assert load_tokenizer(str(tmp_path)).encode("world") == [3]


def test_the_word_cache_keeps_short_words_within_its_own_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokenizer_module, "_WORD_CACHE_LIMIT", 4)
    cache = _WordIds(lambda text: [ord(c) for c in text])  # one id per character
    many_ids = "x" * (_WORD_IDS + 1)  # a space and this: more ids than are worth keeping
    assert cache[many_ids] == [ord(c) for c in " " + many_ids]
    assert many_ids not in cache
    for word in ("a", "b", "c", "d", "e"):
        assert cache[word] == [32, ord(word)]
        assert len(cache) <= 4
    assert "e" in cache
