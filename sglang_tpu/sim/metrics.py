"""Prometheus metrics of the engine twin, registered from `sglang_tpu.metric_names`.

`EngineMetrics` is the core's observer in the HTTP server: token counters move when a request
finishes (as SGLang's tokenizer collector does), latency histograms on every token, and the
scheduler gauges read the core at scrape time, so they are exact whenever Prometheus looks.
Request series carry `is_streaming` ("true" | "false"); both children exist from the start,
as client_python advises for known label values. `/metrics` serves `EngineMetrics.exposed`,
which shows the registry as SGLang's multiprocess collector would (no `_created` series).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from sglang_tpu import metric_names as names
from sglang_tpu.cold_start import CACHE_RESULTS, PHASES, ColdStartReport
from sglang_tpu.metric_names import MetricSpec
from sglang_tpu.sim.engine import EngineCore, Step
from sglang_tpu.sim.request import Request

GEN_THROUGHPUT_WINDOW_SECONDS = 5.0
IS_STREAMING_VALUES = {False: "false", True: "true"}
M = TypeVar("M", Counter, Gauge, Histogram)
R = TypeVar("R", Counter, Histogram)


def _make(spec: MetricSpec, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    if spec.kind == "counter":
        return Counter(spec.name, spec.documentation, spec.labels, registry=registry)
    if spec.kind == "gauge":
        return Gauge(
            spec.name, spec.documentation, spec.labels, registry=registry,
            multiprocess_mode="mostrecent",
        )  # fmt: skip
    return Histogram(
        spec.name, spec.documentation, spec.labels, buckets=spec.buckets, registry=registry
    )


class _WithoutCreated(Collector):
    """A registry's families without client_python's `<name>_created` samples: SGLang serves
    /metrics from the multiprocess collector, which keeps none."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


RADIX_CACHE_LABELS: Mapping[str, str] = {
    "cache_type": names.RADIX_CACHE_TYPE, "tp_rank": "0", "pp_rank": "0", "dp_rank": "0",
}  # fmt: skip


class EngineMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        core: EngineCore,
        engine_type: str = "unified",
    ) -> None:
        self.registry = registry
        self.exposed = CollectorRegistry(auto_describe=False)
        self.exposed.register(_WithoutCreated(registry))
        self.core = core
        tier = core.cache.tiered
        specs = (*names.ALL_METRICS, *(names.HICACHE_METRICS if tier else ()))
        self._made = {spec.name: _make(spec, registry) for spec in specs}
        self._tokenizer = {"model_name": model_name, "engine_type": engine_type}
        self._scheduler = {**self._tokenizer, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        self.scheduler_labels: Mapping[str, str] = self._scheduler
        self._pid = str(os.getpid())
        # cumulative, for /v1/loads' total_prefill_uncached_tokens and total_prefill_busy_us
        self.prefill_uncached_tokens = 0
        self.prefill_busy_seconds = 0.0
        # counters that follow a running total of the core's: [child, read, synced], each step
        self._totals: list[tuple[Counter, Callable[[], float], list[float]]] = []

        self.prompt_tokens = self._by_streaming(names.PROMPT_TOKENS, Counter)
        self.generation_tokens = self._by_streaming(names.GENERATION_TOKENS, Counter)
        self.num_requests = self._by_streaming(names.NUM_REQUESTS, Counter)
        self.ttft = self._by_streaming(names.TIME_TO_FIRST_TOKEN, Histogram)
        self.e2e = self._by_streaming(names.E2E_REQUEST_LATENCY, Histogram)
        self.cached_tokens = self._child(names.CACHED_TOKENS, Counter, cache_source="device")
        self.cached_host_tokens = (
            self._child(names.CACHED_TOKENS, Counter, cache_source="host") if tier else None
        )
        self._child(names.NUM_SO_REQUESTS, Counter)  # the twin has no structured output: 0
        self.num_aborted = self._child(names.NUM_ABORTED_REQUESTS, Counter)
        self.itl = self._child(names.INTER_TOKEN_LATENCY, Histogram)
        self.queue_time = self._child(names.QUEUE_TIME, Histogram)
        self.realtime = {
            mode: self._child(names.REALTIME_TOKENS, Counter, mode=mode)
            for mode in names.REALTIME_TOKEN_MODES
        }
        self.gen_throughput = self._child(names.GEN_THROUGHPUT, Gauge)
        self.cache_hit_rate = self._child(names.CACHE_HIT_RATE, Gauge)
        live: list[tuple[MetricSpec, Callable[[], float]]] = [
            (names.NUM_RUNNING_REQS, lambda: core.num_running),
            (names.NUM_QUEUE_REQS, lambda: core.num_waiting),
            (names.NUM_USED_TOKENS, lambda: core.num_used_tokens),
            (names.TOKEN_USAGE, lambda: core.token_usage),
            (names.NUM_RETRACTED_REQS, lambda: core.retracted_total),
        ]
        if tier:
            cache = core.cache
            live += [
                (names.HICACHE_HOST_USED_TOKENS, lambda: cache.host_size),
                (names.HICACHE_HOST_TOTAL_TOKENS, lambda: cache.host_capacity),
            ]
            pool = {"pool": names.HOST_POOL}
            for spec, total in (
                (names.LOAD_BACK_TOKENS, lambda: cache.loaded_back_tokens_total),
                (names.HICACHE_BACKUP_TOKENS, lambda: cache.backed_up_tokens_total),
            ):
                self._totals.append((self._child(spec, Counter, **pool), total, [0.0]))
        for spec, read in live:
            self._child(spec, Gauge).set_function(read)
        cfg = core.config
        constants: list[tuple[MetricSpec, float]] = [
            (names.MAX_TOTAL_NUM_TOKENS, cfg.cache_tokens),
            (names.PAGE_SIZE, cfg.page_size),
            (names.NUM_PAGES, cfg.cache_tokens // cfg.page_size),
            (names.CONTEXT_LEN, cfg.context_length),
            (names.NUM_GRAMMAR_QUEUE_REQS, 0),
            (names.SPEC_ACCEPT_LENGTH, 0),
            (names.UTILIZATION, -1),  # SGLang's value without max_running_requests_under_SLO
        ]
        for spec, value in constants:
            self._child(spec, Gauge).set(value)
        self._window_start = 0.0
        self._window_tokens = 0
        self.last_gen_throughput = 0.0

    def _child(self, spec: MetricSpec, kind: type[M], **extra: str) -> M:
        metric = self._made[spec.name]
        assert isinstance(metric, kind), spec.name
        base = {
            "tokenizer": self._tokenizer,
            "scheduler": self._scheduler,
            "radix_cache": RADIX_CACHE_LABELS,
        }[spec.collector]
        if "pid" in spec.extra_labels:
            extra = {**extra, "pid": self._pid}
        return metric.labels(**base, **extra)

    def _by_streaming(self, spec: MetricSpec, kind: type[R]) -> Mapping[bool, R]:
        return {
            stream: self._child(spec, kind, **{names.IS_STREAMING: value})
            for stream, value in IS_STREAMING_VALUES.items()
        }

    def emit_startup_time(self, seconds: Mapping[str, float]) -> None:
        """Startup seconds by phase (every one of `metric_names.STARTUP_PHASES`), set once."""
        for phase in names.STARTUP_PHASES:
            self._child(names.STARTUP_TIME, Gauge, phase=phase).set(seconds[phase])

    def emit_cold_start(self, report: ColdStartReport) -> None:
        """This start's seconds by phase and its compile-cache answer (tpuserve's series)."""
        seconds = Gauge(
            names.COLD_START_SECONDS, names.COLD_START_SECONDS_HELP, ["phase"],
            registry=self.registry, multiprocess_mode="mostrecent",
        )  # fmt: skip
        for phase in PHASES:
            seconds.labels(phase=phase).set(report.seconds.get(phase, 0.0))
        starts = Counter(
            names.COMPILE_CACHE_TOTAL, names.COMPILE_CACHE_TOTAL_HELP, ["result"],
            registry=self.registry,
        )  # fmt: skip
        for result in CACHE_RESULTS:
            starts.labels(result=result)  # both series exist, at 0 until counted
        starts.labels(result=report.cache_result).inc()

    def on_scheduled(self, req: Request, now: float) -> None:
        self.queue_time.observe(now - req.arrival_time)

    def on_step(self, step: Step, now: float) -> None:
        for counter, read, synced in self._totals:
            now_total = read()
            counter.inc(now_total - synced[0])
            synced[0] = now_total
        if step.kind == "prefill":
            self.prefill_uncached_tokens += step.prefill_compute_tokens
            self.prefill_busy_seconds += step.duration  # modelled, as the step was timed
            self.realtime["prefill_compute"].inc(step.prefill_compute_tokens)
            self.realtime["prefill_cache"].inc(step.prefill_cached_tokens)
            self.cache_hit_rate.set(self.core.last_prefill_hit_rate)
        else:
            self.realtime["decode"].inc(len(step.decode))
            self._window_tokens += len(step.decode)
            elapsed = now - self._window_start
            if elapsed >= GEN_THROUGHPUT_WINDOW_SECONDS:
                self.last_gen_throughput = self._window_tokens / elapsed
                self.gen_throughput.set(self.last_gen_throughput)
                self._window_start = now
                self._window_tokens = 0

    def on_token(self, req: Request, now: float, interval: float | None) -> None:
        if interval is None:
            self.ttft[req.stream].observe(now - req.arrival_time)
        else:
            self.itl.observe(interval)

    def on_finish(self, req: Request, now: float) -> None:
        self.prompt_tokens[req.stream].inc(len(req.input_ids))
        self.generation_tokens[req.stream].inc(len(req.output_ids))
        self.cached_tokens.inc(req.cached_tokens - req.cached_host_tokens)
        if self.cached_host_tokens is not None:
            self.cached_host_tokens.inc(req.cached_host_tokens)
        self.num_requests[req.stream].inc()
        self.e2e[req.stream].observe(now - req.arrival_time)

    def on_abort(self, req: Request, now: float) -> None:
        self.num_aborted.inc()
