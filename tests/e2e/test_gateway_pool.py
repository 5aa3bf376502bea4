"""A TPUModelServer behind an Inference Extension gateway, on the real apiserver (issue 50).

With the InferencePool CRD of GIE v1.6.0 installed (tests/e2e/crds), `kubectl apply` of a
server with ``spec.inferencePool`` makes the operator create the pool (accepted by the CRD's
schema and CEL rules) and the picker's Service; the router runs as a local process with what
the operator rendered for it (as tests/e2e/test_router_discovery.py runs it), its leaders
pointed at engine twins on loopback. No gateway can run here (docs/gateway.md), so the test
plays the gateway with the ext_proc client of tests/component/router/gateway_emulator.py, and
the official ``openai`` client talks to that "gateway": answers streamed and not, the same
prompt landing where the picker chose, its prefix reused (cached tokens). A gateway
controller's write of the pool's ``status.parents`` reaches ``status.inferencePool``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.component.router.gateway_emulator import GatewayFront, PickerClient
from tests.e2e.test_router_discovery import (
    LISTENING_LINE,
    LOOPBACK,
    READY_LINE,
    START_TIMEOUT_SECONDS,
    annotate,
    engine_pods,
    is_leader,
    is_ready,
    router_deployments,
)
from tests.e2e.tms_harness import (
    NOT_YET,
    POLL_SECONDS,
    TIMEOUT_SECONDS,
    OperatorProcess,
    apply,
    get,
    server,
    tms,
    wait_until,
    while_running,
)
from tests.waiting import eventually
from tpuserve.cluster import Cluster
from tpuserve.cluster.ports import free_ports
from tpuserve.cluster.process import ManagedProcess
from tpuserve_operator import labels, launch_contract
from tpuserve_operator.render import inference_pool as pools

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("operator", ["statefulset"], indirect=True),  # one operator
]

NAME = "sim"  # engine_pods and router_deployments of test_router_discovery look for it
SERVED_NAME = "qwen3-8b"
CRD = Path(__file__).resolve().parent / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
PICKER_LINE = re.compile(r"endpoint picker \(ext_proc\) listening on [\d.]+:(\d+)")
PROMPT = "Shared context for the gateway test, long enough for several KV pages. " * 12


@pytest.fixture
def pool_crd(cluster: Cluster) -> Iterator[None]:
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.wait_crds_established([f"{pools.PLURAL}.{pools.GROUP}"])
    yield
    cluster.kubectl("delete", "-f", str(CRD), "--wait=false")


def start_process(
    name: str, argv: list[str], log: Path, env: dict[str, str], line: re.Pattern[str]
) -> tuple[ManagedProcess, re.Match[str]]:
    process = ManagedProcess.spawn(name, argv, log, env=env)
    match = eventually(
        while_running(process, lambda: line.search(log.read_text())),
        what=f"{name} to start",
        timeout_seconds=START_TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
        ignore=NOT_YET,
    )
    return process, match


def start_engine(name: str, log_dir: Path) -> tuple[ManagedProcess, str]:
    events, replay = free_ports(2)
    argv = [
        sys.executable,
        "-m",
        "tpuserve",
        "engine",
        "sim",
        "--port",
        "0",
        "--time-scale",
        "0",
        "--enable-cache-report",
        f"--served-model-name={SERVED_NAME}",
        f"--kv-events-endpoint=tcp://127.0.0.1:{events}",
        f"--kv-events-replay-endpoint=tcp://127.0.0.1:{replay}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process, match = start_process(name, argv, log_dir / f"{name}.log", env, READY_LINE)
    return process, match.group(1)


def start_router(
    cluster: Cluster, namespace: str, log_dir: Path
) -> tuple[ManagedProcess, int, str]:
    """`tpuserve router` as rendered (the picker on, plaintext here: the test's client cannot
    know the self-signed certificate of another process), with the gateway's token the
    operator created (its Secret, written where the pod would mount it); returns it, its
    picker port and the token."""
    (deployment,) = router_deployments(cluster, namespace)
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    assert f"--picker-port={pools.PICKER_PORT}" in container["args"]
    assert "--picker-tls" in container["args"]
    assert {"name": "picker", "containerPort": pools.PICKER_PORT, "protocol": "TCP"} in container[
        "ports"
    ]
    (source,) = container["envFrom"]
    variables = get(cluster, namespace, "configmaps", source["configMapRef"]["name"])["data"]
    kubeconfig = cluster.service_account_kubeconfig(namespace, pod_spec["serviceAccountName"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(variables, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
    # no peering (one router, no cluster DNS), and no TLS (--picker-tls dropped: the client
    # here cannot know the self-signed certificate another process makes)
    dropped = ("--peers-from-dns=", "--peer-key-file=", "--picker-tls")
    alone = [a for a in container["args"] if not a.startswith(dropped)]
    secret = get(cluster, namespace, "secrets", f"{NAME}-router-picker")  # issue 68: by default
    token = base64.b64decode(secret["data"][pools.PICKER_TOKEN_KEY]).decode()
    token_file = log_dir / "picker-token"
    token_file.write_text(token)
    mounted = f"--picker-token-file={pools.PICKER_TOKEN_DIR}/{pools.PICKER_TOKEN_KEY}"
    assert mounted in alone
    alone = [f"--picker-token-file={token_file}" if a == mounted else a for a in alone]
    argv = [
        sys.executable,
        "-m",
        "tpuserve",
        *container["command"][1:],
        *alone,
        "--host=127.0.0.1",
        "--port=0",
        "--metrics-port=0",
        "--admin-port=0",
        f"--worker-networks={LOOPBACK}",
        "--peer-port=0",
        "--picker-port=0",
    ]
    log = log_dir / "router.log"
    process, _ = start_process("router", argv, log, env, LISTENING_LINE)
    match = eventually(
        while_running(process, lambda: PICKER_LINE.search(log.read_text())),
        what="the router's picker to listen",
        timeout_seconds=START_TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
        ignore=NOT_YET,
    )
    return process, int(match.group(1)), token


def cached_tokens(usage: Any) -> int:
    details = usage.prompt_tokens_details if usage is not None else None
    return int(details.cached_tokens or 0) if details is not None else 0


async def through_the_gateway(picker_port: int, token: str) -> tuple[list[int], str, int]:
    """The same prompt twice and a streamed chat, with the openai client through the emulated
    gateway: the first two answers' cached tokens, the stream's text and its completion
    tokens."""
    client = PickerClient(f"127.0.0.1:{picker_port}", token=token)
    front = GatewayFront(client)
    url = await front.start()
    try:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused") as oa:
            cached = []
            for _ in range(2):
                answer = await oa.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=4)
                cached.append(cached_tokens(answer.usage))
            stream = await oa.chat.completions.create(
                model=SERVED_NAME,
                messages=[{"role": "user", "content": "hello through the gateway"}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
    finally:
        await front.stop()
        await client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    return cached, text, usage.completion_tokens if usage is not None else 0


def test_a_server_with_an_inference_pool_is_picked_for_by_its_router(
    cluster: Cluster,
    namespace: str,
    core_v1: Any,
    operator: OperatorProcess,
    pool_crd: None,
    tmp_path: Path,
) -> None:
    manifest = server(NAME, "v6e", "2x4", replicas=2, engine="simulated")
    manifest["spec"]["inferencePool"] = {"failureMode": "FailOpen", "gatewayName": "gateway"}
    apply(cluster, namespace, manifest)

    def pool() -> dict[str, Any]:
        found: dict[str, Any] = get(cluster, namespace, pools.PLURAL, NAME)
        return found

    body = wait_until("the InferencePool", pool, operator)
    assert body["spec"]["selector"]["matchLabels"] == labels.leader_selector(NAME)
    assert body["spec"]["targetPorts"] == [{"number": launch_contract.HTTP_PORT}]
    assert body["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": f"{NAME}-picker",
        "port": {"number": pools.PICKER_PORT},
        "failureMode": "FailOpen",
    }
    service = get(cluster, namespace, "services", f"{NAME}-picker")
    assert service["spec"]["ports"][0]["port"] == pools.PICKER_PORT

    wait_until(
        "the leader pods to run",
        lambda: len([p for p in engine_pods(cluster, namespace) if is_ready(p)]) == 2,
        operator,
    )
    leaders = [p["metadata"]["name"] for p in engine_pods(cluster, namespace) if is_leader(p)]
    assert len(leaders) == 2
    started: list[ManagedProcess] = []
    try:
        for i, pod in enumerate(leaders):
            process, url = start_engine(f"engine-{i}", tmp_path)
            started.append(process)
            annotate(core_v1, namespace, pod, url)
        router, picker_port, token = start_router(cluster, namespace, tmp_path)
        started.append(router)

        async def readiness() -> str:
            probe = PickerClient(f"127.0.0.1:{picker_port}")
            try:
                return await probe.check("readiness")
            finally:
                await probe.close()

        eventually(  # both leaders routable: the picker's readiness, then the router's listing
            while_running(router, lambda: asyncio.run(readiness()) == "SERVING"),
            what="the picker to report ready",
            timeout_seconds=TIMEOUT_SECONDS,
            interval_seconds=POLL_SECONDS,
            ignore=NOT_YET,
        )
        cached, text, completion_tokens = asyncio.run(through_the_gateway(picker_port, token))
        assert cached[1] > 0  # the second answer reused the first one's prefix: same engine
        assert text
        assert completion_tokens == 5
    finally:
        for process in reversed(started):
            process.stop()

    status = tms(cluster, namespace, NAME)["status"]["inferencePool"]
    assert status == {"name": NAME, "managed": True, "accepted": False, "parents": []}
    parents = {
        "parents": [
            {
                "parentRef": {
                    "group": "gateway.networking.k8s.io",
                    "kind": "Gateway",
                    "name": "inference-gateway",
                },
                "controllerName": "example.net/gateway",
                "conditions": [
                    {
                        "type": "Accepted",
                        "status": "True",
                        "reason": "Accepted",
                        "message": "",
                        "lastTransitionTime": "2026-12-01T00:00:00Z",
                        "observedGeneration": 1,
                    }
                ],
            }
        ]
    }
    cluster.kubectl(
        "patch",
        pools.PLURAL,
        NAME,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": parents}),
    )
    wait_until(
        "the gateway's acceptance in the server's status",
        lambda: tms(cluster, namespace, NAME)["status"]["inferencePool"]["accepted"] is True,
        operator,
    )
