"""Every SGLang Prometheus metric the engine twin exports: name, type, labels and buckets.

The one list of ``sglang:*`` names in tpuserve. The twin registers exactly these; the chart's
dashboards, recording rules and the operator's autoscaler import them. Each is declared by the
SGLang release the image pins (0.5.23, ``srt/observability/metrics_collector.py``) with the same
type, label names and buckets; ``tests/metrics/test_sglang_declarations.py`` checks that against
the pinned wheel. Request-level metrics come from SGLang's tokenizer collector (labels
``model_name``, ``engine_type``), engine metrics from its scheduler collector (labels
``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``).

`name` is spelled as a PromQL query writes it: counters end in ``_total``; a histogram's
series are `name` + ``_bucket`` / ``_sum`` / ``_count``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypedDict

MetricKind = Literal["counter", "gauge", "histogram"]
Collector = Literal["tokenizer", "scheduler", "radix_cache"]

TOKENIZER_LABELS: tuple[str, ...] = ("model_name", "engine_type")
SCHEDULER_LABELS: tuple[str, ...] = (
    "model_name",
    "engine_type",
    "tp_rank",
    "pp_rank",
    "moe_ep_rank",
)
# The radix cache's own collector (`radix_cache_metric_labels`): HiCache's L2 transfer counters.
RADIX_CACHE_LABELS: tuple[str, ...] = ("cache_type", "tp_rank", "pp_rank", "dp_rank")
RADIX_CACHE_TYPE = "UnifiedRadixCache"
"""`cache_type`: the cache's class name; 0.5.23's HiCache is `UnifiedRadixCache`."""
# Request counters and histograms split streaming from non-streaming requests: "true" | "false".
IS_STREAMING = "is_streaming"

TTFT_BUCKETS_SECONDS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0,
)  # fmt: skip
ITL_BUCKETS_SECONDS: tuple[float, ...] = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08,
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
E2E_BUCKETS_SECONDS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
    200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
)  # fmt: skip
QUEUE_TIME_BUCKETS_SECONDS: tuple[float, ...] = (
    0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0,
    800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0,
)  # fmt: skip

REALTIME_TOKEN_MODES: tuple[str, ...] = ("prefill_compute", "prefill_cache", "decode")
CACHE_SOURCES: tuple[str, ...] = ("device", "host")  # host: with the host tier (HiCache)
# The phases SGLang reports once the server is up (`emit_startup_time`).
STARTUP_PHASES: tuple[str, ...] = (
    "load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: MetricKind
    documentation: str
    collector: Collector
    extra_labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def labels(self) -> tuple[str, ...]:
        base = {
            "tokenizer": TOKENIZER_LABELS,
            "scheduler": SCHEDULER_LABELS,
            "radix_cache": RADIX_CACHE_LABELS,
        }[self.collector]
        return base + self.extra_labels

    @property
    def family(self) -> str:
        """The family name prometheus_client's text parser reports (counters lose ``_total``)."""
        if self.kind == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name

    @property
    def series(self) -> tuple[str, ...]:
        """Every series name a query may select for this metric."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


def _c(name: str, doc: str, collector: Collector, *extra: str) -> MetricSpec:
    return MetricSpec(name, "counter", doc, collector, tuple(extra))


def _g(name: str, doc: str, collector: Collector = "scheduler", *extra: str) -> MetricSpec:
    return MetricSpec(name, "gauge", doc, collector, tuple(extra))


def _h(
    name: str, doc: str, collector: Collector, buckets: tuple[float, ...], *extra: str
) -> MetricSpec:
    return MetricSpec(name, "histogram", doc, collector, tuple(extra), buckets)


# Request-level (tokenizer collector).
STARTUP_TIME = _g(
    "sglang:startup_time_seconds",
    "Engine startup duration by phase in seconds.",
    "tokenizer",
    "phase",
)
PROMPT_TOKENS = _c(
    "sglang:prompt_tokens_total", "Number of prefill tokens processed.", "tokenizer", IS_STREAMING
)
GENERATION_TOKENS = _c(
    "sglang:generation_tokens_total",
    "Number of generation tokens processed.",
    "tokenizer",
    IS_STREAMING,
)
CACHED_TOKENS = _c(
    "sglang:cached_tokens_total",
    "Number of cached prompt tokens by source (device/host/storage).",
    "tokenizer",
    "cache_source",
)
NUM_REQUESTS = _c(
    "sglang:num_requests_total", "Number of requests processed.", "tokenizer", IS_STREAMING
)
NUM_SO_REQUESTS = _c(
    "sglang:num_so_requests_total",
    "Number of structured output requests processed.",
    "tokenizer",
)
NUM_ABORTED_REQUESTS = _c(
    "sglang:num_aborted_requests_total", "Number of requests aborted.", "tokenizer"
)
TIME_TO_FIRST_TOKEN = _h(
    "sglang:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    "tokenizer",
    TTFT_BUCKETS_SECONDS,
    IS_STREAMING,
)
INTER_TOKEN_LATENCY = _h(
    "sglang:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    "tokenizer",
    ITL_BUCKETS_SECONDS,
)
E2E_REQUEST_LATENCY = _h(
    "sglang:e2e_request_latency_seconds",
    "Histogram of End-to-end request latency in seconds",
    "tokenizer",
    E2E_BUCKETS_SECONDS,
    IS_STREAMING,
)

# Engine (scheduler collector).
NUM_RUNNING_REQS = _g("sglang:num_running_reqs", "The number of running requests.")
NUM_QUEUE_REQS = _g("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
NUM_USED_TOKENS = _g("sglang:num_used_tokens", "The number of used tokens.")
TOKEN_USAGE = _g("sglang:token_usage", "The token usage.")
MAX_TOTAL_NUM_TOKENS = _g(
    "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."
)
GEN_THROUGHPUT = _g("sglang:gen_throughput", "The generation throughput (token/s).")
CACHE_HIT_RATE = _g("sglang:cache_hit_rate", "The prefix cache hit rate.")
NUM_GRAMMAR_QUEUE_REQS = _g(
    "sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."
)
SPEC_ACCEPT_LENGTH = _g(
    "sglang:spec_accept_length",
    "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
)
UTILIZATION = _g("sglang:utilization", "The utilization.")
# SGLang declares this gauge without a multiprocess mode, so its multiprocess /metrics keeps one
# series per process, labelled with the scheduler's `pid`.
NUM_RETRACTED_REQS = _g(
    "sglang:num_retracted_reqs", "The number of retracted requests.", "scheduler", "pid"
)
PAGE_SIZE = _g("sglang:page_size", "KV cache page size in tokens.")
NUM_PAGES = _g("sglang:num_pages", "Number of KV cache pages.")
CONTEXT_LEN = _g("sglang:context_len", "Maximum context length.")
REALTIME_TOKENS = _c(
    "sglang:realtime_tokens_total",
    "Total number of tokens processed (updated on each log interval). "
    "mode: prefill_compute, prefill_cache, decode.",
    "scheduler",
    "mode",
)
QUEUE_TIME = _h(
    "sglang:queue_time_seconds",
    "Histogram of queueing time in seconds.",
    "scheduler",
    QUEUE_TIME_BUCKETS_SECONDS,
)

ALL_METRICS: tuple[MetricSpec, ...] = (
    STARTUP_TIME,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    CACHED_TOKENS,
    NUM_REQUESTS,
    NUM_SO_REQUESTS,
    NUM_ABORTED_REQUESTS,
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    E2E_REQUEST_LATENCY,
    NUM_RUNNING_REQS,
    NUM_QUEUE_REQS,
    NUM_USED_TOKENS,
    TOKEN_USAGE,
    MAX_TOTAL_NUM_TOKENS,
    GEN_THROUGHPUT,
    CACHE_HIT_RATE,
    NUM_GRAMMAR_QUEUE_REQS,
    SPEC_ACCEPT_LENGTH,
    UTILIZATION,
    NUM_RETRACTED_REQS,
    PAGE_SIZE,
    NUM_PAGES,
    CONTEXT_LEN,
    REALTIME_TOKENS,
    QUEUE_TIME,
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in ALL_METRICS}

# PD disaggregation (scheduler collector), exported by an engine in prefill or decode mode only.
KV_TRANSFER_SPEED_BUCKETS: tuple[float, ...] = (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400)
KV_TRANSFER_LATENCY_BUCKETS_MS: tuple[float, ...] = (
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
)  # fmt: skip
KV_TRANSFER_MB_BUCKETS: tuple[float, ...] = (1, 5, 10, 50, 100, 500, 1000, 5000, 10000)
NUM_PREFILL_BOOTSTRAP_QUEUE_REQS = _g(
    "sglang:num_prefill_bootstrap_queue_reqs",
    "The number of requests in the prefill bootstrap queue.",
)
NUM_PREFILL_INFLIGHT_QUEUE_REQS = _g(
    "sglang:num_prefill_inflight_queue_reqs",
    "The number of requests in the prefill inflight queue.",
)
NUM_DECODE_PREALLOC_QUEUE_REQS = _g(
    "sglang:num_decode_prealloc_queue_reqs",
    "The number of requests in the decode prealloc queue.",
)
NUM_DECODE_TRANSFER_QUEUE_REQS = _g(
    "sglang:num_decode_transfer_queue_reqs",
    "The number of requests in the decode transfer queue.",
)
KV_TRANSFER_SPEED_GB_S = _h(
    "sglang:kv_transfer_speed_gb_s",
    "Histogram of KV cache transfer speed in GB/s.",
    "scheduler",
    KV_TRANSFER_SPEED_BUCKETS,
)
KV_TRANSFER_LATENCY_MS = _h(
    "sglang:kv_transfer_latency_ms",
    "Histogram of KV cache transfer latency in ms.",
    "scheduler",
    KV_TRANSFER_LATENCY_BUCKETS_MS,
)
KV_TRANSFER_TOTAL_MB = _h(
    "sglang:kv_transfer_total_mb",
    "Histogram of KV cache transfer size in MB.",
    "scheduler",
    KV_TRANSFER_MB_BUCKETS,
)
NUM_BOOTSTRAP_FAILED_REQS = _c(
    "sglang:num_bootstrap_failed_reqs_total",
    "The number of bootstrap failed requests.",
    "scheduler",
)
NUM_TRANSFER_FAILED_REQS = _c(
    "sglang:num_transfer_failed_reqs_total", "The number of transfer failed requests.", "scheduler"
)
PD_METRICS: tuple[MetricSpec, ...] = (
    NUM_PREFILL_BOOTSTRAP_QUEUE_REQS,
    NUM_PREFILL_INFLIGHT_QUEUE_REQS,
    NUM_DECODE_PREALLOC_QUEUE_REQS,
    NUM_DECODE_TRANSFER_QUEUE_REQS,
    KV_TRANSFER_SPEED_GB_S,
    KV_TRANSFER_LATENCY_MS,
    KV_TRANSFER_TOTAL_MB,
    NUM_BOOTSTRAP_FAILED_REQS,
    NUM_TRANSFER_FAILED_REQS,
)
BY_NAME.update({m.name: m for m in PD_METRICS})


# The host-memory KV tier (HiCache; docs/host-kv-tier.md): exported only by an engine with
# --enable-hierarchical-cache; the host pool's gauges by the scheduler collector, the transfer
# counters by the radix cache's. `pool` is the host pool (the twin has only kv).
HICACHE_HOST_USED_TOKENS = _g(
    "sglang:hicache_host_used_tokens", "Number of tokens currently used in the host KV cache."
)
HICACHE_HOST_TOTAL_TOKENS = _g(
    "sglang:hicache_host_total_tokens", "Total capacity of the host KV cache in tokens."
)
LOAD_BACK_TOKENS = _c(
    "sglang:load_back_tokens_total",
    "The number of tokens loaded back from local host DRAM (L2) to GPU, by host pool (kv, "
    "swa, mamba, ...). Every TP rank reports the same logical count under its own rank "
    "labels; read one rank rather than summing ranks.",
    "radix_cache",
    "pool",
)
HICACHE_BACKUP_TOKENS = _c(
    "sglang:hicache_backup_tokens_total",
    "The number of tokens backed up from GPU to local host DRAM (L2), by host pool (kv, swa, "
    "mamba, ...). Covers all D->H backups regardless of --hicache-write-policy. Distinct from "
    "the host-to-storage (L3) sglang:backuped_tokens_total. Every TP rank reports the same "
    "logical count under its own rank labels; read one rank rather than summing ranks.",
    "radix_cache",
    "pool",
)
HICACHE_METRICS: tuple[MetricSpec, ...] = (
    HICACHE_HOST_USED_TOKENS,
    HICACHE_HOST_TOTAL_TOKENS,
    LOAD_BACK_TOKENS,
    HICACHE_BACKUP_TOKENS,
)
HOST_POOL = "kv"
BY_NAME.update({m.name: m for m in HICACHE_METRICS})

# tpuserve's own engine series, beside SGLang's on the engine's /metrics (the twin exports
# them; `sglang_tpu.cold_start` defines the phases and results, bounded label values).
COLD_START_SECONDS: Final = "tpuserve_engine_cold_start_seconds"
COLD_START_SECONDS_HELP: Final = (
    "Seconds each phase of this engine's last cold start took (pull, weights, compile, warmup)."
)
COMPILE_CACHE_TOTAL: Final = "tpuserve_engine_compile_cache_total"
COMPILE_CACHE_TOTAL_HELP: Final = (
    "Engine starts by whether the compile cache held their key (result: hit, miss)."
)
TPUSERVE_ENGINE_SERIES: Final = frozenset({COLD_START_SECONDS, COMPILE_CACHE_TOTAL})


def series_names() -> frozenset[str]:
    """Every ``sglang:*`` series name a dashboard or rule may select."""
    return frozenset(s for m in (*ALL_METRICS, *PD_METRICS, *HICACHE_METRICS) for s in m.series)


# SGLang serves /metrics with prometheus_client's content negotiation. Asked for OpenMetrics
# without an `escaping` parameter, as Prometheus 2.x asks, prometheus_client (0.26, the one
# SGLang 0.5.23 runs; prometheus/client_python#1177) writes `sglang_token_usage` in the samples
# for `sglang:token_usage`. Every scrape of a model server puts the colon back with this metric
# relabeling (the local Prometheus, the chart's and the operator's PodMonitors), so rules and
# dashboards find the names SGLang declares whichever Prometheus scrapes; with Prometheus 3
# (`escaping=allow-utf-8`) the names arrive intact and it changes nothing. Lossless while SGLang
# declares no `sglang_` name (tests/metrics/test_sglang_declarations.py checks the wheel).
class PrometheusRelabel(TypedDict):
    """One `metric_relabel_configs` entry, in Prometheus' own configuration spelling."""

    source_labels: list[str]
    regex: str
    target_label: str
    replacement: str


RESTORE_SGLANG_COLON: Final[PrometheusRelabel] = {
    "source_labels": ["__name__"],
    "regex": "sglang_(.+)",
    "target_label": "__name__",
    "replacement": "sglang:${1}",
}


def restore_sglang_colon_relabeling() -> dict[str, str | list[str]]:
    """The same rule as a prometheus-operator `RelabelConfig` (camelCase keys)."""
    return {
        "sourceLabels": list(RESTORE_SGLANG_COLON["source_labels"]),
        "regex": RESTORE_SGLANG_COLON["regex"],
        "targetLabel": RESTORE_SGLANG_COLON["target_label"],
        "replacement": RESTORE_SGLANG_COLON["replacement"],
    }
