"""SGLang-JAX's host KV tier for real (CPU, tiny Qwen3), started with the flags and environment
the launcher gives a contract with a host tier (`spec.kvCache.host`: `TPUSERVE_HOST_KV_CACHE`,
`TPUSERVE_HOST_KV_RATIO`): a prefix evicted from the device pool comes back as cached tokens,
loaded from host memory.

On CPU the load back runs SGLang-JAX's Pallas TPU kernel in JAX's TPU interpret mode (the
launcher's `sglang_tpu.sgl_jax_cpu_shim`; without it the scheduler dies with "Only interpret
mode is supported on CPU backend."). A second test pins SGLang-JAX's own limit (pinned commit):
a host hit is loaded back only when the device pool has that many *free* slots
(`schedule_policy.py` 685, `unified_radix_cache.py` 1094), so a host hit longer than the free
part of a pool full of cached prefixes is computed again (docs/sglang-jax.md, "Its host tier").

The pool is 1,024 tokens (64 pages of 16); with `write_through` every finished prompt has a
host copy (below). Needs the opt-in build
(`scripts/build-sglang-jax.sh SRC`); skips without it, saying so.
"""

from __future__ import annotations

import contextlib
import json
import random
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu import launch
from sglang_tpu.contract.launch_contract import LaunchContract
from tests.component.router.router_fleet import RouterProcess
from tests.contract_env import contract_env
from tests.real_sglang_jax import REQUEST_TIMEOUT_SECONDS, RealJaxEngine, SGLangJax, start_engine
from tests.waiting import eventually

pytestmark = [pytest.mark.component, pytest.mark.real_sglang_jax]

POOL_TOKENS = 1024
PAGE = 16


def host_tier_launch(model: Path) -> tuple[list[str], dict[str, str]]:
    """The host-tier flags and the environment the launcher plans for SGLang-JAX on the cpu
    device with `kvCache.host: {writePolicy: write_through, ratio: 4}`."""
    env = contract_env("v5e", "1x1", hosts=1, chips_per_host=1, model=str(model)) | {
        "TPUSERVE_ENGINE": "sglang-jax",
        "TPUSERVE_DEVICE": "cpu",
        "TPUSERVE_HOST_KV_CACHE": "write_through",
        "TPUSERVE_HOST_KV_RATIO": "4",
    }
    plan = launch.plan(LaunchContract.from_env(env))
    command = plan.command
    flags: list[str] = []
    for name in ("--hicache-storage", "--hicache-write-policy", "--hicache-ratio"):
        flags += [name, command[command.index(name) + 1]]
    return flags, {"PYTHONPATH": plan.env["PYTHONPATH"]}


@pytest.fixture(scope="module")
def tiered_engine(
    real_sglang_jax: SGLangJax, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealJaxEngine]:
    flags, env = host_tier_launch(real_sglang_jax.model)
    assert flags == ["--hicache-storage", "none", "--hicache-write-policy", "write_through",
                     "--hicache-ratio", "4"]  # fmt: skip
    engine = start_engine(
        real_sglang_jax,
        tmp_path_factory.mktemp("sglang-jax-host-tier"),
        name="host-tier",
        extra_args=[*flags, "--max-total-tokens", str(POOL_TOKENS)],
        env=env,
    )
    try:
        yield engine
    finally:
        with contextlib.suppress(ProcessLookupError):
            engine.stop()


def prompt(index: int, length: int) -> list[int]:
    """Ordinary token ids of the tiny model's 2,048-token vocabulary, a different first id for
    each prompt (no shared prefix)."""
    return [100 + index, *random.Random(index).choices(range(200, 2000), k=length - 1)]


def cached(engine: RealJaxEngine, ids: list[int]) -> int:
    """Send one prompt (two new tokens); its cached prompt tokens as the engine counts them."""
    answer = engine.post_json(
        "/generate",
        {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
        timeout=REQUEST_TIMEOUT_SECONDS,
    )
    assert answer["meta_info"]["prompt_tokens"] == len(ids), answer
    return int(answer["meta_info"]["cached_tokens"])


def test_an_evicted_prefix_comes_back_from_host_memory(tiered_engine: RealJaxEngine) -> None:
    """Two 64-token prompts, then three 400-token ones that need 1,328 tokens with them in a
    1,024-token pool: the least recently used, the short ones, are evicted from the device
    (the next test shows such a prompt coming back with nothing cached when it is not loaded
    back). Both come back cached from host memory: SGLang-JAX inserts a prompt into its cache
    after prefill and again when it finishes, and `write_through` backs a node up on its
    first reuse, so every finished prompt has a host copy."""
    engine = tiered_engine
    engine.flush_cache()
    first, second = prompt(0, 64), prompt(1, 64)
    assert cached(engine, first) == 0
    assert cached(engine, second) == 0
    for filler in (2, 3, 4):
        assert cached(engine, prompt(filler, 400)) == 0
    assert engine.alive(), engine.log_tail()
    back = [cached(engine, first), cached(engine, second)]
    print(f"\nMEASURED cached tokens of two evicted 64-token prompts: {back}")
    assert back == [64 - PAGE, 64 - PAGE], engine.log_tail()  # the last page is computed again
    assert engine.alive(), engine.log_tail()


def test_a_host_hit_past_the_free_pool_is_computed_again(tiered_engine: RealJaxEngine) -> None:
    """SGLang-JAX's limit at the pinned commit: it loads a host hit back only into free device
    slots, all or nothing, without evicting cached prefixes for it. A 400-token prompt backed
    up to host, evicted by three others, finds 384 tokens in host memory but the pool has
    fewer free slots (the others' cached prefixes fill it): 0 cached. When this fails with
    384, SGLang-JAX evicts for a load back and docs/sglang-jax.md should say so."""
    engine = tiered_engine
    engine.flush_cache()
    first = prompt(5, 400)
    assert cached(engine, first) == 0
    assert cached(engine, first) == 400 - PAGE
    for filler in (6, 7, 8):
        assert cached(engine, prompt(filler, 400)) == 0
    assert cached(engine, first) == 0, "SGLang-JAX now evicts for a load back"
    assert engine.alive(), engine.log_tail()


def test_the_router_reads_the_size_of_its_host_tier(tiered_engine: RealJaxEngine) -> None:
    """All `/get_server_info` says of the tier (its storage, ratio and the device pool) reaches
    the router's view of the worker: 4 x 1,024 tokens."""
    router = RouterProcess(
        args=[
            *("--worker", tiered_engine.url),
            *("--tokenizer", str(tiered_engine.model_path / "tokenizer.json")),
            "--no-kv-events",
            *("--load-poll-interval", "0.2"),
            *("--health-check-timeout", "10"),
        ]
    ).start()
    try:

        def tier() -> int | None:
            with urllib.request.urlopen(f"{router.url}/workers", timeout=10) as response:
                (worker,) = json.load(response)["workers"]
            load: dict[str, Any] | None = worker["engine_load"]
            return None if load is None else load["host_tier_tokens"]

        seen = eventually(tier, what="the router's view of the engine's host tier",
                          timeout_seconds=60, context=router.log)  # fmt: skip
        assert seen == 4 * POOL_TOKENS
    finally:
        router.stop()
