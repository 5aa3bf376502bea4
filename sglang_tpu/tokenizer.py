"""Tokenizers shared by the engine twin and the router, so both see identical token ids.

`load_tokenizer(path)` returns a `Tokenizer`:

- with a path to a Hugging Face ``tokenizer.json`` it wraps the `tokenizers` library;
- without one it returns the built-in default, ``tpuserve-default-v1``: a deterministic,
  table-free scheme that needs no file and costs well under a microsecond per token, because
  the router tokenizes every prompt on its hot path.

The default scheme (ids are stable; changing them is a breaking change):

==============  =========================================================================
ids             meaning
==============  =========================================================================
0 .. 15         special tokens: ``<|endoftext|>`` (EOS), ``<|im_start|>``, ``<|im_end|>``,
                then reserved ``<|reserved_N|>``; recognised as one token inside text
16 .. 271       one raw UTF-8 byte each (whitespace, punctuation, anything non-ASCII)
272 .. 2491     a run of 1-3 decimal digits, with or without one leading space
2492 ..         a chunk of 1-3 ASCII letters; a word is cut into 3-letter chunks from the
                left and only its first chunk carries the optional leading space
==============  =========================================================================

Pieces are found by one regular expression (specials, `` ?letters``, `` ?digits``, any other
character); each distinct piece is encoded once and cached. A space only ever leads a piece, so
text cut just before every space encodes word by word: encoding splits on spaces and looks up
each word's ids (cached per distinct short word), a dictionary lookup per word. Chat messages
are rendered with a ChatML template (``<|im_start|>role\\ncontent<|im_end|>\\n`` ...
``<|im_start|>assistant\\n``), the template Qwen models use; it is the one template both
tokenizers apply.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from itertools import chain, islice
from typing import Any, Protocol

DEFAULT_TOKENIZER_NAME = "tpuserve-default-v1"

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    *(f"<|reserved_{i}|>" for i in range(3, 16)),
)
EOS_TOKEN = "<|endoftext|>"

_BYTE_BASE = 16
_DIGIT_BASE = _BYTE_BASE + 256  # 272
_DIGITS_PER_FLAG = 10 + 100 + 1000  # groups of 1, 2 or 3 digits
_WORD_BASE = _DIGIT_BASE + 2 * _DIGITS_PER_FLAG  # 2492
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_NL = len(_LETTERS)
_WORDS_PER_FLAG = _NL + _NL**2 + _NL**3
DEFAULT_VOCAB_SIZE = _WORD_BASE + 2 * _WORDS_PER_FLAG
DEFAULT_SCHEME_NUMBERS: tuple[list[str], int, int, int, int, int] = (
    list(SPECIAL_TOKENS), _BYTE_BASE, _DIGIT_BASE, _DIGITS_PER_FLAG, _WORD_BASE, _WORDS_PER_FLAG,
)  # fmt: skip
"""The scheme's numbers, for an encoder written elsewhere (the router's compiled one): the
special tokens (id = position), the byte and digit bases, the digit ids per space flag, the
word base and the word ids per space flag."""

_LETTER_INDEX = {c: i for i, c in enumerate(_LETTERS)}
_SPECIAL_IDS = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
_PIECE_RE = re.compile(
    "|".join(re.escape(t) for t in SPECIAL_TOKENS) + r"| ?[A-Za-z]+| ?[0-9]+|[^A-Za-z0-9]",
    re.DOTALL,
)
_CACHE_LIMIT = 500_000
_WORD_CHARS = 64
"""Words (text between spaces) up to this long have their ids cached."""
_WORD_CACHE_LIMIT = 65_536
"""Words whose ids `_WordIds` keeps before it starts over."""
_WORD_IDS = 16
"""Words of at most this many ids are cached (a long run of symbols is not worth keeping)."""


class TokenizerError(ValueError):
    """A tokenizer file that cannot be loaded, or ids outside the vocabulary."""


class Tokenizer(Protocol):
    """What the engine twin and the router need from a tokenizer."""

    name: str
    vocab_size: int
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]]) -> str: ...


def render_chatml(messages: Sequence[Mapping[str, Any]]) -> str:
    """ChatML rendering with the generation prompt; content may be a string or text parts."""
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            text = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        else:
            text = "" if content is None else str(content)
        parts.append(f"<|im_start|>{message.get('role', 'user')}\n{text}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _letters_id(chunk: str, spaced: bool) -> int:
    n = len(chunk)
    value = 0
    for c in chunk:
        value = value * _NL + _LETTER_INDEX[c]
    offset = (0, 0, _NL, _NL + _NL**2)[n]
    return _WORD_BASE + (_WORDS_PER_FLAG if spaced else 0) + offset + value


def _digits_id(group: str, spaced: bool) -> int:
    offset = (0, 0, 10, 110)[len(group)]
    return _DIGIT_BASE + (_DIGITS_PER_FLAG if spaced else 0) + offset + int(group)


def _id_text(token_id: int) -> str:
    """Text of a non-byte id (special, digit group or letter chunk)."""
    if token_id < _BYTE_BASE:
        return SPECIAL_TOKENS[token_id]
    if _DIGIT_BASE <= token_id < _WORD_BASE:
        rel = token_id - _DIGIT_BASE
        spaced, rel = divmod(rel, _DIGITS_PER_FLAG)
        if rel < 10:
            text = str(rel)
        elif rel < 110:
            text = f"{rel - 10:02d}"
        else:
            text = f"{rel - 110:03d}"
        return " " + text if spaced else text
    rel = token_id - _WORD_BASE
    spaced, rel = divmod(rel, _WORDS_PER_FLAG)
    if rel < _NL:
        n, value = 1, rel
    elif rel < _NL + _NL**2:
        n, value = 2, rel - _NL
    else:
        n, value = 3, rel - _NL - _NL**2
    chars = []
    for _ in range(n):
        value, r = divmod(value, _NL)
        chars.append(_LETTERS[r])
    text = "".join(reversed(chars))
    return " " + text if spaced else text


class DefaultTokenizer:
    """The built-in tokenizer (scheme in the module docstring); needs no file."""

    def __init__(self) -> None:
        self.name = DEFAULT_TOKENIZER_NAME
        self.vocab_size = DEFAULT_VOCAB_SIZE
        self.eos_token_id = _SPECIAL_IDS[EOS_TOKEN]
        self._piece_ids: dict[str, tuple[int, ...]] = {}
        self._word_ids = _WordIds(self._encode_pieces)
        self._id_texts: dict[int, str] = {}

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        special = _SPECIAL_IDS.get(piece)
        if special is not None:
            return (special,)
        spaced = piece[0] == " " and len(piece) > 1
        body = piece[1:] if spaced else piece
        first = body[0]
        ids: list[int] = []
        if first in _LETTER_INDEX:
            for start in range(0, len(body), 3):
                ids.append(_letters_id(body[start : start + 3], spaced and start == 0))
        elif first.isdigit() and first.isascii():
            for start in range(0, len(body), 3):
                ids.append(_digits_id(body[start : start + 3], spaced and start == 0))
        else:
            ids.extend(_BYTE_BASE + b for b in piece.encode("utf-8"))
        return tuple(ids)

    def encode(self, text: str) -> list[int]:
        words = text.split(" ")
        out = self._encode_pieces(words[0]) if words[0] else []
        out.extend(chain.from_iterable(map(self._word_ids.__getitem__, islice(words, 1, None))))
        return out

    def _encode_pieces(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._piece_ids
        get = cache.get
        extend = out.extend
        for piece in _PIECE_RE.findall(text):
            ids = get(piece)
            if ids is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                ids = cache[piece] = self._encode_piece(piece)
            extend(ids)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        parts: list[str] = []
        pending = bytearray()
        texts = self._id_texts
        for token_id in ids:
            if _BYTE_BASE <= token_id < _DIGIT_BASE:
                pending.append(token_id - _BYTE_BASE)
                continue
            if pending:
                parts.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            text = texts.get(token_id)
            if text is None:
                if not 0 <= token_id < self.vocab_size:
                    raise TokenizerError(
                        f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})"
                    )
                text = texts[token_id] = _id_text(token_id)
            parts.append(text)
        if pending:
            parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return render_chatml(messages)


class _WordIds(dict[str, list[int]]):
    """Ids of a space and the word after it, keyed by the word, computed on first use (only
    words up to `_WORD_CHARS` characters and `_WORD_IDS` ids are kept; the whole cache is
    dropped at `_WORD_CACHE_LIMIT`, so what clients send bounds neither count nor size)."""

    def __init__(self, encode: Callable[[str], list[int]]) -> None:
        super().__init__()
        self._encode = encode

    def __missing__(self, word: str) -> list[int]:
        ids = self._encode(" " + word)
        if len(word) <= _WORD_CHARS and len(ids) <= _WORD_IDS:
            if len(self) >= _WORD_CACHE_LIMIT:
                self.clear()
            self[word] = ids
        return ids


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` through the `tokenizers` library."""

    _EOS_CANDIDATES = ("<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "</s>", "<eos>")

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer as _HF

        try:
            self._tok = _HF.from_file(path)
        except Exception as err:  # the library raises its own Exception subclass
            raise TokenizerError(f"--tokenizer: cannot load {path!r}: {err}") from err
        self.name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        eos = 0
        for candidate in self._EOS_CANDIDATES:
            found = self._tok.token_to_id(candidate)
            if found is not None:
                eos = int(found)
                break
        self.eos_token_id = eos

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return render_chatml(messages)


def load_tokenizer(path: str | None = None) -> Tokenizer:
    """The tokenizer at `path` (a ``tokenizer.json``), or the built-in default when None."""
    if path is None or path in ("", DEFAULT_TOKENIZER_NAME):
        return DefaultTokenizer()
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        raise TokenizerError(
            f"--tokenizer: {path!r} is not a file; give a tokenizer.json path or omit the "
            f"flag for the built-in {DEFAULT_TOKENIZER_NAME}"
        )
    return HFTokenizer(path)
