"""What the router reads from a request body: model, streaming, and the prompt to route on.

The router forwards the body it received, byte for byte; it parses it only to validate
what it needs and to build the routing inputs. Errors are `ClientError`s with an
OpenAI-style body naming the field (``param``), never a 500.

Routing text (character policies): the completion prompt (a list joined by spaces, as
sglang-router does), the chat messages flattened as ``role: content`` lines, or
`/generate`'s ``text`` (or its ``input_ids`` written out). Token ids (token policies): the
engine's own view, through the shared tokenizer: chat messages rendered with the chat
template the engine applies, then encoded; token-id prompts are used as they are.

A prompt longer than ``max_prompt_chars`` characters (or token ids) is refused with 413
before anything is tokenized or copied: tokenizing a 30 MB prompt costs seconds and a
gigabyte of token objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson


class Tokens(Protocol):
    """How the router gets token ids (`tpuserve_router.pipeline.token_cache.ChatTokenCache`)."""

    def encode(self, text: str) -> Sequence[int]: ...

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> Sequence[int]: ...


class ClientError(Exception):
    """A request the router refuses; rendered as an OpenAI-style error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        error_type: str = "invalid_request_error",
        headers: Mapping[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type
        self.headers = dict(headers or {})
        self.code = code  # OpenAI's error code (e.g. model_not_found); None: the status

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.param, self.error_type, self.code)


def error_body(
    status: int, message: str, param: str | None, error_type: str, code: str | None = None
) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": error_type,
                "param": param,
                "code": status if code is None else code,
            }
        }
    )


CHARS_PER_TOKEN: Final = 4
"""A prompt's tokens, estimated from its characters when it is not tokenized."""
COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16  # SGLang's CompletionRequest, as OpenAI's
GENERATE_DEFAULT_MAX_NEW_TOKENS: Final = 128  # SGLang's SamplingParams


@dataclass(slots=True)
class ParsedBody:
    model: str
    stream: bool
    text: str
    token_ids: Sequence[int] | None
    prompt_tokens: int  # counted when tokenized or given as ids, else estimated
    max_new_tokens: int | None  # as asked, or the API's default; None: up to the context
    rid: str | None  # the request id the client chose, if a string
    single: bool  # one prompt, one sample (n = 1): the engine knows it by its rid alone
    lora_path: str | None = None  # the LoRA adapter named by ``lora_path`` (a batch's first)


def parse_json_object(body: bytes) -> dict[str, Any]:
    if not body:
        raise ClientError(400, "the request body is empty; send a JSON object", param="body")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ClientError(400, f"the request body is not valid JSON: {err}", param="body") from None
    if not isinstance(data, dict):
        raise ClientError(
            400, f"the request body must be a JSON object, got {type(data).__name__}", param="body"
        )
    return data


def named_route(data: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """The model and LoRA adapter a parsed body names, read alone (what a model's share
    needs, `stages.Pipeline`), or None where either is malformed (the route's parser then
    names the field)."""
    try:
        return _model(data), _lora_path(data)
    except ClientError:
        return None


def _model(data: Mapping[str, Any]) -> str:
    model = data.get("model")
    if model is None:
        return ""
    if not isinstance(model, str):
        raise ClientError(400, f"model must be a string, got {type(model).__name__}", param="model")
    return model


def _lora_path(data: Mapping[str, Any]) -> str | None:
    """SGLang's ``lora_path``: an adapter name, or one per prompt of a batch (the first named
    one is routed on)."""
    value = data.get("lora_path")
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, list) and all(v is None or isinstance(v, str) for v in value):
        return next((v for v in value if v), None)
    raise ClientError(
        400,
        f"lora_path must be an adapter name or a list of them (or null), got "
        f"{type(value).__name__}",
        param="lora_path",
    )


def _stream(data: dict[str, Any]) -> bool:
    stream = data.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise ClientError(
            400,
            f"stream must be true or false, got {orjson.dumps(stream).decode()}",
            param="stream",
        )
    return stream


def _is_token_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


_TOKEN_ID_BOUND = 1 << 63


def _routable_ids(ids: list[int], param: str) -> list[int]:
    """Client token ids, refused unless each fits the router's block keys (64-bit ints)."""
    if ids and (min(ids) < -_TOKEN_ID_BOUND or max(ids) >= _TOKEN_ID_BOUND):
        bad = next(t for t in ids if not -_TOKEN_ID_BOUND <= t < _TOKEN_ID_BOUND)
        raise ClientError(
            400, f"{param}: token id {bad} is out of range; allowed: 64-bit integers", param=param
        )
    return ids


def _check_size(size: int, limit: int | None, param: str) -> int:
    if limit is not None and size > limit:
        raise ClientError(
            413,
            f"{param} has {size} characters or token ids; the router's limit is {limit} "
            "(--max-prompt-chars)",
            param=param,
        )
    return size


def _size(prompt: Any) -> int:
    """Characters (a string) or token ids of a prompt, or of a batch of them (a list)."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(i) if isinstance(i, str | list) else 1 for i in prompt)
    return 0


def _chat_size(messages: list[Any]) -> int:
    """The characters of every message, whatever holds them: the role, the content as a
    string or as parts (text, images, anything), names and tool calls; each other value
    counts one. All of it reaches the chat template, or the routing text."""
    return sum(_json_chars(message) for message in messages)


def _json_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + _json_chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_json_chars(v) for v in value)
    return 1


def _token_count(value: Any) -> int | None:
    """A token count as given (an int that is not a bool), else None."""
    return value if type(value) is int else None


def _rid(data: dict[str, Any], single: bool) -> tuple[str | None, bool]:
    """The client's rid, and whether the request is one generation its rid names (a rid
    that is not a string, a list for a batch, leaves it unnamed)."""
    rid = data.get("rid")
    if rid is None or isinstance(rid, str):
        return rid, single
    return None, False


def _estimate(tokens: Sequence[int] | None, chars: int) -> int:
    return len(tokens) if tokens is not None else chars // CHARS_PER_TOKEN


def parse_completions(
    data: dict[str, Any],
    want_text: bool,
    tokenizer: Tokens | None,
    max_prompt_chars: int | None = None,
) -> ParsedBody:
    prompt = data.get("prompt")
    text = ""
    tokens: Sequence[int] | None = None
    size = _check_size(_size(prompt), max_prompt_chars, "prompt")
    if isinstance(prompt, str):
        text = prompt
        if tokenizer is not None:
            tokens = tokenizer.encode(prompt)
    elif _is_token_list(prompt) and prompt:
        tokens = _routable_ids(prompt, "prompt")
        if want_text:
            text = " ".join(map(str, prompt))
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        text = " ".join(prompt)  # a batch: route on all of it, as sglang-router does
        if tokenizer is not None:
            tokens = tokenizer.encode(prompt[0])
    elif isinstance(prompt, list) and prompt and all(_is_token_list(p) for p in prompt):
        tokens = _routable_ids(prompt[0], "prompt")
        if want_text:
            text = " ".join(" ".join(map(str, p)) for p in prompt)
    else:
        raise ClientError(
            400,
            "prompt is required: a string, a list of strings, a list of token ids or a list "
            "of token-id lists",
            param="prompt",
        )
    max_new = _token_count(data.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS))
    single = isinstance(prompt, str) or _is_token_list(prompt)
    return ParsedBody(
        _model(data), _stream(data), text, tokens, _estimate(tokens, size), max_new,
        *_rid(data, single and data.get("n") in (None, 1)), _lora_path(data),
    )  # fmt: skip


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                if "text" in part:
                    parts.append(str(part["text"]))
                else:  # images and other media: route on their reference
                    parts.append(orjson.dumps(part, option=orjson.OPT_SORT_KEYS).decode())
        return "".join(parts)
    return "" if content is None else str(content)


def parse_chat(
    data: dict[str, Any],
    want_text: bool,
    tokenizer: Tokens | None,
    max_prompt_chars: int | None = None,
) -> ParsedBody:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ClientError(400, "messages is required: a non-empty list", param="messages")
    size = _check_size(_chat_size(messages), max_prompt_chars, "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ClientError(
                400, f"messages[{i}] must be an object with a string role", param="messages"
            )
    text = ""
    if want_text:
        text = "".join(f"{m['role']}: {_message_text(m.get('content'))}\n" for m in messages)
    tokens = None
    if tokenizer is not None:
        tokens = tokenizer.encode_chat(messages)
    max_new = _token_count(data.get("max_completion_tokens")) or _token_count(
        data.get("max_tokens")
    )
    return ParsedBody(
        _model(data), _stream(data), text, tokens, _estimate(tokens, size), max_new,
        *_rid(data, data.get("n") in (None, 1)), _lora_path(data),
    )  # fmt: skip


def parse_generate(
    data: dict[str, Any],
    want_text: bool,
    tokenizer: Tokens | None,
    max_prompt_chars: int | None = None,
) -> ParsedBody:
    text_in = data.get("text")
    ids = data.get("input_ids")
    text = ""
    tokens: Sequence[int] | None = None
    size = _check_size(_size(text_in), max_prompt_chars, "text") + _check_size(
        _size(ids), max_prompt_chars, "input_ids"
    )
    if (text_in == "" or text_in == [] or (isinstance(text_in, list) and "" in text_in)) and (
        ids is None
    ):  # SGLang's scheduler fails on an empty prompt instead of refusing it
        raise ClientError(
            400, "text must not be empty (nor hold an empty string); send a prompt", param="text"
        )
    if isinstance(text_in, str) and ids is None:
        text = text_in
        if tokenizer is not None:
            tokens = tokenizer.encode(text_in)
    elif isinstance(text_in, list) and text_in and all(isinstance(t, str) for t in text_in):
        text = " ".join(text_in)
        if tokenizer is not None:
            tokens = tokenizer.encode(text_in[0])
    elif text_in is None and _is_token_list(ids) and ids:
        tokens = _routable_ids(ids, "input_ids")
        if want_text:
            text = " ".join(map(str, ids))
    elif text_in is None and isinstance(ids, list) and ids and all(_is_token_list(i) for i in ids):
        tokens = _routable_ids(ids[0], "input_ids")
        if want_text:
            text = " ".join(" ".join(map(str, i)) for i in ids)
    else:
        raise ClientError(
            400,
            "exactly one of text (a string or list of strings) and input_ids (a list of token "
            "ids or of token-id lists) is required",
            param="text",
        )
    params = data.get("sampling_params")
    if not isinstance(params, dict):
        params = {}
    asked = params.get("max_new_tokens", GENERATE_DEFAULT_MAX_NEW_TOKENS)
    single = (isinstance(text_in, str) or _is_token_list(ids)) and params.get("n") in (None, 1)
    return ParsedBody(
        _model(data), _stream(data), text, tokens, _estimate(tokens, size), _token_count(asked),
        *_rid(data, single), _lora_path(data),
    )  # fmt: skip


Parser = Callable[[dict[str, Any], bool, "Tokens | None", "int | None"], ParsedBody]

GENERATION_ROUTES: dict[str, Parser] = {
    "/v1/completions": parse_completions,
    "/v1/chat/completions": parse_chat,
    "/generate": parse_generate,
}
