"""bench/pd_disaggregation.py: its SLO, its chip split and its capacity search."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench.pd_disaggregation import (
    Record,
    Slo,
    cache_keys,
    capacity,
    deployments,
    split,
    summarize,
)
from sglang_tpu.perf_model import StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.topology import lookup
from tpuserve.bench.pd_split import Pools
from tpuserve.bench.traces import TraceRequest

pytestmark = pytest.mark.unit

TIMER = StepTimer(lookup("v6e", "1x1"), get_profile("llama-3.1-8b"))
KV = kv_pool_tokens(lookup("v6e", "1x1"), get_profile("llama-3.1-8b"), "bf16", "auto")
BUDGET = 0.05


def trace(
    prompts: list[int], output: int, rate: float
) -> tuple[list[TraceRequest], list[list[int]]]:
    reqs, ids = [], []
    for i, n in enumerate(prompts):
        tokens = [1000 + (i * 7919 + j) % 50_000 for j in range(n)]
        reqs.append(TraceRequest(f"r{i}", i / rate, output, prompt_token_ids=tokens))
        ids.append(tokens)
    return reqs, ids


def test_a_request_is_good_by_its_ttft_and_its_own_p99_gap() -> None:
    slo = Slo(1.0, 0.1)
    smooth = Record(0.0, 10, 101, ttft=0.5, finish=3.5, gaps=[0.03] * 100)
    stalled = Record(0.0, 10, 101, ttft=0.5, finish=3.5, gaps=[0.03] * 98 + [0.3, 0.3])
    late = Record(0.0, 10, 101, ttft=1.5, finish=4.5, gaps=[0.03] * 100)
    summary = summarize([smooth, stalled, late], slo)
    assert summary["good_share"] == pytest.approx(1 / 3)
    assert summary["ttft_miss_share"] == pytest.approx(1 / 3)
    assert summary["itl_miss_share"] == pytest.approx(1 / 3)
    one_stall = Record(0.0, 10, 101, ttft=0.5, finish=3.5, gaps=[0.03] * 99 + [0.3])
    assert summarize([one_stall], slo)["good_share"] == 1.0  # 1 % of its gaps may stall


def test_the_split_keys_a_prompt_by_whole_pages_of_64_tokens() -> None:
    first = cache_keys(list(range(1000)))
    assert len(first) == 1000 // 64
    assert cache_keys([*range(700), 5, 6, 7]) == first[: 703 // 64]  # the shared pages' keys
    assert not set(cache_keys(list(range(1, 1000)))) & set(first)  # a key names its prefix


def test_kv_bound_decode_gets_more_chips_than_compute_alone_gives_it() -> None:
    reqs, ids = trace([8000] * 100, 300, rate=1.0)
    kv = split("always", reqs, ids, TIMER, 8, BUDGET, KV, "kv")
    compute = split("always", reqs, ids, TIMER, 8, BUDGET, KV, "compute")
    assert kv.prefill + kv.decode == 8
    assert kv.colocated == 0
    assert kv.decode > compute.decode
    assert kv.load < compute.load  # KV room, not compute, bounds the load
    assert split("colocated", reqs, ids, TIMER, 8, BUDGET, KV) == Pools(0, 0, 8)


def test_conditional_keeps_a_colocated_pool_only_when_it_sustains_more_load() -> None:
    short, ids_short = trace([500] * 200, 64, rate=20.0)
    assert split("conditional", short, ids_short, TIMER, 8, BUDGET, KV).colocated == 8
    long, ids_long = trace([10_000] * 200, 1000, rate=1.0)
    pools = split("conditional", long, ids_long, TIMER, 8, BUDGET, KV)
    assert pools.colocated == 0
    assert pools.prefill >= 1
    # a few short requests among long ones: a whole chip for them sustains less load
    prompts = [500 if i % 20 == 0 else 10_000 for i in range(200)]
    mixed, ids_mixed = trace(prompts, 1000, rate=1.0)
    pools = split("conditional", mixed, ids_mixed, TIMER, 8, BUDGET, KV)
    always = split("always", mixed, ids_mixed, TIMER, 8, BUDGET, KV)
    assert pools.load >= always.load


def test_capacity_brackets_and_bisects_on_colocated_attainment() -> None:
    asked: list[float] = []

    def runner(mode: str, reqs: Any, ids: Any) -> tuple[Pools, dict[str, Any]]:
        assert mode == "colocated"
        scale = reqs[0].t and 1.0 / reqs[0].t  # the first arrival is at 1 / scale
        asked.append(scale)
        return Pools(0, 0, 8), {"good_share": 1.0 if scale <= 3.1 else 0.5}

    reqs, ids = trace([100, 100], 1, rate=1.0)
    reqs = [dataclasses.replace(r, t=r.t + 1.0) for r in reqs]
    found = capacity(reqs, ids, runner, 0.9, log=lambda _: None)
    assert 3.1 / 1.05 <= found <= 3.1
    assert asked[:3] == [1.0, 2.0, 4.0]


def test_conditionals_candidate_deployments_include_colocated_alone_and_pairs() -> None:
    prompts = [500 if i % 2 else 10_000 for i in range(100)]
    reqs, ids = trace(prompts, 300, rate=2.0)
    found = deployments(reqs, ids, TIMER, 8, BUDGET, KV)
    shapes = [(p.prefill, p.decode, p.colocated) for p in found]
    assert (0, 0, 8) in shapes
    assert any(p and d for p, d, _ in shapes)
    assert len(set(shapes)) == len(shapes)
    assert all(sum(shape) == 8 for shape in shapes)
