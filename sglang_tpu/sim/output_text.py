"""The twin's output: deterministic pseudo-text of one-token words, cut at stop strings.

A request with a sampling seed draws its tokens with its own LCG over a palette of one-token
words of the tokenizer, seeded from the engine seed and the request's seed. A greedy request
(no seed) decodes as a language model does greedily: each next token is a function of the
engine seed and every token before it (the prompt and what was generated so far), folded into
the generator's state one token at a time; so a request whose prompt is another's prompt plus
the first k tokens of its answer continues that answer from its token k + 1 (what a router
migrating a stream relies on). Either way the same request on the same engine always produces
the same text. The twin never samples EOS: a request runs to its ``max_new_tokens`` unless a
stop string or stop token id matches.
"""

from __future__ import annotations

from sglang_tpu.sim.request import Request
from sglang_tpu.tokenizer import Tokenizer

_MASK64 = (1 << 64) - 1
_LCG_A = 6364136223846793005
_LCG_C = 1442695040888963407

PALETTE_WORDS = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " was", " with",
    " be", " by", " on", " not", " he", " this", " are", " or", " his", " from", " at",
    " which", " but", " have", " an", " had", " they", " you", " were", " their", " one",
    " all", " we", " can", " her", " has", " there", " been", " if", " more", " when",
    " will", " would", " who", " so", " no", " out", " up", " into", " that", " time",
    " new", " some", " them", " two", " may", " only", " over", " such", " our", " any",
    " most", " made", " after", " first", " also", " did", " many", " way", " well", " year",
)  # fmt: skip


class OutputPalette:
    """One-token words of a tokenizer from which output tokens are drawn."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        ids: list[int] = []
        texts: list[str] = []
        seen: set[int] = set()
        for word in PALETTE_WORDS:
            encoded = tokenizer.encode(word)
            if (
                len(encoded) == 1
                and encoded[0] not in seen
                and encoded[0] != tokenizer.eos_token_id
                and tokenizer.decode(encoded) == word
            ):
                seen.add(encoded[0])
                ids.append(encoded[0])
                texts.append(word)
        if not ids:  # an unusual vocabulary: fall back to any decodable non-EOS ids
            for token_id in range(min(tokenizer.vocab_size, 512)):
                if token_id != tokenizer.eos_token_id:
                    ids.append(token_id)
                    texts.append(tokenizer.decode([token_id]))
                if len(ids) >= 64:
                    break
        self.ids = ids
        self.texts = texts
        self.text_of = dict(zip(ids, texts, strict=True))


def _fold(state: int, token: int) -> int:
    """The greedy generator's state after one more token of the sequence."""
    return ((state ^ token) * _LCG_A + _LCG_C) & _MASK64


def seed_output(req: Request, engine_seed: int) -> None:
    """Start the request's generator: from its sampling seed, or (greedy) from the engine
    seed with every prompt token folded in."""
    seed = req.sampling_seed
    start = engine_seed * 0x9E3779B97F4A7C15 & _MASK64
    if seed is None:
        state = start
        for token in req.input_ids:
            state = _fold(state, token)
        req.rng_state = state
        return
    req.rng_state = (seed * _LCG_A + start + 1) & _MASK64


def next_token(req: Request, palette: OutputPalette) -> int:
    """Advance the request's generator and return its next output token."""
    if req.sampling_seed is None:  # greedy: a function of the sequence so far
        state = req.rng_state
        mixed = (state ^ (state >> 31)) * 0xBF58476D1CE4E5B9 & _MASK64
        token = palette.ids[(mixed >> 33) % len(palette.ids)]
        req.rng_state = _fold(state, token)
        return token
    x = (req.rng_state * _LCG_A + _LCG_C) & _MASK64
    req.rng_state = x
    return palette.ids[(x >> 33) % len(palette.ids)]


def record_text(req: Request, token: int, palette: OutputPalette) -> None:
    """Keep the token's text and finish the request on a stop string (when it has any)."""
    if not req.stop_strings:
        return
    piece = palette.text_of.get(token, "")
    req.text.append(piece)
    longest = max(len(s) for s in req.stop_strings)
    tail_pieces: list[str] = []
    size = 0
    for p in reversed(req.text):
        tail_pieces.append(p)
        size += len(p)
        if size >= longest + len(piece):
            break
    tail = "".join(reversed(tail_pieces))
    total = sum(len(p) for p in req.text) if len(tail_pieces) < len(req.text) else len(tail)
    offset = total - len(tail)
    best: tuple[int, str] | None = None
    for stop in req.stop_strings:
        idx = tail.find(stop)
        if idx >= 0 and (best is None or idx < best[0]):
            best = (idx, stop)
    if best is not None:
        req.stop_text_index = offset + best[0]
        req.finish_reason = {"type": "stop", "matched": best[1]}


def output_text(req: Request, palette: OutputPalette) -> str:
    """The request's output text so far, cut before a matched stop string."""
    if req.stop_strings:
        text = "".join(req.text)
    else:
        text_of = palette.text_of
        text = "".join([text_of.get(t, "") for t in req.output_ids])
    if req.stop_text_index is not None:
        return text[: req.stop_text_index]
    return text
