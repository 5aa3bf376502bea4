"""`tpuserve engine sim`: the simulated SGLang engine (the command-line module of the twin)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

import uvloop
from aiohttp import web

from sglang_tpu import cli_types, perf_model
from sglang_tpu.perf_model import KV_CACHE_BYTES, WEIGHT_BYTES, ModelDoesNotFit, StepTimer
from sglang_tpu.sim.engine import EngineConfig
from sglang_tpu.sim.server import create_app
from sglang_tpu.sim.service import SERVICE, ServerSettings
from sglang_tpu.tokenizer import TokenizerError, load_tokenizer
from sglang_tpu.topology import CatalogError, generation_names, lookup

log = logging.getLogger(__name__)

DESCRIPTION = """Run the simulated SGLang engine: SGLang's HTTP API, metrics and KV events, no TPU.

It serves SGLang's native and OpenAI-compatible endpoints with deterministic pseudo-text,
keeps a real radix cache with continuous batching, times every scheduler step with a TPU
performance model of --model-profile on --tpu/--topology, and publishes SGLang's KV events
on ZMQ. SIGTERM drains: /health fails, in-flight requests finish within
--drain-grace-seconds, the process exits 0.

example:
  tpuserve engine sim --port 30000 --tpu v6e --topology 2x4 --model-profile qwen3-8b \\
      --kv-events-endpoint tcp://127.0.0.1:5557 --time-scale 0.1
"""


def _endpoint(value: str) -> str:
    if not value.startswith(("tcp://", "ipc://", "inproc://")):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not allowed; allowed: a ZMQ endpoint such as tcp://127.0.0.1:5557"
        )
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    net = parser.add_argument_group("serving")
    net.add_argument("--host", default="127.0.0.1", help="Address to bind (default: %(default)s).")
    net.add_argument(
        "--port",
        type=cli_types.port,
        default=30000,
        help="HTTP port; 0 picks a free one (default: %(default)s).",
    )
    net.add_argument(
        "--drain-grace-seconds",
        type=cli_types.non_negative_float,
        default=30.0,
        help="On SIGTERM, how long in-flight requests may take to finish (default: %(default)s).",
    )
    model = parser.add_argument_group("model and hardware")
    model.add_argument(
        "--tpu",
        default="v6e",
        choices=generation_names(),
        help="TPU generation (default: %(default)s).",
    )
    model.add_argument(
        "--topology",
        default="1x1",
        help="Slice shape as GKE labels it, e.g. 2x4 or 2x2x1 (default: %(default)s).",
    )
    model.add_argument(
        "--model-profile",
        default=perf_model.DEFAULT_PROFILE,
        help="Model whose timing and KV size are simulated: "
        f"{', '.join(perf_model.profile_names())} or one of their Hugging Face ids "
        "(default: %(default)s).",
    )
    model.add_argument(
        "--model-path",
        default=None,
        help="Model path reported by /get_model_info (default: the profile's Hugging Face id).",
    )
    model.add_argument(
        "--served-model-name",
        default=None,
        help="Model name clients send in `model` (default: --model-path).",
    )
    model.add_argument(
        "--tokenizer",
        default=None,
        help="Path to a Hugging Face tokenizer.json (or its folder); default: the built-in "
        "tpuserve-default-v1 tokenizer.",
    )
    model.add_argument(
        "--quantization",
        default="bf16",
        choices=list(WEIGHT_BYTES),
        help="Weight format for HBM and timing (default: %(default)s).",
    )
    model.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=list(KV_CACHE_BYTES),
        help="KV-cache element type (default: %(default)s = bf16).",
    )
    sched = parser.add_argument_group("cache and scheduler")
    sched.add_argument(
        "--cache-tokens",
        type=cli_types.positive_int,
        default=None,
        help="KV pool size in tokens (default: what the slice's HBM holds after weights).",
    )
    sched.add_argument(
        "--page-size",
        type=cli_types.positive_int,
        default=16,
        help="Radix-cache page size in tokens (default: %(default)s).",
    )
    sched.add_argument(
        "--context-length",
        type=cli_types.positive_int,
        default=None,
        help="Longest prompt + output (default: the model's, capped at --cache-tokens).",
    )
    sched.add_argument(
        "--max-running-requests",
        type=cli_types.positive_int,
        default=256,
        help="Requests decoded together at most (default: %(default)s).",
    )
    sched.add_argument(
        "--chunked-prefill-size",
        type=cli_types.positive_int_or_minus_one,
        default=8192,
        help="Prefill token budget per step; -1 disables chunking (default: %(default)s).",
    )
    sched.add_argument(
        "--max-queued-requests",
        type=cli_types.positive_int,
        default=4096,
        help="Waiting-queue bound; beyond it requests get 503 + Retry-After "
        "(default: %(default)s).",
    )
    sched.add_argument(
        "--time-scale",
        type=cli_types.non_negative_float,
        default=1.0,
        help="Multiplier on all modelled time; 0 runs steps back to back (default: %(default)s).",
    )
    sched.add_argument(
        "--seed",
        type=cli_types.non_negative_int,
        default=0,
        help="Seed of the pseudo-text output (default: %(default)s).",
    )
    events = parser.add_argument_group("KV events (SGLang's ZMQ publisher contract)")
    events.add_argument(
        "--kv-events-endpoint",
        type=_endpoint,
        default=None,
        help="ZMQ PUB address to bind, e.g. tcp://127.0.0.1:5557 (default: off).",
    )
    events.add_argument(
        "--kv-events-replay-endpoint",
        type=_endpoint,
        default=None,
        help="ZMQ ROUTER address for replay requests (default: off).",
    )
    events.add_argument(
        "--kv-events-topic", default="", help="Topic frame of every batch (default: empty)."
    )
    events.add_argument(
        "--kv-events-buffer-steps",
        type=cli_types.positive_int,
        default=10_000,
        help="Batches kept for replay (default: %(default)s).",
    )


class ConfigError(ValueError):
    pass


def build_settings(args: argparse.Namespace) -> ServerSettings:
    """Validate the flags together; ConfigError names the flag and what is allowed."""
    try:
        shape = lookup(args.tpu, args.topology, field_path="--topology")
        profile = perf_model.get_profile(args.model_profile)
    except (CatalogError, ValueError) as err:
        raise ConfigError(str(err)) from None
    quant = args.quantization
    kv_dtype = args.kv_cache_dtype
    cache_tokens = args.cache_tokens
    if cache_tokens is None:
        cache_tokens = perf_model.kv_pool_tokens(shape, profile, quant, kv_dtype)
        if cache_tokens <= 0:
            try:
                perf_model.check_fits(shape, profile.name, quant, kv_dtype, 1)
            except ModelDoesNotFit as err:
                raise ConfigError(f"--model-profile: {err}") from None
    context = args.context_length or min(profile.context_length, cache_tokens)
    if context > cache_tokens:
        raise ConfigError(
            f"--context-length: {context} is not allowed; allowed: at most --cache-tokens "
            f"({cache_tokens})"
        )
    if args.cache_tokens is None:
        try:
            perf_model.check_fits(shape, profile.name, quant, kv_dtype, context)
        except ModelDoesNotFit as err:
            raise ConfigError(str(err)) from None
    if args.kv_events_replay_endpoint and not args.kv_events_endpoint:
        raise ConfigError("--kv-events-replay-endpoint needs --kv-events-endpoint")
    try:
        tokenizer = load_tokenizer(args.tokenizer)
    except TokenizerError as err:
        raise ConfigError(str(err)) from None
    model_path = args.model_path or profile.hf_ids[0]
    engine = EngineConfig(
        cache_tokens=cache_tokens,
        page_size=args.page_size,
        max_running_requests=args.max_running_requests,
        chunked_prefill_size=args.chunked_prefill_size,
        max_queued_requests=args.max_queued_requests,
        context_length=context,
        seed=args.seed,
        emit_kv_events=bool(args.kv_events_endpoint),
    )
    return ServerSettings(
        engine=engine,
        timer=StepTimer(shape, profile, quant, kv_dtype),
        tokenizer=tokenizer,
        model_path=model_path,
        served_model_name=args.served_model_name or model_path,
        tokenizer_path=args.tokenizer,
        time_scale=args.time_scale,
        host=args.host,
        port=args.port,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_replay_endpoint=args.kv_events_replay_endpoint,
        kv_events_topic=args.kv_events_topic,
        kv_events_buffer_steps=args.kv_events_buffer_steps,
        quantization=quant,
        kv_cache_dtype=kv_dtype,
    )


async def serve(settings: ServerSettings, drain_grace_seconds: float) -> int:
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=4096)
    await site.start()
    svc = app[SERVICE]
    addresses = [a for a in runner.addresses if isinstance(a, tuple)]
    port = addresses[0][1] if addresses else settings.port
    log.info(
        "engine twin serving %s on http://%s:%d (%s %s, %d KV tokens, time scale %g)",
        settings.served_model_name, settings.host, port, settings.timer.shape.key,
        settings.timer.profile.name, settings.engine.cache_tokens, settings.time_scale,
    )  # fmt: skip
    if svc.publisher is not None:
        log.info(
            "KV events on %s (replay %s)", svc.publisher.endpoint, svc.publisher.replay_endpoint
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"READY http://{settings.host}:{port}", flush=True)
    await stop.wait()
    svc.draining = True
    log.info(
        "draining: /health fails; waiting up to %gs for in-flight requests", drain_grace_seconds
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(svc.idle_event.wait(), drain_grace_seconds)
    if not svc.idle:
        log.warning("grace period over with %d requests unfinished", svc.core.num_running)
    with contextlib.suppress(Exception):
        await site.stop()
    await runner.cleanup()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        settings = build_settings(args)
    except ConfigError as err:
        print(f"tpuserve engine sim: error: {err}", file=sys.stderr, flush=True)
        return 2
    return int(uvloop.run(serve(settings, args.drain_grace_seconds)))
