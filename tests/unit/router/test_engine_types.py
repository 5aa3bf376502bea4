"""One adapter per engine type: SGLang-JAX's load read from its ``/get_server_info`` internal
states (keys as its scheduler's `get_internal_state` writes them), SGLang's from ``/v1/loads``,
and SGLang-JAX told apart by the shape of its internal state."""

from __future__ import annotations

from typing import Any

import pytest

from tpuserve_router.engines.engine_types import (
    ADAPTERS,
    SGLANG,
    SGLANG_JAX,
    LoadAnswerError,
    adapter,
    detect,
    parse_loads,
    parse_server_info_load,
)

pytestmark = pytest.mark.unit


def jax_state(waiting: int, running: int, available: int, capacity: int = 1000) -> dict[str, Any]:
    """One DP rank's internal state as SGLang-JAX's scheduler reports it (the keys read here
    and some around them)."""
    return {
        "device": "tpu", "last_gen_throughput": 12.5,
        "memory_usage": {"kvcache": round(1 - available / capacity, 2), "token_capacity": capacity},
        "waiting_queue_size": waiting, "running_batch_size": running,
        "prefill_decode_size": waiting + running, "waiting_queue_rids": ["a"] * waiting,
        "tree_cache_size": 64, "available_kv_tokens": available,
        "available_kv_tokens_per_dp": [available],
    }  # fmt: skip


def server_info(*states: dict[str, Any]) -> dict[str, Any]:
    return {"model_path": "m", "page_size": 128, "status": "ready", "version": "0.0.2",
            "internal_states": list(states)}  # fmt: skip


def test_sglang_jax_load_sums_its_ranks_and_takes_the_fullest_kv_pool() -> None:
    load = parse_server_info_load(server_info(jax_state(2, 3, 750), jax_state(1, 4, 100)))
    assert (load.requests, load.running, load.waiting) == (10, 7, 3)
    assert load.kv_usage == pytest.approx(0.9)
    assert load.waiting_uncached_tokens is None  # not said: the router's booked prefill stands


def test_sglang_jax_kv_usage_falls_back_to_its_rounded_share() -> None:
    state = jax_state(0, 1, 500)
    del state["available_kv_tokens"]
    assert parse_server_info_load(server_info(state)).kv_usage == 0.5


def test_sglang_jax_host_tier_is_its_ratio_times_its_device_pool() -> None:
    tiered = server_info(jax_state(0, 0, 1000)) | {
        "hicache_storage": "none", "hicache_ratio": 4.0, "max_total_num_tokens": 1024,
    }  # fmt: skip
    assert parse_server_info_load(tiered).host_tier_tokens == 4096
    assert parse_server_info_load(tiered | {"hicache_storage": "disable"}).host_tier_tokens is None
    assert parse_server_info_load(tiered | {"hicache_ratio": "4"}).host_tier_tokens is None
    assert parse_server_info_load(server_info(jax_state(0, 0, 1000))).host_tier_tokens is None


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"internal_states": []}, "'internal_states' must be a non-empty list"),
        ({"detail": "Not Found"}, "'internal_states' must be a non-empty list"),
        (server_info("x"), r"internal_states\[0\] must be an object"),  # type: ignore[arg-type]
        (server_info({**jax_state(0, 0, 1), "waiting_queue_size": -1}),
         r"internal_states\[0\].waiting_queue_size is -1; allowed: an integer >= 0"),
        (server_info({"world_size": 1}),
         r"internal_states\[0\].waiting_queue_size is None"),  # SGLang's state, told it is JAX
    ],
)  # fmt: skip
def test_a_bad_server_info_is_refused_naming_the_field(document: object, problem: str) -> None:
    with pytest.raises(LoadAnswerError, match=problem):
        parse_server_info_load(document)


def test_sglang_jax_is_told_apart_by_its_internal_state() -> None:
    assert detect(server_info(jax_state(0, 0, 10))) == SGLANG_JAX
    sglang_state = {"world_size": 1, "memory_usage": {"token_capacity": 10}}  # SGLang 0.5.23
    assert detect(server_info(sglang_state)) is None
    assert detect({"detail": "Not Found"}) is None
    assert detect([]) is None


def test_each_engine_type_has_its_load_path_and_kv_events() -> None:
    assert adapter("auto") is ADAPTERS[SGLANG]
    assert (ADAPTERS[SGLANG].load_path, ADAPTERS[SGLANG].publishes_kv_events) == (
        "/v1/loads", True
    )  # fmt: skip
    jax = adapter(SGLANG_JAX)
    assert (jax.load_path, jax.publishes_kv_events) == ("/get_server_info", False)
    assert "approximate" in jax.prefix_routing
    snapshot = {"num_running_reqs": 2, "num_waiting_reqs": 1, "num_waiting_uncached_tokens": 40,
                "token_usage": 0.3}  # fmt: skip
    load = parse_loads({"loads": [snapshot]})
    assert (load.requests, load.waiting_uncached_tokens, load.kv_usage) == (3, 40, 0.3)
    assert jax.parse_load(server_info(jax_state(1, 1, 0))).kv_usage == 1.0
