"""A two-host `TPUModelServer` with `engine.type: sglang-jax`: one LeaderWorkerSet group of two
pods of REAL SGLang-JAX, joined through its own distributed initialisation, answering through
the router as one engine with tensor parallelism 2.

The README's local flow with the opt-in CPU build (`scripts/build-sglang-jax.sh`), as in
`test_sglang_jax_server.py`, on a v5p `2x2x2` node pool: two hosts of four chips, the
smallest multi-host slice in the catalog (v5e has none under 4x4; its `2x4` is one 8-chip
host). `kubectl apply`, then the operator renders one LeaderWorkerSet of size 2, the LWS
controller makes the leader and the worker pod, and the pod runner runs each as the engine
image's `tpuserve engine launch` with the build's CPU device standing in for the TPU: the
launcher starts `python -m sgl_jax.launch_server --tp-size 2 --nnodes 2 --node-rank R
--dist-init-addr LEADER:20000` (R from the group's worker index; tp is one CPU device per host).
LEADER is the leader pod's DNS name as rendered (`NAME-r0-0.NAME-r0.NS.svc`); the pod runner
stands in for cluster DNS with a hosts file its pods see as /etc/hosts
(`tpuserve/cluster/pods/dns.py`), so the name reaches JAX's coordinator and SGLang-JAX's
pub/sub between nodes unchanged. Each pod binds its own loopback address, so the two hosts'
ports (30000 each, 20000 and 20005-20006 on the leader) do not collide.

What must hold: the rank of each process and the leader's DNS name in their command lines,
the leader reporting tp 2 over two nodes, and the greedy tokens the router returns equal to
the recorded answers of a one-process engine (`tests/goldens/sglang_jax_recorded.json`,
`/generate` by token ids and an OpenAI completion with the `openai` client).

Without the opt-in build it skips, saying how to build it (CI has none).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.component.differential.sglang_jax_recorded import load
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
from tpuserve.cluster.pods.dns import HOSTS_FILE
from tpuserve_operator import labels

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

NAME = "tiny-jax-tp2"
POOL = "jax-v5p"
SERVED = "tiny-qwen3"
HOSTS = 2
DIST_INIT_PORT = 20000  # the contract's default (TPUSERVE_DIST_INIT_PORT)
HTTP_PORT = 30000
READY_SECONDS = 900.0  # two JAX processes load, join and start on a shared 2-core machine
ANSWER_SECONDS = 900.0  # each new batch shape compiles on both hosts before it answers
REQUEST_TIMEOUT_SECONDS = 300.0
ENGINE_ARGS = {  # the recording's flags (tests/real_sglang_jax.py)
    "page-size": 16,
    "disable-precompile": True,
    "skip-server-warmup": True,
    "max-total-tokens": 4096,
    "max-running-requests": 8,
    "chunked-prefill-size": 512,
    "mem-fraction-static": 0.1,
    "sleep-on-idle": True,
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
        "tpu": {"generation": "v5p", "topology": "2x2x2"},
        "replicas": 1,
        "engine": {"type": "sglang-jax", "args": ENGINE_ARGS},
        "router": {"replicas": 1},
    },
}
GROUP = f"{NAME}-r0"  # the replica's LeaderWorkerSet; its leader pod is GROUP-0
LEADER_DNS = f"{GROUP}-0.{GROUP}.{NAMESPACE}.svc"
WORKER_DNS = f"{GROUP}-0-1.{GROUP}.{NAMESPACE}.svc"


@pytest.fixture(scope="session")
def jax_build() -> SGLangJax:
    """The opt-in build, or a skip naming the script (before any cluster starts)."""
    return installation()


@pytest.fixture(scope="module")
def jax_group(jax_build: SGLangJax, living_cluster: Cluster) -> Iterator[str]:
    """The two-host server Ready on the living cluster; its router's local base URL."""
    cluster = living_cluster
    install_chart(cluster, verb="upgrade")
    cluster.add_node_pool(NodePool.tpu(POOL, "v5p", "2x2x2"))
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


def recorded(name: str) -> dict[str, Any]:
    (exchange,) = [e for e in load()["exchanges"] if e["name"] == name]
    assert isinstance(exchange, dict)
    return exchange


def http_json(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
        return json.load(response)


def answered(url: str, body: Any) -> Any:
    """The answer, or None while the router gives up on a shape still compiling (504)."""
    try:
        return http_json(url, body)
    except urllib.error.HTTPError as err:
        if err.code in (502, 503, 504):
            return None
        raise


def engine_pod(cluster: Cluster, role: str) -> dict[str, Any]:
    (pod,) = pods(cluster, f"app.kubernetes.io/instance={NAME},{labels.ROLE}={role}")
    return pod


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    (engine,) = [c for c in pod["spec"]["containers"] if c["name"] == "engine"]
    return {e["name"]: e["value"] for e in engine["env"] if "value" in e}


def sgl_jax_ranks() -> dict[str, list[str]]:
    """Node rank -> command line of the SGLang-JAX servers on this machine joining LEADER_DNS
    (their forked children share the command line)."""
    found: dict[str, list[str]] = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        joining = f"{LEADER_DNS}:{DIST_INIT_PORT}"
        if "sgl_jax.launch_server" in argv and joining in argv:
            found[argv[argv.index("--node-rank") + 1]] = argv
    return found


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_two_pods_of_one_group_answer_as_one_engine_with_tp_2(
    jax_group: str, living_cluster: Cluster
) -> None:
    cluster = living_cluster
    lws = get(cluster, "leaderworkerset", GROUP, "-n", NAMESPACE)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == HOSTS
    leader, worker = engine_pod(cluster, "leader"), engine_pod(cluster, "worker")
    names = (leader["metadata"]["name"], worker["metadata"]["name"])
    assert names == (f"{GROUP}-0", f"{GROUP}-0-1")
    for pod in (leader, worker):
        assert pod["spec"]["containers"][0]["image"].startswith(
            "ghcr.io/tpuserve/tpuserve-sglang-jax"
        )
        assert pod["spec"]["subdomain"] == GROUP  # the LWS's headless Service: its DNS names
        # the rendered contract names the hosts by DNS, untouched by the pod runner
        assert env_of(pod)["TPUSERVE_WORKER_HOSTNAMES"] == f"{LEADER_DNS},{WORKER_DNS}"
        assert pod["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2x2"
    leader_ip, worker_ip = leader["status"]["podIP"], worker["status"]["podIP"]
    assert leader_ip != worker_ip
    # the runner's stand-in for cluster DNS maps both names to the pods' own addresses
    hosts = (cluster.run_dir / HOSTS_FILE).read_text().splitlines()
    assert f"{leader_ip} {LEADER_DNS}.cluster.local {LEADER_DNS} {GROUP}-0.{GROUP}.{NAMESPACE}" in (
        hosts
    )
    assert any(line.startswith(f"{worker_ip} {WORKER_DNS}.cluster.local ") for line in hosts)

    # Two processes, rank 0 and rank 1, joined at the leader's DNS name
    ranks = sgl_jax_ranks()
    assert sorted(ranks) == ["0", "1"], ranks
    for rank, argv in ranks.items():
        assert (flag(argv, "--tp-size"), flag(argv, "--nnodes")) == ("2", "2")
        assert flag(argv, "--device") == "cpu"
        assert flag(argv, "--host") == (leader_ip if rank == "0" else worker_ip)
    info = http_json(f"http://{leader_ip}:{HTTP_PORT}/get_server_info")
    assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (HOSTS, HOSTS, 0)
    assert info["dist_init_addr"] == f"{LEADER_DNS}:{DIST_INIT_PORT}"
    with urllib.request.urlopen(f"http://{worker_ip}:{HTTP_PORT}/health", timeout=30) as health:
        assert health.status == 200  # rank 1 answers its own bare health check

    # Through the router: the one-process engine's greedy tokens
    client = openai.OpenAI(base_url=f"{jax_group}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [SERVED]
    one_process = recorded("generate_ids")
    began = time.monotonic()
    answer = wait(
        "the router's answer to the recorded /generate (its shape compiles first)",
        lambda: answered(f"{jax_group}/generate", one_process["body"]),
        ANSWER_SECONDS,
    )
    print(f"MEASURED first /generate through the router after {time.monotonic() - began:.0f} s")
    expected = one_process["json"]["output_ids"]
    print(f"MEASURED tp 2 over two pods: {answer['output_ids']}, tp 1 recorded: {expected}")
    assert answer["output_ids"] == expected
    assert answer["meta_info"]["prompt_tokens"] == one_process["json"]["meta_info"]["prompt_tokens"]

    completion = recorded("completion")
    body = completion["body"]
    began = time.monotonic()
    got = wait(
        "the router's answer to the recorded completion (its shape compiles first)",
        lambda: _complete(client, body),
        ANSWER_SECONDS,
    )
    print(f"MEASURED first completion through the router after {time.monotonic() - began:.0f} s")
    want = completion["json"]
    assert got.choices[0].text == want["choices"][0]["text"]
    assert got.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
        want["usage"]["prompt_tokens"],
        want["usage"]["completion_tokens"],
    )
    assert all(pod_ready(cluster, role) for role in ("leader", "worker"))


def _complete(client: openai.OpenAI, body: dict[str, Any]) -> Any:
    try:
        return client.completions.create(
            model=body["model"],
            prompt=body["prompt"],
            max_tokens=body["max_tokens"],
            temperature=body["temperature"],
            extra_body={"ignore_eos": body["ignore_eos"]},
            timeout=REQUEST_TIMEOUT_SECONDS,
        )
    except openai.APIStatusError as err:
        if err.status_code in (502, 503, 504):
            return None
        raise


def pod_ready(cluster: Cluster, role: str) -> bool:
    conditions = engine_pod(cluster, role)["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
