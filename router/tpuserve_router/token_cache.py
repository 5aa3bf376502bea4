"""Token ids of chat prompts, with the shared parts (system prompts, earlier turns) cached.

Token policies need a prompt's token ids exactly as the engine computes them: the chat
template applied, then encoded. Encoding a 2 kB prompt costs about 120 µs, most of it spent
on a system prompt that thousands of requests share. The rendered template is split just
before every ``<|im_start|>``: tokenizers never merge across a special token (the built-in
one matches it as a piece of its own; Hugging Face tokenizers split on added tokens first),
so encoding the pieces separately and concatenating gives the same ids as encoding the
whole. Each piece's ids are cached (least recently used first out, bounded by characters),
so a request pays only for its new turns.

With the built-in tokenizer, plain-text prompts (and long chat pieces) are also cut into
chunks of about ``CHUNK_CHARS`` characters, each ending just before a space: that tokenizer
starts a new piece at every space (a space only ever leads a piece), so chunks encode
independently, and prompts that share a prefix share their leading chunks. Hugging Face
tokenizers are not chunked (a pre-tokenizer may merge runs of spaces, or none may split on
them), only split at special tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from sglang_tpu.tokenizer import DEFAULT_TOKENIZER_NAME, Tokenizer

TURN_START = "<|im_start|>"
CHUNK_CHARS = 256


class ChatTokenCache:
    def __init__(self, tokenizer: Tokenizer, max_chars: int = 32 * 1024 * 1024) -> None:
        self.tokenizer = tokenizer
        self.max_chars = max_chars
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self.hits = 0
        self.misses = 0
        self.chunked = tokenizer.name == DEFAULT_TOKENIZER_NAME

    def encode(self, text: str) -> list[int]:
        """``tokenizer.encode(text)``, reusing the ids of chunks seen before."""
        if not self.chunked or len(text) < 2 * CHUNK_CHARS:
            return self.tokenizer.encode(text)
        ids: list[int] = []
        for chunk in _chunks(text):
            ids.extend(self._piece(chunk))
        return ids

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """``encode(apply_chat_template(messages))``, reusing the ids of pieces seen before."""
        text = self.tokenizer.apply_chat_template(messages)
        pieces = text.split(TURN_START)
        ids: list[int] = []
        if pieces[0]:
            ids.extend(self._cached(pieces[0]))
        for piece in pieces[1:]:
            ids.extend(self._cached(TURN_START + piece))
        return ids

    def _cached(self, piece: str) -> list[int]:
        if self.chunked and len(piece) >= 2 * CHUNK_CHARS:
            ids: list[int] = []
            for chunk in _chunks(piece):
                ids.extend(self._piece(chunk))
            return ids
        return self._piece(piece)

    def _piece(self, piece: str) -> list[int]:
        cache = self._pieces
        ids = cache.get(piece)
        if ids is not None:
            cache.move_to_end(piece)
            self.hits += 1
            return ids
        self.misses += 1
        ids = self.tokenizer.encode(piece)
        if len(piece) <= self.max_chars:
            cache[piece] = ids
            self._chars += len(piece)
            while self._chars > self.max_chars:
                old, _ = cache.popitem(last=False)
                self._chars -= len(old)
        return ids


def _chunks(text: str) -> list[str]:
    """``text`` cut just before a space after every ``CHUNK_CHARS`` characters."""
    out = []
    start = 0
    end = len(text)
    while start < end:
        cut = text.find(" ", start + CHUNK_CHARS)
        if cut < 0:
            out.append(text[start:])
            break
        out.append(text[start:cut])
        start = cut
    return out
