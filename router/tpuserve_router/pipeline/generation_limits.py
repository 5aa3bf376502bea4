"""How many tokens a request may generate: its max-tokens fields, checked, and its generations.

Each route names the bound as SGLang reads it:

- ``/v1/completions``: ``max_tokens`` (16 when absent, as SGLang's and OpenAI's default);
- ``/v1/chat/completions``: ``max_completion_tokens``, else ``max_tokens`` (SGLang takes
  ``max_completion_tokens or max_tokens``); absent, generation runs up to the context;
- ``/generate``: ``sampling_params.max_new_tokens`` (128 when absent), one per prompt when
  ``sampling_params`` is a list.

A value given must be an integer from 0 to `MAX_TOKENS_ALLOWED`: anything else (a negative
number, a fraction, a string, ``true``, 10¹⁵) is refused with 400 naming the field, before it
reaches a worker or a token limit (`tpuserve_router.tenancy.quotas`). ``null`` reads as absent; for
``/v1/completions`` SGLang refuses it, and the router leaves that to SGLang.

A request generates ``n`` samples of each of its prompts (a batch's prompts are a list); the
limit's `GenerationLimit.generations` counts them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from tpuserve_router.pipeline.request_body import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    GENERATE_DEFAULT_MAX_NEW_TOKENS,
    ClientError,
)

MAX_TOKENS_ALLOWED: Final = 2**31 - 1
"""The largest max-tokens value the router passes on (no context comes near it)."""


@dataclass(frozen=True, slots=True)
class GenerationLimit:
    """How much a request may generate."""

    max_new_tokens: int | None
    """Per generation (the largest of a batch's); None: up to the context."""
    generations: int
    """Prompts × samples (``n``)."""
    param: str
    """The field that bounds it (what to lower when it is too many)."""

    def allowance(self, prompt_tokens: int, context: int | None, otherwise: int) -> int:
        """The completion tokens it may generate in all, with a prompt of ``prompt_tokens``
        (each of a batch's: fewer) on a worker whose context holds ``context`` tokens (None:
        not known); ``otherwise`` when nothing bounds it (no field, no context)."""
        per = self.max_new_tokens
        if context is not None:
            room = max(0, context - prompt_tokens) if self.generations == 1 else context
            per = room if per is None else min(per, room)
        elif per is None:
            return otherwise
        return per * self.generations


def _max_tokens(data: Mapping[str, Any], name: str, param: str) -> int | None:
    """``data[name]`` checked: None if absent or null; ClientError unless an integer from 0
    to `MAX_TOKENS_ALLOWED`."""
    value = data.get(name)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_TOKENS_ALLOWED:
        raise ClientError(
            400,
            f"{param}: {orjson.dumps(value).decode()[:80]} is not allowed; allowed: an "
            f"integer from 0 to {MAX_TOKENS_ALLOWED}",
            param=param,
        )
    return value


def _samples(params: Mapping[str, Any]) -> int:
    """``n``, as SGLang will read it (a value it refuses counts as one: it never runs)."""
    n = params.get("n")
    return n if type(n) is int and n > 1 else 1


def _prompts(prompt: Any) -> int:
    """Prompts of a batch (a list of strings or of token-id lists), else one."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def completions_limit(data: Mapping[str, Any]) -> GenerationLimit:
    if "max_tokens" in data:
        asked = _max_tokens(data, "max_tokens", "max_tokens")
    else:
        asked = COMPLETIONS_DEFAULT_MAX_TOKENS
    return GenerationLimit(asked, _prompts(data.get("prompt")) * _samples(data), "max_tokens")


def chat_limit(data: Mapping[str, Any]) -> GenerationLimit:
    completion = _max_tokens(data, "max_completion_tokens", "max_completion_tokens")
    legacy = _max_tokens(data, "max_tokens", "max_tokens")
    asked = completion or legacy  # SGLang's: a 0 of max_completion_tokens falls through
    param = "max_completion_tokens" if completion or legacy is None else "max_tokens"
    return GenerationLimit(asked, _samples(data), param)


def generate_limit(data: Mapping[str, Any]) -> GenerationLimit:
    param = "sampling_params.max_new_tokens"
    params = data.get("sampling_params")
    prompts = max(_prompts(data.get("text")), _prompts(data.get("input_ids")))
    listed = params if isinstance(params, list) else [params]
    largest: int | None = 0
    samples = 1
    for i, item in enumerate(listed):
        if not isinstance(item, Mapping):
            item = {}  # SGLang refuses what is not an object; its default otherwise
        name = param if not isinstance(params, list) else f"sampling_params[{i}].max_new_tokens"
        if "max_new_tokens" in item:
            asked = _max_tokens(item, "max_new_tokens", name)
        else:
            asked = GENERATE_DEFAULT_MAX_NEW_TOKENS
        largest = None if asked is None or largest is None else max(largest, asked)
        samples = max(samples, _samples(item))
    return GenerationLimit(largest, prompts * samples, param)


GENERATION_LIMITS: Final[dict[str, Callable[[Mapping[str, Any]], GenerationLimit]]] = {
    "/v1/completions": completions_limit,
    "/v1/chat/completions": chat_limit,
    "/generate": generate_limit,
}
