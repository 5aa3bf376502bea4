"""A hundred models behind one TPUGateway on the local control plane (issue 70, item 3).

    .venv/bin/python bench/gateway_hundred.py [--models 100] [--stagger 3] [--requests 24]
        [--rate 1.5] [--idle 30] [--flood-clients N --max-in-flight-per-model M]
        [--json bench/gateway_results/hundred.json]

A real apiserver, scheduler and kwok nodes; pods run as local processes (engine twins of a
simulated Qwen3-8B on v6e `2x4`, the gateway's `tpuserve router`); `tpuserve operator` runs as
a local process. `--models` TPUModelServers at zero (`autoscaling.minReplicas: 0`, no router of
their own, `scaleToZero.idleSeconds` `--idle`) and one TPUGateway selecting them. Then each
model gets one session, model i starting at i x `--stagger` s: `--requests` chat completions
at `--rate` per second (open loop, the official `openai` client), so most models are at zero
at any time and each session's first request wakes its server from zero.

Reported: requests and failures (any answer but 200), the cold start through the gateway
(each session's first request, sent at zero: p50 / p99 / max), the warm requests' latency,
and the gateway's router process: resident memory at rest with every model configured, its
peak, and its CPU time over the run per request and per model. Twins start in seconds and
compile nothing, so the cold start here is the platform's part (demand Lease, operator, pod
start, readiness), not a TPU's weights and compilation (minutes; docs/operator.md).

With `--flood-clients N`, a process of its own floods `model-000` with N closed-loop clients
for the whole run (each 429 waited out for its Retry-After); the others' warm latencies are
then the figure to hold against a run without it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import openai
import yaml

from tpuserve.cluster import Cluster, NodePool
from tpuserve.cluster.pods.addresses import NETWORKS, Network
from tpuserve.cluster.ports import free_port
from tpuserve.cluster.process import ManagedProcess, wait_for
from tpuserve_operator import labels

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "default"
GATEWAY = "models"


def manifests(models: int, idle: int, per_model: int = 1024) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "apiVersion": labels.API_VERSION,
            "kind": labels.KIND,
            "metadata": {"name": f"m{i:03d}", "labels": {"tier": "bench"}},
            "spec": {
                "model": {"source": "hf://Qwen/Qwen3-8B", "servedName": f"model-{i:03d}"},
                "tpu": {"generation": "v6e", "topology": "2x4"},
                "engine": {"type": "simulated"},
                "replicas": 0,
                "router": {"enabled": False},
                "autoscaling": {
                    "minReplicas": 0,
                    "maxReplicas": 1,
                    "scaleToZero": {"idleSeconds": idle},
                },
            },
        }
        for i in range(models)
    ]
    out.append(
        {
            "apiVersion": labels.API_VERSION,
            "kind": labels.GATEWAY_KIND,
            "metadata": {"name": GATEWAY},
            "spec": {
                "serverSelector": {"matchLabels": {"tier": "bench"}},
                "replicas": 1,
                "maxInFlightPerModel": per_model,
                "hold": {"maxRequests": 32, "maxSeconds": 600},
            },
        }
    )
    return out


def get(cluster: Cluster, *args: str) -> Any:
    return yaml.safe_load(cluster.kubectl("get", *args, "-n", NAMESPACE, "-o", "yaml").stdout)


def gateway_pid() -> int:
    """The gateway's router process (the pod runner's child; of the processes whose command
    line names its flags, the one holding most memory: the interpreter, not a wrapper)."""
    found: list[tuple[float, int]] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"--hold-models-only" in cmdline and b"router" in cmdline:
                found.append((memory_mib(int(proc.name), "VmRSS"), int(proc.name)))
        except (OSError, RuntimeError):
            continue
    if not found:
        raise RuntimeError("no gateway router process")
    return max(found)[1]


def memory_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field}")


def cpu_seconds(pid: int) -> float:
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


FLOOD_MODEL = "model-000"


def _flood(base_url: str, clients: int, stop: Any, counts: Any) -> None:
    """A flood's process: ``clients`` closed-loop threads on `FLOOD_MODEL`; a 429 is waited
    out for its Retry-After, as the openai SDK's retries do. counts: 200, 429, other."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)

    def loop() -> None:
        while not stop.is_set():
            slot, wait = 0, 0.0
            try:
                client.chat.completions.create(
                    model=FLOOD_MODEL,
                    messages=[{"role": "user", "content": "flood: what is a TPU?"}],
                    max_tokens=64,
                    timeout=600,
                )
            except openai.APIStatusError as err:
                slot = 1 if err.status_code == 429 else 2
                wait = float(err.response.headers.get("retry-after") or 0)
            except Exception:
                slot = 2
            with counts.get_lock():
                counts[slot] += 1
            stop.wait(wait)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Sessions:
    """Each model's session: its requests at fixed times, each on a thread of its own."""

    def __init__(self, base_url: str) -> None:
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        self.results: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def one(self, model: str, index: int, at: float) -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        started = time.monotonic()
        status, reason = 200, ""
        try:
            answer = self.client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"{model} {index}: what is a TPU?"}],
                max_tokens=8,
                timeout=600,
            )
            if not (answer.choices and answer.choices[0].message.content):
                status, reason = 0, "empty answer"
        except openai.APIStatusError as err:
            status, reason = err.status_code, str(err)[:200]
        except Exception as err:  # every failure is an outcome
            status, reason = 0, f"{type(err).__name__}: {err}"[:200]
        row = {
            "model": model,
            "index": index,
            "status": status,
            "started": started,
            "ended": time.monotonic(),
            "seconds": time.monotonic() - started,
            "reason": reason,
        }
        with self.lock:
            self.results.append(row)

    def schedule(self, model: str, start: float, requests: int, rate: float) -> None:
        for index in range(requests):
            at = start + index / rate
            thread = threading.Thread(target=self.one, args=(model, index, at), daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(900)


def run(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    documents = "---\n".join(
        yaml.safe_dump(m) for m in manifests(args.models, args.idle, args.max_in_flight_per_model)
    )
    created = time.monotonic()
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=documents)

    def listed() -> bool:
        status = get(cluster, "tpugateway", GATEWAY).get("status") or {}
        return bool(len(status.get("models") or []) == args.models)

    wait_for("the gateway listing every model", listed, 600)
    selector = f"{labels.GATEWAY}={GATEWAY}"

    def gateway_ip() -> str | None:
        for pod in get(cluster, "pods", "-l", selector).get("items") or []:
            ready = [c for c in pod["status"].get("conditions") or [] if c["type"] == "Ready"]
            if ready and ready[0]["status"] == "True":
                return str(pod["status"]["podIP"])
        return None

    def serving_every_model() -> bool:
        items = get(cluster, "pods", "-l", selector).get("items") or []
        args_ = " ".join(a for p in items for a in p["spec"]["containers"][0]["args"])
        return gateway_ip() is not None and f"model-{args.models - 1:03d}" in args_

    wait_for("the gateway Ready with every model", serving_every_model, 600)

    def valid() -> bool:
        servers = get(cluster, "tpumodelservers").get("items") or []
        return bool(
            sum(
                1
                for s in servers
                for c in (s.get("status") or {}).get("conditions") or []
                if c["type"] == "Valid" and c["status"] == "True"
            )
            == args.models
        )

    wait_for("every server valid behind the gateway", valid, 600)
    setup_seconds = time.monotonic() - created
    ip = gateway_ip()
    base_url = f"http://{ip}:8000"
    wait_for(
        "the gateway's /readiness",
        lambda: urllib.request.urlopen(base_url + "/readiness", timeout=5).status == 200,
        120,
    )
    time.sleep(5)  # settle
    pid = gateway_pid()
    rest_rss = memory_mib(pid, "VmRSS")
    cpu_before = cpu_seconds(pid)

    flood = None
    if args.flood_clients:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        stop, counts = context.Event(), context.Array("i", 3)
        flood = context.Process(
            target=_flood, args=(base_url, args.flood_clients, stop, counts), daemon=True
        )
        flood.start()
    sessions = Sessions(base_url)
    t0 = time.monotonic() + 1
    for i in range(args.models):
        sessions.schedule(f"model-{i:03d}", t0 + i * args.stagger, args.requests, args.rate)
    sessions.join()
    duration = time.monotonic() - t0
    flooded = None
    if flood is not None:
        stop.set()
        flood.join(700)
        flooded = {"clients": args.flood_clients, "200": counts[0], "429": counts[1]}
        flooded["other"] = counts[2]
    cpu = cpu_seconds(pid) - cpu_before
    peak = memory_mib(pid, "VmHWM")
    end_rss = memory_mib(pid, "VmRSS")

    rows = sessions.results
    failed = [r for r in rows if r["status"] != 200]
    cold = [r["seconds"] for r in rows if r["index"] == 0 and r["status"] == 200]
    # warm: sent after its model's first answer (its server up), not held
    up = {r["model"]: r["ended"] for r in rows if r["index"] == 0}
    warm = [
        r["seconds"]
        for r in rows
        if r["status"] == 200
        and r["started"] > up.get(r["model"], float("inf"))
        and not (flood is not None and r["model"] == FLOOD_MODEL)
    ]
    return {
        "models": args.models,
        "stagger_seconds": args.stagger,
        "requests_per_session": args.requests,
        "rate_per_model": args.rate,
        "idle_seconds": args.idle,
        "setup_seconds": round(setup_seconds, 1),
        "run_seconds": round(duration, 1),
        "requests": len(rows),
        "failed": len(failed),
        "failures": [f"{r['model']} #{r['index']}: {r['status']} {r['reason']}" for r in failed][
            :20
        ],
        "cold_start_seconds": {
            "p50": round(statistics.median(cold), 2) if cold else None,
            "p99": round(percentile(cold, 0.99), 2) if cold else None,
            "max": round(max(cold), 2) if cold else None,
            "count": len(cold),
        },
        "warm_seconds": {
            "p50": round(statistics.median(warm), 3) if warm else None,
            "p99": round(percentile(warm, 0.99), 3) if warm else None,
            "count": len(warm),
        },
        "flood": flooded,
        "gateway": {
            "rss_at_rest_mib": round(rest_rss, 1),
            "rss_after_mib": round(end_rss, 1),
            "peak_rss_mib": round(peak, 1),
            "cpu_seconds": round(cpu, 2),
            "cpu_ms_per_request": round(1000 * cpu / max(1, len(rows)), 2),
            "cpu_percent_of_a_core": round(100 * cpu / duration, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--stagger", type=float, default=3.0)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--rate", type=float, default=1.5)
    parser.add_argument("--idle", type=int, default=30)
    parser.add_argument(
        "--flood-clients",
        type=int,
        default=0,
        help=f"closed-loop clients flooding {FLOOD_MODEL} for the whole run (its warm "
        "latencies are then left out of the others')",
    )
    parser.add_argument("--max-in-flight-per-model", type=int, default=1024)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    pools = [
        NodePool("bench-cpu", 2, "e2-standard-8", cpu="96", memory="384Gi"),
        NodePool.tpu("bench-v6e", "v6e", "2x4", nodes=40),
    ]
    with (
        tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp,
        Cluster(
            Path(tmp) / "cp",
            pools=pools,
            run_pods=True,
            prometheus=False,
            metrics_adapter=False,
            network=Network(NETWORKS - 1),
        ) as cluster,
    ):
        cluster.kubectl("apply", "--server-side", "-f", str(REPO / "charts/tpuserve/crds"))
        for crd in ("tpumodelservers", "tpugateways"):
            cluster.kubectl(
                "wait", "--for=condition=Established", f"crd/{crd}.serving.tpuserve.dev"
            )
        liveness = free_port()
        operator = ManagedProcess.spawn(
            "operator",
            [
                sys.executable, "-m", "tpuserve", "operator", "--log-level", "warning",
                "--kubeconfig", str(cluster.kubeconfig), "--standalone",
                "--listen-address", "127.0.0.1", "--metrics-port", str(free_port()),
                "--liveness-port", str(liveness), "--skip-cold-start-reports",
            ],
            Path(tmp) / "operator.log",
        )  # fmt: skip
        try:
            wait_for(
                "the operator",
                lambda: (
                    urllib.request.urlopen(f"http://127.0.0.1:{liveness}/healthz", timeout=2).status
                    == 200
                ),
                60,
                process=operator,
            )
            results = run(cluster, args)
        finally:
            operator.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
