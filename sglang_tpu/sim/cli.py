"""`tpuserve engine sim`: the simulated SGLang engine (the command-line module of the twin)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shlex
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

import uvloop
from aiohttp import web

from sglang_tpu import cli_types, disaggregation, hicache, model_config, perf_model
from sglang_tpu.cold_start import TPU_FIGURES, ColdStartFigures, compile_figures
from sglang_tpu.lora import parse_lora_paths
from sglang_tpu.perf_model import KV_CACHE_BYTES, WEIGHT_BYTES, ModelDoesNotFit, StepTimer
from sglang_tpu.sim.engine import EngineConfig
from sglang_tpu.sim.kv_publisher import wire_from_env
from sglang_tpu.sim.pd import PdSettings
from sglang_tpu.sim.server import create_app
from sglang_tpu.sim.service import FLAVORS, SERVICE, SGLANG_JAX, ServerSettings
from sglang_tpu.sim.startup import STARTUP_DEFAULTS, StartupSettings
from sglang_tpu.tasks import cancel_and_wait
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


DEFAULT_TPU = "v6e"
DEFAULT_TOPOLOGY = "1x1"


@dataclass(frozen=True, slots=True)
class Option:
    """One flag of `tpuserve engine sim`.

    A flag that sets a field of `ServerSettings` or `EngineConfig` (the field named like the
    flag) takes that field's default, so every default has one source; `default` is only for
    flags that set no field of those (the slice, the profile, and values derived when unset).
    """

    flag: str
    help: str
    kind: Callable[[str], Any] = str
    source: type[ServerSettings] | type[EngineConfig] | None = None
    default: Any = None
    choices: tuple[str, ...] | None = None
    switch: bool = False  # a flag without a value that turns the setting on
    many: bool = False  # a flag taking any number of values

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def resolved_default(self) -> Any:
        if self.source is None:
            return self.default
        return field_defaults(self.source)[self.dest]


def field_defaults(cls: type[ServerSettings] | type[EngineConfig]) -> dict[str, Any]:
    """The declared defaults of a settings dataclass, by field name."""
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


OPTION_GROUPS: tuple[tuple[str, tuple[Option, ...]], ...] = (
    (
        "serving",
        (
            Option(
                "--flavor",
                "Whose API and metrics to present: sglang (SGLang 0.5.23's) or sglang-jax "
                "(SGLang-JAX's: /get_server_info with its internal states, /get_load 500, no "
                "/server_info, no sglang:* metrics, no KV events) (default: %(default)s).",
                source=ServerSettings,
                choices=FLAVORS,
            ),
            Option("--host", "Address to bind (default: %(default)s).", source=ServerSettings),
            Option(
                "--port",
                "HTTP port; 0 picks a free one (default: %(default)s).",
                cli_types.port,
                ServerSettings,
            ),
            Option(
                "--drain-grace-seconds",
                "On SIGTERM, how long in-flight requests may take to finish "
                "(default: %(default)s).",
                cli_types.non_negative_float,
                ServerSettings,
            ),
            Option(
                "--system-fingerprint",
                "OpenAI's system_fingerprint, sent in every completion and chat answer and "
                "chunk, e.g. to tell which engine answered behind a router (default: none).",
                source=ServerSettings,
            ),
            Option(
                "--body-timeout-seconds",
                "How long a request body may take to arrive; then 408 and the connection "
                "closes (default: %(default)s).",
                cli_types.duration_seconds,
                ServerSettings,
            ),
            Option(
                "--enable-debug-endpoints",
                "Serve the tpuserve-specific /debug/radix_cache (every cached page with its "
                "token ids: prompt text, readable by anyone who reaches the port); off by "
                "default.",
                source=ServerSettings,
                switch=True,
            ),
            Option(
                "--enable-cache-report",
                "Report cached prompt tokens in OpenAI usage (prompt_tokens_details), as "
                "SGLang's flag of the same name; off by default, as in SGLang.",
                source=ServerSettings,
                switch=True,
            ),
        ),
    ),
    (
        "model and hardware",
        (
            Option(
                "--tpu",
                "TPU generation (default: %(default)s).",
                default=DEFAULT_TPU,
                choices=tuple(generation_names()),
            ),
            Option(
                "--topology",
                "Slice shape as GKE labels it, e.g. 2x4 or 2x2x1 (default: %(default)s).",
                default=DEFAULT_TOPOLOGY,
            ),
            Option(
                "--model-profile",
                "Model whose timing and KV size are simulated: "
                f"{', '.join(perf_model.profile_names())} or one of their Hugging Face ids "
                "(default: %(default)s).",
                default=perf_model.DEFAULT_PROFILE,
            ),
            Option(
                "--execution-mode",
                "How TorchTPU runs the modelled engine; the eager modes add the performance "
                "model's per-layer host time (default: %(default)s).",
                default="compiled",
                choices=perf_model.EXECUTION_MODES,
            ),
            Option(
                "--model-architecture",
                "The model's config.json facts as a JSON object (num_hidden_layers, "
                "hidden_size, ...: sglang_tpu.model_config.KEYS), for a model without a "
                "built-in profile; replaces --model-profile (default: none).",
            ),
            Option(
                "--model-path",
                "Model path reported by /get_model_info (default: the profile's Hugging Face id).",
            ),
            Option(
                "--served-model-name",
                "Model name clients send in `model` (default: --model-path).",
            ),
            Option(
                "--enable-lora",
                "Accept LoRA adapter requests (set by --lora-paths), as SGLang.",
                source=ServerSettings,
                switch=True,
            ),
            Option(
                "--lora-paths",
                "LoRA adapters served, NAME=PATH or PATH (named by its path); listed by "
                "/v1/models and named by requests as MODEL:NAME or lora_path, as SGLang. The "
                "twin loads no weights: an adapter changes no output.",
                many=True,
            ),
            Option(
                "--tokenizer",
                "Path to a Hugging Face tokenizer.json (or its folder); default: the built-in "
                "tpuserve-default-v1 tokenizer.",
            ),
            Option(
                "--quantization",
                "Weight format for HBM and timing (default: %(default)s).",
                source=ServerSettings,
                choices=tuple(WEIGHT_BYTES),
            ),
            Option(
                "--kv-cache-dtype",
                "KV-cache element type (default: %(default)s = bf16).",
                source=ServerSettings,
                choices=tuple(KV_CACHE_BYTES),
            ),
        ),
    ),
    (
        "cache and scheduler",
        (
            Option(
                "--cache-tokens",
                "KV pool size in tokens (default: what the slice's HBM holds after weights).",
                cli_types.positive_int,
            ),
            Option(
                "--page-size",
                "Radix-cache page size in tokens (default: %(default)s).",
                cli_types.positive_int,
                EngineConfig,
            ),
            Option(
                "--context-length",
                "Longest prompt + output (default: the model's, capped at --cache-tokens).",
                cli_types.positive_int,
            ),
            Option(
                "--enable-hierarchical-cache",
                "A host-memory KV tier below the HBM pool, as SGLang's HiCache: HBM eviction "
                "demotes to host, a host hit loads back at the generation's host-to-device "
                "bandwidth before prefill (docs/host-kv-tier.md); off by default.",
                switch=True,
                default=False,
            ),
            Option(
                "--hicache-ratio",
                f"Host pool as a multiple of --cache-tokens (default: {hicache.DEFAULT_RATIO}, "
                "SGLang's; the twin does not lower it to the host's memory).",
                cli_types.positive_float,
            ),
            Option(
                "--hicache-size",
                "Host pool in GB per rank (SGLang's unit; one rank per TPU device); overrides "
                "--hicache-ratio (default: %(default)s, unset).",
                cli_types.non_negative_int,
                default=0,
            ),
            Option(
                "--hicache-write-policy",
                "When a page gets its host copy (default: %(default)s).",
                choices=hicache.WRITE_POLICIES,
                default=hicache.DEFAULT_WRITE_POLICY,
            ),
            Option(
                "--hicache-io-backend",
                "Accepted as SGLang's; the twin times every copy from the catalog's bandwidth "
                "(default: %(default)s).",
                choices=("direct", "kernel", "kernel_ascend"),
                default="kernel",
            ),
            Option(
                "--max-running-requests",
                "Requests decoded together at most (default: %(default)s).",
                cli_types.positive_int,
                EngineConfig,
            ),
            Option(
                "--chunked-prefill-size",
                "Prefill token budget per step; -1 disables chunking (default: %(default)s).",
                cli_types.positive_int_or_minus_one,
                EngineConfig,
            ),
            Option(
                "--max-queued-requests",
                "Waiting-queue bound; beyond it requests get 503 + Retry-After "
                "(default: %(default)s).",
                cli_types.positive_int,
                EngineConfig,
            ),
            Option(
                "--time-scale",
                "Multiplier on all modelled time; 0 runs steps back to back "
                "(default: %(default)s).",
                cli_types.non_negative_float,
                ServerSettings,
            ),
            Option(
                "--stream-interval",
                "Tokens per streamed chunk after the first, as SGLang's flag "
                "(default: %(default)s).",
                cli_types.positive_int,
                ServerSettings,
            ),
            Option(
                "--seed",
                "Seed of the pseudo-text output (default: %(default)s).",
                cli_types.non_negative_int,
                EngineConfig,
            ),
        ),
    ),
    (
        "cold start (sglang_tpu.cold_start: figures at real scale)",
        (
            Option(
                "--startup-time-scale",
                "Multiplier on the modelled cold start; 0 starts at once (default: %(default)s).",
                cli_types.non_negative_float,
                default=STARTUP_DEFAULTS.time_scale,
            ),
            Option(
                "--pull-seconds",
                "Image pull (default: %(default)s).",
                cli_types.non_negative_float,
                default=TPU_FIGURES.pull_seconds,
            ),
            Option(
                "--weights-read-gb-per-second",
                "Weight read bandwidth of each host, GB/s (default: %(default)s).",
                cli_types.positive_float,
                default=TPU_FIGURES.read_gb_per_second,
            ),
            Option(
                "--compile-cold-seconds",
                "XLA compile of the warmup shapes with no cache entry (default: measured on a "
                "v5e, scaled by the profile's layers: sglang_tpu.cold_start.compile_figures).",
                cli_types.non_negative_float,
                default=None,
            ),
            Option(
                "--compile-warm-seconds",
                "The same when the compile cache holds the key (default: as above).",
                cli_types.non_negative_float,
                default=None,
            ),
            Option(
                "--warmup-seconds",
                "SGLang's warmup request; /health answers 503 meanwhile (default: %(default)s).",
                cli_types.non_negative_float,
                default=TPU_FIGURES.warmup_seconds,
            ),
            Option(
                "--compile-cache-dir",
                "This key's compile-cache directory: a start finding the twin's entry there "
                "compiles warm, a cold one writes it (default: none, every start is cold).",
            ),
            Option(
                "--compile-cache-key",
                "The compile cache key this start reports (default: %(default)s).",
                default=STARTUP_DEFAULTS.compile_cache_key,
            ),
        ),
    ),
    (
        "PD disaggregation (SGLang's flags; sglang_tpu.sim.pd)",
        (
            Option(
                "--disaggregation-mode",
                "null (colocated), prefill (serves the bootstrap server, makes the first token "
                "and sends the KV) or decode (receives the KV, decodes) (default: %(default)s).",
                default="null",
                choices=disaggregation.MODES,
            ),
            Option(
                "--disaggregation-bootstrap-port",
                "The prefill's bootstrap server port (default: %(default)s).",
                cli_types.port,
                default=disaggregation.DEFAULT_BOOTSTRAP_PORT,
            ),
            Option(
                "--disaggregation-transfer-backend",
                "SGLang's transfer backend; the twin times every one as --kv-link, and fake "
                "moves nothing, as SGLang's (default: %(default)s).",
                default=disaggregation.DEFAULT_TRANSFER_BACKEND,
                choices=disaggregation.TRANSFER_BACKENDS,
            ),
            Option(
                "--dp-size",
                "Data-parallel ranks the prefill registers (room %% dp-size picks one) "
                "(default: %(default)s).",
                cli_types.positive_int,
                default=1,
            ),
            Option(
                "--kv-link",
                "The network the KV crosses from prefill to decode: dcn (between slices) or "
                "ici (inside one slice) (default: %(default)s).",
                default=disaggregation.DEFAULT_KV_LINK,
                choices=tuple(disaggregation.KV_LINKS),
            ),
        ),
    ),
    (
        "KV events (SGLang's ZMQ publisher contract)",
        (
            Option(
                "--kv-events-endpoint",
                "ZMQ PUB address to bind, e.g. tcp://127.0.0.1:5557 (default: off).",
                _endpoint,
                ServerSettings,
            ),
            Option(
                "--kv-events-replay-endpoint",
                "ZMQ ROUTER address for replay requests (default: off).",
                _endpoint,
                ServerSettings,
            ),
            Option(
                "--kv-events-topic",
                "Topic frame of every batch (default: empty).",
                source=ServerSettings,
            ),
            Option(
                "--kv-events-buffer-steps",
                "Batches kept for replay (default: %(default)s).",
                cli_types.positive_int,
                ServerSettings,
            ),
        ),
    ),
)


def configure(parser: argparse.ArgumentParser) -> None:
    for title, options in OPTION_GROUPS:
        group = parser.add_argument_group(title)
        for option in options:
            if option.switch:
                group.add_argument(
                    option.flag,
                    action="store_true",
                    default=option.resolved_default(),
                    help=option.help,
                )
                continue
            group.add_argument(
                option.flag,
                type=option.kind,
                default=option.resolved_default(),
                choices=option.choices,
                help=option.help,
                nargs="*" if option.many else None,
            )


class ConfigError(ValueError):
    pass


def build_settings(args: argparse.Namespace) -> ServerSettings:
    """Validate the flags together; ConfigError names the flag and what is allowed."""
    try:
        shape = lookup(args.tpu, args.topology, field_path="--topology")
        if args.model_architecture is not None:
            name = args.served_model_name or args.model_path or "custom"
            profile = model_config.architecture_from_json(
                args.model_architecture, "--model-architecture", name
            )
        else:
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
                perf_model.check_fits(shape, profile, quant, kv_dtype, 1)
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
            perf_model.check_fits(shape, profile, quant, kv_dtype, context)
        except ModelDoesNotFit as err:
            raise ConfigError(str(err)) from None
    if args.flavor == SGLANG_JAX and args.disaggregation_mode != "null":
        raise ConfigError(
            f"--disaggregation-mode {args.disaggregation_mode} is not allowed with --flavor "
            f"{SGLANG_JAX}; allowed: null (the twin's PD roles speak SGLang's bootstrap)"
        )
    if args.kv_events_replay_endpoint and not args.kv_events_endpoint:
        raise ConfigError("--kv-events-replay-endpoint needs --kv-events-endpoint")
    try:
        wire_from_env()  # read again by the publisher; checked here to fail with a message
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for env, default in (
        (disaggregation.BOOTSTRAP_TIMEOUT_ENV, disaggregation.DEFAULT_BOOTSTRAP_TIMEOUT_SECONDS),
        (disaggregation.WAITING_TIMEOUT_ENV, disaggregation.DEFAULT_WAITING_TIMEOUT_SECONDS),
    ):
        try:
            disaggregation.timeout_seconds(env, default)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    try:
        tokenizer = load_tokenizer(args.tokenizer)
    except TokenizerError as err:
        raise ConfigError(str(err)) from None
    host_tokens = 0
    if args.enable_hierarchical_cache:
        kv_per_rank_token = profile.kv_bytes_per_token(kv_dtype) / shape.devices
        host_tokens = (
            int(args.hicache_size * hicache.GB // kv_per_rank_token)
            if args.hicache_size > 0
            else int(cache_tokens * (args.hicache_ratio or hicache.DEFAULT_RATIO))
        )
    model_path = args.model_path or (profile.hf_ids[0] if profile.hf_ids else profile.name)
    engine = EngineConfig(
        cache_tokens=cache_tokens,
        page_size=args.page_size,
        max_running_requests=args.max_running_requests,
        chunked_prefill_size=args.chunked_prefill_size,
        max_queued_requests=args.max_queued_requests,
        context_length=context,
        seed=args.seed,
        emit_kv_events=bool(args.kv_events_endpoint) and args.flavor != SGLANG_JAX,
        host_cache_tokens=host_tokens,
        write_policy=args.hicache_write_policy,
        load_back_free_only=args.flavor == SGLANG_JAX,
    )
    lora_paths = parse_lora_paths(args.lora_paths or ())
    measured_cold, measured_warm = compile_figures(profile.layers)
    return ServerSettings(
        engine=engine,
        timer=StepTimer(shape, profile, quant, kv_dtype, execution_mode=args.execution_mode),
        tokenizer=tokenizer,
        model_path=model_path,
        served_model_name=args.served_model_name or model_path,
        enable_lora=args.enable_lora or bool(lora_paths),
        lora_paths=lora_paths,
        tokenizer_path=args.tokenizer,
        time_scale=args.time_scale,
        stream_interval=args.stream_interval,
        host=args.host,
        port=args.port,
        flavor=args.flavor,
        kv_events_endpoint=args.kv_events_endpoint,
        kv_events_replay_endpoint=args.kv_events_replay_endpoint,
        kv_events_topic=args.kv_events_topic,
        kv_events_buffer_steps=args.kv_events_buffer_steps,
        quantization=quant,
        kv_cache_dtype=kv_dtype,
        drain_grace_seconds=args.drain_grace_seconds,
        body_timeout_seconds=args.body_timeout_seconds,
        system_fingerprint=args.system_fingerprint,
        enable_cache_report=args.enable_cache_report,
        enable_debug_endpoints=args.enable_debug_endpoints,
        pd=PdSettings(
            mode=args.disaggregation_mode,
            bootstrap_port=args.disaggregation_bootstrap_port,
            transfer_backend=args.disaggregation_transfer_backend,
            kv_link=args.kv_link,
            dp_size=args.dp_size,
        ),
        startup=StartupSettings(
            figures=ColdStartFigures(
                pull_seconds=args.pull_seconds,
                read_gb_per_second=args.weights_read_gb_per_second,
                compile_cold_seconds=(
                    measured_cold
                    if args.compile_cold_seconds is None
                    else args.compile_cold_seconds
                ),
                compile_warm_seconds=(
                    measured_warm
                    if args.compile_warm_seconds is None
                    else args.compile_warm_seconds
                ),
                warmup_seconds=args.warmup_seconds,
            ),
            time_scale=args.startup_time_scale,
            compile_cache_dir=args.compile_cache_dir,
            compile_cache_key=args.compile_cache_key,
        ),
    )


async def _until_stopped(work: Awaitable[object], stop: asyncio.Event) -> bool:
    """Run `work` unless `stop` is set first (then cancel it); True when `work` finished."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    await cancel_and_wait([stopped])
    if task.done():
        task.result()
        return True
    await cancel_and_wait([task])
    return False


async def serve(settings: ServerSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    if not await _until_stopped(runner.setup(), stop):  # pull, weights, compile
        log.info("stopped while starting")
        return 0
    site = web.TCPSite(runner, settings.host, settings.port, backlog=4096)
    await site.start()
    svc = app[SERVICE]
    if not await _until_stopped(svc.up.wait(), stop):  # warmup: /health answers 503
        log.info("stopped while warming up")
        await runner.cleanup()
        return 0
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
    print(f"READY http://{settings.host}:{port}", flush=True)
    await stop.wait()
    svc.draining = True
    grace = settings.drain_grace_seconds
    log.info("draining: /health fails; waiting up to %gs for in-flight requests", grace)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(svc.idle_event.wait(), grace)
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
    settings = replace(settings, launch_command=shlex.join(["tpuserve", *sys.argv[1:]]))
    return int(uvloop.run(serve(settings)))
