"""A real Kubernetes control plane on loopback, with kwok-simulated GKE TPU node pools.

`Cluster` starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and
(optionally) the LeaderWorkerSet controller as local processes, in that order, each waited
for with a deadline; every component binds 127.0.0.1 on a free port and logs to
`RUN_DIR/logs/NAME.log`. The same object serves the pytest session fixture (attached
processes, stopped at teardown) and `tpuserve cluster up|down` (detached processes recorded in
`RUN_DIR/state.json`, stopped later by `Cluster.attach(run_dir).stop()`).

Auth is a static admin token in group system:masters, served over TLS from a throwaway CA.
The ServiceAccount admission plugin is off (as in envtest), so pods created right after their
namespace do not race the token controller. ExtendedResourceToleration is NOT enabled: a pod
that asks for `google.com/tpu` without tolerating the TPU taint stays Pending, which is how a
missing toleration in the operator gets caught.

This module holds the order of start-up, the state file and the public surface; the parts
live beside it: `components` (each process's argv, start and stop), `kubeconfig`, `tools`
(kubectl, helm) and `nodes` (fake node pools in the API).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tpuserve.cluster import kube, kubeconfig, nodes
from tpuserve.cluster.components import POD_LOGS_DIR as PODS_DIR
from tpuserve.cluster.components import Components, Ports
from tpuserve.cluster.node_pools import NodePool, load_profile
from tpuserve.cluster.pki import ADMIN_USER, PKI, create_pki, load_pki
from tpuserve.cluster.pods.addresses import DEFAULT_NETWORK, Network
from tpuserve.cluster.process import ManagedProcess, tail, wait_for
from tpuserve.cluster.toolchain import Toolchain, ToolchainMissing
from tpuserve.cluster.tools import Tools

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
DEFAULT_STARTUP_TIMEOUT_SECONDS = 120.0


class Cluster:
    """A local control plane. Use as a context manager, or `start()` / `stop()`.

    Args:
        run_dir: where PKI, kubeconfig, etcd data, configs, logs and the state file go.
        pools: fake node pools to create (default: the default profile).
        lws: run the LeaderWorkerSet controller; None means "if its binary was built".
        run_pods: run every pod bound to a fake node as local processes on loopback (the pod
            runner, `tpuserve.cluster.pods`) instead of letting kwok fake them Running.
        prometheus: run the real Prometheus scraping what the cluster's PodMonitors and
            ServiceMonitors select (`tpuserve.cluster.monitoring`, with the Prometheus Operator's
            CRDs); None means "when pods run" (without them there is nothing to scrape).
        metrics_adapter: run Prometheus Adapter as the custom and external metrics APIs, so
            HorizontalPodAutoscalers act on the engines' series; None means "with Prometheus,
            when its binary was built".
        keda: run KEDA's operator and metrics apiserver (`tpuserve.cluster.keda`; opt-in, built
            by `scripts/build-keda.sh`), which take over the external metrics API (Prometheus
            Adapter keeps the custom one); needs Prometheus. Default off.
        detach: leave processes running after this Python process exits (`cluster up`).
        startup_timeout_seconds: deadline for each component's readiness.
        ports, pki: those of a cluster already running (`attach`); default: new ones.
        network: the address ranges of its Services and pods (`pods.addresses.Network`): clusters
            whose pods run at the same time on one machine need different ones.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        pools: Sequence[NodePool] | None = None,
        lws: bool | None = None,
        run_pods: bool = False,
        prometheus: bool | None = None,
        metrics_adapter: bool | None = None,
        keda: bool = False,
        detach: bool = False,
        toolchain: Toolchain | None = None,
        startup_timeout_seconds: float = DEFAULT_STARTUP_TIMEOUT_SECONDS,
        ports: Ports | None = None,
        pki: PKI | None = None,
        network: Network = DEFAULT_NETWORK,
    ) -> None:
        self.run_dir = run_dir.resolve()
        self.toolchain = toolchain or Toolchain.discover()
        self.pools: list[NodePool] = list(load_profile() if pools is None else pools)
        self.lws_enabled = self.toolchain.has_lws if lws is None else lws
        self.run_pods = run_pods
        self.prometheus = run_pods if prometheus is None else prometheus
        self.metrics_adapter = (
            self.prometheus and self.toolchain.has_metrics_adapter
            if metrics_adapter is None
            else metrics_adapter
        )
        self.keda = keda
        self.components = Components(
            self.run_dir,
            self.toolchain,
            ports or Ports.allocate(),
            detach,
            startup_timeout_seconds,
            network,
        )
        self.tools = Tools(self.toolchain, self.kubeconfig, self.run_dir / "helm")
        self._pki = pki
        self.started_seconds: float | None = None
        # Seconds each start-up step took (pki, etcd, kube-apiserver, ..., node pools).
        self.start_seconds: dict[str, float] = {}

    # ---- paths and connection facts --------------------------------------------------------

    @property
    def detach(self) -> bool:
        return self.components.detach

    @property
    def startup_timeout_seconds(self) -> float:
        return self.components.startup_timeout_seconds

    @property
    def ports(self) -> Ports:
        return self.components.ports

    @property
    def network(self) -> Network:
        return self.components.network

    @property
    def processes(self) -> dict[str, ManagedProcess]:
        return self.components.processes

    @property
    def prometheus_url(self) -> str | None:
        """The local Prometheus (`prometheus=True`), on 127.0.0.1."""
        return f"http://127.0.0.1:{self.ports.prometheus}" if self.prometheus else None

    @property
    def kubeconfig(self) -> Path:
        return self.run_dir / "kubeconfig"

    @property
    def logs_dir(self) -> Path:
        return self.components.logs_dir

    @property
    def server(self) -> str:
        return self.components.server

    @property
    def pki(self) -> PKI:
        if self._pki is None:
            raise RuntimeError("the cluster has not been started")
        return self._pki

    @property
    def token(self) -> str:
        return self.pki.admin_token

    @property
    def ca_cert(self) -> Path:
        return self.pki.ca_cert

    def log_paths(self) -> dict[str, Path]:
        return self.components.log_paths()

    # ---- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Cluster:
        """Start every component in order; on any failure stop what started, then raise."""
        missing = self.toolchain.missing_binaries()
        if missing:
            raise ToolchainMissing(
                f"missing control-plane binaries in {self.toolchain.k8s_bin}: "
                f"{', '.join(missing)}; build them with `scripts/build-control-plane.sh` "
                "(needs Go 1.26+)"
            )
        t0 = time.monotonic()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        components = self.components
        steps: list[tuple[str, Callable[[], object]]] = [
            ("pki", self._create_pki),
            ("etcd", components.start_etcd),
            ("kube-apiserver", lambda: components.start_apiserver(self.pki)),
            (
                "kube-controller-manager",
                lambda: components.start_controller_manager(
                    self.pki, self.kubeconfig, loopback_pods=self.run_pods
                ),
            ),
            ("kube-scheduler", lambda: components.start_scheduler(self.kubeconfig)),
            (
                "kwok",
                lambda: components.start_kwok(self.kubeconfig, pod_stages=not self.run_pods),
            ),
            ("node pools", lambda: self.add_node_pools(self.pools)),
        ]
        if self.lws_enabled:
            steps.append(
                (
                    "lws-controller",
                    lambda: components.start_lws(self.pki, self.kubeconfig, self.api_client),
                )
            )
        if self.run_pods:
            steps.append(
                ("pod-runner", lambda: components.start_pod_runner(self.pki, self.kubeconfig))
            )
        if self.prometheus:
            steps.append(
                (
                    "prometheus",
                    lambda: components.start_monitoring(self.kubeconfig, self.api_client),
                )
            )
        if self.metrics_adapter:
            steps.append(
                (
                    "metrics-adapter",
                    lambda: components.start_metrics_adapter(
                        self.pki, self.kubeconfig, self.api_client
                    ),
                )
            )
        if self.keda:
            steps.append(
                (
                    "keda",
                    lambda: components.start_keda(self.pki, self.kubeconfig, self.api_client),
                )
            )
        steps.append(("default namespace", self._wait_default_namespace))
        try:
            for step, run in steps:
                t_step = time.monotonic()
                run()
                self.start_seconds[step] = time.monotonic() - t_step
        except BaseException:
            self.stop()
            raise
        self.started_seconds = time.monotonic() - t0
        self._save_state()
        log.info(
            "control plane up in %.1f s at %s (%s)",
            self.started_seconds,
            self.server,
            ", ".join(f"{k} {v:.1f} s" for k, v in self.start_seconds.items()),
        )
        return self

    def stop(self) -> None:
        """Stop every component, in reverse start order; no process is left behind.

        The state file goes only when every process is gone, so `cluster down` can retry.
        """
        self.components.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.run_dir / STATE_FILE).unlink()

    def alive_processes(self) -> list[str]:
        return self.components.alive()

    @classmethod
    def attach(cls, run_dir: Path, toolchain: Toolchain | None = None) -> Cluster:
        """The cluster a detached `start()` left running in run_dir (read from its state file)."""
        state_path = run_dir.resolve() / STATE_FILE
        try:
            state = json.loads(state_path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no running cluster recorded in {state_path} "
                "(start one with `tpuserve cluster up`)"
            ) from None
        cluster = cls(
            run_dir,
            pools=[],
            lws=bool(state["lws"]),
            run_pods=bool(state.get("run_pods", False)),
            prometheus=bool(state.get("prometheus", False)),
            metrics_adapter=bool(state.get("metrics_adapter", False)),
            keda=bool(state.get("keda", False)),
            detach=True,
            toolchain=toolchain,
            startup_timeout_seconds=float(
                state.get("startup_timeout_seconds", DEFAULT_STARTUP_TIMEOUT_SECONDS)
            ),
            ports=Ports(**state["ports"]),
            pki=load_pki(run_dir.resolve() / "pki"),
            network=Network(int(state.get("network", 0))),
        )
        cluster.processes.update(
            (p["name"], ManagedProcess.from_state(p)) for p in state["processes"]
        )
        cluster.started_seconds = state.get("started_seconds")
        cluster.start_seconds = dict(state.get("start_seconds", {}))
        return cluster

    def _save_state(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "ports": asdict(self.ports),
            "lws": self.lws_enabled,
            "run_pods": self.run_pods,
            "network": self.network.index,
            "prometheus": self.prometheus,
            "metrics_adapter": self.metrics_adapter,
            "keda": self.keda,
            "started_seconds": self.started_seconds,
            "start_seconds": self.start_seconds,
            "startup_timeout_seconds": self.startup_timeout_seconds,
            "processes": [p.to_state() for p in self.processes.values()],
        }
        (self.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    def _create_pki(self) -> None:
        self._pki = create_pki(self.run_dir / "pki")
        kubeconfig.write_kubeconfig(
            self.kubeconfig, self.server, self.pki.ca_cert, self.pki.admin_token, ADMIN_USER
        )

    def _wait_default_namespace(self) -> None:
        """Wait for the `default` namespace to exist (kube-apiserver creates it at start-up)."""

        def ready() -> bool:
            with contextlib.closing(self.api_client()) as api:
                kube.client().CoreV1Api(api).read_namespace("default")
            return True

        wait_for("namespace default", ready, self.startup_timeout_seconds)

    def restart_apiserver(self, grace_seconds: float = 3.0) -> None:
        """Stop kube-apiserver and start it again on the same port, flags and etcd data.

        SIGTERM first; kube-apiserver drains in-flight requests at once but, with clients
        still watching, does not exit on its own for a long while, so it gets SIGKILL after
        `grace_seconds` (everything it acknowledged is already in etcd).
        """
        self.components.restart_apiserver(self.pki, grace_seconds)
        if self.detach:
            self._save_state()

    # ---- clients and tools -----------------------------------------------------------------

    def api_client(self) -> Any:
        """A new `kubernetes.client.ApiClient` for the admin user; close it when done."""
        return kubeconfig.api_client(self.kubeconfig)

    def wait_crds_established(self, names: Sequence[str], timeout_seconds: float = 60.0) -> None:
        """Until the apiserver serves every CRD in `names`. (`kubectl wait
        --for=condition=Established` fails at once instead of waiting while a CRD just applied
        has no `status.conditions` yet: `.status.conditions accessor error: <nil>`, kubectl
        1.35, seen on a loaded machine.)"""
        with contextlib.closing(self.api_client()) as api:
            extensions = kube.client().ApiextensionsV1Api(api)
            kube.wait_established(extensions, names, timeout_seconds)

    def service_account_kubeconfig(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount (TokenRequest), to test RBAC."""
        with contextlib.closing(self.api_client()) as api:
            token = kubeconfig.service_account_token(api, namespace, name, expiration_seconds)
        return kubeconfig.write_kubeconfig(
            self.run_dir / f"kubeconfig-sa-{namespace}-{name}",
            self.server,
            self.pki.ca_cert,
            token,
            f"{namespace}-{name}",
            namespace,
        )

    def server_version(self) -> dict[str, str]:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        request = urllib.request.Request(
            f"{self.server}/version", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            data: dict[str, str] = json.load(response)
        return data

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout_seconds: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; CommandError (with stderr) when check fails."""
        return self.tools.kubectl(*args, check=check, input=input, timeout_seconds=timeout_seconds)

    def helm(
        self, *args: str, check: bool = True, input: str | None = None, timeout_seconds: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster, with its config/cache/data kept inside run_dir."""
        return self.tools.helm(*args, check=check, input=input, timeout_seconds=timeout_seconds)

    # ---- node pools ------------------------------------------------------------------------

    def add_node_pools(self, pools: Sequence[NodePool], *, wait: bool = True) -> list[str]:
        names: list[str] = []
        for pool in pools:
            names += self.add_node_pool(pool, wait=False)
        if wait:
            self.wait_nodes_ready(names)
        return names

    def add_node_pool(self, pool: NodePool, *, wait: bool = True) -> list[str]:
        """Create the pool's Nodes (kwok makes them Ready); returns their names."""
        names = nodes.create_pool(self.api_client, pool)
        if pool not in self.pools:
            self.pools.append(pool)
        if wait:
            self.wait_nodes_ready(names)
        return names

    def remove_node_pool(self, name: str, *, wait: bool = True) -> list[str]:
        """Delete the pool's Nodes; returns their names. Pods bound to them are orphaned and
        garbage-collected by kube-controller-manager, as when GKE deletes a node pool."""
        deleted = nodes.delete_pool(
            self.api_client,
            name,
            wait_timeout_seconds=self.startup_timeout_seconds if wait else None,
        )
        self.pools = [p for p in self.pools if p.name != name]
        return deleted

    def wait_nodes_ready(self, names: Sequence[str], timeout_seconds: float | None = None) -> None:
        """Wait until the nodes are Ready and free of the not-ready taint (pods can land)."""
        nodes.wait_ready(
            self.api_client,
            names,
            timeout_seconds or self.startup_timeout_seconds,
            self.processes.get("kwok"),
        )

    # ---- diagnostics -----------------------------------------------------------------------

    def log_report(self, lines: int = 40) -> str:
        """The last lines of every component log (and pod log, when pods run), for a failing
        test's report."""
        report = self.components.log_report(lines)
        if self.run_pods:
            for path in sorted((self.run_dir / PODS_DIR).glob("*/*/*.log")):
                report += f"\n---- pod log {path}\n{tail(path, lines // 2)}"
        return report


def default_run_dir() -> Path:
    """Where `tpuserve cluster up|down` keep a cluster unless told otherwise."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "tpuserve" / "cluster"
