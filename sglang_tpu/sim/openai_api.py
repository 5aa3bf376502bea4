"""SGLang's OpenAI-compatible routes on the twin: completions, chat completions, models.

Shapes follow SGLang 0.5.23: the response ``id`` is the request id, ``model`` echoes the
request's (``default`` when it names none), non-streamed responses carry ``metadata`` with the
weight version, and ``usage.prompt_tokens_details`` holds the cached tokens only when the
server runs with ``--enable-cache-report`` (otherwise null, or absent from a streamed
completions usage chunk, which SGLang serialises without nulls).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from aiohttp import web

from sglang_tpu.lora import split_model
from sglang_tpu.sim import jax_api
from sglang_tpu.sim.generation import RequestRejected, prepare, run_request, run_to_end
from sglang_tpu.sim.output_text import output_text
from sglang_tpu.sim.protocol import (
    GenerationRequest,
    InvalidRequest,
    parse_chat,
    parse_completions,
    parse_json,
)
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.responses import (
    VALIDATION_ERROR_TYPE,
    json_response,
    openai_error,
    sse_done,
    sse_event,
    sse_start,
)
from sglang_tpu.sim.service import (
    SGLANG,
    SGLANG_JAX,
    WEIGHT_VERSION,
    EngineService,
    service_of,
    weight_versions,
)

DEFAULT_MODEL_NAME = "default"  # what SGLang's OpenAI routes echo when a request names no model


def _finish_reason(reason: dict[str, Any] | None) -> str | None:
    """As SGLang: the finish reason's type, ``"stop"``, ``"length"`` or ``"abort"``."""
    if reason is None:
        return None
    kind: str = reason["type"]
    return kind


def _check_model(svc: EngineService, model: str | None) -> None:
    """The twin's own check (SGLang serves any name): the model, less a ``:ADAPTER`` naming
    a LoRA adapter (`sglang_tpu.lora.split_model`), must be the served one."""
    served = svc.settings.served_model_name
    base = split_model(model, (served,))[0] if model is not None else None
    if base is not None and base not in (served, svc.settings.model_path):
        raise InvalidRequest(
            "model",
            f"model: {model!r} does not exist; allowed: {served!r}",
            status=404,
        )


def _error(err: InvalidRequest) -> web.Response:
    """As SGLang: a body its request schema refuses is a "Bad Request" (FastAPI's validation),
    a value its serving code refuses gets the status's error class."""
    error_type = VALIDATION_ERROR_TYPE if err.kind in ("schema", "contract") else None
    return openai_error(str(err), err.status, err.param, error_type=error_type)


def usage(req: Request, *, enable_cache_report: bool, flavor: str = SGLANG) -> dict[str, Any]:
    """SGLang's `UsageInfo` of a finished request (null fields included); SGLang-JAX's with
    ``flavor`` sglang-jax (`jax_api.usage`)."""
    if flavor == SGLANG_JAX:
        return jax_api.usage(req, enable_cache_report=enable_cache_report)
    details = {"cached_tokens": req.cached_tokens} if enable_cache_report else None
    return {
        "prompt_tokens": len(req.input_ids),
        "total_tokens": len(req.input_ids) + len(req.output_ids),
        "completion_tokens": len(req.output_ids),
        "prompt_tokens_details": details,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def running_usage(req: Request, *, chat: bool, enable_cache_report: bool) -> dict[str, Any]:
    """SGLang's usage on every streamed chunk (``stream_options.continuous_usage_stats``): the
    prompt and the tokens generated so far. Chat attaches ``prompt_tokens_details`` when the
    cache is reported; completions never do."""
    details = None
    if chat and enable_cache_report:
        details = {"cached_tokens": req.cached_tokens}
    return {
        "prompt_tokens": len(req.input_ids),
        "total_tokens": len(req.input_ids) + len(req.output_ids),
        "completion_tokens": len(req.output_ids),
        "prompt_tokens_details": details,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def _without_nulls(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not None}


async def handle_completions(request: web.Request) -> web.StreamResponse:
    svc = service_of(request)
    try:
        gen = parse_completions(parse_json(await request.read()))
        _check_model(svc, gen.model)
        ids = gen.input_ids if gen.input_ids is not None else svc.tokenizer.encode(gen.text or "")
        req = prepare(svc, gen, ids, openai=True)
    except InvalidRequest as err:
        return _error(err)
    return await _respond(request, svc, gen, req, chat=False)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    svc = service_of(request)
    try:
        data = parse_json(await request.read())
        gen, messages = parse_chat(data)
        _check_model(svc, gen.model)
        ids = chat_prompt_ids(svc, messages, data.get("continue_final_message") is True)
        req = prepare(svc, gen, ids, openai=True)
    except InvalidRequest as err:
        return _error(err)
    return await _respond(request, svc, gen, req, chat=True)


def chat_prompt_ids(
    svc: EngineService, messages: list[dict[str, Any]], continue_final: bool
) -> list[int]:
    """The prompt's ids, as SGLang 0.5.23's ``serving_chat`` makes them: the messages rendered
    with the generation prompt; with ``continue_final_message`` and a last assistant message
    of string content, that message is taken out, the others rendered so, and its content's
    tokens appended (`_handle_last_assistant_message`, `_append_assistant_prefix_to_prompt_ids`:
    the assistant's turn continues from its text)."""
    tokenizer = svc.tokenizer
    last = messages[-1]
    if continue_final and last.get("role") == "assistant" and isinstance(last.get("content"), str):
        ids = list(tokenizer.encode(tokenizer.apply_chat_template(messages[:-1])))
        return ids + list(tokenizer.encode(last["content"]))
    return list(tokenizer.encode(tokenizer.apply_chat_template(messages)))


async def _respond(
    request: web.Request, svc: EngineService, gen: GenerationRequest, req: Request, chat: bool
) -> web.StreamResponse:
    palette = svc.core.palette
    model = gen.model or DEFAULT_MODEL_NAME
    report = svc.settings.enable_cache_report
    fingerprint = svc.settings.system_fingerprint
    flavor = svc.settings.flavor
    created = int(time.time())
    rid = req.rid
    obj = "chat.completion" if chat else "text_completion"
    try:
        if not gen.stream:
            await run_to_end(svc, req, request)
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": _finish_reason(req.finish_reason),
                "matched_stop": (req.finish_reason or {}).get("matched"),
            }
            text = output_text(req, palette)
            if chat:
                choice["message"] = {
                    "role": "assistant",
                    "content": text,
                    "reasoning_content": None,
                }
            else:
                choice["text"] = text
            if flavor == SGLANG_JAX:
                jax_api.choice(choice, chat=chat)
            body = {"id": rid, "object": obj, "created": created, "model": model,
                    "choices": [choice],
                    "usage": usage(req, enable_cache_report=report, flavor=flavor),
                    "metadata": {"weight_version": WEIGHT_VERSION,
                                 "weight_versions": weight_versions(req)}}  # fmt: skip
            if flavor == SGLANG_JAX:  # its responses have no weight-version metadata
                del body["metadata"]
            if fingerprint is not None:
                body["system_fingerprint"] = fingerprint
            return json_response(body)
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        resp: web.StreamResponse | None = None
        sent_text = 0

        def chunk(delta: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0}
            if chat:
                d: dict[str, Any] = {"reasoning_content": None}
                if first:
                    d["role"] = "assistant"
                if delta is not None:
                    d["content"] = delta
                c["delta"] = d
            else:
                c["text"] = delta or ""
            c |= {
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": (req.finish_reason or {}).get("matched") if finish else None,
            }
            body = {"id": rid, "object": chunk_obj, "created": created, "model": model,
                    "choices": [c]}  # fmt: skip
            if fingerprint is not None:
                body["system_fingerprint"] = fingerprint
            running = gen.continuous_usage and (delta or not chat) and not first
            running = running and svc.settings.flavor != SGLANG_JAX  # its StreamOptions lack it
            if running:  # SGLang: on content chunks (chat), on every chunk (completions)
                body["usage"] = running_usage(req, chat=chat, enable_cache_report=report)
            elif not chat:
                body["usage"] = None
            return jax_api.chunk(body, chat=chat, first=first) if flavor == SGLANG_JAX else body

        async with contextlib.aclosing(run_request(svc, req, stream=True)) as run:
            async for _ in run:
                if resp is None:
                    resp = await sse_start(request)
                    if chat:
                        await sse_event(resp, chunk("", None, first=True))
                text = output_text(req, palette)
                delta, sent_text = text[sent_text:], len(text)
                if not chat:  # SGLang: one chunk per update, the last one with the reason
                    finish = _finish_reason(req.finish_reason) if req.finished else None
                    await sse_event(resp, chunk(delta, finish))
                elif delta:  # chat: content chunks only, then the reason on its own
                    await sse_event(resp, chunk(delta, None))
        assert resp is not None
        if chat:
            await sse_event(resp, chunk(None, _finish_reason(req.finish_reason)))
        if gen.include_usage:
            final = usage(req, enable_cache_report=report, flavor=flavor)
            await sse_event(
                resp,
                {"id": rid, "object": chunk_obj, "created": created, "model": model,
                 "choices": [], "usage": final if chat else _without_nulls(final)},
            )  # fmt: skip
        return await sse_done(resp)
    except RequestRejected as rejected:
        return rejected.response


async def handle_models(request: web.Request) -> web.Response:
    """SGLang's model cards: the served model, then each loaded LoRA adapter (its name, its
    path as ``root``, the served model as ``parent``)."""
    s = service_of(request).settings
    created = int(time.time())
    base = {"id": s.served_model_name, "object": "model", "created": created,
            "owned_by": "sglang", "root": s.served_model_name, "parent": None,
            "max_model_len": s.engine.context_length}  # fmt: skip
    adapters = [
        {"id": name, "object": "model", "created": created, "owned_by": "sglang",
         "root": path, "parent": s.served_model_name, "max_model_len": None}
        for name, path in s.lora_paths
    ]  # fmt: skip
    if s.flavor == SGLANG_JAX:  # its model card has no parent
        del base["parent"]
    return json_response({"object": "list", "data": [base, *adapters]})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v1/completions", handle_completions)
    router.add_post("/v1/chat/completions", handle_chat)
    router.add_get("/v1/models", handle_models)
