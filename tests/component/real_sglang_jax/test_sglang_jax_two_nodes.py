"""Two SGLang-JAX processes joined as one engine with tensor parallelism 2, on loopback.

What a two-host slice's LeaderWorkerSet group runs (docs/sglang-jax.md, *The command line*):
each process gets `--tp-size 2 --nnodes 2 --node-rank R --dist-init-addr LEADER:PORT`, rank 0
hosts JAX's distributed service there and serves HTTP, rank 1 joins it (and answers only a
health check of its own). Here both are processes on this machine with one CPU device each
(JAX's CPU collectives over gloo), and the tiny model's two KV heads split one per process.

The joined engine must answer as the one-process engine did: the same greedy tokens for the
same prompt as the recording of a tp-1 engine (`tests/goldens/sglang_jax_recorded.json`), and
a repeated prompt comes back with its cached pages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.component.differential.sglang_jax_recorded import load
from tests.real_sglang_jax import RealJaxEngine, SGLangJax, spawn_engine
from tpuserve.cluster.ports import LOOPBACK, free_ports

pytestmark = [pytest.mark.component, pytest.mark.real_sglang_jax]

TP = 2


@pytest.fixture(scope="module")
def joined(
    real_sglang_jax: SGLangJax, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[RealJaxEngine]]:
    run_dir: Path = tmp_path_factory.mktemp("sglang-jax-tp2")
    coordinator, *ports = free_ports(1 + TP)
    env = {"JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}  # collectives between processes
    nodes = []
    for rank in range(TP):
        joining = ["--tp-size", str(TP), "--nnodes", str(TP), "--node-rank", str(rank),
                   "--dist-init-addr", f"{LOOPBACK}:{coordinator}"]  # fmt: skip
        nodes.append(
            spawn_engine(
                real_sglang_jax,
                run_dir,
                name=f"node-{rank}",
                port=ports[rank],
                env=env,
                extra_args=joining,
            )
        )
    try:
        for node in nodes:  # rank 1's /health is its own small server's
            node.wait_healthy()
        yield nodes
    finally:
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                node.stop()


def recorded(name: str) -> dict[str, Any]:
    (exchange,) = [e for e in load()["exchanges"] if e["name"] == name]
    assert isinstance(exchange, dict)
    return exchange


def test_the_joined_engine_answers_with_the_single_engines_tokens(
    joined: list[RealJaxEngine],
) -> None:
    leader = joined[0]
    one_process = recorded("generate_ids")
    expected = one_process["json"]["output_ids"]
    answer = leader.post_json("/generate", one_process["body"])
    print(f"\nMEASURED tp 2 over two processes: {answer['output_ids']}, tp 1 recorded: {expected}")
    assert answer["output_ids"] == expected
    assert answer["meta_info"]["prompt_tokens"] == 40
    again = leader.post_json("/generate", one_process["body"])
    assert again["meta_info"]["cached_tokens"] == 32  # two whole pages of 16 of the 40
    info = leader.get_json("/get_server_info")
    assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (TP, TP, 0)
    assert all(node.alive() for node in joined)
