"""The README's local flow, with pods that really run: `tpuserve cluster up`, `helm install`
(the operator runs as a pod), `kubectl apply -f charts/tpuserve/examples/simulated.yaml`, and
the official `openai` client gets answers from the address `tpuserve cluster services` prints,
and the cluster's Prometheus scrapes what the chart's monitors select.

One flow on the module's `living_cluster` (the pod runner on): the operator pod passes its
real probes; the server's engine and router pods run at loopback pod addresses; answers come
through the router Service's local address, with prefix reuse; switching the router to the
`precise` policy rolls the router Deployment and its new pod rebuilds the engines' caches from
their KV events; an engine killed with SIGKILL is restarted (LeaderWorkerSet recreates its
group, or the StatefulSet's pod restarts) and the server is Ready again; deleting the server
stops every engine with SIGTERM (the launcher drains) and removes its pods.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest
import yaml

from tests.e2e.tms_harness import NOT_YET, POLL_SECONDS, REPO, condition
from tests.waiting import eventually
from tpuserve.cluster import Cluster

pytestmark = pytest.mark.e2e

CHART = REPO / "charts" / "tpuserve"
EXAMPLE = CHART / "examples" / "simulated.yaml"
OPERATOR_NAMESPACE = "tpuserve-system"
NAMESPACE = "default"
TIMEOUT_SECONDS = 180.0
T = TypeVar("T")


def wait(what: str, check: Callable[[], T], timeout_seconds: float = TIMEOUT_SECONDS) -> T:
    return eventually(
        check,
        what=what,
        timeout_seconds=timeout_seconds,
        interval_seconds=POLL_SECONDS * 2,
        ignore=NOT_YET,
    )


def get(cluster: Cluster, *args: str) -> Any:
    return yaml.safe_load(cluster.kubectl("get", *args, "-o", "yaml").stdout)


def ready(cluster: Cluster, name: str) -> bool:
    server = get(cluster, "tpumodelserver", name, "-n", NAMESPACE)
    return condition(server, "Ready").get("status") == "True"


def local_base_url(cluster: Cluster, name: str) -> str:
    """The server's local URL as `tpuserve cluster services` prints it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpuserve",
            "cluster",
            "services",
            "--run-dir",
            str(cluster.run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ},
    )
    rows = done.stdout.splitlines()
    line = next(row for row in rows if f"tpumodelserver {NAMESPACE}/{name}" in row)
    found = re.search(r"http://127\.96\.\d+\.\d+:\d+", line)
    assert found, line
    return found.group(0)


def pods(cluster: Cluster, selector: str) -> list[dict[str, Any]]:
    listing = get(cluster, "pods", "-n", NAMESPACE, "-l", selector)
    return list(listing.get("items") or [])


def read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?query={urllib.parse.quote(promql)}"
    result: list[dict[str, Any]] = json.loads(read(url))["data"]["result"]
    return result


def ask(client: openai.OpenAI, model: str, prompt: str) -> Any:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=8
    )


def test_readme_flow_answers_from_the_printed_endpoint(living_cluster: Cluster) -> None:
    cluster = living_cluster
    cluster.helm(
        "install", "tpuserve", str(CHART), "--namespace", OPERATOR_NAMESPACE,
        "--create-namespace", "--wait", "--timeout", "180s",
        "--set", "monitoring.scrapeInterval=2s", "--set", "monitoring.scrapeTimeout=2s",
    )  # fmt: skip
    (operator_pod,) = get(cluster, "pods", "-n", OPERATOR_NAMESPACE)["items"]
    assert operator_pod["status"]["podIP"].startswith("127.244.")
    assert condition(operator_pod, "Ready")["status"] == "True"  # its real probes passed

    manifest = yaml.safe_load(EXAMPLE.read_text())
    name = manifest["metadata"]["name"]
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLE))
    wait(f"{name} Ready", lambda: ready(cluster, name))
    engines = pods(cluster, f"app.kubernetes.io/instance={name},serving.tpuserve.dev/role=leader")
    assert len(engines) == manifest["spec"]["replicas"]
    for engine in engines:
        assert engine["status"]["podIP"].startswith("127.244.")
        assert engine["status"]["containerStatuses"][0]["state"].get("running")

    base_url = local_base_url(cluster, name)
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    model = get(cluster, "tpumodelserver", name, "-n", NAMESPACE)["status"]["servedName"]
    assert [m.id for m in client.models.list().data] == [model]
    prefix = "You are a careful assistant who answers in one sentence. " * 20
    first = ask(client, model, prefix + "What is a TPU?")
    assert first.choices[0].message.content
    second = ask(client, model, prefix + "What is a slice?")
    details = second.usage.prompt_tokens_details if second.usage else None
    assert details is not None
    assert details.cached_tokens, "no prefix reuse on the second request"

    # Prometheus scrapes what the chart's PodMonitors select, and evaluates its rules.
    assert cluster.prometheus_url is not None
    prometheus = cluster.prometheus_url

    def scraped_and_recorded() -> bool:
        queues = query(prometheus, f'sglang:num_queue_reqs{{namespace="{NAMESPACE}"}}')
        models = {(r["metric"].get("pod"), r["metric"].get("model")) for r in queues}
        requests = query(prometheus, f'model:sglang_requests:rate1m{{model_name="{model}"}}')
        return models == {(e["metadata"]["name"], model) for e in engines} and bool(requests)

    wait("Prometheus scraping the engines and recording rates", scraped_and_recorded)

    # KV events: the precise policy rebuilds each engine's cache from its KV events.
    cluster.kubectl(
        "patch", "tpumodelserver", name, "-n", NAMESPACE, "--type=merge",
        "-p", '{"spec": {"router": {"policy": "precise"}}}',
    )  # fmt: skip
    router_selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=router"
    metrics_url = base_url.rsplit(":", 1)[0] + ":9000/metrics"

    def precise_router_only() -> bool:
        routers = pods(cluster, router_selector)
        return len(routers) == 1 and 'policy="precise"' in read(metrics_url)

    wait("the router rolled to the precise policy", precise_router_only)

    def kv_events_counted() -> bool:
        ask(client, model, prefix + "What is HBM?")
        counts = re.findall(r"^tpuserve_router_kv_events_total\S* (\S+)$", read(metrics_url), re.M)
        return sum(float(c) for c in counts) > 0

    wait("the router counting the engines' KV events", kv_events_counted)
    third = ask(client, model, prefix + "What is ICI?")
    details = third.usage.prompt_tokens_details if third.usage else None
    assert details is not None
    assert details.cached_tokens

    # A killed engine comes back (its container restarts, or LWS recreates the group).
    victim = engines[0]
    pid = int(victim["status"]["containerStatuses"][0]["containerID"].rsplit("/", 1)[1])
    os.kill(pid, signal.SIGKILL)

    def restarted() -> bool:
        now = pods(cluster, f"statefulset.kubernetes.io/pod-name={victim['metadata']['name']}")
        return any(
            p["metadata"]["uid"] != victim["metadata"]["uid"]
            or p["status"]["containerStatuses"][0]["restartCount"] > 0
            for p in now
        )

    wait(f"{victim['metadata']['name']} restarted or recreated", restarted)
    wait(f"{name} Ready again", lambda: ready(cluster, name))
    assert ask(client, model, prefix + "Still there?").choices[0].message.content

    # Deleting the server stops the engines with SIGTERM: the launcher drains, then exits.
    logs = [
        cluster.run_dir / "pods" / NAMESPACE / e["metadata"]["name"] / "engine.log" for e in engines
    ]
    cluster.kubectl("delete", "tpumodelserver", name, "-n", NAMESPACE, "--wait=false")
    wait(f"{name}'s pods gone", lambda: not pods(cluster, f"app.kubernetes.io/instance={name}"))
    for log in logs:
        assert "received SIGTERM: draining" in Path(log).read_text(), log
    cluster.helm("uninstall", "tpuserve", "--namespace", OPERATOR_NAMESPACE, "--wait")
    wait(
        "the operator pod gone", lambda: not get(cluster, "pods", "-n", OPERATOR_NAMESPACE)["items"]
    )
