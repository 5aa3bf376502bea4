"""The twin's admin and information routes: health, model and server info, load, cache
flush, metrics, and the tpuserve-specific ``/debug/radix_cache``.

``/server_info`` and ``/model_info`` are the current names in SGLang 0.5.23; ``/get_server_info``
and ``/get_model_info`` stay as deprecated aliases that log a warning, as SGLang's do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web
from prometheus_client.exposition import choose_encoder

from sglang_tpu.sim.generation import RequestRejected, run_to_end
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.responses import json_response
from sglang_tpu.sim.service import WEIGHT_VERSION, EngineService, service_of

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"  # the SGLang release whose API the twin answers as
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)


async def handle_health(request: web.Request) -> web.Response:
    unavailable = service_of(request).unavailable
    if unavailable is not None:
        return web.Response(status=503, text=unavailable)
    return web.Response(status=200)


async def handle_health_generate(request: web.Request) -> web.Response:
    svc = service_of(request)
    if svc.unavailable is not None:
        return web.Response(status=503, text=svc.unavailable)
    req = Request(f"HEALTH_CHECK_{svc.new_rid()}", [svc.core.palette.ids[0]], 1)
    try:
        await run_to_end(svc, req)
    except RequestRejected:
        return web.Response(status=503, text="the waiting queue is full")
    return web.Response(status=200)


def deprecated(
    handler: Callable[[web.Request], Awaitable[web.Response]], current: str
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An old path that answers like `current` and logs SGLang's deprecation warning."""

    async def alias(request: web.Request) -> web.Response:
        log.warning(
            "Endpoint '%s' is deprecated and will be removed in a future version. "
            "Please use '%s' instead.",
            request.path,
            current,
        )
        return await handler(request)

    return alias


async def handle_model_info(request: web.Request) -> web.Response:
    s = service_of(request).settings
    return json_response(
        {"model_path": s.model_path, "served_model_name": s.served_model_name,
         "tokenizer_path": s.tokenizer_path or s.tokenizer.name, "is_generation": True,
         "preferred_sampling_params": None, "weight_version": WEIGHT_VERSION,
         "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
         "disaggregation_mode": "null", "has_image_understanding": False,
         "has_audio_understanding": False, "model_type": None, "architectures": None}
    )  # fmt: skip


def _kv_events_config(svc: EngineService) -> str | None:
    """`--kv-events-config` as SGLang keeps it: the publisher's JSON (bound endpoints here)."""
    if svc.publisher is None:
        return None
    return orjson.dumps(
        {"publisher": "zmq", "endpoint": svc.publisher.endpoint, "bind": True,
         "replay_endpoint": svc.publisher.replay_endpoint, "topic": svc.settings.kv_events_topic,
         "buffer_steps": svc.settings.kv_events_buffer_steps}
    ).decode()  # fmt: skip


def kv_events_descriptor(svc: EngineService) -> dict[str, Any] | None:
    """The ``kv_events`` block of ``/server_info``, as SGLang's `describe_kv_events_publisher`
    builds it (`KVEventPublisher.describe`): where to subscribe, the topic and the block size
    to hash prompts with; None without a publisher on TCP."""
    if svc.publisher is None:
        return None
    return svc.publisher.describe(svc.core.config.page_size)


def _server_args(svc: EngineService) -> dict[str, Any]:
    """The resolved server arguments the twin has, under SGLang's `ServerArgs` names."""
    s = svc.settings
    cfg = svc.core.config
    shape = s.timer.shape
    return {
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
        "stream_interval": s.stream_interval,
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
        "enable_cache_report": s.enable_cache_report,
        "kv_events_config": _kv_events_config(svc),
        "disable_radix_cache": False,
        "weight_version": WEIGHT_VERSION,
    }


async def handle_server_info(request: web.Request) -> web.Response:
    """SGLang's ``/server_info``: resolved server arguments, scheduler info, the KV-event
    publisher, live internal state and the version, plus a tpuserve-specific block."""
    svc = service_of(request)
    s = svc.settings
    cfg = svc.core.config
    shape = s.timer.shape
    server_args = _server_args(svc)
    return json_response(
        {
            **server_args,
            "launch_command": s.launch_command,
            # scheduler info
            "status": "ready",
            "max_total_num_tokens": cfg.cache_tokens,
            "max_req_input_len": cfg.context_length - 1,
            "kv_events": kv_events_descriptor(svc),
            "startup_time": svc.startup_time,
            "internal_states": [
                {**server_args, "world_size": shape.devices,
                 "effective_max_running_requests_per_dp": cfg.max_running_requests,
                 "last_gen_throughput": svc.metrics.last_gen_throughput,
                 "memory_usage": {"token_capacity": cfg.cache_tokens}}
            ],
            "version": SGLANG_VERSION,
            "frontend": "python",
            "tpuserve": {
                "simulated": True, "tpu": shape.generation.name, "topology": shape.topology,
                "chips": shape.chips, "model_profile": s.timer.profile.name,
                "time_scale": s.time_scale, "tokenizer": s.tokenizer.name,
                "cold_start": svc.cold_start.as_json() if svc.cold_start else None,
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
    load = _load(service_of(request))
    return json_response(
        [{"dp_rank": 0, "num_reqs": load["num_total_reqs"],
          "num_waiting_reqs": load["num_waiting_reqs"], "num_tokens": load["num_total_tokens"],
          "num_pending_tokens": load["num_total_tokens"] - load["num_used_tokens"],
          "ts_tic": time.perf_counter()}]
    )  # fmt: skip


GIB = 1 << 30


async def handle_loads(request: web.Request) -> web.Response:
    """SGLang 0.5.23's ``/v1/loads`` (its default, every section): one load snapshot per DP
    rank (the twin has one), with the memory, disaggregation and queue sections."""
    svc = service_of(request)
    load = _load(svc)
    core, timer = svc.core, svc.settings.timer
    snapshot = {
        "timestamp": load["timestamp"], "dp_rank": 0,
        "num_running_reqs": load["num_running_reqs"],
        "num_waiting_reqs": load["num_waiting_reqs"],
        "num_waiting_uncached_tokens": core.waiting_uncached_tokens,
        "num_used_tokens": load["num_used_tokens"],
        "num_total_tokens": load["num_total_tokens"],
        "num_active_tokens": load["num_total_tokens"], "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": load["max_total_num_tokens"],
        "max_running_requests": load["max_running_requests"],
        "token_usage": load["token_usage"], "gen_throughput": load["gen_throughput"],
        "cache_hit_rate": load["cache_hit_rate"], "utilization": 0.0,
        "total_prefill_uncached_tokens": svc.metrics.prefill_uncached_tokens,
        "total_prefill_busy_us": round(svc.metrics.prefill_busy_seconds * 1e6),
        "decode_moments": None,
        "memory": {
            "weight_gb": round(timer.weight_bytes / timer.shape.devices / GIB, 3),
            "kv_cache_gb": round(core.config.cache_tokens * timer.kv_bytes_per_token / GIB, 3),
            "graph_gb": 0.0, "token_capacity": core.config.cache_tokens,
        },
        "disaggregation": {
            "mode": "null", "prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0,
            "decode_retracted_queue_reqs": 0, "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        },
        "queues": {"waiting": load["num_waiting_reqs"], "grammar": 0, "paused": 0,
                   "retracted": 0, "prealloc_ready": 0},
    }  # fmt: skip
    return json_response(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": None,  # SGLang's device name; the twin runs on none
            "num_accelerators": timer.shape.devices,
            "loads": [snapshot],
        }
    )


async def handle_flush_cache(request: web.Request) -> web.Response:
    core = service_of(request).core
    if core.flush_cache():
        return web.Response(status=200, text=FLUSH_OK)
    return web.Response(
        status=400,
        text="Cache not flushed because there are pending requests. "
        f"#queue-req: {core.num_waiting}, #running-req: {core.num_running}\n",
    )


async def handle_metrics(request: web.Request) -> web.Response:
    """Prometheus text, negotiated as SGLang's `make_asgi_app` does (the same prometheus_client
    call): OpenMetrics when asked for it, with its escaping of names."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = encoder(service_of(request).metrics.exposed)
    return web.Response(body=body, headers={"Content-Type": content_type})


async def handle_debug_radix_cache(request: web.Request) -> web.Response:
    """tpuserve-specific (not an SGLang path): the cache as pages with their event hashes.
    Only with ``--enable-debug-endpoints``: the token ids are the cached prompts' text."""
    svc = service_of(request)
    if not svc.settings.enable_debug_endpoints:
        return json_response({"detail": "Not Found"}, status=404)
    cache = svc.core.cache
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
    return json_response(body)


def add_common_routes(router: web.UrlDispatcher) -> None:
    """The routes every flavour answers alike: health, cache flush, the twin's debug view."""
    router.add_get("/health", handle_health)
    router.add_get("/health_generate", handle_health_generate)
    router.add_get("/flush_cache", handle_flush_cache)
    router.add_post("/flush_cache", handle_flush_cache)
    router.add_get("/debug/radix_cache", handle_debug_radix_cache)


def add_routes(router: web.UrlDispatcher) -> None:
    """SGLang 0.5.23's information routes (the default flavour)."""
    router.add_get("/model_info", handle_model_info)
    router.add_get("/get_model_info", deprecated(handle_model_info, "/model_info"))
    router.add_get("/server_info", handle_server_info)
    router.add_get("/get_server_info", deprecated(handle_server_info, "/server_info"))
    router.add_get("/get_load", handle_get_load)
    router.add_get("/v1/loads", handle_loads)
    router.add_get("/metrics", handle_metrics)
