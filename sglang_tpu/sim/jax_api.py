"""The twin's SGLang-JAX flavour (``tpuserve engine sim --flavor sglang-jax``): what SGLang-JAX's
server (``sgl_jax``, source commit cddbf6f1) presents where it differs from SGLang 0.5.23's.

Read from its source (``srt/entrypoints/http_server.py``, ``srt/managers/tokenizer_manager.py``,
``srt/managers/scheduler.py``, ``srt/entrypoints/openai/usage_processor.py``) and seen on CPU
and on the v5e (docs/engine-sim.md, "The SGLang-JAX flavour"):

- ``/get_server_info``: its server arguments, the scheduler's start report (``status``,
  ``max_total_num_tokens``, ``max_req_input_len``), ``internal_states`` (one per DP rank: the
  scheduler's `get_internal_state`: waiting queue, running batch, token pool, radix-cache size,
  KV memory) and ``version``; ``/get_model_info`` with four keys;
- ``/server_info``, ``/model_info`` and ``/v1/loads`` are not routes of it (404, FastAPI's
  ``{"detail": "Not Found"}``); ``/get_load`` answers 500 (its tokenizer manager reads a
  ``load`` key the internal state never has: ``KeyError: 'load'``), with Starlette's plain
  ``Internal Server Error``;
- ``/metrics`` exposes only ``pd_bootstrap_registry_size``: no ``sglang:*`` series;
- no KV events: ``--kv-events-config`` is parsed and nothing reads it (the twin accepts its
  KV-event flags, reports them in ``kv_events_config`` and publishes nothing);
- ``meta_info``: ``id``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens`` (and ``e2e_latency`` once finished);
- OpenAI ``usage``: ``prompt_tokens``, ``total_tokens``, ``completion_tokens`` and
  ``prompt_tokens_details``, which is ``{"cached_tokens": N}`` only with
  ``--enable-cache-report`` and N > 0, else null.
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from sglang_tpu.sim.request import Request
from sglang_tpu.sim.responses import json_response
from sglang_tpu.sim.service import EngineService, service_of

SGLANG_JAX_VERSION: Final = "0.0.2"
"""``sgl_jax.version.__version__`` of the source the flavour follows (commit cddbf6f1)."""
NOT_FOUND: Final = {"detail": "Not Found"}
METRICS_TEXT: Final = (
    "# HELP pd_bootstrap_registry_size Number of P registrations in the bootstrap registry\n"
    "# TYPE pd_bootstrap_registry_size gauge\n"
)
"""All its ``/metrics`` shows with ``--enable-metrics``: one family, without a sample (a
multiprocess gauge never set), and no request or scheduler series (as recorded)."""
ABSENT_ROUTES: Final = ("/server_info", "/model_info", "/v1/loads")
"""SGLang 0.5.23 routes SGLang-JAX does not have (404)."""


def meta_info(req: Request) -> dict[str, Any]:
    """SGLang-JAX's `meta_info` (tokenizer manager, `_handle_batch_output`), keys in its order."""
    info: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "routed_experts": None,
        "cache_miss_count": 0,
    }
    if req.finished and req.finish_time is not None:
        info["e2e_latency"] = req.finish_time - req.arrival_time
    return info


def usage(req: Request, *, enable_cache_report: bool) -> dict[str, Any]:
    """SGLang-JAX's `UsageInfo`: cached tokens reported only when the flag is on and some
    were cached (its `_details_if_cached`)."""
    cached = req.cached_tokens if enable_cache_report else 0
    return {
        "prompt_tokens": len(req.input_ids),
        "total_tokens": len(req.input_ids) + len(req.output_ids),
        "completion_tokens": len(req.output_ids),
        "prompt_tokens_details": {"cached_tokens": cached} if cached > 0 else None,
    }


def choice(body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """A non-streamed OpenAI choice as SGLang-JAX's models serialise it (null extras kept)."""
    body["hidden_states"] = None
    if chat:
        body["message"]["tool_calls"] = None
    else:
        body["routed_experts"] = None
    return body


def chunk(body: dict[str, Any], *, chat: bool, first: bool) -> dict[str, Any]:
    """A streamed chunk as SGLang-JAX writes it: every delta field present (null when unset),
    ``hidden_states`` null, ``usage`` null on every content chunk."""
    (c,) = body["choices"]
    if chat:
        delta = c["delta"]
        c["delta"] = {
            "role": "assistant" if first else None, "content": delta.get("content"),
            "reasoning_content": None, "tool_calls": None, "hidden_states": None,
        }  # fmt: skip
    else:
        c["hidden_states"] = None
    body["usage"] = None
    return body


def _server_args(svc: EngineService) -> dict[str, Any]:
    """The server arguments the twin has, under SGLang-JAX's `ServerArgs` names."""
    s = svc.settings
    cfg = svc.core.config
    shape = s.timer.shape
    kv_events_config = None
    if s.kv_events_endpoint:  # parsed and kept, never read (no publisher)
        kv_events_config = (
            f'{{"publisher": "zmq", "endpoint": "{s.kv_events_endpoint}", '
            f'"topic": "{s.kv_events_topic}"}}'
        )
    return {
        "model_path": s.model_path,
        "tokenizer_path": s.tokenizer_path or s.model_path,
        "served_model_name": s.served_model_name,
        "host": s.host,
        "port": s.port,
        "device": "tpu",
        "context_length": cfg.context_length,
        "page_size": cfg.page_size,
        "max_running_requests": cfg.max_running_requests,
        "chunked_prefill_size": cfg.chunked_prefill_size,
        "stream_interval": s.stream_interval,
        "max_total_tokens": cfg.cache_tokens,
        "quantization": None if s.quantization == "bf16" else s.quantization,
        "kv_cache_dtype": s.kv_cache_dtype,
        "tp_size": shape.devices,
        "dp_size": 1,
        "nnodes": shape.hosts,
        "schedule_policy": "fcfs",
        "random_seed": cfg.seed,
        "enable_metrics": True,
        "enable_cache_report": s.enable_cache_report,
        "kv_events_config": kv_events_config,
        "disable_radix_cache": False,
        "disaggregation_mode": "null",
        # its host tier (`--hicache-storage none`): a ratio of the device pool, no size in GB
        "hicache_storage": "none" if cfg.host_cache_tokens > 0 else "disable",
        "hicache_ratio": cfg.host_cache_tokens / cfg.cache_tokens
        if cfg.host_cache_tokens > 0
        else 2.0,  # SGLang-JAX's default
        "hicache_write_policy": cfg.write_policy,
    }


def internal_state(svc: EngineService) -> dict[str, Any]:
    """One DP rank's `Scheduler.get_internal_state` (the keys a router or dashboard reads and
    those the twin can fill; its PD queues empty)."""
    core = svc.core
    cfg = core.config
    capacity = cfg.cache_tokens
    available = max(0, capacity - core.num_used_tokens)
    waiting = [r.rid for r in core.waiting]
    running = [r.rid for r in core.running] + ([core.chunked.rid] if core.chunked else [])
    return {
        "device": "tpu",
        "chunked_prefill_size": cfg.chunked_prefill_size,
        "disable_radix_cache": False,
        "speculative_algorithm": None,
        "enable_deterministic_sampling": False,
        "pd_disaggregation": None,
        "last_gen_throughput": svc.metrics.last_gen_throughput,
        "memory_usage": {"kvcache": round(core.token_usage, 2), "token_capacity": capacity},
        "engine_paused": False,
        "waiting_queue_size": len(waiting),
        "pending_dp_reqs_size": 0,
        "running_batch_size": len(running),
        "prefill_decode_size": len(waiting) + len(running),
        "waiting_queue_rids": waiting,
        "running_batch_rids": running,
        "cur_batch_is_none": not running,
        "last_batch_is_none": not running,
        "chunked_req_is_none": core.chunked is None,
        "chunked_req_rids": [core.chunked.rid if core.chunked else None],
        "tree_cache_size": core.cache.total_size,
        "req_to_token_pool_total": cfg.max_running_requests,
        "req_to_token_pool_available": max(0, cfg.max_running_requests - len(running)),
        "req_to_token_pool_used": len(running),
        "available_kv_tokens": available,
        "available_kv_tokens_per_dp": [available],
        "num_generated_tokens": core.generated_tokens_total,
        "forward_ct_decode": 0,
        "new_token_ratio": 0.7,
        "init_new_token_ratio": 0.7,
        "disagg_prefill_queue_size": 0,
        "disagg_prealloc_queue_size": 0,
        "disagg_transfer_queue_size": 0,
    }


async def handle_server_info(request: web.Request) -> web.Response:
    """SGLang-JAX's ``/get_server_info``: server args, scheduler info, internal states per DP
    rank, version; plus the twin's own ``tpuserve`` block (slice and profile)."""
    svc = service_of(request)
    s = svc.settings
    cfg = svc.core.config
    shape = s.timer.shape
    return json_response(
        {
            **_server_args(svc),
            "status": "ready",
            "max_total_num_tokens": cfg.cache_tokens,
            "max_req_input_len": cfg.context_length - 1,
            "internal_states": [internal_state(svc)],
            "version": SGLANG_JAX_VERSION,
            "tpuserve": {
                "simulated": True, "flavor": s.flavor, "tpu": shape.generation.name,
                "topology": shape.topology, "chips": shape.chips,
                "model_profile": s.timer.profile.name, "time_scale": s.time_scale,
                "tokenizer": s.tokenizer.name,
            },
        }
    )  # fmt: skip


async def handle_model_info(request: web.Request) -> web.Response:
    s = service_of(request).settings
    return json_response(
        {"model_path": s.model_path, "tokenizer_path": s.tokenizer_path or s.model_path,
         "is_generation": True, "preferred_sampling_params": None}
    )  # fmt: skip


async def handle_get_load(request: web.Request) -> web.Response:
    """500, as SGLang-JAX's tokenizer manager raises ``KeyError: 'load'`` (Starlette's body)."""
    return web.Response(status=500, text="Internal Server Error")


async def handle_not_found(request: web.Request) -> web.Response:
    return json_response(NOT_FOUND, status=404)


async def handle_metrics(request: web.Request) -> web.Response:
    return web.Response(
        text=METRICS_TEXT, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


def add_routes(router: web.UrlDispatcher) -> None:
    """The routes where SGLang-JAX differs; health, ``/flush_cache`` and the generation routes
    are the common ones (`info_api.add_common_routes`, `native_api`, `openai_api`)."""
    router.add_get("/get_server_info", handle_server_info)
    router.add_get("/get_model_info", handle_model_info)
    router.add_get("/get_load", handle_get_load)
    router.add_get("/metrics", handle_metrics)
    for path in ABSENT_ROUTES:
        router.add_get(path, handle_not_found)
