"""SGLang's native generation route, ``/generate``, on the twin (text or token ids in).

The response and every streamed chunk carry ``meta_info`` with SGLang 0.5.23's keys (its
server runs with ``--enable-metrics``, as the launcher starts it): the request's counts on
every chunk, the timing keys of the scheduler on every chunk, and the end-to-end timings only
once the request has finished. Values of `TIMING_KEYS` are the twin's own clock readings, the
intended difference from a real engine (with the request id and the generated text).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from aiohttp import web

from sglang_tpu.sim import jax_api
from sglang_tpu.sim.generation import RequestRejected, prepare, run_request, run_to_end
from sglang_tpu.sim.output_text import output_text
from sglang_tpu.sim.protocol import (
    AdapterRejected,
    InvalidRequest,
    parse_generate,
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
    SGLANG_JAX,
    WEIGHT_VERSION,
    EngineService,
    service_of,
    weight_versions,
)

TIMING_KEYS = frozenset(
    {
        "forward_entry_time",
        "prefill_finished_time",
        "queue_time",
        "e2e_latency",
        "request_received_ts",
        "first_token_latency",
        "api_server_dispatch_finish_ts",
        "request_finished_ts",
        "decode_throughput",
        "response_sent_to_client_ts",
    }
)
"""`meta_info` keys whose values are times: present as in SGLang 0.5.23, values the twin's."""


def meta_info(svc: EngineService, req: Request, sent_at: float | None) -> dict[str, Any]:
    """`meta_info` of the request's current state, keys in SGLang 0.5.23's order.

    `sent_at` is when the first chunk (or the whole answer) went to the client: as SGLang's,
    a stream reports it on its first chunk and again on its last, not in between."""
    info: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.input_ids),
        "weight_version": WEIGHT_VERSION,
        "num_retractions": req.retractions,
        "storage_prefetch_wait": 0.0,
        "storage_staging_wait": 0.0,
    }
    if req.schedule_time is not None:
        info["forward_entry_time"] = svc.realtime(req.schedule_time)
    if req.first_token_time is not None:
        info["prefill_finished_time"] = svc.realtime(req.first_token_time)
    scheduled = req.schedule_time if req.schedule_time is not None else req.arrival_time
    info["queue_time"] = scheduled - req.arrival_time
    info |= {
        "reasoning_tokens": 0,
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
    }
    if req.finished:
        info["weight_versions"] = weight_versions(req)
    info["cached_tokens_details"] = (
        {"device": req.cached_tokens, "host": 0} if req.cached_tokens > 0 else None
    )
    info["dp_rank"] = None  # SGLang reports its DP rank only behind a DP controller
    if req.finished and req.finish_time is not None:
        first = req.first_token_time if req.first_token_time is not None else req.finish_time
        info |= {
            "e2e_latency": req.finish_time - req.arrival_time,
            "request_received_ts": svc.realtime(req.arrival_time),
            "first_token_latency": first - req.arrival_time,
            "api_server_dispatch_finish_ts": svc.realtime(req.arrival_time),
            "request_finished_ts": svc.realtime(req.finish_time),
        }
        decoding = req.finish_time - first
        if len(req.output_ids) > 1 and decoding > 0:
            info["decode_throughput"] = (len(req.output_ids) - 1) / decoding
    if sent_at is not None:
        info["response_sent_to_client_ts"] = sent_at
    return info


def _body(svc: EngineService, req: Request, sent_at: float | None) -> dict[str, Any]:
    info = (
        jax_api.meta_info(req)
        if svc.settings.flavor == SGLANG_JAX
        else meta_info(svc, req, sent_at)
    )
    return {"text": output_text(req, svc.core.palette), "output_ids": list(req.output_ids),
            "meta_info": info}  # fmt: skip


async def _stream_error(request: web.Request, err: InvalidRequest) -> web.StreamResponse:
    """A streamed ``/generate`` SGLang refuses once it has started: 200, an error event."""
    resp = await sse_start(request)
    error = {"message": str(err), "type": "invalid_request_error", "code": err.status,
             "retryable": False}  # fmt: skip
    await sse_event(resp, {"error": error})
    return await sse_done(resp)


def native_error(err: InvalidRequest) -> web.Response:
    """The body SGLang 0.5.23's ``/generate`` answers for this kind of problem."""
    if err.kind == "schema":  # FastAPI's validation handler: an OpenAI error object
        return openai_error(str(err), err.status, error_type=VALIDATION_ERROR_TYPE)
    if err.kind == "contract":  # the API contract check
        return json_response({"error": str(err)}, status=err.status)
    return json_response({"error": {"message": str(err)}}, status=err.status)


async def handle_generate(request: web.Request) -> web.StreamResponse:
    svc = service_of(request)
    try:
        gen = parse_generate(parse_json(await request.read()))
        ids = gen.input_ids if gen.input_ids is not None else svc.tokenizer.encode(gen.text or "")
        req = prepare(svc, gen, ids, openai=False)
    except AdapterRejected as err:  # SGLang: found once the stream has started
        return native_error(err) if not gen.stream else await _stream_error(request, err)
    except InvalidRequest as err:
        return native_error(err)
    try:
        if not gen.stream:
            await run_to_end(svc, req, request)
            return json_response(_body(svc, req, time.time()))
        resp: web.StreamResponse | None = None
        first_sent: float | None = None
        async with contextlib.aclosing(run_request(svc, req, stream=True)) as run:
            async for _ in run:
                if resp is None:
                    resp = await sse_start(request)
                sent_at = first_sent if req.finished else None
                if first_sent is None:
                    sent_at = first_sent = time.time()
                await sse_event(resp, _body(svc, req, sent_at))
        assert resp is not None
        return await sse_done(resp)
    except RequestRejected as rejected:
        return rejected.response


async def handle_abort_request(request: web.Request) -> web.Response:
    """SGLang's ``/abort_request``: ``{"rid": ...}`` or ``{"abort_all": true}``; 200, empty."""
    try:
        data = parse_json(await request.read())
    except InvalidRequest as err:
        return native_error(err)
    rid = data.get("rid")
    abort_all = data.get("abort_all", False)
    if (rid is not None and not isinstance(rid, str)) or not isinstance(abort_all, bool):
        return native_error(
            InvalidRequest(
                "rid", "rid: a string and abort_all: true or false are allowed", kind="schema"
            )
        )
    service_of(request).abort(rid or "", abort_all)
    return web.Response(status=200)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/abort_request", handle_abort_request)
    router.add_post("/generate", handle_generate)
    router.add_put("/generate", handle_generate)
