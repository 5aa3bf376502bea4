"""The control-plane components: each one's command line, start with a readiness wait, and stop.

Every component binds 127.0.0.1 on a port from `Ports`, logs to `LOGS_DIR/NAME.log` and is
waited for with a deadline (`process.wait_for`, which fails early with the log tail if the
process exits). The argv builders are pure functions of paths and ports, so they are tested
without starting anything.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tpuserve.cluster import keda, kube, kwok, lws, metrics_adapter
from tpuserve.cluster.pki import FRONT_PROXY_CLIENT, PKI, issue_serving_cert
from tpuserve.cluster.pods.addresses import DEFAULT_NETWORK, Network
from tpuserve.cluster.ports import LOOPBACK, free_ports
from tpuserve.cluster.probes import http_ok, https_ok, port_open
from tpuserve.cluster.process import ManagedProcess, tail, wait_for
from tpuserve.cluster.toolchain import METRICS_ADAPTER_BINARY, Toolchain

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# Used only when the host has no default route, where kube-apiserver cannot pick an advertise
# address itself and rejects loopback ones. It is written into the `kubernetes` Endpoints object
# and never dialled (TEST-NET-1, RFC 5737).
FALLBACK_ADVERTISE_ADDRESS = "192.0.2.1"
START_ORDER = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "lws-controller",
    "pod-runner",
    "monitoring",
    "metrics-adapter",
    "keda-operator",
    "keda-adapter",
)
# What a component inherits from our environment; everything else it needs is in its argv.
INHERITED_ENV = ("PATH", "HOME", "TMPDIR", "TZ")
# The pod runner also passes PYTHONPATH on to the pods, so they run the code it runs.
POD_RUNNER_ENV = ("PYTHONPATH", "LANG")
# Written by the pod runner into the run directory once it has listed pods and Services.
POD_RUNNER_READY_FILE = "pod-runner.ready"
# Under the run directory: NAMESPACE/POD/CONTAINER.log, and each pod's volumes.
POD_LOGS_DIR = "pods"


@dataclass(frozen=True, slots=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    lws_webhook: int
    lws_health: int
    prometheus: int = 0  # 0 in state files written before the cluster ran Prometheus
    metrics_adapter: int = 0
    # KEDA (opt-in): the operator's gRPC metrics service, metrics and health; the metrics
    # apiserver's secure port and its own metrics
    keda_grpc: int = 0
    keda_metrics: int = 0
    keda_health: int = 0
    keda_adapter: int = 0
    keda_adapter_metrics: int = 0

    @classmethod
    def allocate(cls) -> Ports:
        return cls(*free_ports(15))


# ---- command lines --------------------------------------------------------------------------


def etcd_argv(binary: Path, data_dir: Path, ports: Ports) -> list[str]:
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync=true",  # test data: speed over durability, as envtest
        "--quota-backend-bytes=2147483648",
        "--log-level=warn",
    ]


def apiserver_argv(
    binary: Path, ports: Ports, pki: PKI, *, default_route: bool, network: Network = DEFAULT_NETWORK
) -> list[str]:
    argv = [
        str(binary),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.apiserver_cert}",
        f"--tls-private-key-file={pki.apiserver_key}",
        f"--cert-dir={pki.dir}",
        f"--client-ca-file={pki.ca_cert}",
        f"--token-auth-file={pki.token_file}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.service_account_key}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={network.service_cluster_ip_range}",
        "--allow-privileged=true",
        "--disable-admission-plugins=ServiceAccount",
        # Aggregated APIs (a metrics adapter) learn the caller from these headers, trusting
        # the front-proxy client certificate the apiserver presents.
        f"--requestheader-client-ca-file={pki.ca_cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_cert}",
        f"--proxy-client-key-file={pki.front_proxy_key}",
        "--profiling=false",
        "--v=1",
    ]
    if not default_route:
        argv.append(f"--advertise-address={FALLBACK_ADVERTISE_ADDRESS}")
    return argv


def controller_argv(binary: Path, kubeconfig: Path, port: int) -> list[str]:
    """The flags kube-controller-manager and kube-scheduler share."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        # No --authentication/authorization-kubeconfig: their secure port then only serves
        # the always-allowed /healthz, /readyz and /livez, which is all the harness reads
        # (with them, both log requestheader client-CA errors every few seconds).
        "--leader-elect=false",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        "--profiling=false",
    ]


# With pods on loopback addresses, which Endpoints and EndpointSlices refuse, their controllers
# only fail and post Warning events; the pod runner's Service proxy reads pods instead.
LOOPBACK_POD_DISABLED_CONTROLLERS = ("endpoint", "endpointslice", "endpointslicemirroring")


def controller_manager_argv(
    binary: Path, kubeconfig: Path, ports: Ports, pki: PKI, *, loopback_pods: bool = False
) -> list[str]:
    argv = [
        *controller_argv(binary, kubeconfig, ports.controller_manager),
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.service_account_key}",
        "--cluster-name=tpuserve-local",
        "--node-monitor-period=5s",
        "--node-monitor-grace-period=40s",
    ]
    if loopback_pods:
        argv.append(
            "--controllers=*," + ",".join(f"-{c}" for c in LOOPBACK_POD_DISABLED_CONTROLLERS)
        )
        # Pods really run: HorizontalPodAutoscalers look every 5 s (the default is 15 s).
        argv.append("--horizontal-pod-autoscaler-sync-period=5s")
    return argv


def kwok_argv(binary: Path, kubeconfig: Path, config: Path, ports: Ports) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--server-address={LOOPBACK}:{ports.kwok}",
        *kwok.kwok_flags(),
    ]


def lws_argv(binary: Path, kubeconfig: Path, config: Path) -> list[str]:
    return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}"]


def pod_runner_argv(
    run_dir: Path, kubeconfig: Path, server: str, pki: PKI, network: Network = DEFAULT_NETWORK
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tpuserve.cluster.pods",
        f"--kubeconfig={kubeconfig}",
        f"--run-dir={run_dir}",
        f"--server={server}",
        f"--ca-cert={pki.ca_cert}",
        f"--network={network.index}",
    ]


def monitoring_argv(run_dir: Path, kubeconfig: Path, ports: Ports) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tpuserve.cluster.monitoring",
        f"--kubeconfig={kubeconfig}",
        f"--dir={run_dir / 'prometheus'}",
        f"--port={ports.prometheus}",
    ]


def has_default_route(route_table: Path = Path("/proc/net/route")) -> bool:
    try:
        lines = route_table.read_text().splitlines()[1:]
    except OSError:
        return True  # not Linux: let kube-apiserver decide
    return any(line.split()[1] == "00000000" for line in lines if len(line.split()) > 1)


# ---- readiness probes -----------------------------------------------------------------------


# ---- the running processes ------------------------------------------------------------------


@dataclass
class Components:
    """The processes of one control plane: start each and wait until it is ready; stop all.

    `detach` processes outlive this Python process (`tpuserve cluster up`); attached ones die
    with it (the pytest fixture).
    """

    run_dir: Path
    toolchain: Toolchain
    ports: Ports
    detach: bool
    startup_timeout_seconds: float
    network: Network = DEFAULT_NETWORK
    processes: dict[str, ManagedProcess] = field(default_factory=dict)

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

    def spawn(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        base_env = {k: v for k, v in os.environ.items() if k in INHERITED_ENV}
        process = ManagedProcess.spawn(
            name,
            argv,
            self.logs_dir / f"{name}.log",
            env={**base_env, **(env or {})},
            detach=self.detach,
        )
        self.processes[name] = process
        return process

    def wait(
        self,
        what: str,
        ready: Callable[[], bool],
        process: ManagedProcess | None = None,
        timeout_seconds: float | None = None,
    ) -> None:
        """Wait for `ready` within the start-up deadline; StartupError if `process` exits."""
        wait_for(what, ready, timeout_seconds or self.startup_timeout_seconds, process)

    def start_etcd(self) -> None:
        argv = etcd_argv(self.toolchain.binary("etcd"), self.run_dir / "etcd-data", self.ports)
        process = self.spawn("etcd", argv)
        readyz = f"http://{LOOPBACK}:{self.ports.etcd_client}/readyz"
        self.wait("etcd /readyz", lambda: http_ok(readyz), process)

    def start_apiserver(self, pki: PKI, argv: list[str] | None = None) -> None:
        if argv is None:
            binary = self.toolchain.binary("kube-apiserver")
            argv = apiserver_argv(
                binary, self.ports, pki, default_route=has_default_route(), network=self.network
            )
        process = self.spawn("kube-apiserver", argv)
        readyz = f"{self.server}/readyz"
        self.wait(
            "kube-apiserver /readyz",
            lambda: https_ok(readyz, ca_cert=pki.ca_cert, token=pki.admin_token),
            process,
        )

    def restart_apiserver(self, pki: PKI, grace_seconds: float) -> None:
        """Stop kube-apiserver (SIGKILL after `grace_seconds`), start it on the same argv."""
        old = self.processes.pop("kube-apiserver")
        old.stop(grace_seconds)
        self.start_apiserver(pki, old.argv)

    def start_controller_manager(
        self, pki: PKI, kubeconfig: Path, *, loopback_pods: bool = False
    ) -> None:
        binary = self.toolchain.binary("kube-controller-manager")
        argv = controller_manager_argv(
            binary, kubeconfig, self.ports, pki, loopback_pods=loopback_pods
        )
        process = self.spawn("kube-controller-manager", argv)
        healthz = f"https://{LOOPBACK}:{self.ports.controller_manager}/healthz"
        self.wait(
            "kube-controller-manager /healthz",
            lambda: https_ok(healthz, ca_cert=None),
            process,
        )

    def start_scheduler(self, kubeconfig: Path) -> None:
        binary = self.toolchain.binary("kube-scheduler")
        process = self.spawn(
            "kube-scheduler", controller_argv(binary, kubeconfig, self.ports.scheduler)
        )
        healthz = f"https://{LOOPBACK}:{self.ports.scheduler}/healthz"
        self.wait("kube-scheduler /healthz", lambda: https_ok(healthz, ca_cert=None), process)

    def start_kwok(self, kubeconfig: Path, *, pod_stages: bool = True) -> None:
        config = self.run_dir / "kwok.yaml"
        config.write_text(kwok.kwok_config(self.toolchain.kwok_module_dir(), pod_stages=pod_stages))
        process = self.spawn(
            "kwok", kwok_argv(self.toolchain.binary("kwok"), kubeconfig, config, self.ports)
        )
        healthz = f"http://{LOOPBACK}:{self.ports.kwok}/healthz"
        self.wait("kwok /healthz", lambda: http_ok(healthz), process)

    def start_lws(self, pki: PKI, kubeconfig: Path, new_api: Callable[[], Any]) -> None:
        """CRDs first, then the controller with a serving cert from our CA, then its webhooks."""
        module_dir = self.toolchain.lws_module_dir()
        with contextlib.closing(new_api()) as api:
            kube.install_crds(api, lws.crd_paths(module_dir), self.startup_timeout_seconds)
        cert_dir = self.run_dir / "lws-certs"
        cert_dir.mkdir(exist_ok=True)
        issue_serving_cert(
            pki.ca_cert, pki.ca_key, cert_dir / "tls.crt", cert_dir / "tls.key", "lws-webhook"
        )
        config = self.run_dir / "lws-config.yaml"
        config.write_text(
            yaml.safe_dump(
                lws.lws_config(
                    webhook_port=self.ports.lws_webhook,
                    health_port=self.ports.lws_health,
                    cert_dir=cert_dir,
                )
            )
        )
        process = self.spawn(
            "lws-controller",
            lws_argv(self.toolchain.binary("lws-controller"), kubeconfig, config),
            env={"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": "lws-system"},
        )
        readyz = f"http://{LOOPBACK}:{self.ports.lws_health}/readyz"
        self.wait("lws-controller /readyz", lambda: http_ok(readyz), process)
        self.wait("lws webhook port", lambda: port_open(self.ports.lws_webhook), process)
        with contextlib.closing(new_api()) as api:
            lws.register_webhooks(api, module_dir, self.ports.lws_webhook, pki.ca_cert)

    def start_pod_runner(self, pki: PKI, kubeconfig: Path) -> None:
        """The pod runner (`tpuserve.cluster.pods`), ready once it has listed pods and Services."""
        ready_file = self.run_dir / POD_RUNNER_READY_FILE
        ready_file.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if k in POD_RUNNER_ENV}
        process = self.spawn(
            "pod-runner",
            pod_runner_argv(self.run_dir, kubeconfig, self.server, pki, self.network),
            env,
        )
        self.wait("pod-runner ready", ready_file.exists, process)

    def start_monitoring(self, kubeconfig: Path, new_api: Callable[[], Any]) -> None:
        """The Prometheus Operator's monitor CRDs, then Prometheus kept equal to the monitors."""
        with contextlib.closing(new_api()) as api:
            crds = self.toolchain.prometheus_operator_crds()
            kube.install_crds(api, crds, self.startup_timeout_seconds)
        env = {k: v for k, v in os.environ.items() if k in POD_RUNNER_ENV}
        argv = monitoring_argv(self.run_dir, kubeconfig, self.ports)
        process = self.spawn("monitoring", argv, env)
        ready = f"http://{LOOPBACK}:{self.ports.prometheus}/-/ready"
        self.wait("prometheus /-/ready", lambda: http_ok(ready), process)

    def start_metrics_adapter(self, pki: PKI, kubeconfig: Path, new_api: Callable[[], Any]) -> None:
        """Prometheus Adapter on loopback, registered as the custom and external metrics APIs."""
        cert_dir = self.run_dir / "metrics-adapter"
        cert_dir.mkdir(exist_ok=True)
        cert, key = cert_dir / "tls.crt", cert_dir / "tls.key"
        issue_serving_cert(
            pki.ca_cert,
            pki.ca_key,
            cert,
            key,
            metrics_adapter.SERVICE,
            metrics_adapter.SERVING_NAMES,
        )
        argv = metrics_adapter.adapter_argv(
            self.toolchain.binary(METRICS_ADAPTER_BINARY),
            port=self.ports.metrics_adapter,
            cert=cert,
            key=key,
            kubeconfig=kubeconfig,
            prometheus_url=f"http://{LOOPBACK}:{self.ports.prometheus}",
        )
        process = self.spawn("metrics-adapter", argv)
        healthz = f"https://{LOOPBACK}:{self.ports.metrics_adapter}/healthz"
        self.wait("metrics-adapter /healthz", lambda: https_ok(healthz, ca_cert=None), process)
        with contextlib.closing(new_api()) as api:
            metrics_adapter.register(api, self.ports.metrics_adapter, pki.ca_cert)
            self.wait(
                "the metrics APIServices Available",
                lambda: metrics_adapter.available(api),
                process,
            )

    def start_keda(self, pki: PKI, kubeconfig: Path, new_api: Callable[[], Any]) -> None:
        """KEDA's CRDs and namespace, the shared mutual-TLS certificate, the operator (once its
        /healthz answers and its gRPC port is open) and the metrics apiserver, registered as the
        external metrics API and Available."""
        with contextlib.closing(new_api()) as api:
            kube.install_crds(api, self.toolchain.keda_all_crds(), self.startup_timeout_seconds)
            keda.ensure_namespace(api)
        cert_dir = self.run_dir / "keda"
        cert_dir.mkdir(exist_ok=True)
        issue_serving_cert(
            pki.ca_cert, pki.ca_key, cert_dir / "tls.crt", cert_dir / "tls.key",
            keda.OPERATOR_SERVICE, keda.SERVING_NAMES, server_and_client=True,
        )  # fmt: skip
        shutil.copyfile(pki.ca_cert, cert_dir / "ca.crt")
        p = self.ports
        operator = self.spawn(
            "keda-operator",
            keda.operator_argv(
                self.toolchain.binary(keda.OPERATOR_BINARY),
                cert_dir=cert_dir,
                grpc_port=p.keda_grpc,
                metrics_port=p.keda_metrics,
                health_port=p.keda_health,
            ),
            keda.operator_env(kubeconfig),
        )
        healthz = f"http://{LOOPBACK}:{p.keda_health}/healthz"
        self.wait("keda-operator /healthz", lambda: http_ok(healthz), operator)
        self.wait("keda-operator's gRPC port", lambda: port_open(p.keda_grpc), operator)
        adapter = self.spawn(
            "keda-adapter",
            keda.adapter_argv(
                self.toolchain.binary(keda.ADAPTER_BINARY),
                cert_dir=cert_dir,
                kubeconfig=kubeconfig,
                secure_port=p.keda_adapter,
                metrics_port=p.keda_adapter_metrics,
                grpc_port=p.keda_grpc,
            ),
            keda.operator_env(kubeconfig),
        )
        adapter_healthz = f"https://{LOOPBACK}:{p.keda_adapter}/healthz"
        self.wait("keda-adapter /healthz", lambda: https_ok(adapter_healthz, ca_cert=None), adapter)
        with contextlib.closing(new_api()) as api:
            keda.register(api, p.keda_adapter, pki.ca_cert)
            self.wait(
                "the external metrics APIService on KEDA Available",
                lambda: keda.available(api),
                adapter,
            )

    def stop(self) -> None:
        """Stop every component, in reverse start order; RuntimeError names any survivor."""
        errors = []
        for name in reversed(START_ORDER):
            process = self.processes.get(name)
            if process is None:
                continue
            try:
                process.stop()
            except RuntimeError as err:
                errors.append(str(err))
        if errors:
            raise RuntimeError("; ".join(errors))

    def alive(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.alive()]

    def log_paths(self) -> dict[str, Path]:
        return {name: p.log_path for name, p in self.processes.items()}

    def log_report(self, lines: int = 40) -> str:
        """The last lines of every component log, for a failing test's report."""
        parts = []
        for name, process in self.processes.items():
            state = "running" if process.alive() else "NOT RUNNING"
            parts.append(
                f"---- {name} ({state}) {process.log_path}\n{tail(process.log_path, lines)}"
            )
        return "\n".join(parts)
