"""Token counts from a worker's response: OpenAI ``usage`` or SGLang ``meta_info``.

OpenAI responses carry ``usage.prompt_tokens``, ``usage.completion_tokens`` and
``usage.prompt_tokens_details.cached_tokens``; SGLang's ``/generate`` carries
``meta_info.prompt_tokens``, ``completion_tokens`` and ``cached_tokens`` (a batch is a list
of those). A stream reports usage in its last data event (OpenAI, when the client asked
with ``stream_options.include_usage``) or in every event (``/generate``, cumulative), so
the proxy keeps only the tail of a stream and parses it once, at the end.

An answer that is one JSON object is first skimmed by the compiled `usage_counts`
(router/native/src/usage.rs), which builds no objects: with the caches cold between requests,
parsing a small answer in Python cost about 1,000 last-level cache misses (CHANGELOG.md,
router CPU pass 13). What it does not read (a batch's list, a key with escapes, anything not
JSON) is parsed here, with the same result.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from tpuserve_router._native import usage_counts

TokenCounts = tuple[int, int, int]
"""(prompt, completion, cached) tokens: a `Usage`, or the compiled reader's plain tuple."""


class Usage(NamedTuple):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


def _int(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0


def usage_from_object(data: Any) -> Usage | None:
    if isinstance(data, list):
        found = [u for u in (usage_from_object(item) for item in data) if u is not None]
        if not found:
            return None
        return Usage(
            sum(u.prompt_tokens for u in found),
            sum(u.completion_tokens for u in found),
            sum(u.cached_tokens for u in found),
        )
    if not isinstance(data, dict):
        return None
    usage = data.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Usage(
            _int(usage.get("prompt_tokens")),
            _int(usage.get("completion_tokens")),
            _int(cached),
        )
    meta = data.get("meta_info")
    if isinstance(meta, dict):
        return Usage(
            _int(meta.get("prompt_tokens")),
            _int(meta.get("completion_tokens")),
            _int(meta.get("cached_tokens")),
        )
    return None


def usage_from_body(body: bytes) -> TokenCounts | None:
    """Usage of a whole JSON response, or None if it has none (or is not JSON)."""
    try:
        return usage_counts(body)
    except ValueError:  # not one the compiled reader reads: parsed here
        pass
    try:
        return usage_from_object(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


def usage_from_stream_tail(tail: bytes) -> TokenCounts | None:
    """Usage in the last data event of an SSE stream's tail that carries one."""
    for event in reversed(tail.split(b"\n\n")):
        event = event.strip()
        if not event.startswith(b"data:"):
            continue
        payload = event[5:].strip()
        if not payload.startswith(b"{") or (
            b'"usage"' not in payload and b'"meta_info"' not in payload
        ):
            continue
        usage = usage_from_body(payload)  # None too when the tail began mid-event
        if usage is not None:
            return usage
    return None
