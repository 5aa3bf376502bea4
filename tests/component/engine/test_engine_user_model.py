"""The engine twin as a process, simulating a model none of the built-in profiles knows, from
its config.json facts (`--model-architecture`, what the operator passes from
spec.model.architecture; issue 58)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import aiohttp
import pytest

from sglang_tpu import model_config, perf_model
from sglang_tpu.topology import lookup
from tests.component.engine.engine_process import ENTRY, running_engine

pytestmark = pytest.mark.component

GEMMA_STYLE = {
    "num_hidden_layers": 42, "hidden_size": 3584, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336,
    "vocab_size": 256000, "max_position_embeddings": 8192, "tie_word_embeddings": True,
}  # fmt: skip


async def _exchange(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/server_info") as r:
            assert r.status == 200
            info: dict[str, Any] = await r.json()
        body = {"model": "gemma-2-9b-it", "prompt": "hello there", "max_tokens": 4}
        async with s.post(url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            answer: dict[str, Any] = await r.json()
    return info, answer


def test_the_twin_serves_a_model_given_by_its_config_facts() -> None:
    args = ["--time-scale", "0", "--tpu", "v6e", "--topology", "1x1",
            "--model-architecture", json.dumps(GEMMA_STYLE),
            "--served-model-name", "gemma-2-9b-it"]  # fmt: skip
    with running_engine(args) as engine:
        info, answer = asyncio.run(_exchange(engine.url))
    profile = model_config.profile_from_config(GEMMA_STYLE, "test", "gemma-2-9b-it")
    pool = perf_model.kv_pool_tokens(lookup("v6e", "1x1"), profile)
    assert info["max_total_num_tokens"] == pool
    assert info["max_req_input_len"] == min(GEMMA_STYLE["max_position_embeddings"], pool) - 1
    assert info["tpuserve"]["model_profile"] == "gemma-2-9b-it"
    assert answer["model"] == "gemma-2-9b-it"
    assert answer["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"num_hidden_layers": 0}', "num_hidden_layers: 0 is not allowed; allowed: an integer"),
        ("xx", "not valid JSON"),
        ('{"layers": 3}', "'layers' is not allowed; allowed: the keys num_hidden_layers"),
    ],
)
def test_a_bad_architecture_exits_2_naming_the_flag(value: str, message: str) -> None:
    command = [sys.executable, "-c", ENTRY, "engine", "sim", "--port", "0"]
    command += ["--model-architecture", value]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"error: --model-architecture: {message}" in done.stderr
