"""Operator benchmark on a local control plane (real apiserver, scheduler, kwok nodes).

    .venv/bin/python bench/operator_reconcile.py [--latency-servers 100] [--burst-servers 500]
        [--workload auto|leaderworkerset|statefulset] [--json bench/results/operator.json]

Measures, with `tpuserve operator` run as a local process:

1. latency: TPUModelServers created one at a time; seconds from the create call until every
   child the operator renders exists (polled every 20 ms): p50 / p99 / max;
2. burst: N servers created at once (8 client threads); seconds until every one carries a
   `Progressing` condition, and until every one is `Ready`;
3. the operator's peak resident memory (VmHWM) after the burst.

Servers use the simulated engine (one host, CPU nodes), so nothing needs TPU capacity; the
control plane gets a CPU pool large enough for every engine and router pod. Numbers depend on
the machine: the control plane, kwok and the operator share its cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tpuserve.cluster import Cluster, NodePool, kube
from tpuserve.cluster.ports import free_port
from tpuserve.cluster.process import ManagedProcess, wait_for
from tpuserve_operator import labels
from tpuserve_operator.render import RenderConfig, build_children

REPO = Path(__file__).resolve().parents[1]


def server(name: str) -> dict[str, Any]:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "hf://Qwen/Qwen3-8B"},
            "tpu": {"generation": "v6e", "topology": "2x4"},
            "replicas": 1,
            "engine": {"type": "simulated"},
        },
    }


def expected_children(namespace: str, lws: bool) -> set[tuple[str, str]]:
    spec = server("x")["spec"]
    rendered = build_children(
        {"name": "x", "namespace": namespace}, spec, RenderConfig(leaderworkerset=lws)
    )
    return {(c["kind"], c["metadata"]["name"]) for c in rendered}


class ChildWatcher:
    """Watches every child kind in a namespace and remembers when each object first appeared
    (watch events, not polling, so measuring adds no load and no polling granularity)."""

    def __init__(self, api: Any, namespace: str, lws: bool) -> None:
        client = kube.client()
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        rbac, policy = client.RbacAuthorizationV1Api(api), client.PolicyV1Api(api)
        self._listers: list[tuple[str, Any]] = [
            ("Service", core.list_namespaced_service),
            ("ConfigMap", core.list_namespaced_config_map),
            ("ServiceAccount", core.list_namespaced_service_account),
            ("Deployment", apps.list_namespaced_deployment),
            ("StatefulSet", apps.list_namespaced_stateful_set),
            ("Role", rbac.list_namespaced_role),
            ("RoleBinding", rbac.list_namespaced_role_binding),
            ("PodDisruptionBudget", policy.list_namespaced_pod_disruption_budget),
        ]
        if lws:
            custom = client.CustomObjectsApi(api)

            def list_lws(namespace: str, **kw: Any) -> Any:
                return custom.list_namespaced_custom_object(
                    "leaderworkerset.x-k8s.io", "v1", namespace, "leaderworkersets", **kw
                )

            self._listers.append(("LeaderWorkerSet", list_lws))
        self.namespace = namespace
        self.seen: dict[tuple[str, str], float] = {}
        self._changed = threading.Condition()
        self._watches: list[Any] = []  # kubernetes.watch.Watch
        self._threads: list[threading.Thread] = []
        self._stopping = False

    def start(self) -> None:
        for kind, lister in self._listers:
            stream = kube.watch().Watch()
            self._watches.append(stream)
            thread = threading.Thread(target=self._follow, args=(kind, lister, stream), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _follow(self, kind: str, lister: Any, stream: Any) -> None:
        selector = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
        try:
            for event in stream.stream(lister, self.namespace, label_selector=selector):
                obj = event["object"]
                name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
                with self._changed:
                    self.seen.setdefault((kind, name), time.perf_counter())
                    self._changed.notify_all()
        except Exception:  # the stream is cut when the benchmark stops it
            if not self._stopping:
                raise

    def wait_all(self, wanted: set[tuple[str, str]], timeout_seconds: float) -> float:
        """The time the last of `wanted` appeared."""
        deadline = time.monotonic() + timeout_seconds
        with self._changed:
            while not wanted <= self.seen.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(wanted - self.seen.keys())
                    raise RuntimeError(f"children missing after {timeout_seconds} s: {missing}")
                self._changed.wait(left)
            return max(self.seen[w] for w in wanted)

    def stop(self) -> None:
        self._stopping = True
        for stream in self._watches:
            stream.stop()


def create(api: Any, namespace: str, body: dict[str, Any]) -> None:
    kube.client().CustomObjectsApi(api).create_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, labels.PLURAL, body
    )


def list_servers(api: Any, namespace: str) -> list[dict[str, Any]]:
    listing = (
        kube.client()
        .CustomObjectsApi(api)
        .list_namespaced_custom_object(labels.GROUP, labels.VERSION, namespace, labels.PLURAL)
    )
    items: list[dict[str, Any]] = listing["items"]
    return items


def has_condition(body: dict[str, Any], type_: str, status: str | None = None) -> bool:
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and (status is None or c.get("status") == status):
            return True
    return False


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-servers", type=int, default=100)
    parser.add_argument("--burst-servers", type=int, default=500)
    parser.add_argument(
        "--workload", choices=("auto", "leaderworkerset", "statefulset"), default="auto"
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the results here.")
    args = parser.parse_args(argv)

    pods_needed = 2 * (args.latency_servers + args.burst_servers)
    cpu_nodes = max(2, -(-pods_needed // 100))
    pools = [NodePool("bench-cpu", cpu_nodes, "e2-standard-8", cpu="96", memory="384Gi")]
    with (
        tempfile.TemporaryDirectory(prefix="operator-bench-") as tmp,
        Cluster(Path(tmp) / "cp", pools=pools) as cluster,
    ):
        lws = args.workload == "leaderworkerset" or (
            args.workload == "auto" and cluster.lws_enabled
        )
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "charts/tpuserve/crds"))
        cluster.kubectl(
            "wait", "--for=condition=Established", "crd/tpumodelservers.serving.tpuserve.dev"
        )
        liveness = free_port()
        operator = ManagedProcess.spawn(
            "operator",
            [
                sys.executable,
                "-m",
                "tpuserve",
                "operator",
                "--log-level",
                "warning",
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--standalone",
                "--listen-address",
                "127.0.0.1",
                "--metrics-port",
                str(free_port()),
                "--liveness-port",
                str(liveness),
                "--workload",
                args.workload,
            ],
            Path(tmp) / "operator.log",
        )
        try:
            wait_for(
                "the operator",
                lambda: _http_ok(f"http://127.0.0.1:{liveness}/healthz"),
                60,
                process=operator,
            )
            api = cluster.api_client()
            api.configuration.connection_pool_maxsize = 16
            results = run(cluster, api, operator, args, lws)
        finally:
            operator.stop()
    print_table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def run(
    cluster: Cluster,
    api: Any,
    operator: ManagedProcess,
    args: argparse.Namespace,
    lws: bool,
) -> dict[str, Any]:
    core = kube.client().CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "bench-latency"}})
    core.create_namespace({"metadata": {"name": "bench-burst"}})
    wanted = expected_children("bench-latency", lws)
    watcher = ChildWatcher(api, "bench-latency", lws)
    watcher.start()
    latencies: list[float] = []
    try:
        for i in range(args.latency_servers):
            name = f"lat-{i}"
            want = {(k, n.replace("x", name, 1)) for k, n in wanted}
            start = time.perf_counter()
            create(api, "bench-latency", server(name))
            latencies.append(watcher.wait_all(want, 60) - start)
    finally:
        watcher.stop()

    names = [f"burst-{i}" for i in range(args.burst_servers)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: create(api, "bench-burst", server(n)), names))
    created_seconds = time.perf_counter() - start
    progressing_seconds = ready_seconds = None
    while time.perf_counter() - start < 600:
        items = list_servers(api, "bench-burst")
        if progressing_seconds is None and sum(
            has_condition(b, "Progressing") for b in items
        ) == len(names):
            progressing_seconds = time.perf_counter() - start
        if sum(has_condition(b, "Ready", "True") for b in items) == len(names):
            ready_seconds = time.perf_counter() - start
            break
        time.sleep(0.5)
    return {
        "workload": "LeaderWorkerSet" if lws else "StatefulSet",
        "children_per_server": len(wanted),
        "latency_servers": args.latency_servers,
        "children_exist_seconds": {
            "p50": statistics.median(latencies),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies),
        },
        "burst_servers": args.burst_servers,
        "burst_create_calls_seconds": created_seconds,
        "burst_all_progressing_seconds": progressing_seconds,
        "burst_all_ready_seconds": ready_seconds,
        "operator_peak_rss_mib": peak_rss_mib(operator.pid),
        "cores": len(__import__("os").sched_getaffinity(0)),
    }


def print_table(r: dict[str, Any]) -> None:
    lat = r["children_exist_seconds"]
    print(
        f"workload: {r['workload']}, {r['children_per_server']} children/server, {r['cores']} cores"
    )
    print(f"CR created -> all children exist ({r['latency_servers']} CRs, one at a time)")
    p50, p99, top = (lat[k] * 1000 for k in ("p50", "p99", "max"))
    print(f"  p50 {p50:8.1f} ms   p99 {p99:8.1f} ms   max {top:8.1f} ms")
    print(f"{r['burst_servers']} CRs at once")
    print(f"  create calls done        {r['burst_create_calls_seconds']:8.1f} s")
    print(f"  all Progressing          {_s(r['burst_all_progressing_seconds'])}")
    print(f"  all Ready                {_s(r['burst_all_ready_seconds'])}")
    print(f"operator peak RSS          {r['operator_peak_rss_mib']:8.1f} MiB")


def _s(value: float | None) -> str:
    return "   (not reached)" if value is None else f"{value:8.1f} s"


if __name__ == "__main__":
    raise SystemExit(main())
