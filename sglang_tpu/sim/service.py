"""The running engine twin: its settings, the engine core on the event loop's clock, metrics
and the KV-event publisher.

The engine loop is the real-clock driver of `sglang_tpu.sim.engine.EngineCore`: it forms a
step, sleeps the modelled step time times ``time_scale`` (0 = only yield to the event loop)
and applies the step. Handlers reach the service through the app key `SERVICE`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from sglang_tpu.cold_start import ColdStartReport
from sglang_tpu.disaggregation import ENGINE_TYPES
from sglang_tpu.kv_events import AllBlocksCleared, KVEvent
from sglang_tpu.perf_model import StepTimer
from sglang_tpu.sim.engine import EngineConfig, EngineCore
from sglang_tpu.sim.kv_publisher import KVEventPublisher
from sglang_tpu.sim.metrics import EngineMetrics
from sglang_tpu.sim.output_text import OutputPalette
from sglang_tpu.sim.pd import PD_COLOCATED, PdRole, PdSettings
from sglang_tpu.sim.request import Request
from sglang_tpu.sim.startup import STARTUP_DEFAULTS, StartupSettings
from sglang_tpu.tasks import cancel_and_wait
from sglang_tpu.tokenizer import Tokenizer

log = logging.getLogger(__name__)

SGLANG = "sglang"
SGLANG_JAX = "sglang-jax"
FLAVORS = (SGLANG, SGLANG_JAX)
"""Whose API the twin presents (`--flavor`): SGLang 0.5.23's, or SGLang-JAX's (`jax_api`)."""
WEIGHT_VERSION = "default"  # SGLang's --weight-version default; the twin's weights never change


@dataclass(frozen=True, slots=True)
class ServerSettings:
    engine: EngineConfig
    timer: StepTimer
    tokenizer: Tokenizer
    model_path: str
    served_model_name: str
    tokenizer_path: str | None = None
    time_scale: float = 1.0
    # SGLang's --stream-interval: a streamed request gets its first token at once, then a chunk
    # every this many tokens (and the last), fewer chunks for a client or router to parse
    stream_interval: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    kv_events_buffer_steps: int = 10_000
    quantization: str = "bf16"
    kv_cache_dtype: str = "auto"
    drain_grace_seconds: float = 30.0
    body_timeout_seconds: float = 30.0  # a request body must arrive within this, else 408
    system_fingerprint: str | None = None  # OpenAI's field, in every answer and chunk
    enable_cache_report: bool = False  # as SGLang: cached tokens in OpenAI usage only when set
    enable_debug_endpoints: bool = False  # /debug/radix_cache shows cached token ids
    enable_lora: bool = False  # as SGLang: requests may name adapters (set by --lora-paths)
    lora_paths: tuple[tuple[str, str], ...] = ()  # (name, path) of each loaded adapter
    launch_command: str | None = None  # the command line, reported by /server_info
    startup: StartupSettings = STARTUP_DEFAULTS  # the cold-start model (`sim/startup.py`)
    pd: PdSettings = PD_COLOCATED  # SGLang's --disaggregation-* flags (`sim/pd.py`)
    flavor: str = SGLANG  # whose API and metrics it presents (`FLAVORS`)


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
        if settings.kv_events_endpoint and settings.flavor == SGLANG_JAX:
            log.warning(
                "--flavor %s publishes no KV events (SGLang-JAX parses --kv-events-config and "
                "nothing reads it): --kv-events-endpoint is reported, not bound",
                SGLANG_JAX,
            )
        elif settings.kv_events_endpoint:
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
        self.metrics = EngineMetrics(
            self.registry, settings.served_model_name, self.core,
            engine_type=ENGINE_TYPES[settings.pd.mode],
        )  # fmt: skip
        self.core.observer = self.metrics
        self.pd: PdRole | None = None
        self.pd_waits: dict[str, asyncio.Future[None]] = {}  # rid -> its bootstrap or transfer
        if settings.pd.enabled:
            timer = settings.timer
            self.pd = PdRole(
                settings.pd, host=settings.host, kv_bytes_per_token=timer.kv_bytes_per_token,
                hosts=timer.shape.hosts, time_scale=settings.time_scale, registry=self.registry,
                scheduler_labels=self.metrics.scheduler_labels,
            )  # fmt: skip
        self.draining = False
        self.cold_start: ColdStartReport | None = None  # set once warmup is done
        self.up = asyncio.Event()  # set with it
        self.idle_event = asyncio.Event()
        self.idle_event.set()
        self._wake = asyncio.Event()
        self.stepped = asyncio.Condition()  # notified after every step (KV freed, maybe)
        self._task: asyncio.Task[None] | None = None
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self.startup_time: dict[str, float] = {}  # SGLang's startup phases, in seconds

    def now(self) -> float:
        """Seconds on the engine's clock (monotonic, 0 at construction)."""
        return time.monotonic() - self._t0

    def realtime(self, t: float) -> float:
        """A time on the engine's clock as a Unix timestamp (SGLang's ``*_ts`` values)."""
        return self.started_at + t

    async def start(self) -> None:
        if self.publisher is not None:
            self.publisher.start()
            # SGLang's radix cache resets when it is built, so a real engine's first batch is
            # AllBlocksCleared (seq 0), published before any request.
            self.publisher.publish([AllBlocksCleared()])
        # The twin loads no weights; its KV pool and scheduler are the core it just built.
        self.startup_time = {
            "load_weight": 0.0, "kv_cache_allocation": self._core_seconds,
            "scheduler_e2e": self._core_seconds,
            "tokenizer_e2e": time.perf_counter() - self._began,
        }  # fmt: skip
        self.metrics.emit_startup_time(self.startup_time)
        if self.pd is not None:
            await self.pd.start()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait([self._task])
        if self.pd is not None:
            await self.pd.stop()
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
            if self.pd is not None:
                async with self.stepped:
                    self.stepped.notify_all()

    @property
    def unavailable(self) -> str | None:
        """Why `/health` answers 503 (starting, draining), or None when it answers 200."""
        if self.draining:
            return "draining"
        return "starting" if self.cold_start is None else None

    def mark_up(self, report: ColdStartReport) -> None:
        """Warmup is done: `/health` answers 200 and the cold start is reported."""
        self.cold_start = report
        self.metrics.emit_cold_start(report)
        self.up.set()

    def submit(self, req: Request) -> None:
        """Queue a request (QueueFull when the waiting queue is at its bound)."""
        self.core.add_request(req, self.now())
        self.idle_event.clear()
        self._wake.set()

    def submit_transferred(self, req: Request, arrived: float) -> None:
        """A decode engine's request whose KV has arrived: it decodes from now on."""
        self.core.add_transferred(req, arrived, self.now())
        self.idle_event.clear()
        self._wake.set()

    def abort(self, rid: str, abort_all: bool = False) -> int:
        """SGLang's ``/abort_request``: every live request if ``abort_all``; else, if a live
        request has exactly ``rid`` (SGLang's tokenizer manager ignores an unknown one), every
        live request whose rid starts with it (its scheduler's match). Their waiters wake."""
        core = self.core
        live = [*core.waiting, *core.running, *([core.chunked] if core.chunked else [])]
        waits = [t for r, t in self.pd_waits.items() if abort_all or (rid and r.startswith(rid))]
        for task in waits:  # a PD bootstrap or transfer in progress
            task.cancel()
        if not abort_all:
            if not rid or all(r.rid != rid for r in live):
                return len(waits)
            live = [r for r in live if r.rid.startswith(rid)]
        now = self.now()
        for req in live:
            if core.abort(req, now) and req.on_update is not None:
                req.on_update(req)
        self._wake.set()
        return len(live) + len(waits)

    def new_rid(self) -> str:
        """A request id as SGLang makes one (32 hex digits)."""
        return uuid.uuid4().hex

    @property
    def idle(self) -> bool:
        return not self.core.has_work()


SERVICE = web.AppKey("service", EngineService)


def weight_versions(req: Request) -> list[dict[str, Any]]:
    """Which weights produced which output tokens (one version: the twin never reloads)."""
    return [{"version": WEIGHT_VERSION, "start": 0, "end": len(req.output_ids)}]


def service_of(request: web.Request) -> EngineService:
    return request.app[SERVICE]
