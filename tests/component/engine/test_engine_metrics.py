"""/metrics has every SGLang name with its type; token counters move by exactly what was served."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_tpu.metric_names import ALL_METRICS
from tests.component.engine.engine_process import running_engine

pytestmark = pytest.mark.component

MODEL = "sim-model"


def scrape(url: str) -> dict[str, tuple[str, dict[str, float]]]:
    async def go() -> str:
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            return await r.text()

    families: dict[str, tuple[str, dict[str, float]]] = {}
    for family in text_string_to_metric_families(asyncio.run(go())):
        samples = {s.name + str(sorted(s.labels.items())): s.value for s in family.samples}
        families[family.name] = (family.type, samples)
    return families


def total(families: dict[str, tuple[str, dict[str, float]]], family: str, sample: str) -> float:
    return sum(v for k, v in families[family][1].items() if k.startswith(sample + "["))


def serve(url: str, n: int) -> list[dict[str, Any]]:
    """The `usage` of n completions (with `prompt_tokens_details`)."""

    async def go() -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            usages = []
            for i in range(n):
                body = {"prompt": f"metrics probe {i % 3} " + "lorem ipsum " * 30,
                        "max_tokens": 3 + i}  # fmt: skip
                async with s.post(url + "/v1/completions", json=body) as r:
                    usages.append((await r.json())["usage"])
            return usages

    return asyncio.run(go())


def test_every_listed_metric_is_exposed_with_its_type_and_counters_add_up() -> None:
    args = ["--time-scale", "0", "--served-model-name", MODEL, "--enable-cache-report"]
    with running_engine(args) as engine:
        before = scrape(engine.url)
        for spec in ALL_METRICS:
            assert spec.family in before, spec.name
            assert before[spec.family][0] == spec.kind, spec.name
        assert "model_name" in str(before["sglang:num_running_reqs"][1])
        usages = serve(engine.url, 6)
        after = scrape(engine.url)

    def delta(family: str, sample: str) -> float:
        return total(after, family, sample) - total(before, family, sample)

    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0
    assert delta("sglang:prompt_tokens", "sglang:prompt_tokens_total") == prompt
    assert delta("sglang:generation_tokens", "sglang:generation_tokens_total") == completion
    assert delta("sglang:cached_tokens", "sglang:cached_tokens_total") == cached
    assert delta("sglang:num_requests", "sglang:num_requests_total") == 6
    assert (
        delta("sglang:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds_count") == 6
    )
    assert delta("sglang:time_to_first_token_seconds",
                 "sglang:time_to_first_token_seconds_count") == 6  # fmt: skip
    realtime = after["sglang:realtime_tokens"][1]
    computed = sum(v for k, v in realtime.items() if "prefill_compute" in k)
    from_cache = sum(v for k, v in realtime.items() if "prefill_cache" in k)
    assert computed + from_cache == prompt
    assert from_cache == cached
