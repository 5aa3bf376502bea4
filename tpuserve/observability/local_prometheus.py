"""A real Prometheus on loopback for a local fleet (`tpuserve up --prometheus`) and the tests.

`start(targets, ...)` writes a configuration and runs the `prometheus` binary (Debian's, from
PATH or the tool cache) bound to 127.0.0.1, with tpuserve's recording rules and alerts
(`rules.py`) plus the chart's price constants (`price_group`, from the chart's values), and a
1 s scrape and evaluation interval so rates over 1-minute windows fill in seconds.

For a local fleet, `fleet_targets` labels every engine twin as the chart's PodMonitor labels a
model-server leader (`namespace`, `pod`, `model`, `tpu_generation`, `tpu_topology`), labels the
router alike, and `ReplicaExporter` serves the fleet's `tpuserve_replica_info` /
`tpuserve_replica_tpu_chips` with the operator's own collector (`tpuserve_operator.metrics`),
from each engine's `/get_server_info` (its TPU generation, topology and chips): what the
operator exports for the pods it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sglang_tpu.metric_names import RESTORE_SGLANG_COLON, PrometheusRelabel
from tpuserve.observability import rules
from tpuserve.subprocesses import stop_processes

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_VALUES = REPO_ROOT / "charts" / "tpuserve" / "values.yaml"
SCRAPE_INTERVAL = "1s"
START_TIMEOUT_SECONDS = 60.0
LOCAL_NAMESPACE = "local"
# Job names as the chart's monitors make them (PodMonitor `<namespace>/<name>`); dashboards and
# alerts match them with `job=~".*model-server"` and the like.
MODEL_SERVER_JOB = "tpuserve-model-server"
ROUTER_JOB = "tpuserve-router"
REPLICAS_JOB = "tpuserve-replicas"
OPERATOR_JOB = "tpuserve-operator"
# A model server's escaped `sglang_` names get their colon back (see the rule's comment).
JOB_METRIC_RELABELINGS: Mapping[str, list[PrometheusRelabel]] = {
    MODEL_SERVER_JOB: [RESTORE_SGLANG_COLON]
}


def prometheus_argv(binary: Path, root: Path, port: int) -> list[str]:
    """Prometheus on 127.0.0.1:`port` with `root`/prometheus.yml, its data under `root`/data."""
    return [
        str(binary),
        f"--config.file={root / 'prometheus.yml'}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
    ]


class PrometheusError(Exception):
    """Prometheus could not be configured or started (the message says why)."""


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One `/metrics` URL to scrape, with the target labels a Kubernetes monitor would add."""

    job: str
    url: str  # http://127.0.0.1:PORT[/path]; the path defaults to /metrics
    labels: Mapping[str, str] = field(default_factory=dict)
    honor_labels: bool = False  # keep the exporter's own namespace/pod (the operator's series)


def parse_target(text: str) -> ScrapeTarget:
    """`JOB=URL` (the `--prometheus-target` flag) as a target; ValueError names what is wrong."""
    job, sep, url = text.partition("=")
    if not sep or not job or not url.startswith("http://"):
        raise ValueError(
            f"--prometheus-target {text!r} is not allowed; allowed: JOB=http://HOST:PORT/PATH, "
            "e.g. tpu-device-plugin=http://127.0.0.1:2112/metrics"
        )
    return ScrapeTarget(job, url)


def price_group(pricing: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The `tpuserve.prices` group as the chart renders it from `values.pricing`
    (`_helpers.tpl`, `tpuserve.ruleGroups`; a test checks the two agree)."""
    return {
        "name": "tpuserve.prices",
        "rules": [
            {
                "record": "tpuserve:tpu_chip_hour_price_usd",
                "expr": f"vector({float(p['usdPerChipHour'])!r})",
                "labels": {"tpu_generation": p["generation"], "pricing": p["pricing"]},
            }
            for p in pricing
        ],
    }


def rule_file(values_path: Path = CHART_VALUES) -> dict[str, Any]:
    """tpuserve's rule groups plus the price constants of the chart's values."""
    try:
        values = yaml.safe_load(values_path.read_text())
    except OSError as err:
        raise PrometheusError(f"cannot read the chart's prices from {values_path}: {err}") from err
    groups = [g.to_group() for g in rules.groups()]
    return {"groups": [*groups, price_group(values.get("pricing") or [])]}


def config(targets: Iterable[ScrapeTarget], interval: str = SCRAPE_INTERVAL) -> dict[str, Any]:
    """A prometheus.yml scraping `targets` (one job per job name, one static config each)."""
    jobs: dict[str, dict[str, Any]] = {}
    for target in targets:
        scheme, _, rest = target.url.partition("://")
        address, slash, path = rest.partition("/")
        metrics_path = "/" + path if slash else "/metrics"
        job = jobs.setdefault(
            f"{target.job}{metrics_path}",
            {
                "job_name": target.job,
                "scheme": scheme,
                "metrics_path": metrics_path,
                "honor_labels": target.honor_labels,
                "static_configs": [],
            },
        )
        if target.job in JOB_METRIC_RELABELINGS:
            job["metric_relabel_configs"] = JOB_METRIC_RELABELINGS[target.job]
        job["static_configs"].append({"targets": [address], "labels": dict(target.labels)})
    names = [j["job_name"] for j in jobs.values()]
    if len(names) != len(set(names)):
        raise PrometheusError(f"each job needs one metrics path; got {sorted(jobs)}")
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": ["rules.yaml"],
        "scrape_configs": list(jobs.values()),
    }


def find_prometheus() -> Path:
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    from tpuserve.cluster.toolchain import Toolchain, ToolchainMissing

    try:
        return Toolchain.discover().tool("prometheus")
    except ToolchainMissing as err:
        raise PrometheusError(
            f"{err} (Debian: `apt-get install prometheus`; `make test` installs it)"
        ) from None


@dataclass
class LocalPrometheus:
    """A running Prometheus; `stop()` ends it and removes its data."""

    url: str
    process: asyncio.subprocess.Process
    directory: tempfile.TemporaryDirectory[str]
    exporter: ReplicaExporter | None = None

    async def stop(self) -> None:
        await stop_processes([self.process])
        if self.exporter is not None:
            await self.exporter.stop()
        self.directory.cleanup()


async def start(
    targets: Sequence[ScrapeTarget],
    port: int,
    *,
    values_path: Path = CHART_VALUES,
    interval: str = SCRAPE_INTERVAL,
) -> LocalPrometheus:
    """Run Prometheus on 127.0.0.1:`port` scraping `targets`; returns once it is ready."""
    import aiohttp

    binary = find_prometheus()
    directory = tempfile.TemporaryDirectory(prefix="tpuserve-prometheus-")
    root = Path(directory.name)
    (root / "prometheus.yml").write_text(yaml.safe_dump(config(targets, interval)))
    (root / "rules.yaml").write_text(yaml.safe_dump(rule_file(values_path), sort_keys=False))
    log_path = root / "prometheus.log"
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            *prometheus_argv(binary, root, port),
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # Ctrl-C reaches `tpuserve up`, which stops it in order
        )
    url = f"http://127.0.0.1:{port}"
    prometheus = LocalPrometheus(url, process, directory)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    async with aiohttp.ClientSession() as session:
        while True:
            if process.returncode is not None:
                text = log_path.read_text(errors="replace")[-2000:]
                directory.cleanup()
                raise PrometheusError(f"prometheus exited ({process.returncode}):\n{text}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url + "/-/ready") as response:
                    if response.status == 200:
                        return prometheus
            if time.monotonic() > deadline:
                await prometheus.stop()
                raise PrometheusError(f"prometheus at {url} not ready in {START_TIMEOUT_SECONDS} s")
            await asyncio.sleep(0.1)


# ====================================================================== a local fleet


@dataclass(frozen=True, slots=True)
class FleetEngine:
    """An engine twin of the local fleet and the pod name it stands for."""

    url: str
    pod: str
    model_name: str
    tpu_generation: str
    tpu_topology: str
    chips: int


async def describe_engines(urls: Sequence[str]) -> list[FleetEngine]:
    """Ask every engine what it serves on which slice (`/get_server_info`)."""
    import aiohttp

    engines = []
    async with aiohttp.ClientSession() as session:
        for i, url in enumerate(urls):
            async with session.get(url + "/get_server_info") as response:
                info = await response.json()
            slice_ = info.get("tpuserve") or {}
            if not slice_.get("tpu"):
                raise PrometheusError(f"{url}/get_server_info names no TPU slice (tpuserve.tpu)")
            engines.append(
                FleetEngine(
                    url=url,
                    pod=f"engine-{i}",
                    model_name=str(info.get("served_model_name") or info.get("model_path")),
                    tpu_generation=str(slice_["tpu"]),
                    tpu_topology=str(slice_["topology"]),
                    chips=int(slice_["chips"]),
                )
            )
    return engines


def engine_targets(engines: Sequence[FleetEngine]) -> list[ScrapeTarget]:
    """Engines, labelled as the chart's PodMonitor labels a model-server leader's series."""
    return [
        ScrapeTarget(
            MODEL_SERVER_JOB,
            engine.url + "/metrics",
            {
                "namespace": LOCAL_NAMESPACE,
                "pod": engine.pod,
                "model": engine.model_name,
                "tpu_generation": engine.tpu_generation,
                "tpu_topology": engine.tpu_topology,
            },
        )
        for engine in engines
    ]


def fleet_targets(engines: Sequence[FleetEngine], router_url: str) -> list[ScrapeTarget]:
    """Engines and router, labelled as the chart's PodMonitors label their pods' series."""
    router = ScrapeTarget(
        ROUTER_JOB, router_url + "/metrics", {"namespace": LOCAL_NAMESPACE, "pod": "router"}
    )
    return [*engine_targets(engines), router]


class _ReplicaSeries(Collector):
    """Only the per-replica families of the operator's collector: the local fleet has no
    operator, so its reconcile and server series would be made up."""

    def __init__(self, engines: Sequence[FleetEngine]) -> None:
        from tpuserve_operator.metrics import ReplicaCollector, ReplicaRow

        rows = [
            ReplicaRow(
                LOCAL_NAMESPACE, e.pod, e.model_name, e.tpu_generation, e.tpu_topology, e.chips
            )
            for e in engines
        ]
        self._collector = ReplicaCollector(lambda: rows, tuple)

    def collect(self) -> Iterator[Metric]:
        for family in self._collector.collect():
            if family.name.startswith("tpuserve_replica_"):
                yield family


class ReplicaExporter:
    """`/metrics` on loopback with the fleet's `tpuserve_replica_*` series."""

    def __init__(self, engines: Sequence[FleetEngine]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_ReplicaSeries(engines))
        self.url = ""
        self._runner: Any = None

    async def start(self) -> str:
        from aiohttp import web

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.registry), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def start_for_fleet(
    engine_urls: Sequence[str],
    router_url: str,
    port: int,
    extra_targets: Sequence[str] = (),
) -> LocalPrometheus:
    """Prometheus for `tpuserve up`: the engines, the router, the replica series and any
    `JOB=URL` extra targets."""
    extra = [parse_target(t) for t in extra_targets]
    engines = await describe_engines(engine_urls)
    exporter = ReplicaExporter(engines)
    exporter_url = await exporter.start()
    try:
        targets = [
            *fleet_targets(engines, router_url),
            ScrapeTarget(REPLICAS_JOB, exporter_url + "/metrics", honor_labels=True),
            *extra,
        ]
        prometheus = await start(targets, port)
    except BaseException:
        await exporter.stop()
        raise
    prometheus.exporter = exporter
    return prometheus
