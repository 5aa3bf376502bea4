"""Where the engine twin differs from real SGLang 0.5.23 on purpose: the one list, each with why.

The differential tests (`tests/component/differential/`) compare the twin with a real engine and
ignore exactly what is listed here; `tests/metrics/test_sglang_declarations.py` ignores the
metric differences listed here when it compares the twin with the wheel's declarations.
docs/engine-sim.md's "Intended differences" paragraph says the same in prose.

- `JSON_DIFFERENCES`: paths inside a JSON answer (``meta_info.id``, ``choices[].text``; ``[]``
  is any element of a list). ``value``: both have the key with the same JSON type, the values
  differ. ``type``: both have the key, its type differs too.
- `ONLY_ON_REAL`: keys a real engine's answer has and the twin's does not.
- `OMITTED_BY_REAL_WHEN`: paths the twin always answers and a real engine leaves out of a
  whole (not streamed) answer in one condition, which the test checks on the real answer (the
  object holding the key).
- `SERVED_ONLY_BY_THE_TWIN`: GET routes a real 0.5.23 engine answers with 404.
- `REFUSED_BY_THE_TWIN`: requests the twin answers with a 4xx where SGLang serves them. The
  differential test sends each to both and checks the difference is still there, except the
  ones marked `crashes_real` (a real 0.5.23 engine on CPU dies on them).
- `METRIC_DIFFERENCES`: ``(family, aspect)``; aspects ``declared``, ``type``, ``labels``,
  ``buckets``, ``help`` (the twin against the wheel's declarations), ``not_modelled`` (a real
  engine exposes the family, the twin does not) and ``created_on_first_use`` (the twin exposes
  the family from the start, a real engine once the first such event happened).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from sglang_tpu.sim.native_api import TIMING_KEYS


@dataclass(frozen=True, slots=True)
class Difference:
    aspect: Literal["value", "type"]
    reason: str


_TIMING = "the twin's own clock: its steps take modelled TPU time (--time-scale), not CPU time"
_GENERATED = "generated text: the twin writes deterministic pseudo-text, it computes no model"
_ID = "a fresh id or clock reading per request"

JSON_DIFFERENCES: Mapping[str, Difference] = MappingProxyType(
    {
        **{f"meta_info.{key}": Difference("value", _TIMING) for key in sorted(TIMING_KEYS)},
        "meta_info.id": Difference("value", _ID),
        "id": Difference("value", _ID),
        "created": Difference("value", _ID),
        "text": Difference("value", _GENERATED),
        "output_ids[]": Difference("value", _GENERATED),
        "choices[].text": Difference("value", _GENERATED),
        "choices[].message.content": Difference("value", _GENERATED),
        "choices[].delta.content": Difference("value", _GENERATED),
        # error bodies
        "message": Difference(
            "value", "the twin's messages name the field, the value and what is allowed"
        ),
        "error": Difference("value", "the twin's message names the field, value and allowed"),
        "error.message": Difference(
            "value", "the twin's message names the field, the value and what is allowed"
        ),
        "param": Difference(
            "type", "the twin names the offending field in `param`; SGLang 0.5.23 leaves it null"
        ),
        # /v1/loads
        "timestamp": Difference("value", _ID),
        "loads[].timestamp": Difference("value", _ID),
        "loads[].gen_throughput": Difference("value", _TIMING),
        "loads[].total_prefill_busy_us": Difference("value", _TIMING),
        "loads[].total_prefill_uncached_tokens": Difference(
            "value",
            "cumulative since start: a real engine also prefills its /health probes "
            "and the requests only it serves",
        ),
        "loads[].decode_moments": Difference(
            "type",
            "moments of the decode batches: not modelled (null, as SGLang before its first decode)",
        ),
        "loads[].memory.weight_gb": Difference(
            "value", "the twin's memory is its modelled TPU model's, not the tiny CPU model's"
        ),
        "loads[].memory.kv_cache_gb": Difference(
            "value", "the twin's memory is its modelled TPU model's, not the tiny CPU model's"
        ),
        # /model_info
        "model_type": Difference("type", "the twin loads no model config: null"),
        "architectures": Difference("type", "the twin loads no model config: null"),
    }
)

ONLY_ON_REAL: Mapping[str, str] = MappingProxyType(
    {
        "embedding": "/model_info's embedding-model capabilities: the twin serves generation only",
    }
)


@dataclass(frozen=True, slots=True)
class Omission:
    """The real engine leaves the key out of a whole (not streamed) answer when `applies(the
    real answer's object holding it)`."""

    applies: Callable[[Mapping[str, Any]], bool]
    reason: str


def _first_token_time_fell_back(meta_info: Mapping[str, Any]) -> bool:
    first, e2e = meta_info.get("first_token_latency"), meta_info.get("e2e_latency")
    return isinstance(first, float) and isinstance(e2e, float) and first == e2e


OMITTED_BY_REAL_WHEN: Mapping[str, Omission] = MappingProxyType(
    {
        "meta_info.decode_throughput": Omission(
            _first_token_time_fell_back,
            "SGLang 0.5.23 times a non-streaming answer's first token by the scheduler's stamp, "
            "moved between processes by each one's wall-clock offset; when the wall clock has "
            "moved against the monotonic clock since the engine started, the stamp can land "
            "outside the request (after the answer, or before it arrived), and SGLang falls back "
            "to the answer's own arrival (first_token_latency == e2e_latency) and reports no "
            "decode time",
        ),
    }
)


SERVED_ONLY_BY_THE_TWIN: Mapping[str, str] = MappingProxyType(
    {
        "/get_load": "SGLang's load route before /v1/loads (0.5.23 answers 404); kept for "
        "clients of older engines, tpuserve's own code reads /v1/loads",
        "/debug/radix_cache": "tpuserve-specific: every cached page with its event hash "
        "(with --enable-debug-endpoints only)",
    }
)


@dataclass(frozen=True, slots=True)
class Refusal:
    path: str
    body: Mapping[str, object]
    reason: str
    crashes_real: bool = False


REFUSED_BY_THE_TWIN: Mapping[str, Refusal] = MappingProxyType(
    {
        "n > 1": Refusal(
            "/v1/completions",
            {"prompt": "two choices", "n": 2, "max_tokens": 1},
            "the twin samples one choice per request (400 naming `n`)",
        ),
        "an unknown model": Refusal(
            "/v1/completions",
            {"prompt": "which model", "model": "no-such-model", "max_tokens": 1},
            "the twin answers 404 naming the served model; SGLang serves any model name",
        ),
        "an empty text prompt": Refusal(
            "/generate",
            {"text": "", "sampling_params": {"max_new_tokens": 1}},
            "the twin answers 400; a real 0.5.23 engine on CPU crashed (its scheduler died "
            "reshaping an empty batch)",
            crashes_real=True,
        ),
        "a token id outside the vocabulary": Refusal(
            "/generate",
            {"input_ids": [1 << 20], "sampling_params": {"max_new_tokens": 1}},
            "the twin answers 400 naming the vocabulary size; a real engine on CPU crashed",
            crashes_real=True,
        ),
    }
)

_NOT_MODELLED_GROUPS: Mapping[str, tuple[str, ...]] = {
    "device memory and CUDA graphs: the twin holds no weights and captures no graphs": (
        "cuda_graph_passes", "is_cuda_graph", "graph_memory_usage_gb",
        "kv_cache_memory_usage_gb", "weight_memory_usage_gb",
        "startup_available_gpu_memory_gb", "startup_cuda_graph_time_seconds",
    ),
    "data-parallel attention: the twin runs one DP rank": (
        "dp_attention_pairs", "dp_attention_steps", "dp_attention_sync_wait_seconds",
        "dp_attention_token_imbalance_ratio", "dp_attention_tokens",
    ),
    "hybrid KV pools (Mamba, sliding window): the twin models one full-attention pool": (
        "full_token_usage", "mamba_available_tokens", "mamba_evictable_tokens",
        "mamba_usage", "mamba_used_tokens", "swa_available_tokens", "swa_evictable_tokens",
        "swa_token_usage", "swa_used_tokens",
    ),
    "speculative decoding beyond its accept length: not modelled": (
        "spec_accept_rate", "spec_block_accept_length", "spec_cap_length",
        "spec_num_draft_tokens", "spec_num_steps",
    ),
    "prefill/decode disaggregation queues: not modelled yet": (
        "num_decode_deferred_kv_release_reqs", "num_decode_host_receive_queue_reqs",
        "num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs",
        "num_prefill_bootstrap_queue_reqs", "num_prefill_inflight_queue_reqs",
        "pending_prealloc_token_usage", "prealloc_full_token_usage",
        "prealloc_swa_token_usage",
    ),
    "routing-key accounting (SGLang's own router integration): not modelled": (
        "num_unique_running_routing_keys", "routing_key_all_req_count",
        "routing_key_running_req_count", "routing_keys_active",
    ),
    "HTTP middleware counters and endpoint timings: tpuserve reads request counts from the "
    "router and the engine's own request counters": (
        "http_requests", "http_requests_active", "http_responses", "get_loads_duration_seconds",
    ),
    "CPU time of SGLang's own processes: the twin is one process of another program": (
        "process_cpu_seconds", "scheduler_process_cpu_seconds", "scheduler_idle_seconds",
    ),
    "scheduler internals and per-request histograms nothing in tpuserve reads": (
        "decode_sum_seq_lens", "fwd_occupancy", "new_token_ratio", "num_paused_reqs",
        "per_stage_req_latency_seconds", "prefill_effective_tokens", "scheduler_stage_seconds",
        "kv_available_tokens", "kv_evictable_tokens", "kv_used_tokens",
        "prompt_tokens_histogram", "generation_tokens_histogram",
        "uncached_prompt_tokens_histogram", "request_time_per_output_token_seconds",
    ),
}  # fmt: skip

METRIC_DIFFERENCES: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        **{
            (f"sglang:{name}", "not_modelled"): reason
            for reason, names in _NOT_MODELLED_GROUPS.items()
            for name in names
        },
        ("sglang:num_aborted_requests", "created_on_first_use"): (
            "a real engine creates the labelled child at its first aborted request"
        ),
        ("sglang:num_so_requests", "created_on_first_use"): (
            "a real engine creates the labelled child at its first structured-output request "
            "(the CPU test engine runs without a grammar backend)"
        ),
    }
)
DECLARATION_ASPECTS = frozenset({"declared", "type", "labels", "buckets", "help"})


def metric_differences(*aspects: str) -> Mapping[tuple[str, str], str]:
    """The listed metric differences of the given aspects."""
    return MappingProxyType({k: v for k, v in METRIC_DIFFERENCES.items() if k[1] in aspects})
