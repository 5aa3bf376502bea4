"""The SGLang metric list holds the core names with SGLang's types and label sets.

tests/metrics/test_sglang_declarations.py checks every entry against the pinned SGLang wheel;
these checks need no wheel."""

from __future__ import annotations

import pytest

from sglang_tpu import metric_names as m

pytestmark = pytest.mark.unit

CORE = {
    "sglang:prompt_tokens_total": "counter",
    "sglang:generation_tokens_total": "counter",
    "sglang:cached_tokens_total": "counter",
    "sglang:realtime_tokens_total": "counter",
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
}


@pytest.mark.parametrize(("name", "kind"), CORE.items())
def test_core_metric_has_sglangs_type(name: str, kind: str) -> None:
    assert m.BY_NAME[name].kind == kind


def test_names_are_unique_and_prefixed() -> None:
    names = [spec.name for spec in m.ALL_METRICS]
    assert len(names) == len(set(names))
    assert all(n.startswith("sglang:") for n in names)
    assert all(s.name.endswith("_total") for s in m.ALL_METRICS if s.kind == "counter")


def test_label_sets_follow_the_collector() -> None:
    scheduler = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
    assert m.NUM_RUNNING_REQS.labels == scheduler
    assert m.PROMPT_TOKENS.labels == ("model_name", "engine_type", "is_streaming")
    assert m.CACHED_TOKENS.labels == ("model_name", "engine_type", "cache_source")
    assert m.INTER_TOKEN_LATENCY.labels == ("model_name", "engine_type")
    assert m.STARTUP_TIME.labels == ("model_name", "engine_type", "phase")
    assert m.REALTIME_TOKENS.labels == (*scheduler, "mode")


def test_series_names_include_histogram_parts_and_counter_families() -> None:
    names = m.series_names()
    assert "sglang:time_to_first_token_seconds_bucket" in names
    assert "sglang:prompt_tokens_total" in names
    assert m.PROMPT_TOKENS.family == "sglang:prompt_tokens"
    for spec in m.ALL_METRICS:
        assert tuple(sorted(spec.buckets)) == spec.buckets, spec.name
        assert bool(spec.buckets) == (spec.kind == "histogram"), spec.name
