"""A TPUGateway in front of three TPUModelServers, one at zero, on the living fleet.

`kubectl apply` of three simulated servers (no router of their own; `gw-z` at zero with
`autoscaling.minReplicas: 0`, the combination refused before the gateway) and one TPUGateway
selecting them by label. The operator renders the gateway's router; the official `openai`
client talks to it:

1. each running model is answered through the gateway; the model at zero is not woken by
   them (its demand Lease never renewed, its replicas stay 0);
2. an unloaded run of model B, then the same run while model A runs as many closed-loop
   clients as its share of requests in flight (`maxInFlightPerModel`), then while A is flooded
   by three times as many: B is answered every time (no 429 or 503), A's excess gets 429
   naming its share; the latencies of the runs are printed (`-s`) for the report, never
   asserted;
3. a burst at the model at zero, more than its hold slots: the excess gets 503 with
   Retry-After at once (its own slots), A and B keep being answered meanwhile; its own held
   requests renew its Lease, the operator wakes exactly that server, and they are answered.
"""

from __future__ import annotations

import functools
import multiprocessing
import statistics
import threading
import time
from typing import Any

import openai
import pytest
import yaml

from tests.e2e.fleet_harness import NAMESPACE, get, install_chart, pods, read, wait
from tests.e2e.tms_harness import CRDS, condition
from tpuserve.cluster import Cluster
from tpuserve_operator import labels

# three servers, a gateway, an unloaded run, a run at A's share, a flood and a wake from zero:
# ~110 s on a quiet machine, past 300 s seen at a load average of 20
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

GATEWAY = "models"
SERVERS = {"gw-a": "model-a", "gw-b": "model-b", "gw-z": "model-z"}
ZERO = "gw-z"
HOLD_REQUESTS = 3  # hold.maxRequests: per model
IN_FLIGHT_PER_MODEL = 4  # maxInFlightPerModel
FLOOD_CLIENTS = 12  # model A's flood: three times its share
SAMPLES = 40  # requests per latency run
STARTUP_TIMEOUT_SECONDS = 600.0


def manifests() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, served in SERVERS.items():
        spec: dict[str, Any] = {
            "model": {"source": "hf://Qwen/Qwen3-8B", "contextLength": 8192, "servedName": served},
            "tpu": {"generation": "v6e", "topology": "2x4"},
            "engine": {"type": "simulated"},
            "replicas": 1,
            "router": {"enabled": False},
        }
        if name == ZERO:
            spec["replicas"] = 0
            spec["autoscaling"] = {
                "minReplicas": 0,
                "maxReplicas": 1,
                "scaleToZero": {"idleSeconds": 3600},
            }
        out.append(
            {
                "apiVersion": labels.API_VERSION,
                "kind": labels.KIND,
                "metadata": {"name": name, "labels": {"tier": "shared"}},
                "spec": spec,
            }
        )
    out.append(
        {
            "apiVersion": labels.API_VERSION,
            "kind": labels.GATEWAY_KIND,
            "metadata": {"name": GATEWAY},
            "spec": {
                "serverSelector": {"matchLabels": {"tier": "shared"}},
                "replicas": 1,
                "maxInFlightPerModel": IN_FLIGHT_PER_MODEL,
                "hold": {"maxRequests": HOLD_REQUESTS, "maxSeconds": 900, "modelShare": 0.25},
            },
        }
    )
    return out


def server(cluster: Cluster, name: str) -> dict[str, Any]:
    body: dict[str, Any] = get(cluster, "tpumodelserver", name, "-n", NAMESPACE)
    return body


def lease_renewed(cluster: Cluster, name: str) -> bool:
    lease = get(cluster, "lease", f"{name}-demand", "-n", NAMESPACE)
    return bool((lease.get("spec") or {}).get("renewTime"))


def gateway_url(cluster: Cluster) -> str:
    selector = f"{labels.GATEWAY}={GATEWAY},{labels.COMPONENT}={labels.COMPONENT_ROUTER}"
    found = [p for p in pods(cluster, selector) if condition(p, "Ready").get("status") == "True"]
    assert found, "no Ready gateway pod yet"
    return f"http://{found[0]['status']['podIP']}:8000"


class Calls:
    """Requests for one model on threads of their own: each one's status and seconds."""

    def __init__(self, base_url: str, model: str) -> None:
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        self.model = model
        self.results: list[tuple[int, float, str | None]] = []  # status, seconds, retry-after
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()

    def one(self, index: int) -> tuple[int, float, str | None]:
        started = time.monotonic()
        status, retry_after = 200, None
        try:
            answer = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": f"{self.model} {index}: what is a TPU?"}],
                max_tokens=8,
                timeout=900,
            )
            if not (answer.choices and answer.choices[0].message.content):
                status = 0
        except openai.APIStatusError as err:
            status = err.status_code
            retry_after = err.response.headers.get("retry-after")
        except Exception:  # a failure is an outcome
            status = 0
        result = (status, time.monotonic() - started, retry_after)
        with self.lock:
            self.results.append(result)
        return result

    def sequential(self, count: int) -> list[float]:
        """``count`` requests one after another; their seconds (each must be answered)."""
        seconds = []
        for i in range(count):
            status, took, _ = self.one(i)
            assert status == 200, f"{self.model}: request {i} got {status}"
            seconds.append(took)
        return seconds

    def burst(self, count: int) -> None:
        for i in range(count):
            thread = threading.Thread(target=self.one, args=(i,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(960)

    def statuses(self) -> list[int]:
        with self.lock:
            return sorted(status for status, _, _ in self.results)


def _flood(base_url: str, model: str, clients: int, stop: Any, counts: Any) -> None:
    """A flood's process: ``clients`` closed-loop threads, statuses counted in ``counts``."""
    calls = Calls(base_url, model)

    def loop(client: int) -> None:
        sent = 0
        while not stop.is_set():
            sent += 1
            status, _, _ = calls.one(client * 100_000 + sent)
            slot = FLOOD_SLOTS.get(status, len(FLOOD_SLOTS))
            with counts.get_lock():
                counts[slot] += 1

    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


FLOOD_SLOTS = {200: 0, 429: 1}  # any other status: slot 2


class Flood:
    """Closed-loop clients of one model in a process of their own, so their threads do not
    take the interpreter from the test's measuring thread (the machine's cores they share)."""

    def __init__(self, base_url: str, model: str, clients: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.counts = context.Array("i", len(FLOOD_SLOTS) + 1)
        self.process = context.Process(
            target=_flood, args=(base_url, model, clients, self.stop, self.counts), daemon=True
        )
        self.process.start()

    def count(self, status: int) -> int:
        with self.counts.get_lock():
            return int(self.counts[FLOOD_SLOTS.get(status, len(FLOOD_SLOTS))])

    def others(self) -> int:
        return self.count(0)

    def halt(self) -> None:
        self.stop.set()
        self.process.join(960)


def p99(seconds: list[float]) -> float:
    return statistics.quantiles(seconds, n=100, method="inclusive")[98]


def test_one_gateway_fronts_three_servers_and_wakes_only_the_one_asked_for(
    living_cluster: Cluster,
) -> None:
    cluster = living_cluster
    install_chart(cluster, verb="upgrade")
    # `helm upgrade` leaves CRDs as they were: the gateway's, applied as the chart ships it
    cluster.kubectl("apply", "-f", str(CRDS / "tpugateways.serving.tpuserve.dev.yaml"))
    documents = "---\n".join(yaml.safe_dump(m) for m in manifests())
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=documents)
    try:
        _run(cluster)
    finally:
        cluster.kubectl("delete", "tpugateway", GATEWAY, "-n", NAMESPACE, "--wait=false")
        cluster.kubectl(
            "delete", "tpumodelserver", *SERVERS, "-n", NAMESPACE, "--wait=false", check=False
        )
        wait(
            "the gateway's pods gone",
            lambda: not pods(cluster, f"{labels.GATEWAY}={GATEWAY}"),
            STARTUP_TIMEOUT_SECONDS,
        )


def ready(cluster: Cluster, name: str) -> bool:
    return condition(server(cluster, name), "Ready").get("status") == "True"


def gateway_status(cluster: Cluster) -> dict[str, Any] | None:
    """The gateway's status once it lists every model."""
    status: dict[str, Any] = get(cluster, "tpugateway", GATEWAY, "-n", NAMESPACE).get("status")
    return status if len((status or {}).get("models") or []) == len(SERVERS) else None


def _run(cluster: Cluster) -> None:
    for name in ("gw-a", "gw-b"):
        wait(f"{name} Ready", functools.partial(ready, cluster, name), STARTUP_TIMEOUT_SECONDS)
    wait(
        f"{ZERO} valid at zero behind the gateway",
        lambda: (
            condition(server(cluster, ZERO), "Valid").get("status") == "True"
            and condition(server(cluster, ZERO), "Ready").get("reason") == "ScaledToZero"
        ),
    )
    gateway = wait("the gateway's status lists the three models", lambda: gateway_status(cluster))
    assert gateway is not None
    assert {m["model"]: m["scalesToZero"] for m in gateway["models"]} == {
        "model-a": False,
        "model-b": False,
        "model-z": True,
    }
    base_url = wait("the gateway Ready", lambda: gateway_url(cluster), STARTUP_TIMEOUT_SECONDS)
    metrics_url = base_url.rsplit(":", 1)[0] + ":9000/metrics"

    # 1. each running model through the gateway; the model at zero not woken by them
    a, b = Calls(base_url, "model-a"), Calls(base_url, "model-b")
    wait("model-a answered", lambda: a.one(0)[0] == 200 or None, STARTUP_TIMEOUT_SECONDS)
    wait("model-b answered", lambda: b.one(0)[0] == 200 or None, STARTUP_TIMEOUT_SECONDS)
    unloaded_a = a.sequential(SAMPLES)
    unloaded_b = b.sequential(SAMPLES)
    assert not lease_renewed(cluster, ZERO), "other models' requests renewed gw-z's Lease"
    assert server(cluster, ZERO)["spec"].get("replicas") == 0
    assert not pods(cluster, f"{labels.INSTANCE}={ZERO}")

    # 2. model A at its share, then flooded past it; model B answered every time
    steady = Flood(base_url, "model-a", IN_FLIGHT_PER_MODEL)
    try:
        wait("model-a at its share answered", lambda: steady.count(200) > 0 or None)
        share_b = b.sequential(SAMPLES)
    finally:
        steady.halt()
    flood = Flood(base_url, "model-a", FLOOD_CLIENTS)
    try:
        wait("the flood at its share", lambda: flood.count(429) > 0 or None)
        loaded_b = b.sequential(SAMPLES)
    finally:
        flood.halt()
    assert flood.others() == 0  # 200 or the share's 429, nothing else
    assert flood.count(200) > 0
    assert not lease_renewed(cluster, ZERO)

    # 3. a burst at the model at zero: its own slots, its own Lease, its own server woken
    z = Calls(base_url, "model-z")
    z.burst(HOLD_REQUESTS + 2)
    wait("the burst past the slots refused", lambda: z.statuses().count(503) == 2 or None)
    during = [a.one(1)[0], b.one(1)[0]]  # the others are answered while model-z is held
    assert during == [200, 200]
    wait("gw-z's Lease renewed by its own requests", lambda: lease_renewed(cluster, ZERO))
    wait("gw-z woken", lambda: server(cluster, ZERO)["spec"].get("replicas") == 1)
    z.halt()
    held = z.statuses()
    assert held == [200] * HOLD_REQUESTS + [503] * 2, held
    assert all(after for status, _, after in z.results if status == 503)
    assert server(cluster, "gw-a")["spec"].get("replicas") == 1  # nobody else scaled
    text = read(metrics_url)
    assert 'tpuserve_router_hold_outcomes_total{model="model-z",outcome="queue_full"} 2.0' in text

    print(
        "\ngateway latencies (s): "
        f"model-a unloaded p50 {statistics.median(unloaded_a):.4f} p99 {p99(unloaded_a):.4f}; "
        f"model-b unloaded p50 {statistics.median(unloaded_b):.4f} p99 {p99(unloaded_b):.4f}; "
        f"model-b with model-a at its share ({IN_FLIGHT_PER_MODEL} clients) p50 "
        f"{statistics.median(share_b):.4f} p99 {p99(share_b):.4f} "
        f"(p99 ratio {p99(share_b) / p99(unloaded_b):.2f}, model-a statuses "
        f"{steady.count(200)} x 200, {steady.count(429)} x 429); "
        f"model-b under model-a's flood ({FLOOD_CLIENTS} clients) p50 "
        f"{statistics.median(loaded_b):.4f} p99 {p99(loaded_b):.4f} "
        f"(p99 ratio {p99(loaded_b) / p99(unloaded_b):.2f}); flood statuses: "
        f"{flood.count(200)} x 200, {flood.count(429)} x 429; "
        f"model-z burst {held}, its held requests answered after "
        f"{min(t for st, t, _ in z.results if st == 200):.1f}-"
        f"{max(t for st, t, _ in z.results if st == 200):.1f} s (cold start from zero)"
    )
