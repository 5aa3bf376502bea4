"""The router's Kubernetes discovery against the real apiserver: ready leader pods of a
TPUModelServer become workers and leave live; worker pods and not-ready pods never do; and
nothing is ever dialled but loopback (issue 6, item 8; issue 4, discovery).

Closest to production: the operator (a local process) reconciles a simulated TPUModelServer,
kwok runs its pods, and `tpuserve router` runs as a local process with exactly what the
operator rendered for the router — the ServiceAccount bound to its Role (a token kubeconfig,
so a missing permission fails here), the ConfigMap's `TPUSERVE_ROUTER_*` variables (namespace,
selector) and the Deployment's arguments — overriding only where it listens and adding
`--worker-networks 127.0.0.0/8`. Engine twins run on 127.0.0.1; a leader pod is pointed at one
with the `serving.tpuserve.dev/worker-url` annotation. Until annotated, a ready leader has only
its fake kwok pod IP, so the router must report it as rejected and never dial it.

The server sets no policy and no kvEvents, so the router runs its own default policy and,
as that policy uses them, subscribes to each discovered leader's KV events at the endpoint
the engine reports in `/get_server_info` (the twins publish on loopback).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlsplit
from urllib.request import urlopen

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_tpu.metric_names import NUM_REQUESTS
from tests.e2e.tms_harness import (
    NOT_YET,
    POLL_SECONDS,
    TIMEOUT_SECONDS,
    OperatorProcess,
    apply,
    get,
    server,
    wait_until,
    while_running,
)
from tests.waiting import eventually
from tpuserve.cluster import Cluster
from tpuserve.cluster.kwok import POD_CIDR
from tpuserve.cluster.ports import free_ports
from tpuserve.cluster.process import ManagedProcess, tail
from tpuserve_operator import labels
from tpuserve_operator.render.router import ENV_NAMESPACE, ENV_SELECTOR
from tpuserve_router.config import DEFAULT_POLICY, DEFAULT_WORKER_URL_ANNOTATION
from tpuserve_router.metrics import UPSTREAM_ERROR_REASONS

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parametrize("operator", ["statefulset"], indirect=True),  # one operator
]

NAME = "sim"
SERVED_NAME = "qwen3-8b"  # the status.servedName of `server(...)`'s model, hf://Qwen/Qwen3-8B
REPLICAS = 2
LOOPBACK = "127.0.0.0/8"
START_TIMEOUT_SECONDS = 60.0
READY_LINE = re.compile(r"^READY (http://\S+)$", re.MULTILINE)
LISTENING_LINE = re.compile(r"tpuserve router: listening on (http://\S+)")
# Long enough for several full KV pages, so every request makes its engine publish BlockStored.
QUESTION = "tell me about TPUs, their chips, slices, hosts and interconnect. " * 6


# -- engine twins and the router, as real processes on loopback --------------------------------


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_get(url: str) -> Response:
    try:
        with urlopen(url, timeout=10) as answer:
            return Response(answer.status, dict(answer.headers), answer.read())
    except HTTPError as err:
        return Response(err.code, dict(err.headers), err.read())


@dataclass
class Engine:
    process: ManagedProcess
    url: str

    def requests_received(self) -> float:
        """The engine's own count of finished generation requests (SGLang's counter)."""
        text = http_get(self.url + "/metrics").body.decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == NUM_REQUESTS.name
        )


def start_engine(name: str, log_dir: Path) -> Engine:
    events, replay = free_ports(2)
    argv = [
        sys.executable, "-m", "tpuserve", "engine", "sim", "--port", "0", "--time-scale", "0",
        f"--kv-events-endpoint=tcp://127.0.0.1:{events}",
        f"--kv-events-replay-endpoint=tcp://127.0.0.1:{replay}",
        # the name the router learns from the leader pods' model label (the server's servedName)
        f"--served-model-name={SERVED_NAME}",
    ]  # fmt: skip
    log = log_dir / f"{name}.log"
    process = ManagedProcess.spawn(name, argv, log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    match = eventually(
        while_running(process, lambda: READY_LINE.search(log.read_text())),
        what=f"{name} to serve",
        timeout_seconds=START_TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
        ignore=NOT_YET,
    )
    return Engine(process, match.group(1))


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[dict[str, Engine]]:
    """a, b: the two leaders; c: the leader that replaces a; decoy: put on worker pods."""
    started: dict[str, Engine] = {}
    try:
        for name in ("a", "b", "c", "decoy"):
            started[name] = start_engine(f"engine-{name}", tmp_path)
        yield started
    finally:
        for engine in started.values():
            engine.process.stop()


@dataclass
class Router:
    process: ManagedProcess
    base_url: str

    def get(self, path: str) -> Response:
        return http_get(self.base_url + path)

    def listing(self) -> dict[str, Any]:
        """GET /workers, checking on every read that each worker is a loopback address."""
        body: dict[str, Any] = self.get("/workers").json()
        for worker in body["workers"]:
            host = urlsplit(worker["url"]).hostname
            assert host is not None, worker
            assert ipaddress.ip_address(host).is_loopback, worker
        return body

    def urls(self) -> set[str]:
        """Every worker the router knows, routable or not."""
        return {w["url"] for w in self.listing()["workers"]}

    def routable(self) -> set[str]:
        """Workers that are healthy and have reported their models (fully admitted)."""
        return {w["url"] for w in self.listing()["workers"] if w["healthy"] and w["models"]}

    def metrics(self) -> dict[str, list[Any]]:
        families = text_string_to_metric_families(self.get("/metrics").body.decode())
        return {f.name: f.samples for f in families}


def router_deployments(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    selector = labels.selector_string(labels.router_selector(NAME))
    found: list[dict[str, Any]] = get(cluster, namespace, "deployments", selector=selector)["items"]
    return found


def start_router(
    cluster: Cluster, namespace: str, log_dir: Path
) -> tuple[Router, dict[str, str], list[str]]:
    """`tpuserve router` as the operator rendered it; also its variables and arguments."""
    (deployment,) = router_deployments(cluster, namespace)
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    (source,) = container["envFrom"]
    variables: dict[str, str] = get(
        cluster, namespace, "configmaps", source["configMapRef"]["name"]
    )["data"]
    args: list[str] = container["args"]
    kubeconfig = cluster.service_account_kubeconfig(namespace, pod_spec["serviceAccountName"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(variables, KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
    # one router here, and no cluster DNS to find peers by: peering off (--peer-port=0 below),
    # so neither its peer list nor its key (a mounted Secret, absent here) is passed
    alone = [a for a in args if not a.startswith(("--peers-from-dns=", "--peer-key-file="))]
    argv = [
        sys.executable, "-m", "tpuserve", *container["command"][1:], *alone,
        # later flags win: listen on loopback only (free ports: workers run side by side), and
        # never dial anything else
        "--host=127.0.0.1", "--port=0", "--metrics-port=0", "--admin-port=0",
        f"--worker-networks={LOOPBACK}", "--peer-port=0",
    ]  # fmt: skip
    log = log_dir / "router.log"
    process = ManagedProcess.spawn("router", argv, log, env=env)
    match = eventually(
        while_running(process, lambda: LISTENING_LINE.search(log.read_text())),
        what="the router to listen",
        timeout_seconds=START_TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
        ignore=NOT_YET,
    )
    return Router(process, match.group(1)), variables, args


# -- pods --------------------------------------------------------------------------------------


def engine_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    selector = labels.selector_string(labels.engine_selector(NAME))
    pods: list[dict[str, Any]] = get(cluster, namespace, "pods", selector=selector)["items"]
    return sorted(pods, key=lambda p: p["metadata"]["name"])


def is_leader(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"]["labels"].get(labels.ROLE) == labels.ROLE_LEADER)


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def annotate(core_v1: Any, namespace: str, pod: str, url: str) -> None:
    body = {"metadata": {"annotations": {DEFAULT_WORKER_URL_ANNOTATION: url}}}
    core_v1.patch_namespaced_pod(pod, namespace, body)


def set_ready(core_v1: Any, namespace: str, pod: str, ready: bool) -> None:
    """What a kubelet does when a readiness probe fails or passes again (kwok has none)."""
    status = "True" if ready else "False"
    conditions = [{"type": t, "status": status} for t in ("Ready", "ContainersReady")]
    core_v1.patch_namespaced_pod_status(pod, namespace, {"status": {"conditions": conditions}})


# -- the test ----------------------------------------------------------------------------------


def test_ready_leaders_come_and_go_live_and_only_loopback_is_dialled(
    cluster: Cluster,
    namespace: str,
    core_v1: Any,
    operator: OperatorProcess,
    engines: dict[str, Engine],
    tmp_path: Path,
) -> None:
    a, b, c, decoy = engines["a"], engines["b"], engines["c"], engines["decoy"]
    apply(cluster, namespace, server(NAME, "v6e", "4x4", replicas=REPLICAS, engine="simulated"))
    hosts = 4  # v6e 4x4: one leader and three workers per replica

    def pods_running() -> bool:
        pods = engine_pods(cluster, namespace)
        return len(pods) == REPLICAS * hosts and all(is_ready(p) for p in pods)

    wait_until("the model-server pods to run", pods_running, operator)
    assert {p["metadata"]["labels"].get(labels.MODEL) for p in engine_pods(cluster, namespace)} == {
        SERVED_NAME
    }
    wait_until(
        "the operator to render the router",
        lambda: len(router_deployments(cluster, namespace)) == 1,
        operator,
    )
    pods = engine_pods(cluster, namespace)
    leaders = [p["metadata"]["name"] for p in pods if is_leader(p)]
    followers = [p["metadata"]["name"] for p in pods if not is_leader(p)]
    assert len(leaders) == REPLICAS
    assert len(followers) == REPLICAS * (hosts - 1)

    router, variables, args = start_router(cluster, namespace, tmp_path)
    try:
        # The router watches with the operator's one leader selector, in the server's namespace.
        assert variables[ENV_SELECTOR] == labels.selector_string(labels.leader_selector(NAME))
        assert variables[ENV_NAMESPACE] == namespace
        assert "--discovery=kubernetes" in args
        # Nothing set on the server or the operator: the router's own defaults apply.
        assert "TPUSERVE_ROUTER_POLICY" not in variables
        assert not [a for a in args if "kv-events" in a]
        (info,) = router.metrics()["tpuserve_router_info"]
        assert info.labels["policy"] == DEFAULT_POLICY
        log = router.process.log_path

        def wait(what: str, check: Callable[[], bool]) -> None:
            eventually(
                while_running(router.process, check),
                what=what,
                timeout_seconds=TIMEOUT_SECONDS,
                interval_seconds=POLL_SECONDS,
                ignore=NOT_YET,
            )

        # 1. Ready leaders with only kwok's fake pod IPs: reported as rejected, never workers.
        wait(
            "both leaders reported as rejected",
            lambda: sorted(r["pod"] for r in router.listing()["rejected"]) == leaders,
        )
        listing = router.listing()
        assert listing["workers"] == []
        for rejected in listing["rejected"]:
            host = urlsplit(rejected["url"]).hostname
            assert host is not None
            assert ipaddress.ip_address(host) in ipaddress.ip_network(POD_CIDR)
            assert f"is outside worker_networks ({LOOPBACK})" in rejected["reason"]
            assert f"is not routed: worker url {rejected['url']}" in log.read_text()
        readiness = router.get("/readiness")
        assert readiness.status == 503
        assert readiness.headers["retry-after"] == "1"

        # 2. Point the worker pods at a live engine first, then the leaders at a and b. Watch
        # events arrive in order, so once a and b are workers the router has seen the worker
        # pods' annotations too: they stay non-routable because they are not leaders.
        for pod in followers:
            annotate(core_v1, namespace, pod, decoy.url)
        annotate(core_v1, namespace, leaders[0], a.url)
        annotate(core_v1, namespace, leaders[1], b.url)
        wait("a and b routable", lambda: router.routable() == {a.url, b.url})
        listing = router.listing()
        assert {w["url"] for w in listing["workers"]} == {a.url, b.url}
        assert all(w["source"] == "discovery" for w in listing["workers"])
        assert listing["rejected"] == []
        assert router.get("/readiness").status == 200

        # A worker's error series exist at zero from the start (so increase() sees the first
        # error), and its token series once it has reported its models.
        (model,) = {m for w in listing["workers"] for m in w["models"]}
        series = router.metrics()
        errors = {
            (s.labels["worker"], s.labels["reason"]): s.value
            for s in series["tpuserve_router_upstream_errors"]
        }
        assert errors == {(w, r): 0.0 for w in (a.url, b.url) for r in UPSTREAM_ERROR_REASONS}

        def prompt_tokens() -> dict[tuple[str, str], float]:
            return {
                (s.labels["model"], s.labels["worker"]): s.value
                for s in router.metrics().get("tpuserve_router_prompt_tokens", [])
            }

        # A worker's token series come right after its models are learned, in a step of their
        # own: a pod updated meanwhile may show its models in the listing a moment earlier.
        wait(
            "both workers' token series",
            lambda: prompt_tokens() == {(model, a.url): 0.0, (model, b.url): 0.0},
        )

        client = openai.OpenAI(base_url=router.base_url + "/v1", api_key="unused", max_retries=0)
        sent = 0

        def complete(count: int) -> None:
            nonlocal sent
            for _ in range(count):
                answer = client.completions.create(
                    model=model, prompt=f"request {sent}: {QUESTION}", max_tokens=4
                )
                assert answer.choices[0].text
                assert answer.usage is not None
                assert answer.usage.prompt_tokens > 0
                sent += 1

        def received() -> dict[str, float]:
            return {n: e.requests_received() for n, e in engines.items()}

        start = received()
        complete(8)
        after_both = received()
        assert after_both["a"] + after_both["b"] - start["a"] - start["b"] == 8
        assert after_both["c"] == after_both["decoy"] == 0

        # The default policy's index is fed by the discovered leaders' own KV events.
        def blocks_stored() -> dict[str, float]:
            return {
                s.labels["worker"]: s.value
                for s in router.metrics()["tpuserve_router_kv_events"]
                if s.name.endswith("_total") and s.labels["type"] == "BlockStored"
            }

        stored = {url for n, url in (("a", a.url), ("b", b.url)) if after_both[n] > start[n]}
        wait(
            "KV events from the leaders that served",
            lambda: stored <= {w for w, n in blocks_stored().items() if n > 0},
        )

        # 3. A leader that stops being ready leaves; its requests go to the other one.
        set_ready(core_v1, namespace, leaders[1], ready=False)
        wait("b gone after its pod became not ready", lambda: router.urls() == {a.url})
        complete(4)
        after_a_alone = received()
        assert after_a_alone["a"] - after_both["a"] == 4
        assert after_a_alone["b"] == after_both["b"]
        set_ready(core_v1, namespace, leaders[1], ready=True)
        wait("b back once ready again", lambda: router.routable() == {a.url, b.url})
        b_rejoined_at = received()["b"]

        # 4. A deleted leader leaves at once; the StatefulSet's replacement is a new pod with a
        # fake IP again (rejected) until it is pointed at engine c.
        old = core_v1.read_namespaced_pod(leaders[0], namespace)
        core_v1.delete_namespaced_pod(leaders[0], namespace)
        wait("a gone after its pod was deleted", lambda: router.urls() == {b.url})

        def replaced() -> bool:
            pod = core_v1.read_namespaced_pod(leaders[0], namespace)
            return bool(pod.metadata.uid != old.metadata.uid and pod.status.pod_ip)

        wait("the StatefulSet to replace the leader", replaced)
        wait(
            "the replacement reported as rejected",
            lambda: [r["pod"] for r in router.listing()["rejected"]] == [leaders[0]],
        )
        assert router.urls() == {b.url}
        annotate(core_v1, namespace, leaders[0], c.url)
        wait("c routable in a's place", lambda: router.routable() == {b.url, c.url})
        before_last = received()
        complete(4)

        # 5. Traffic only ever went to loopback engines: the engines' counters add up to every
        # request sent, the decoy on the worker pods got none, a got none after its pod left,
        # and the router's own counts match the engines' for its current workers.
        final = received()
        assert final["a"] + final["b"] + final["c"] - start["a"] - start["b"] == sent == 16
        assert final["decoy"] == 0
        assert final["a"] == before_last["a"] == after_a_alone["a"]
        series = router.metrics()
        answered: dict[str, float] = {}
        for sample in series["tpuserve_router_requests"]:
            if sample.name.endswith("_total"):
                worker = sample.labels["worker"]
                assert sample.labels["status"] == "200", sample
                answered[worker] = answered.get(worker, 0.0) + sample.value
        expected = {b.url: final["b"] - b_rejoined_at, c.url: final["c"]}
        assert answered == {worker: count for worker, count in expected.items() if count}
        assert all(s.value == 0 for s in series["tpuserve_router_upstream_errors"])
        assert all(s.value == 0 for s in series.get("tpuserve_router_retries", []))
        assert router.process.alive()
    except BaseException:
        print(f"--- router log ---\n{tail(router.process.log_path, 80)}")
        print(f"--- operator log ---\n{operator.log_tail()}")
        raise
    finally:
        router.process.stop()
