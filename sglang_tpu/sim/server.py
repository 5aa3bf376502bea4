"""The engine twin's HTTP server: SGLang's paths and JSON shapes over the shared engine core.

`create_app(settings)` builds the aiohttp application; its cleanup context owns the engine
loop task and the KV-event publisher. The engine loop is the real-clock driver of
`sglang_tpu.sim.engine.EngineCore`: it forms a step, sleeps the modelled step time times
``time_scale`` (0 = only yield to the event loop) and applies the step.

Paths: ``/generate``, ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``,
``/health``, ``/health_generate``, ``/get_model_info`` (and ``/model_info``),
``/get_server_info`` (and ``/server_info``), ``/flush_cache``, ``/metrics``, ``/get_load``,
``/v1/loads``, plus the tpuserve-specific ``/debug/radix_cache``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from sglang_tpu.kv_events import KVEvent
from sglang_tpu.perf_model import StepTimer
from sglang_tpu.sim.engine import EngineConfig, EngineCore, OutputPalette, QueueFull, Request
from sglang_tpu.sim.kv_publisher import KVEventPublisher
from sglang_tpu.sim.metrics import EngineMetrics
from sglang_tpu.sim.protocol import (
    GenerationRequest,
    InvalidRequest,
    parse_chat,
    parse_completions,
    parse_generate,
    parse_json,
)
from sglang_tpu.tokenizer import Tokenizer

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.6"  # the SGLang API generation the twin answers as
RETRY_AFTER_SECONDS = "1"
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    engine: EngineConfig
    timer: StepTimer
    tokenizer: Tokenizer
    model_path: str
    served_model_name: str
    tokenizer_path: str | None = None
    time_scale: float = 1.0
    host: str = "127.0.0.1"
    port: int = 30000
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    kv_events_buffer_steps: int = 10_000
    quantization: str = "bf16"
    kv_cache_dtype: str = "auto"


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


def openai_error(
    message: str, status: int, param: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    return _json(
        {
            "object": "error",
            "message": message,
            "type": kind.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        },
        status=status,
        headers=headers,
    )


def _finish_reason_openai(reason: dict[str, Any] | None) -> str | None:
    if reason is None:
        return None
    return "stop" if reason["type"] in ("stop", "abort") else "length"


class EngineService:
    """The running engine: core, real-clock loop, metrics and KV-event publisher."""

    def __init__(self, settings: ServerSettings) -> None:
        self._began = time.perf_counter()  # startup phases are measured from here
        self.settings = settings
        self.tokenizer = settings.tokenizer
        self.registry = CollectorRegistry()
        self.publisher: KVEventPublisher | None = None
        sink: Callable[[list[KVEvent]], None] | None = None
        engine_config = settings.engine
        if settings.kv_events_endpoint:
            self.publisher = KVEventPublisher(
                settings.kv_events_endpoint,
                settings.kv_events_replay_endpoint,
                settings.kv_events_topic,
                settings.kv_events_buffer_steps,
            )
            sink = self.publisher.publish
            if not engine_config.emit_kv_events:
                engine_config = EngineConfig(**{**asdict(engine_config), "emit_kv_events": True})
        self.core = EngineCore(
            engine_config, settings.timer, OutputPalette(self.tokenizer), kv_event_sink=sink
        )
        self._core_seconds = time.perf_counter() - self._began
        self.metrics = EngineMetrics(self.registry, settings.served_model_name, self.core)
        self.core.observer = self.metrics
        self.draining = False
        self.idle_event = asyncio.Event()
        self.idle_event.set()
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self.started_at = time.time()

    def now(self) -> float:
        return time.monotonic() - self._t0

    async def start(self) -> None:
        if self.publisher is not None:
            self.publisher.start()
        # The twin loads no weights; its KV pool and scheduler are the core it just built.
        self.metrics.emit_startup_time(
            {"load_weight": 0.0, "kv_cache_allocation": self._core_seconds,
             "scheduler_e2e": self._core_seconds,
             "tokenizer_e2e": time.perf_counter() - self._began}
        )  # fmt: skip
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.publisher is not None:
            await self.publisher.close()

    async def _run(self) -> None:
        core = self.core
        scale = self.settings.time_scale
        while True:
            if not core.has_work():
                self.idle_event.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            step = core.begin_step(self.now())
            if step is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = step.duration * scale
            await asyncio.sleep(delay if delay > 0 else 0)
            try:
                core.finish_step(step, self.now())
            except Exception:
                log.exception("engine step failed")
                raise

    def submit(self, req: Request) -> None:
        """Queue a request (QueueFull when the waiting queue is at its bound)."""
        self.core.add_request(req, self.now())
        self.idle_event.clear()
        self._wake.set()

    def new_rid(self) -> str:
        return f"{uuid.uuid4().hex[:16]}{next(self._ids)}"

    @property
    def idle(self) -> bool:
        return not self.core.has_work()


SERVICE = web.AppKey("service", EngineService)


def _service(request: web.Request) -> EngineService:
    return request.app[SERVICE]


class RequestRejected(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


def _prepare(
    svc: EngineService, gen: GenerationRequest, prompt_ids: list[int], openai: bool
) -> Request:
    ctx = svc.settings.engine.context_length
    if len(prompt_ids) >= ctx:
        param = "messages" if gen.text is None and gen.input_ids is None else "prompt"
        if not openai:
            param = "text" if gen.text is not None else "input_ids"
        raise InvalidRequest(
            param,
            f"{param}: the prompt has {len(prompt_ids)} tokens; allowed: fewer than the "
            f"context length {ctx}",
        )
    vocab = svc.tokenizer.vocab_size
    bad = next((t for t in prompt_ids if t >= vocab), None)
    if bad is not None:
        raise InvalidRequest(
            "input_ids" if not openai else "prompt",
            f"token id {bad} is not allowed; allowed: ids below the vocabulary size {vocab}",
        )
    max_new = min(gen.max_new_tokens, ctx - len(prompt_ids))
    seed = gen.seed
    if seed is None and gen.temperature > 0:
        seed = svc.core.next_sampling_seed()
    return Request(
        gen.rid or svc.new_rid(),
        prompt_ids,
        max_new,
        stop_strings=gen.stop,
        stop_token_ids=gen.stop_token_ids,
        sampling_seed=seed,
        stream=gen.stream,
    )


def _check_model(svc: EngineService, model: str | None) -> None:
    served = svc.settings.served_model_name
    if model is not None and model not in (served, svc.settings.model_path):
        raise InvalidRequest(
            "model",
            f"model: {model!r} does not exist; allowed: {served!r}",
            status=404,
        )


async def _run_request(svc: EngineService, req: Request, stream: bool) -> AsyncGenerator[int, None]:
    """Submit `req` and yield the output length each time it grows; aborts on disconnect."""
    wake = asyncio.Event()
    req.on_update = lambda _r: wake.set()
    if svc.draining:
        raise RequestRejected(
            openai_error(
                "the server is draining", 503, headers={"Retry-After": RETRY_AFTER_SECONDS}
            )
        )
    try:
        svc.submit(req)
    except QueueFull as err:
        raise RequestRejected(
            openai_error(str(err), 503, headers={"Retry-After": RETRY_AFTER_SECONDS})
        ) from None
    try:
        while not req.finished:
            await wake.wait()
            wake.clear()
            if stream:
                yield len(req.output_ids)
        yield len(req.output_ids)
    finally:
        if not req.finished:
            svc.core.abort(req, svc.now())


def _meta_info(svc: EngineService, req: Request) -> dict[str, Any]:
    return {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "e2e_latency": (req.finish_time or svc.now()) - req.arrival_time,
        "weight_version": "default",
    }


def _usage(req: Request) -> dict[str, Any]:
    return {
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "total_tokens": len(req.input_ids) + len(req.output_ids),
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
    }


async def _sse_start(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    return resp


async def _sse(resp: web.StreamResponse, data: Any) -> None:
    await resp.write(b"data: " + orjson.dumps(data) + b"\n\n")


async def _sse_done(resp: web.StreamResponse) -> web.StreamResponse:
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


# --- generation handlers ------------------------------------------------------------------


async def handle_generate(request: web.Request) -> web.StreamResponse:
    svc = _service(request)
    try:
        gen = parse_generate(parse_json(await request.read()))
        ids = gen.input_ids if gen.input_ids is not None else svc.tokenizer.encode(gen.text or "")
        req = _prepare(svc, gen, ids, openai=False)
    except InvalidRequest as err:
        return _json(
            {"error": {"message": str(err), "type": "BadRequestError", "param": err.param,
                       "code": err.status}},
            status=err.status,
        )  # fmt: skip
    core = svc.core
    try:
        if not gen.stream:
            async with contextlib.aclosing(_run_request(svc, req, stream=False)) as run:
                async for _ in run:
                    pass
            return _json(
                {"text": core.output_text(req), "output_ids": req.output_ids,
                 "meta_info": _meta_info(svc, req)}
            )  # fmt: skip
        resp: web.StreamResponse | None = None
        async with contextlib.aclosing(_run_request(svc, req, stream=True)) as run:
            async for _ in run:
                if resp is None:
                    resp = await _sse_start(request)
                await _sse(
                    resp,
                    {"text": core.output_text(req), "output_ids": list(req.output_ids),
                     "meta_info": _meta_info(svc, req)},
                )  # fmt: skip
        assert resp is not None
        return await _sse_done(resp)
    except RequestRejected as rejected:
        return rejected.response


async def handle_completions(request: web.Request) -> web.StreamResponse:
    svc = _service(request)
    try:
        gen = parse_completions(parse_json(await request.read()))
        _check_model(svc, gen.model)
        ids = gen.input_ids if gen.input_ids is not None else svc.tokenizer.encode(gen.text or "")
        req = _prepare(svc, gen, ids, openai=True)
    except InvalidRequest as err:
        return openai_error(str(err), err.status, err.param)
    return await _openai_response(request, svc, gen, req, chat=False)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    svc = _service(request)
    try:
        gen, messages = parse_chat(parse_json(await request.read()))
        _check_model(svc, gen.model)
        ids = svc.tokenizer.encode(svc.tokenizer.apply_chat_template(messages))
        req = _prepare(svc, gen, ids, openai=True)
    except InvalidRequest as err:
        return openai_error(str(err), err.status, err.param)
    return await _openai_response(request, svc, gen, req, chat=True)


async def _openai_response(
    request: web.Request, svc: EngineService, gen: GenerationRequest, req: Request, chat: bool
) -> web.StreamResponse:
    core = svc.core
    model = svc.settings.served_model_name
    created = int(time.time())
    rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
    obj = "chat.completion" if chat else "text_completion"
    try:
        if not gen.stream:
            async with contextlib.aclosing(_run_request(svc, req, stream=False)) as run:
                async for _ in run:
                    pass
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": _finish_reason_openai(req.finish_reason),
                "matched_stop": (req.finish_reason or {}).get("matched"),
            }
            text = core.output_text(req)
            if chat:
                choice["message"] = {
                    "role": "assistant", "content": text, "reasoning_content": None,
                    "tool_calls": None,
                }  # fmt: skip
            else:
                choice["text"] = text
            return _json(
                {"id": rid, "object": obj, "created": created, "model": model,
                 "choices": [choice], "usage": _usage(req)}
            )  # fmt: skip
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        resp: web.StreamResponse | None = None
        sent_text = 0

        def chunk(delta: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
            c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
            if chat:
                d: dict[str, Any] = {}
                if first:
                    d["role"] = "assistant"
                if delta is not None:
                    d["content"] = delta
                c["delta"] = d
            else:
                c["text"] = delta or ""
            if finish is not None:
                c["matched_stop"] = (req.finish_reason or {}).get("matched")
            return {"id": rid, "object": chunk_obj, "created": created, "model": model,
                    "choices": [c]}  # fmt: skip

        async with contextlib.aclosing(_run_request(svc, req, stream=True)) as run:
            async for _ in run:
                if resp is None:
                    resp = await _sse_start(request)
                    if chat:
                        await _sse(resp, chunk("", None, first=True))
                text = core.output_text(req)
                if len(text) > sent_text:
                    await _sse(resp, chunk(text[sent_text:], None))
                    sent_text = len(text)
        assert resp is not None
        await _sse(resp, chunk(None if chat else "", _finish_reason_openai(req.finish_reason)))
        if gen.include_usage:
            await _sse(
                resp,
                {"id": rid, "object": chunk_obj, "created": created, "model": model,
                 "choices": [], "usage": _usage(req)},
            )  # fmt: skip
        return await _sse_done(resp)
    except RequestRejected as rejected:
        return rejected.response


# --- informational handlers ---------------------------------------------------------------


async def handle_models(request: web.Request) -> web.Response:
    s = _service(request).settings
    return _json(
        {
            "object": "list",
            "data": [
                {"id": s.served_model_name, "object": "model", "created": int(time.time()),
                 "owned_by": "sglang", "root": s.model_path,
                 "max_model_len": s.engine.context_length},
            ],
        }
    )  # fmt: skip


async def handle_health(request: web.Request) -> web.Response:
    if _service(request).draining:
        return web.Response(status=503, text="draining")
    return web.Response(status=200)


async def handle_health_generate(request: web.Request) -> web.Response:
    svc = _service(request)
    if svc.draining:
        return web.Response(status=503, text="draining")
    req = Request(f"HEALTH_CHECK_{svc.new_rid()}", [svc.core.palette.ids[0]], 1)
    try:
        async with contextlib.aclosing(_run_request(svc, req, stream=False)) as run:
            async for _ in run:
                pass
    except RequestRejected:
        return web.Response(status=503, text="the waiting queue is full")
    return web.Response(status=200)


async def handle_model_info(request: web.Request) -> web.Response:
    s = _service(request).settings
    return _json(
        {"model_path": s.model_path, "tokenizer_path": s.tokenizer_path or s.tokenizer.name,
         "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
         "has_image_understanding": False, "has_audio_understanding": False,
         "model_type": None, "architectures": None}
    )  # fmt: skip


def _kv_events_config(svc: EngineService) -> str | None:
    if svc.publisher is None:
        return None
    return orjson.dumps(
        {"publisher": "zmq", "endpoint": svc.publisher.endpoint,
         "replay_endpoint": svc.publisher.replay_endpoint, "topic": svc.settings.kv_events_topic,
         "buffer_steps": svc.settings.kv_events_buffer_steps}
    ).decode()  # fmt: skip


async def handle_server_info(request: web.Request) -> web.Response:
    svc = _service(request)
    s = svc.settings
    cfg = svc.core.config
    shape = s.timer.shape
    return _json(
        {
            # server_args, as SGLang dumps its ServerArgs dataclass (the fields the twin has)
            "model_path": s.model_path,
            "tokenizer_path": s.tokenizer_path,
            "served_model_name": s.served_model_name,
            "host": s.host,
            "port": s.port,
            "context_length": cfg.context_length,
            "page_size": cfg.page_size,
            "max_running_requests": cfg.max_running_requests,
            "max_queued_requests": cfg.max_queued_requests,
            "chunked_prefill_size": cfg.chunked_prefill_size,
            "max_total_tokens": cfg.cache_tokens,
            "quantization": s.quantization,
            "kv_cache_dtype": s.kv_cache_dtype,
            "tp_size": shape.devices,
            "dp_size": 1,
            "pp_size": 1,
            "nnodes": shape.hosts,
            "device": "tpu",
            "schedule_policy": "fcfs",
            "random_seed": cfg.seed,
            "enable_metrics": True,
            "kv_events_config": _kv_events_config(svc),
            "disable_radix_cache": False,
            # scheduler_info
            "max_total_num_tokens": cfg.cache_tokens,
            "max_req_input_len": cfg.context_length - 1,
            "internal_states": [
                {"last_gen_throughput": svc.metrics.last_gen_throughput,
                 "memory_usage": {"token_capacity": cfg.cache_tokens}}
            ],
            "version": SGLANG_VERSION,
            "tpuserve": {
                "simulated": True, "tpu": shape.generation.name, "topology": shape.topology,
                "chips": shape.chips, "model_profile": s.timer.profile.name,
                "time_scale": s.time_scale, "tokenizer": s.tokenizer.name,
            },
        }
    )  # fmt: skip


def _load(svc: EngineService) -> dict[str, Any]:
    core = svc.core
    cfg = core.config
    used = core.num_used_tokens
    return {
        "dp_rank": 0,
        "timestamp": time.time(),
        "num_running_reqs": core.num_running,
        "num_waiting_reqs": core.num_waiting,
        "num_total_reqs": core.num_running + core.num_waiting,
        "num_used_tokens": used,
        "num_total_tokens": used + core.waiting_prompt_tokens,
        "max_total_num_tokens": cfg.cache_tokens,
        "token_usage": core.token_usage,
        "gen_throughput": svc.metrics.last_gen_throughput,
        "cache_hit_rate": core.last_prefill_hit_rate,
        "utilization": -1.0,
        "max_running_requests": cfg.max_running_requests,
    }


async def handle_get_load(request: web.Request) -> web.Response:
    load = _load(_service(request))
    return _json(
        [{"dp_rank": 0, "num_reqs": load["num_total_reqs"],
          "num_waiting_reqs": load["num_waiting_reqs"], "num_tokens": load["num_total_tokens"],
          "num_pending_tokens": load["num_total_tokens"] - load["num_used_tokens"],
          "ts_tic": time.perf_counter()}]
    )  # fmt: skip


async def handle_loads(request: web.Request) -> web.Response:
    load = _load(_service(request))
    return _json(
        {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
            "version": SGLANG_VERSION,
            "dp_rank_count": 1,
            "loads": [load],
            "aggregate": {
                "total_running_reqs": load["num_running_reqs"],
                "total_waiting_reqs": load["num_waiting_reqs"],
                "total_reqs": load["num_total_reqs"],
                "total_used_tokens": load["num_used_tokens"],
                "total_tokens": load["num_total_tokens"],
                "avg_token_usage": load["token_usage"],
                "avg_throughput": load["gen_throughput"],
                "avg_utilization": load["utilization"],
            },
        }
    )


async def handle_flush_cache(request: web.Request) -> web.Response:
    core = _service(request).core
    if core.flush_cache():
        return web.Response(status=200, text=FLUSH_OK)
    return web.Response(
        status=400,
        text="Cache not flushed because there are pending requests. "
        f"#queue-req: {core.num_waiting}, #running-req: {core.num_running}\n",
    )


async def handle_metrics(request: web.Request) -> web.Response:
    body = generate_latest(_service(request).metrics.exposed)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def handle_debug_radix_cache(request: web.Request) -> web.Response:
    """tpuserve-specific (not an SGLang path): the cache as pages with their event hashes."""
    core = _service(request).core
    cache = core.cache
    blocks = [
        {"block_hash": b.block_hash, "parent_block_hash": b.parent_block_hash,
         "token_ids": list(b.token_ids)}
        for b in cache.blocks()
    ]  # fmt: skip
    body: dict[str, Any] = {
        "page_size": cache.page_size,
        "total_tokens": cache.total_size,
        "evictable_tokens": cache.evictable_size,
        "protected_tokens": cache.protected_size,
        "evicted_tokens_total": cache.evicted_tokens_total,
        "blocks": blocks,
    }
    if request.query.get("tree") in ("1", "true"):
        body["tree"] = cache.debug_tree()
    return _json(body)


def create_app(settings: ServerSettings) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        svc = EngineService(settings)
        app[SERVICE] = svc
        await svc.start()
        yield
        await svc.stop()

    app.cleanup_ctx.append(lifetime)
    r = app.router
    r.add_post("/generate", handle_generate)
    r.add_put("/generate", handle_generate)
    r.add_post("/v1/completions", handle_completions)
    r.add_post("/v1/chat/completions", handle_chat)
    r.add_get("/v1/models", handle_models)
    r.add_get("/health", handle_health)
    r.add_get("/health_generate", handle_health_generate)
    r.add_get("/get_model_info", handle_model_info)
    r.add_get("/model_info", handle_model_info)
    r.add_get("/get_server_info", handle_server_info)
    r.add_get("/server_info", handle_server_info)
    r.add_get("/get_load", handle_get_load)
    r.add_get("/v1/loads", handle_loads)
    r.add_get("/flush_cache", handle_flush_cache)
    r.add_post("/flush_cache", handle_flush_cache)
    r.add_get("/metrics", handle_metrics)
    r.add_get("/debug/radix_cache", handle_debug_radix_cache)
    return app
