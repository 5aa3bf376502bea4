"""The reader of SGLang's metric declarations (tests/sglang_metrics.py) finds what the pinned
wheel declares, with SGLang's types, labels and buckets, and reports what it does not declare."""

from __future__ import annotations

import pytest

from tests import sglang_metrics as sm

SCHEDULER = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER = ("model_name", "engine_type")
# Names the engine twin exposed before 0.5.23 was checked; spelled without the literal prefix so
# the repository-wide name check (test_sglang_names.py) does not trip over this file.
DROPPED = ("num_requests_received_total", "engine_startup_time", "engine_load_weights_time",
           "cache_config_info")  # fmt: skip


@pytest.mark.component
def test_the_pinned_wheel_declares_the_core_metrics_as_sglang_exposes_them() -> None:
    declared = sm.declared_metrics()
    queue = declared["sglang:num_queue_reqs"]
    assert (queue.kind, queue.labels, queue.collector) == (
        "gauge",
        SCHEDULER,
        "SchedulerMetricsCollector",
    )
    ttft = declared["sglang:time_to_first_token_seconds"]
    assert (ttft.kind, ttft.labels) == ("histogram", (*TOKENIZER, "is_streaming"))
    assert (ttft.buckets or ())[:3] == (0.1, 0.2, 0.4)
    # 0.5.23 added low buckets to the queue-time histogram
    assert (declared["sglang:queue_time_seconds"].buckets or ())[:5] == (
        0.0, 0.001, 0.005, 0.01, 0.05,
    )  # fmt: skip
    prompt = declared["sglang:prompt_tokens_total"]
    assert (prompt.kind, prompt.labels) == ("counter", (*TOKENIZER, "is_streaming"))
    assert prompt.series == ("sglang:prompt_tokens_total",)
    assert declared["sglang:startup_time_seconds"].labels == (*TOKENIZER, "phase")
    assert declared["sglang:http_requests_total"].labels == ("endpoint", "method")
    # A GaugeHistogram is a gauge with gt/le labels; computed buckets are not guessed.
    assert declared["sglang:routing_key_running_req_count"].labels == (*SCHEDULER, "gt", "le")
    assert declared["sglang:func_latency_seconds"].buckets is None


@pytest.mark.component
def test_names_sglang_does_not_declare_are_reported() -> None:
    dropped = {sm.PREFIX + name for name in DROPPED}
    assert sm.undeclared(dropped) == dropped
    assert sm.undeclared(
        {"sglang:num_queue_reqs", "sglang:e2e_request_latency_seconds_bucket"}
    ) == (set())
    # Only series are names a query selects: a histogram's bare name is not one.
    assert sm.undeclared({"sglang:e2e_request_latency_seconds"}) == {
        "sglang:e2e_request_latency_seconds"
    }
    assert sm.undeclared({"tpuserve_router_requests_total", "model:sglang_x:rate1m"}) == set()


@pytest.mark.component
def test_the_startup_phases_are_read_from_the_collector() -> None:
    phases = sm.loop_values(
        sm.COLLECTORS_FILE, "TokenizerMetricsCollector.emit_startup_time", "phase"
    )
    assert phases == ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e")
    with pytest.raises(LookupError):
        sm.loop_values(sm.COLLECTORS_FILE, "TokenizerMetricsCollector.emit_startup_time", "mode")


SOURCE = """
from prometheus_client import Counter, Histogram

class Collector:
    def __init__(self, labels):
        buckets_default = [0.5, 1, 2]
        self.a = Counter(name="demo:a_total", documentation="a",
                         labelnames=[*labels.keys(), "x"])
        self.b = Histogram("demo:b_seconds", "b", list(labels.keys()) + ["y"],
                           buckets=buckets_default)
        self.c = Histogram("demo:c_seconds", "c", labelnames=labels.keys(),
                           buckets=make_buckets())
        self.d = Counter(name="other:d_total", documentation="another prefix")

GAUGE = Gauge("demo:e", "e")
"""


@pytest.mark.unit
def test_the_reader_resolves_every_way_sglang_writes_a_declaration() -> None:
    found = {m.name: m for m in sm.declarations_in(SOURCE, "x.py", {"Collector": ("m",)}, "demo:")}
    assert sorted(found) == ["demo:a_total", "demo:b_seconds", "demo:c_seconds", "demo:e"]
    assert found["demo:a_total"].labels == ("m", "x")
    assert found["demo:b_seconds"].labels == ("m", "y")
    assert found["demo:b_seconds"].buckets == (0.5, 1.0, 2.0)
    assert found["demo:c_seconds"].buckets is None
    # a gauge in the default multiprocess mode keeps a series per process: label pid
    assert (found["demo:e"].kind, found["demo:e"].labels) == ("gauge", ("pid",))
    unknown_base = sm.declarations_in(SOURCE, "x.py", {}, "demo:")
    assert {m.name: m.labels for m in unknown_base}["demo:a_total"] is None


@pytest.mark.unit
def test_a_declaration_the_reader_cannot_read_fails_loudly() -> None:
    source = 'Gauge("demo:f", "f", labelnames=label_list())\n'
    with pytest.raises(sm.UnreadableDeclaration, match=r"x\.py:1"):
        sm.declarations_in(source, "x.py", {}, "demo:")
