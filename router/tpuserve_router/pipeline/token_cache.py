"""Token ids of chat prompts, with the shared parts (system prompts, earlier turns) cached.

Token policies need a prompt's token ids exactly as the engine computes them: the chat
template applied, then encoded. Encoding a 2 kB prompt costs about 120 µs, most of it spent
on a system prompt that thousands of requests share. The rendered template is split just
before every ``<|im_start|>``: tokenizers never merge across a special token (the built-in
one matches it as a piece of its own; Hugging Face tokenizers split on added tokens first),
so encoding the pieces separately and concatenating gives the same ids as encoding the
whole. Each piece's ids are cached, bounded by the memory they take (``max_bytes``, 64 MiB by
default: 4 bytes per id and an estimate of each piece's table overhead; with the built-in
tokenizer about 28 MiB of prompt text), so the bound holds whatever the tokenizer; the clock
algorithm, an approximation of least recently used, picks what goes. A request pays only for
its new turns. Pieces are keyed by a 128-bit hash of their text (a collision would only
route one piece as the other; the engine still receives the request's own text).

With the built-in tokenizer, plain-text prompts (and long chat pieces) are also cut into
chunks of about ``CHUNK_BYTES`` bytes, each ending just before a space: that tokenizer
starts a new piece at every space (a space only ever leads a piece), so chunks encode
independently, and prompts that share a prefix share their leading chunks. Hugging Face
tokenizers are not chunked (a pre-tokenizer may merge runs of spaces, or none may split on
them), only split at special tokens.

The cache, and the built-in tokenizer's encoding, are compiled (`tpuserve_router._native`,
the block index's module): the ids stay in one native array (`TokenIds`, a read-only
sequence of ints) from the cache to the block index's keys, so a request creates no Python
int per token. The built-in scheme's numbers come from `sglang_tpu.tokenizer`, its
specification; `tests/unit/router/test_token_cache.py` checks both encodings agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sglang_tpu.tokenizer import DEFAULT_SCHEME_NUMBERS, DEFAULT_TOKENIZER_NAME, Tokenizer
from tpuserve_router._native import TokenCache, TokenIds

__all__ = ["CHUNK_BYTES", "MAX_BYTES", "TURN_START", "ChatTokenCache", "TokenIds"]

TURN_START = "<|im_start|>"
CHUNK_BYTES = 256
MAX_BYTES = 64 * 1024 * 1024
"""The cache's default bound, in bytes of memory (ids and table overhead)."""

Sequence.register(TokenIds)  # it is one (len, indexing, slices, iteration, count, index)


class ChatTokenCache:
    def __init__(self, tokenizer: Tokenizer, max_bytes: int = MAX_BYTES) -> None:
        self.tokenizer = tokenizer
        self.chunked = tokenizer.name == DEFAULT_TOKENIZER_NAME
        self._cache = TokenCache(
            None if self.chunked else tokenizer.encode,
            DEFAULT_SCHEME_NUMBERS if self.chunked else None,
            max_bytes,
            CHUNK_BYTES,
        )

    @property
    def hits(self) -> int:
        return self._cache.hits

    @property
    def misses(self) -> int:
        return self._cache.misses

    @property
    def cached_bytes(self) -> int:
        return self._cache.cached_bytes

    def encode(self, text: str) -> TokenIds:
        """``tokenizer.encode(text)``, reusing the ids of chunks seen before."""
        return self._cache.encode(text)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> TokenIds:
        """``encode(apply_chat_template(messages))``, reusing the ids of pieces seen before."""
        return self._cache.encode_pieces(self.tokenizer.apply_chat_template(messages), TURN_START)
