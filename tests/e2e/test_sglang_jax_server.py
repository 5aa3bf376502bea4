"""A `TPUModelServer` with `engine.type: sglang-jax` on the living cluster, answered by a REAL
SGLang-JAX engine through the server's router.

The README's local flow (`tpuserve cluster up`, `helm install`, `kubectl apply`) with the
opt-in CPU build of SGLang-JAX (`scripts/build-sglang-jax.sh`): a v5e 1x1 node pool, the tiny
random-weight Qwen3 on a PersistentVolumeClaim (`model.source: pvc://...`, the pod runner's
directory of the claim), one replica with the flags the component tests use
(`spec.engine.args`: no precompile, no warm-up request, page size 16, a small pool). The pod
runner runs the engine image as `tpuserve engine launch` with the build standing in for the
TPU (`tpuserve/cluster/pods/images.py`: `TPUSERVE_DEVICE=cpu`, `TPUSERVE_SGLANG_PYTHON`): the
operator's command line, the launcher's, SGLang-JAX's server, the operator's router
(`--engine-type=sglang-jax`) and its Service's local address (127.(96 + network).A.B, never a
kwok pod IP). The official `openai` client gets a chat completion with usage, and a repeated
prefix comes back as cached tokens, as the engine counts them (`--enable-cache-report`).

A batch shape the engine has not run yet compiles first (30-50 s on a busy 2-core machine;
JAX's compilation cache beside the build keeps them across runs), longer than the router gives
a short non-streamed answer before it answers 504: the warm-up requests are asked again until
answered; the measured pair then runs shapes already compiled and is sent once each.

Without the opt-in build it skips, saying how to build it (CI has none).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e.fleet_harness import (
    NAMESPACE,
    get,
    install_chart,
    local_base_url,
    pods,
    ready,
    wait,
)
from tests.e2e.jax_harness import CLAIM, MODEL_DIR, apply_object, model_claim, remove_claim
from tests.real_sglang_jax import SGLangJax, installation
from tpuserve.cluster import Cluster, NodePool
from tpuserve_operator import labels

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

NAME = "tiny-jax"
POOL = "jax-v5e"
SERVED = "tiny-qwen3"
READY_SECONDS = 480.0  # pods start, the engine loads and JAX starts on CPU: 1-3 min here
ANSWER_SECONDS = 600.0  # warm-up: each new batch shape compiles (30-50 s) before it answers
CLIENT_TIMEOUT_SECONDS = 300.0
MAX_TOKENS = 8
ENGINE_ARGS = {
    "page-size": 16,
    "disable-precompile": True,
    "skip-server-warmup": True,
    "max-total-tokens": 4096,
    "max-running-requests": 8,
    "chunked-prefill-size": 512,
    "mem-fraction-static": 0.1,
    "sleep-on-idle": True,  # its idle scheduler otherwise polls ~17 % of a core
}
SERVER: dict[str, Any] = {
    "apiVersion": f"{labels.GROUP}/{labels.VERSION}",
    "kind": labels.KIND,
    "metadata": {"name": NAME, "namespace": NAMESPACE},
    "spec": {
        "model": {
            "source": f"pvc://{CLAIM}/{MODEL_DIR}",
            "servedName": SERVED,
            "contextLength": 2048,
        },
        "tpu": {"generation": "v5e", "topology": "1x1"},
        "replicas": 1,
        "engine": {"type": "sglang-jax", "args": ENGINE_ARGS},
        "router": {"replicas": 1},
    },
}


@pytest.fixture(scope="session")
def jax_build() -> SGLangJax:
    """The opt-in build, or a skip naming the script (before any cluster starts)."""
    return installation()


@pytest.fixture(scope="module")
def jax_server(jax_build: SGLangJax, living_cluster: Cluster) -> Iterator[str]:
    """The server Ready on the living cluster; its router's local base URL."""
    cluster = living_cluster
    install_chart(cluster, verb="upgrade")
    cluster.add_node_pool(NodePool.tpu(POOL, "v5e", "1x1"))
    model_claim(cluster, jax_build)
    started = time.monotonic()
    apply_object(cluster, SERVER)
    try:
        wait(f"{NAME} Ready", lambda: ready(cluster, NAME), READY_SECONDS)
        print(f"\nMEASURED {NAME} Ready {time.monotonic() - started:.0f} s after kubectl apply")
        yield local_base_url(cluster, NAME)
    finally:
        cluster.kubectl("delete", labels.KIND.lower(), NAME, "-n", NAMESPACE, "--wait=false")
        selector = f"app.kubernetes.io/instance={NAME}"
        wait(f"{NAME}'s pods gone", lambda: not pods(cluster, selector), 240)
        remove_claim(cluster)
        cluster.remove_node_pool(POOL)


def chat(client: openai.OpenAI, prompt: str) -> Any:
    return client.chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        timeout=CLIENT_TIMEOUT_SECONDS,
    )


def answered(client: openai.OpenAI, text: str) -> bool:
    return bool(chat(client, text).choices[0].message.content)


def prompt(session: int, question: str) -> str:
    """~200 tokens: a prefix shared by every question of one session, then the question."""
    words = " ".join(f"fact{session}x{i}" for i in range(40))
    return f"Session {session} notes: {words}. Question: {question}"


def test_a_sglang_jax_server_answers_through_its_router_with_cached_prefixes(
    jax_server: str, living_cluster: Cluster
) -> None:
    cluster = living_cluster
    (engine,) = pods(cluster, f"app.kubernetes.io/instance={NAME},{labels.ROLE}=leader")
    assert engine["spec"]["containers"][0]["image"].startswith(
        "ghcr.io/tpuserve/tpuserve-sglang-jax"
    )
    status = get(cluster, labels.KIND.lower(), NAME, "-n", NAMESPACE)["status"]
    assert status["servedName"] == SERVED
    client = openai.OpenAI(base_url=f"{jax_server}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [SERVED]

    # Warm-up: the shapes of a whole prompt and of a prompt whose prefix is cached compile.
    for question in ("What is a TPU?", "What is a slice?"):
        began = time.monotonic()
        wait(
            f"an answer to the warm-up {question!r} (its batch shape compiles first)",
            functools.partial(answered, client, prompt(0, question)),
            ANSWER_SECONDS,
        )
        print(f"MEASURED warm-up {question!r} answered after {time.monotonic() - began:.0f} s")

    first = chat(client, prompt(1, "What is a TPU?"))
    began = time.monotonic()
    second = chat(client, prompt(1, "What is a slice?"))
    print(f"MEASURED repeated-prefix request {time.monotonic() - began:.1f} s")
    for answer in (first, second):
        assert answer.model == SERVED
        assert answer.choices[0].message.content
        assert answer.usage is not None
        assert answer.usage.completion_tokens == MAX_TOKENS or (
            answer.choices[0].finish_reason == "stop"
        )
        assert answer.usage.prompt_tokens > 100
    assert first.usage is not None
    assert second.usage is not None
    # SGLang-JAX leaves the details out (null) when nothing was cached: the new session shares
    # only the chat template's head (under one page of 16) with the warm-up; the second
    # question of it shares the whole session prefix with the first, in whole pages.
    first_details = first.usage.prompt_tokens_details
    first_cached = first_details.cached_tokens or 0 if first_details is not None else 0
    second_details = second.usage.prompt_tokens_details
    assert second_details is not None, "no cached tokens reported (--enable-cache-report)"
    second_cached = second_details.cached_tokens or 0
    print(
        f"MEASURED prompt tokens {first.usage.prompt_tokens}/{second.usage.prompt_tokens}, "
        f"cached {first_cached}/{second_cached}"
    )
    assert second_cached % ENGINE_ARGS["page-size"] == 0
    assert second_cached > first_cached
    assert second_cached >= second.usage.prompt_tokens // 2
