"""The twin's output: deterministic pseudo-text of one-token words, cut at stop strings.

Each request draws its tokens with its own LCG over a palette of one-token words of the
tokenizer, seeded from the engine seed and the request's seed (or its prompt), so the same
request on the same engine always produces the same text. The twin never samples EOS: a
request runs to its ``max_new_tokens`` unless a stop string or stop token id matches.
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


def seed_output(req: Request, engine_seed: int) -> None:
    """Start the request's generator from its sampling seed (else its prompt's tail)."""
    seed = req.sampling_seed
    if seed is None:
        tail = tuple(req.input_ids[-32:])
        seed = hash(tail) ^ (len(req.input_ids) << 32)
    req.rng_state = (seed * _LCG_A + engine_seed * 0x9E3779B97F4A7C15 + 1) & _MASK64


def next_token(req: Request, palette: OutputPalette) -> int:
    """Advance the request's generator and return its next output token."""
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
