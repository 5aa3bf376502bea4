"""Request parsing for the twin's three generation APIs, with SGLang's field names.

Every check raises `InvalidRequest` naming the field, the value and what is allowed; the
server turns it into a 4xx. The OpenAI routes always answer with an OpenAI error object; the
native ``/generate`` answers as SGLang 0.5.23 does for each kind of problem (`ErrorKind`).
Nothing is silently dropped: unknown *types* are rejected, unknown optional fields that change
nothing here (logprobs, top_p, ...) are accepted as SGLang accepts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from sglang_tpu.sim.pd import Bootstrap, parse_bootstrap

DEFAULT_GENERATE_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default
DEFAULT_COMPLETIONS_MAX_TOKENS = 16  # OpenAI's /v1/completions default
DEFAULT_CHAT_MAX_TOKENS = 128  # the twin never samples EOS, so chat needs a finite default
MAX_STOP_STRINGS = 16
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


ErrorKind = Literal["schema", "contract", "value"]
"""How SGLang 0.5.23's ``/generate`` reports a bad request (all with status 400):

- ``schema``: the body is not JSON, a required field is missing or a top-level field has the
  wrong type; FastAPI's request validation answers with an OpenAI error object (``type``
  "Bad Request"; on the OpenAI routes, whose request models type every field, so does a
  ``contract`` error);
- ``contract``: a sampling parameter has the wrong type; the API contract check answers
  ``{"error": "<message>"}``;
- ``value``: a well-typed value is not allowed (no prompt, a negative token budget, a prompt
  longer than the context); the tokenizer manager answers ``{"error": {"message": ...}}``.
"""


class InvalidRequest(ValueError):
    def __init__(
        self, param: str | None, message: str, status: int = 400, kind: ErrorKind = "value"
    ) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.kind = kind


@dataclass(slots=True)
class GenerationRequest:
    """What the server needs from any of the three APIs, before tokenization."""

    text: str | None
    input_ids: list[int] | None
    max_new_tokens: int
    stop: list[str]
    stop_token_ids: list[int]
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool
    model: str | None
    rid: str | None = None
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk
    max_new_tokens_asked: bool = True  # False: the API's default (chat without max_tokens)
    lora_path: str | None = None  # the LoRA adapter the request names in lora_path
    bootstrap: Bootstrap | None = None  # PD: the prefill to pair with (`sglang_tpu.sim.pd`)


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise InvalidRequest(
            None, f"request body is not valid JSON: {err}", kind="schema"
        ) from None
    if not isinstance(data, dict):
        raise InvalidRequest(
            None, f"request body must be a JSON object, got {type(data).__name__}", kind="schema"
        )
    return data


def _int(
    data: Mapping[str, Any],
    key: str,
    param: str,
    minimum: int | None = None,
    type_kind: ErrorKind = "contract",
) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(
            param, f"{param}: {value!r} is not allowed; allowed: an integer", kind=type_kind
        )
    if minimum is not None and value < minimum:
        raise InvalidRequest(param, f"{param}: {value!r} is not allowed; allowed: >= {minimum}")
    return value


def _float(data: Mapping[str, Any], key: str, param: str, minimum: float = 0.0) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(
            param, f"{param}: {value!r} is not allowed; allowed: a number", kind="contract"
        )
    if value < minimum:
        raise InvalidRequest(param, f"{param}: {value!r} is not allowed; allowed: >= {minimum}")
    return float(value)


def _bool(data: Mapping[str, Any], key: str, param: str, type_kind: ErrorKind = "contract") -> bool:
    value = data.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(
            param, f"{param}: {value!r} is not allowed; allowed: true or false", kind=type_kind
        )
    return value


def _stop(data: Mapping[str, Any], key: str, param: str) -> list[str]:
    value = data.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if (
        isinstance(value, list)
        and len(value) <= MAX_STOP_STRINGS
        and all(isinstance(s, str) for s in value)
    ):
        return list(value)
    raise InvalidRequest(
        param,
        f"{param}: {value!r:.80} is not allowed; allowed: a string or a list of at most "
        f"{MAX_STOP_STRINGS} strings",
        kind="contract",
    )


def _token_ids(value: object, param: str, kind: ErrorKind = "contract") -> list[int]:
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        return list(value)
    raise InvalidRequest(
        param,
        f"{param}: {value!r:.80} is not allowed; allowed: a non-empty list of token ids",
        kind=kind,
    )


def _positive_max_tokens(
    value: int | None, param: str, default: int, kind: ErrorKind = "value"
) -> int:
    if value is None:
        return default
    if value <= 0:
        raise InvalidRequest(param, f"{param}: {value!r} is not allowed; allowed: >= 1", kind=kind)
    return value


def _rid(data: Mapping[str, Any], kind: ErrorKind = "value") -> str | None:
    """The request id a client (or a router, to abort it later) chose, as SGLang reads it."""
    rid = data.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise InvalidRequest("rid", f"rid: {rid!r} is not allowed; allowed: a string", kind=kind)
    return rid


class AdapterRejected(InvalidRequest):
    """A LoRA adapter the server cannot use (SGLang's tokenizer manager raises it after the
    request is accepted: a stream of ``/generate`` gets it as an error event)."""


def _lora_path(data: Mapping[str, Any]) -> str | None:
    """SGLang's ``lora_path`` for one prompt: an adapter name (or a one-element list)."""
    value = data.get("lora_path")
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(
            "lora_path", f"lora_path: {value!r:.80} is not allowed; allowed: a string",
            kind="schema",
        )  # fmt: skip
    return value


def _model(data: Mapping[str, Any]) -> str | None:
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest(
            "model", f"model: {model!r} is not allowed; allowed: a string", kind="schema"
        )
    return model


def _n_is_one(data: Mapping[str, Any]) -> None:
    n = _int(data, "n", "n", minimum=1)
    if n not in (None, 1):
        raise InvalidRequest("n", f"n: {n!r} is not allowed; allowed: 1")


def _stream_options(data: Mapping[str, Any]) -> tuple[bool, bool]:
    """``stream_options``' ``include_usage`` and ``continuous_usage_stats`` (SGLang's
    ``should_include_usage``: each false when absent)."""
    options = data.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, dict):
        raise InvalidRequest(
            "stream_options",
            f"stream_options: {options!r:.80} is not allowed; allowed: an object",
            kind="schema",
        )
    return (
        _bool(options, "include_usage", "stream_options.include_usage"),
        _bool(options, "continuous_usage_stats", "stream_options.continuous_usage_stats"),
    )


def _bootstrap(data: Mapping[str, Any]) -> Bootstrap | None:
    try:
        return parse_bootstrap(data)
    except ValueError as err:
        param = str(err).split(":", 1)[0]
        raise InvalidRequest(param, str(err), kind="schema") from None


def parse_generate(data: Mapping[str, Any]) -> GenerationRequest:
    """SGLang's native ``/generate`` (``GenerateReqInput``) with one prompt."""
    text = data.get("text")
    ids = data.get("input_ids")
    if (text is None) == (ids is None):
        raise InvalidRequest("text", "text / input_ids: give exactly one of them")
    if isinstance(text, list) and len(text) == 1:
        text = text[0]
    if ids is not None and isinstance(ids, list) and ids and isinstance(ids[0], list):
        if len(ids) != 1:
            raise InvalidRequest("input_ids", "input_ids: batches are not supported; send one")
        ids = ids[0]
    if text is not None and not isinstance(text, str):
        raise InvalidRequest(
            "text", f"text: {text!r:.80} is not allowed; allowed: a string", kind="schema"
        )
    if text == "":
        raise InvalidRequest("text", "text: '' is not allowed; allowed: a non-empty string")
    params = data.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise InvalidRequest(
            "sampling_params",
            f"sampling_params: {params!r:.80} is not allowed; allowed: an object",
            kind="schema",
        )
    max_new = _int(params, "max_new_tokens", "sampling_params.max_new_tokens")
    stop_ids = params.get("stop_token_ids")
    return GenerationRequest(
        text=text,
        input_ids=_token_ids(ids, "input_ids", kind="schema") if ids is not None else None,
        max_new_tokens=_positive_max_tokens(
            max_new, "sampling_params.max_new_tokens", DEFAULT_GENERATE_MAX_NEW_TOKENS
        ),
        stop=_stop(params, "stop", "sampling_params.stop"),
        stop_token_ids=_token_ids(stop_ids, "sampling_params.stop_token_ids") if stop_ids else [],
        temperature=_float(params, "temperature", "sampling_params.temperature") or 0.0,
        seed=_int(params, "sampling_seed", "sampling_params.sampling_seed"),
        stream=_bool(data, "stream", "stream", type_kind="schema"),
        include_usage=False,
        model=None,
        rid=_rid(data, "schema"),
        lora_path=_lora_path(data),
        bootstrap=_bootstrap(data),
    )


def _openai_sampling(data: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling, streaming and naming fields completions and chat read alike."""
    stop_ids = data.get("stop_token_ids")
    include_usage, continuous_usage = _stream_options(data)
    return {
        "stop": _stop(data, "stop", "stop"),
        "stop_token_ids": _token_ids(stop_ids, "stop_token_ids") if stop_ids else [],
        "temperature": _float(data, "temperature", "temperature") or 0.0,
        "seed": _int(data, "seed", "seed"),
        "stream": _bool(data, "stream", "stream"),
        "include_usage": include_usage,
        "continuous_usage": continuous_usage,
        "model": _model(data),
        "rid": _rid(data),
        "lora_path": _lora_path(data),
        "bootstrap": _bootstrap(data),
    }


def parse_completions(data: Mapping[str, Any]) -> GenerationRequest:
    """OpenAI ``/v1/completions`` with one prompt (a string or token ids)."""
    _n_is_one(data)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    text: str | None = None
    ids: list[int] | None = None
    if isinstance(prompt, str) and prompt:
        text = prompt
    elif isinstance(prompt, list):
        ids = _token_ids(prompt, "prompt")
    else:  # SGLang's schema requires a string or a list; its serving code refuses ""
        raise InvalidRequest(
            "prompt",
            f"prompt: {prompt!r:.80} is not allowed; allowed: a non-empty string or a list of "
            "token ids",
            kind="value" if prompt == "" else "schema",
        )
    max_tokens = _int(data, "max_tokens", "max_tokens")
    return GenerationRequest(
        text=text,
        input_ids=ids,
        max_new_tokens=_positive_max_tokens(  # a validator of SGLang's request schema
            max_tokens, "max_tokens", DEFAULT_COMPLETIONS_MAX_TOKENS, kind="schema"
        ),
        **_openai_sampling(data),
    )


def parse_chat(data: Mapping[str, Any]) -> tuple[GenerationRequest, list[dict[str, Any]]]:
    """OpenAI ``/v1/chat/completions``; returns the request (text unset) and the messages."""
    _n_is_one(data)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(  # SGLang's schema requires a list; its serving code refuses []
            "messages",
            f"messages: {messages!r:.80} is not allowed; allowed: a non-empty list of messages",
            kind="value" if messages == [] else "schema",
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"messages[{i}]", f"messages[{i}]: must be an object", kind="schema"
            )
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidRequest(
                f"messages[{i}].role",
                f"messages[{i}].role: {role!r} is not allowed; allowed: {', '.join(CHAT_ROLES)}",
                kind="schema",
            )
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise InvalidRequest(
                        f"messages[{i}].content[{j}]",
                        f"messages[{i}].content[{j}]: only text parts are allowed "
                        '({"type": "text", "text": ...})',
                    )
        elif content is not None and not isinstance(content, str):
            raise InvalidRequest(
                f"messages[{i}].content",
                f"messages[{i}].content: {content!r:.80} is not allowed; allowed: a string or "
                "a list of text parts",
                kind="schema",
            )
    max_tokens = _int(data, "max_completion_tokens", "max_completion_tokens")
    param = "max_completion_tokens"
    if max_tokens is None:
        max_tokens = _int(data, "max_tokens", "max_tokens")
        param = "max_tokens"
    request = GenerationRequest(
        text=None,
        input_ids=None,
        max_new_tokens=_positive_max_tokens(max_tokens, param, DEFAULT_CHAT_MAX_TOKENS),
        **_openai_sampling(data),
        max_new_tokens_asked=max_tokens is not None,
    )
    return request, messages
