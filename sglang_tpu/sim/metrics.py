"""Prometheus metrics of the engine twin, registered from `sglang_tpu.metric_names`.

`EngineMetrics` is the core's observer in the HTTP server: token counters move when a request
finishes (as SGLang's tokenizer collector does), latency histograms on every token, and the
scheduler gauges read the core at scrape time, so they are exact whenever Prometheus looks.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sglang_tpu import metric_names as names
from sglang_tpu.metric_names import MetricSpec
from sglang_tpu.sim.engine import EngineCore, Request, Step

GEN_THROUGHPUT_WINDOW_SECONDS = 5.0


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


class EngineMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        core: EngineCore,
        engine_type: str = "unified",
    ) -> None:
        self.registry = registry
        self.core = core
        made = {spec.name: _make(spec, registry) for spec in names.ALL_METRICS}
        tok = {"model_name": model_name}
        sched = {
            "model_name": model_name,
            "engine_type": engine_type,
            "tp_rank": "0",
            "pp_rank": "0",
        }

        def counter(spec: MetricSpec, **extra: str) -> Counter:
            metric = made[spec.name]
            assert isinstance(metric, Counter)
            base = tok if spec.collector == "tokenizer" else sched
            return metric.labels(**base, **extra)

        def gauge(spec: MetricSpec, **extra: str) -> Gauge:
            metric = made[spec.name]
            assert isinstance(metric, Gauge)
            return metric.labels(**sched, **extra)

        def histogram(spec: MetricSpec) -> Histogram:
            metric = made[spec.name]
            assert isinstance(metric, Histogram)
            return metric.labels(**(tok if spec.collector == "tokenizer" else sched))

        self.prompt_tokens = counter(names.PROMPT_TOKENS)
        self.generation_tokens = counter(names.GENERATION_TOKENS)
        self.cached_tokens = counter(names.CACHED_TOKENS, cache_source="device")
        self.num_requests = counter(names.NUM_REQUESTS)
        self.num_requests_received = counter(names.NUM_REQUESTS_RECEIVED)
        counter(names.NUM_SO_REQUESTS)  # the twin has no structured output: stays 0
        self.num_aborted = counter(names.NUM_ABORTED_REQUESTS)
        self.ttft = histogram(names.TIME_TO_FIRST_TOKEN)
        self.itl = histogram(names.INTER_TOKEN_LATENCY)
        self.e2e = histogram(names.E2E_REQUEST_LATENCY)
        self.queue_time = histogram(names.QUEUE_TIME)
        self.realtime = {
            mode: counter(names.REALTIME_TOKENS, mode=mode) for mode in names.REALTIME_TOKEN_MODES
        }
        self.gen_throughput = gauge(names.GEN_THROUGHPUT)
        self.cache_hit_rate = gauge(names.CACHE_HIT_RATE)
        cfg = core.config
        live: list[tuple[MetricSpec, Callable[[], float]]] = [
            (names.NUM_RUNNING_REQS, lambda: core.num_running),
            (names.NUM_QUEUE_REQS, lambda: core.num_waiting),
            (names.NUM_USED_TOKENS, lambda: core.num_used_tokens),
            (names.TOKEN_USAGE, lambda: core.token_usage),
            (names.MAX_TOTAL_NUM_TOKENS, lambda: cfg.cache_tokens),
            (names.NUM_RETRACTED_REQS, lambda: core.retracted_total),
        ]
        for spec, read in live:
            gauge(spec).set_function(read)
        gauge(names.NUM_GRAMMAR_QUEUE_REQS).set(0)
        gauge(names.SPEC_ACCEPT_LENGTH).set(0)
        gauge(names.UTILIZATION).set(-1)
        gauge(names.ENGINE_STARTUP_TIME).set(0)
        gauge(names.ENGINE_LOAD_WEIGHTS_TIME).set(0)
        gauge(
            names.CACHE_CONFIG_INFO,
            page_size=str(cfg.page_size),
            num_pages=str(cfg.cache_tokens // cfg.page_size),
        ).set(1)
        self._window_start = 0.0
        self._window_tokens = 0
        self.last_gen_throughput = 0.0

    def on_received(self) -> None:
        self.num_requests_received.inc()

    def on_scheduled(self, req: Request, now: float) -> None:
        self.queue_time.observe(now - req.arrival_time)

    def on_step(self, step: Step, now: float) -> None:
        if step.kind == "prefill":
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
            self.ttft.observe(now - req.arrival_time)
        else:
            self.itl.observe(interval)

    def on_finish(self, req: Request, now: float) -> None:
        self.prompt_tokens.inc(len(req.input_ids))
        self.generation_tokens.inc(len(req.output_ids))
        self.cached_tokens.inc(req.cached_tokens)
        self.num_requests.inc()
        self.e2e.observe(now - req.arrival_time)

    def on_abort(self, req: Request, now: float) -> None:
        self.num_aborted.inc()
