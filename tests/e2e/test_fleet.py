"""The README's local flow with pods that really run, and autoscaling on live metrics.

`tpuserve cluster up`, `helm install` (the operator runs as a pod), `kubectl apply -f
charts/tpuserve/examples/simulated.yaml`, and the official `openai` client gets answers from the
address `tpuserve cluster services` prints; the cluster's Prometheus scrapes what the chart's
monitors select.

One flow on the module's `living_cluster` (the pod runner on): the operator pod passes its
real probes; the server's engine and router pods run at loopback pod addresses; answers come
through the router Service's local address, with prefix reuse; switching the router to the
`precise` policy rolls the router Deployment and its new pod rebuilds the engines' caches from
their KV events; an engine killed with SIGKILL is restarted (LeaderWorkerSet recreates its
group, or the StatefulSet's pod restarts) and the server is Ready again; deleting the server
stops every engine with SIGTERM (the launcher drains) and removes its pods.

Prefill/decode disaggregation: the chart's disaggregated example with one prefill and one decode
replica gets both roles Ready in `status.roles`; the official client's answers, plain and
streamed, and a native `/generate` come through the router from prefill/decode pairs (its
`tpuserve_router_pd_requests_total{how="disaggregated"}` counts them); every query of the
Prefill-decode dashboard returns data from the cluster's Prometheus, and the TTFT/ITL rules split
by role see both engines; a decode-only args change rolls the decode role alone (a surge decode
group first) while the prefill pod keeps its uid and every request under load is answered;
deleting the server removes its pods.

Autoscaling: a server with `spec.autoscaling` (KV tokens in use per chip) under load from the
official client: the engines' series go from Prometheus through Prometheus Adapter to the HPA,
which raises `spec.replicas` through the scale subresource; the operator adds a slice, the
router finds it and sends it requests; when the load drops to a trickle the HPA lowers
`spec.replicas` after the stabilisation window and the operator removes the slice (the router
stops sending to its terminating leader, the engine drains). Not one request fails; the
timeline is printed (`-s`) and recorded in docs/operator.md.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml

from tests.e2e.fleet_harness import (
    EXAMPLE,
    NAMESPACE,
    OPERATOR_NAMESPACE,
    TIMEOUT_SECONDS,
    Load,
    ask,
    get,
    install_chart,
    local_base_url,
    pods,
    query,
    read,
    ready,
    wait,
)
from tests.e2e.tms_harness import condition
from tests.panel_queries import panel_queries
from tests.waiting import eventually
from tpuserve.cluster import Cluster

pytestmark = pytest.mark.e2e


def test_readme_flow_answers_from_the_printed_endpoint(living_cluster: Cluster) -> None:
    cluster = living_cluster
    install_chart(cluster)
    (operator_pod,) = get(cluster, "pods", "-n", OPERATOR_NAMESPACE)["items"]
    in_pod_network = cluster.network.pods
    assert ipaddress.ip_address(operator_pod["status"]["podIP"]) in in_pod_network
    assert condition(operator_pod, "Ready")["status"] == "True"  # its real probes passed

    manifest = yaml.safe_load(EXAMPLE.read_text())
    name = manifest["metadata"]["name"]
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLE))
    wait(f"{name} Ready", lambda: ready(cluster, name))
    engines = pods(cluster, f"app.kubernetes.io/instance={name},serving.tpuserve.dev/role=leader")
    assert len(engines) == manifest["spec"]["replicas"]
    for engine in engines:
        assert ipaddress.ip_address(engine["status"]["podIP"]) in in_pod_network
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
    init = int(victim["status"]["containerStatuses"][0]["containerID"].rsplit("/", 1)[1])
    (main,) = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    os.kill(int(main), signal.SIGKILL)  # the container's main process: the launcher

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


# ---- prefill/decode disaggregation ------------------------------------------------------------

PD_EXAMPLE = EXAMPLE.parent / "disaggregated-simulated.yaml"


def test_disaggregated_server_answers_through_the_router_as_pairs(living_cluster: Cluster) -> None:
    """The PD example with one prefill and one decode replica: both roles Ready in
    status.roles, and the official client's answers (plain and streamed) come from pairs."""
    cluster = living_cluster
    install_chart(cluster, verb="upgrade")
    manifest = yaml.safe_load(PD_EXAMPLE.read_text())
    name = manifest["metadata"]["name"]
    manifest["spec"]["disaggregation"]["decode"]["replicas"] = 1
    # Each role scales on its own metric; targets far above this test's load: read, never met.
    roles_scaled = {"prefill": ("ttft", "external"), "decode": ("queue", "pods")}
    for role, (metric, _) in roles_scaled.items():
        manifest["spec"]["disaggregation"][role]["autoscaling"] = {
            "minReplicas": 1, "maxReplicas": 2, "metric": metric, "target": 1000,
        }  # fmt: skip
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(manifest))
    wait(f"{name} Ready", lambda: ready(cluster, name))
    status = get(cluster, "tpumodelserver", name, "-n", NAMESPACE)["status"]
    roles = {r["role"]: (r["replicas"], r["readyReplicas"]) for r in status["roles"]}
    assert roles == {"prefill": (1, 1), "decode": (1, 1)}, status["roles"]
    leaders = pods(cluster, f"app.kubernetes.io/instance={name},serving.tpuserve.dev/role=leader")
    by_role = {p["metadata"]["labels"].get("serving.tpuserve.dev/pd-role") for p in leaders}
    assert by_role == {"prefill", "decode"}

    base_url = local_base_url(cluster, name)
    metrics_url = base_url.rsplit(":", 1)[0] + ":9000/metrics"

    def disaggregated() -> float:
        found = re.search(
            r'^tpuserve_router_pd_requests_total\{how="disaggregated"\} (\S+)$',
            read(metrics_url),
            re.M,
        )
        return float(found.group(1)) if found else 0.0

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    model = status["servedName"]
    # The router finds the pairs through its own watch: the first answer may wait for it.
    answer = wait("an answer through the router", lambda: ask(client, model, "What is a TPU?"))
    assert answer.choices[0].message.content
    before = disaggregated()
    assert before >= 1
    plain = ask(client, model, "What is a slice? " * 200)  # a long prompt: over any threshold
    assert plain.choices[0].message.content
    chunks = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is ICI? " * 200}],
        max_tokens=8,
        stream=True,
    )
    text, finish = "", None
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text
    assert finish is not None
    # SGLang's native API: the prefill's meta_info times its KV hand-off (the router's
    # tpuserve_router_pd_kv_transfer_seconds; the OpenAI routes do not report it).
    native = urllib.request.Request(
        f"{base_url}/generate",
        data=json.dumps(
            {"text": "What is HBM? " * 200, "sampling_params": {"max_new_tokens": 8}}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(native, timeout=60) as response:
        assert json.loads(response.read())["text"]
    assert disaggregated() == before + 3

    # The cluster's Prometheus: every query of the Prefill-decode dashboard returns data, and
    # the TTFT and ITL rules split by role see the prefill and the decode engine.
    assert cluster.prometheus_url is not None
    prometheus = cluster.prometheus_url
    empty = panel_queries(["tpuserve-pd"])
    for rule, role in (("ttft", "prefill"), ("ttft", "decode"), ("itl", "decode")):
        record = f"model_role:sglang_{rule}_seconds:p99_5m"
        empty[f"{record} {role}"] = f'{record}{{engine_type="{role}", model_name="{model}"}}'

    def every_query_has_data() -> bool:
        for key, expr in list(empty.items()):
            if query(prometheus, expr):
                del empty[key]
        return not empty

    eventually(
        every_query_has_data,
        what="data from every Prefill-decode panel query and the role rules",
        timeout_seconds=TIMEOUT_SECONDS,
        interval_seconds=1.0,
        context=lambda: f"still empty: {sorted(empty)}",
    )

    # Each role's HPA reads its own metric through the cluster's Prometheus Adapter: the
    # prefill engines' p90 TTFT (an External metric of the chart's rule) and the decode
    # leaders' queue (a Pods metric over the role's scale selector).
    if cluster.metrics_adapter:

        def current(role: str) -> object:
            hpa = get(cluster, "hpa", f"{name}-{role}", "-n", NAMESPACE)
            kind = roles_scaled[role][1]
            found = [m[kind]["current"] for m in hpa["status"].get("currentMetrics") or []]
            active = any(
                c["type"] == "ScalingActive" and c["status"] == "True"
                for c in hpa["status"].get("conditions") or []
            )
            return found[0] if found and active else None

        for role in roles_scaled:
            wait(f"the {role} role's HPA reading its metric", functools.partial(current, role))

    # A decode-only change rolls the decode role alone: its one group surges a new one first
    # (the pair surge, docs/pd.md "Rollouts"), the prefill pod is never restarted, and pairs
    # answer every request meanwhile.
    selector = f"app.kubernetes.io/instance={name},serving.tpuserve.dev/pd-role="
    prefill_uids = {p["metadata"]["uid"] for p in pods(cluster, selector + "prefill")}
    old_decodes = {p["metadata"]["uid"] for p in pods(cluster, selector + "decode")}
    decode_pods: set[str] = set()
    load = Load(base_url, model)
    load.run(streams=2, prompt_words=200, max_tokens=8)
    try:
        change = {"spec": {"disaggregation": {"decode": {"args": {"max-running-requests": 64}}}}}
        cluster.kubectl(
            "patch", "tpumodelserver", name, "-n", NAMESPACE, "--type=merge",
            "-p", json.dumps(change),
        )  # fmt: skip

        def decode_rolled() -> bool:
            server = get(cluster, "tpumodelserver", name, "-n", NAMESPACE)
            decodes = pods(cluster, selector + "decode")
            decode_pods.update(p["metadata"]["name"] for p in decodes)
            decode = next(r for r in server["status"]["roles"] if r["role"] == "decode")
            staying = [p for p in decodes if not p["metadata"].get("deletionTimestamp")]
            return (
                server["status"].get("observedGeneration") == server["metadata"]["generation"]
                and (decode["updatedReplicas"], decode["readyReplicas"]) == (1, 1)
                and [p["metadata"]["name"] for p in staying] == [f"{name}-d0-0"]
                and not old_decodes & {p["metadata"]["uid"] for p in staying}
            )

        wait("the decode role rolled (its surge group going)", decode_rolled)
    finally:
        load.halt()
    assert load.failed == [], load.failed
    assert load.ok > 0
    assert f"{name}-d1-0" in decode_pods  # the surge group
    assert {p["metadata"]["uid"] for p in pods(cluster, selector + "prefill")} == prefill_uids

    cluster.kubectl("delete", "tpumodelserver", name, "-n", NAMESPACE, "--wait=false")
    wait(f"{name}'s pods gone", lambda: not pods(cluster, f"app.kubernetes.io/instance={name}"))


# ---- autoscaling on live metrics ------------------------------------------------------------

AUTOSCALED = "autoscaled"
# KV tokens in use per chip; the v6e 2x4 slice has 8 chips, so 800 tokens per replica.
TOKENS_PER_CHIP_TARGET = 100
HEAVY_STREAMS = 6
HEAVY_PROMPT_WORDS = 1500
SCALE_TIMEOUT_SECONDS = 300.0


def test_autoscaling_acts_on_live_metrics_with_no_failed_request(living_cluster: Cluster) -> None:
    cluster = living_cluster
    if not cluster.metrics_adapter:
        pytest.skip("Prometheus Adapter was not built (scripts/build-control-plane.sh)")
    install_chart(cluster, verb="upgrade")
    server = {
        "apiVersion": "serving.tpuserve.dev/v1alpha1",
        "kind": "TPUModelServer",
        "metadata": {"name": AUTOSCALED},
        "spec": {
            "model": {"source": "hf://Qwen/Qwen3-8B", "contextLength": 8192},
            "tpu": {"generation": "v6e", "topology": "2x4"},
            "engine": {"type": "simulated"},
            "router": {"replicas": 1},
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "metric": "tokensInFlight",
                "target": TOKENS_PER_CHIP_TARGET,
                "scaleDownStabilizationSeconds": 20,
            },
        },
    }
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(server))
    wait(f"{AUTOSCALED} Ready", lambda: ready(cluster, AUTOSCALED))
    base_url = local_base_url(cluster, AUTOSCALED)
    model = get(cluster, "tpumodelserver", AUTOSCALED, "-n", NAMESPACE)["status"]["servedName"]
    metrics_url = base_url.rsplit(":", 1)[0] + ":9000/metrics"
    timeline: dict[str, float] = {}
    load = Load(base_url, model)
    t0 = time.monotonic()
    try:
        load.run(HEAVY_STREAMS, HEAVY_PROMPT_WORDS, max_tokens=400)
        timeline["load start"] = 0.0

        def replicas() -> int:
            spec = get(cluster, "tpumodelserver", AUTOSCALED, "-n", NAMESPACE)["spec"]
            return int(spec.get("replicas", 0))

        wait("the HPA raising spec.replicas", lambda: replicas() == 2, SCALE_TIMEOUT_SECONDS)
        timeline["scale-up decision (spec.replicas 2)"] = time.monotonic() - t0

        def two_ready() -> bool:
            status = get(cluster, "tpumodelserver", AUTOSCALED, "-n", NAMESPACE)["status"]
            return int(status.get("readyReplicas", 0)) == 2

        wait("the new slice Ready", two_ready, SCALE_TIMEOUT_SECONDS)
        timeline["new group Ready"] = time.monotonic() - t0
        (new_leader,) = pods(
            cluster,
            f"app.kubernetes.io/instance={AUTOSCALED},serving.tpuserve.dev/role=leader,"
            "serving.tpuserve.dev/replica=1",
        )
        new_worker = f"http://{new_leader['status']['podIP']}:30000"

        def served_by_new_group() -> float:
            worker = f'worker="{new_worker}"'
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in read(metrics_url).splitlines()
                if line.startswith("tpuserve_router_requests_total{") and worker in line
            )

        wait("the router sending requests to the new slice", lambda: served_by_new_group() > 0)
        timeline["first request served by the new group"] = time.monotonic() - t0

        # Light steady load: far below the target, so the fleet scales back down while
        # requests keep flowing through the group being removed.
        load.run(1, 20, max_tokens=16)
        timeline["heavy load stops (light load goes on)"] = time.monotonic() - t0
        wait("the HPA lowering spec.replicas", lambda: replicas() == 1, SCALE_TIMEOUT_SECONDS)
        timeline["scale-down decision (spec.replicas 1)"] = time.monotonic() - t0
        wait(
            "the removed slice's pods gone",
            lambda: (
                len(
                    pods(
                        cluster,
                        f"app.kubernetes.io/instance={AUTOSCALED},serving.tpuserve.dev/role=leader",
                    )
                )
                == 1
            ),
            SCALE_TIMEOUT_SECONDS,
        )
        timeline["removed group gone"] = time.monotonic() - t0
        settled_ok = load.ok
        wait("requests still answered after the scale-down", lambda: load.ok > settled_ok + 3)
    finally:
        load.halt()
        report = ", ".join(f"{k} {v:.1f} s" for k, v in timeline.items())
        print(f"\nautoscaling timeline: {report}; {load.ok} requests ok, {len(load.failed)} failed")
    assert load.failed == [], load.failed[:5]
    assert load.ok > 0
    cluster.kubectl("delete", "tpumodelserver", AUTOSCALED, "-n", NAMESPACE, "--wait=false")
    wait(
        f"{AUTOSCALED}'s pods gone",
        lambda: not pods(cluster, f"app.kubernetes.io/instance={AUTOSCALED}"),
    )
