"""`tpuserve engine sim --flavor sglang-jax` as a real process: what SGLang-JAX's server
presents (its source at cddbf6f1, and what was seen of the real engine): no `sglang:` series,
no KV events even when asked, `/get_load` 500, `/server_info` 404, `/get_server_info` with
its internal states, its `meta_info` and `usage` with cached tokens on a repeated prefix."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import zmq

from tests.component.differential.engine_pair import request
from tests.component.engine.engine_process import ENTRY, EngineProcess, running_engine
from tpuserve.cluster.ports import free_port

pytestmark = pytest.mark.component

PREFIX = list(range(100, 164))  # four pages of 16


@pytest.fixture(scope="module")
def jax_twin() -> Iterator[tuple[EngineProcess, str]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    args = ["--flavor", "sglang-jax", "--time-scale", "0", "--enable-cache-report",
            "--kv-events-endpoint", endpoint]  # fmt: skip
    with running_engine(args) as engine:
        yield engine, endpoint


def test_its_routes_answer_as_sglang_jax(jax_twin: tuple[EngineProcess, str]) -> None:
    twin, endpoint = jax_twin
    assert request(twin.url, "GET", "/get_load", None).status == 500
    for path in ("/server_info", "/model_info", "/v1/loads"):
        answer = request(twin.url, "GET", path, None)
        assert (answer.status, answer.body) == (404, {"detail": "Not Found"}), path
    info = request(twin.url, "GET", "/get_model_info", None).body
    assert set(info) == {"model_path", "tokenizer_path", "is_generation",
                         "preferred_sampling_params"}  # fmt: skip
    server = request(twin.url, "GET", "/get_server_info", None).body
    assert endpoint in server["kv_events_config"]  # parsed and kept ...
    assert "kv_events" not in server
    (state,) = server["internal_states"]
    assert state["memory_usage"]["token_capacity"] == server["max_total_num_tokens"]
    assert state["waiting_queue_size"] == state["running_batch_size"] == 0
    metrics = request(twin.url, "GET", "/metrics", None).body
    assert "pd_bootstrap_registry_size" in metrics
    assert "sglang" not in metrics


def test_it_publishes_no_kv_events(jax_twin: tuple[EngineProcess, str]) -> None:
    """... but nothing is bound there: a subscriber connects to nothing and hears nothing."""
    twin, endpoint = jax_twin
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        body = {"input_ids": [*PREFIX, 7], "sampling_params": {"max_new_tokens": 2}}
        assert request(twin.url, "POST", "/generate", body).status == 200
        assert not sub.poll(1000), "an event came from the SGLang-JAX flavour"
        probe = context.socket(zmq.PUB)
        probe.bind(endpoint)  # the port is free: the twin never bound it
        probe.close(linger=0)
    finally:
        sub.close(linger=0)
        context.term()


def test_cached_tokens_on_a_repeated_prefix_in_its_shapes(
    jax_twin: tuple[EngineProcess, str],
) -> None:
    twin, _ = jax_twin
    prefix = [t + 200 for t in PREFIX]  # not sent before in this module
    body = {"input_ids": [*prefix, 8, 9], "sampling_params": {"max_new_tokens": 2}}
    first = request(twin.url, "POST", "/generate", body).body["meta_info"]
    again = request(twin.url, "POST", "/generate", body).body["meta_info"]
    assert set(again) == {"id", "finish_reason", "prompt_tokens", "completion_tokens",
                          "cached_tokens", "e2e_latency"}  # fmt: skip
    assert (first["cached_tokens"], again["cached_tokens"]) == (0, 64)
    model = request(twin.url, "GET", "/v1/models", None).body["data"][0]["id"]
    chat = {"model": model, "messages": [{"role": "user", "content": "hello " * 40}],
            "max_tokens": 2}  # fmt: skip
    cold = request(twin.url, "POST", "/v1/chat/completions", chat).body
    warm = request(twin.url, "POST", "/v1/chat/completions", chat).body
    assert set(warm["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens",
                                  "prompt_tokens_details"}  # fmt: skip
    assert cold["usage"]["prompt_tokens_details"] is None  # none cached: null, as its usage
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert "metadata" not in warm


def test_pd_roles_are_refused_with_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, "engine", "sim", "--flavor", "sglang-jax",
         "--disaggregation-mode", "prefill"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--disaggregation-mode prefill is not allowed with --flavor sglang-jax" in done.stderr
