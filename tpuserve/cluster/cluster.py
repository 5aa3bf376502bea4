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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from sglang_tpu import topology
from tpuserve.cluster import kube, kwok, lws
from tpuserve.cluster.node_pools import FAKE_NODE_LABEL, NodePool, load_profile
from tpuserve.cluster.pki import PKI, create_pki, issue_serving_cert, load_pki
from tpuserve.cluster.ports import LOOPBACK, free_ports
from tpuserve.cluster.process import ManagedProcess, tail, wait_for
from tpuserve.cluster.toolchain import Toolchain, ToolchainMissing

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
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
)


class CommandError(subprocess.CalledProcessError):
    """kubectl or helm failed; the message carries their stderr."""

    def __str__(self) -> str:
        return (
            f"{' '.join(map(str, self.cmd))} exited {self.returncode}: {self.stderr or self.stdout}"
        )


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

    @classmethod
    def allocate(cls) -> Ports:
        return cls(*free_ports(8))


def _has_default_route() -> bool:
    try:
        lines = Path("/proc/net/route").read_text().splitlines()[1:]
    except OSError:
        return True  # not Linux: let kube-apiserver decide
    return any(line.split()[1] == "00000000" for line in lines if len(line.split()) > 1)


class Cluster:
    """A local control plane. Use as a context manager, or `start()` / `stop()`.

    Args:
        run_dir: where PKI, kubeconfig, etcd data, configs, logs and the state file go.
        pools: fake node pools to create (default: the default profile).
        lws: run the LeaderWorkerSet controller; None means "if its binary was built".
        detach: leave processes running after this Python process exits (`cluster up`).
        startup_timeout_seconds: deadline for each component's readiness.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        pools: Sequence[NodePool] | None = None,
        lws: bool | None = None,
        detach: bool = False,
        toolchain: Toolchain | None = None,
        startup_timeout_seconds: float = 120.0,
    ) -> None:
        self.run_dir = run_dir.resolve()
        self.toolchain = toolchain or Toolchain.discover()
        self.pools: list[NodePool] = list(load_profile() if pools is None else pools)
        self.lws_enabled = self.toolchain.has_lws if lws is None else lws
        self.detach = detach
        self.startup_timeout_seconds = startup_timeout_seconds
        self.processes: dict[str, ManagedProcess] = {}
        self.ports = Ports.allocate()
        self._pki: PKI | None = None
        self.started_seconds: float | None = None
        # Seconds each start-up step took (pki, etcd, kube-apiserver, ..., node pools).
        self.start_seconds: dict[str, float] = {}

    # ---- paths and connection facts --------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self.run_dir / "kubeconfig"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

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
        return {name: p.log_path for name, p in self.processes.items()}

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
        steps: list[tuple[str, Callable[[], object]]] = [
            ("pki", self._create_pki),
            ("etcd", self._start_etcd),
            ("kube-apiserver", self._start_apiserver),
            ("kube-controller-manager", self._start_controller_manager),
            ("kube-scheduler", self._start_scheduler),
            ("kwok", self._start_kwok),
            ("node pools", lambda: self.add_node_pools(self.pools)),
        ]
        if self.lws_enabled:
            steps.append(("lws-controller", self._start_lws))
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
        """Stop every component, in reverse start order; no process is left behind."""
        errors = []
        for name in reversed(START_ORDER):
            process = self.processes.get(name)
            if process is None:
                continue
            try:
                process.stop()
            except RuntimeError as err:
                errors.append(str(err))
        state = self.run_dir / STATE_FILE
        with contextlib.suppress(FileNotFoundError):
            if not errors:
                state.unlink()
        if errors:
            raise RuntimeError("; ".join(errors))

    def alive_processes(self) -> list[str]:
        return [name for name, p in self.processes.items() if p.alive()]

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
        cluster = cls.__new__(cls)
        cluster.run_dir = run_dir.resolve()
        cluster.toolchain = toolchain or Toolchain.discover()
        cluster.pools = []
        cluster.lws_enabled = bool(state["lws"])
        cluster.detach = True
        cluster.startup_timeout_seconds = float(state.get("startup_timeout_seconds", 120.0))
        cluster.ports = Ports(**state["ports"])
        cluster._pki = load_pki(cluster.run_dir / "pki")
        cluster.processes = {p["name"]: ManagedProcess.from_state(p) for p in state["processes"]}
        cluster.started_seconds = state.get("started_seconds")
        cluster.start_seconds = dict(state.get("start_seconds", {}))
        return cluster

    def _save_state(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "ports": asdict(self.ports),
            "lws": self.lws_enabled,
            "started_seconds": self.started_seconds,
            "start_seconds": self.start_seconds,
            "startup_timeout_seconds": self.startup_timeout_seconds,
            "processes": [p.to_state() for p in self.processes.values()],
        }
        (self.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    # ---- components ------------------------------------------------------------------------

    def _spawn(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        base_env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "TMPDIR", "TZ")}
        process = ManagedProcess.spawn(
            name,
            argv,
            self.logs_dir / f"{name}.log",
            env={**base_env, **(env or {})},
            detach=self.detach,
        )
        self.processes[name] = process
        return process

    def _https_ok(self, url: str, *, verify: bool = True, token: str | None = None) -> bool:
        if verify:
            context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        else:  # component health ports use self-signed certs; loopback only
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, context=context, timeout=5) as response:
            return bool(response.status == 200)

    @staticmethod
    def _http_ok(url: str) -> bool:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)

    def _create_pki(self) -> None:
        self._pki = create_pki(self.run_dir / "pki")
        self._write_kubeconfig(self.kubeconfig, self.pki.admin_token, "tpuserve-admin")

    def _start_etcd(self) -> None:
        p = self.ports
        client = f"http://{LOOPBACK}:{p.etcd_client}"
        peer = f"http://{LOOPBACK}:{p.etcd_peer}"
        process = self._spawn(
            "etcd",
            [
                str(self.toolchain.binary("etcd")),
                "--name=default",
                f"--data-dir={self.run_dir / 'etcd-data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync=true",  # test data: speed over durability, as envtest
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )
        wait_for(
            "etcd /readyz",
            lambda: self._http_ok(f"{client}/readyz"),
            self.startup_timeout_seconds,
            process,
        )

    def _apiserver_argv(self) -> list[str]:
        pki = self.pki
        argv = [
            str(self.toolchain.binary("kube-apiserver")),
            f"--etcd-servers=http://{LOOPBACK}:{self.ports.etcd_client}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.ports.apiserver}",
            f"--tls-cert-file={pki.apiserver_cert}",
            f"--tls-private-key-file={pki.apiserver_key}",
            f"--cert-dir={pki.dir}",
            f"--client-ca-file={pki.ca_cert}",
            f"--token-auth-file={pki.token_file}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki.service_account_key}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--disable-admission-plugins=ServiceAccount",
            "--profiling=false",
            "--v=1",
        ]
        if not _has_default_route():
            argv.append(f"--advertise-address={FALLBACK_ADVERTISE_ADDRESS}")
        return argv

    def _start_apiserver(self, argv: list[str] | None = None) -> None:
        process = self._spawn("kube-apiserver", argv or self._apiserver_argv())
        wait_for(
            "kube-apiserver /readyz",
            lambda: self._https_ok(f"{self.server}/readyz", token=self.pki.admin_token),
            self.startup_timeout_seconds,
            process,
        )

    def _component_argv(self, binary: str, port: int) -> list[str]:
        return [
            str(self.toolchain.binary(binary)),
            f"--kubeconfig={self.kubeconfig}",
            # No --authentication/authorization-kubeconfig: their secure port then only serves
            # the always-allowed /healthz, /readyz and /livez, which is all the harness reads
            # (with them, both log requestheader client-CA errors every few seconds).
            "--leader-elect=false",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            "--profiling=false",
        ]

    def _start_controller_manager(self) -> None:
        argv = self._component_argv("kube-controller-manager", self.ports.controller_manager)
        argv += [
            f"--root-ca-file={self.pki.ca_cert}",
            f"--service-account-private-key-file={self.pki.service_account_key}",
            "--cluster-name=tpuserve-local",
            "--node-monitor-period=5s",
            "--node-monitor-grace-period=40s",
        ]
        process = self._spawn("kube-controller-manager", argv)
        url = f"https://{LOOPBACK}:{self.ports.controller_manager}/healthz"
        wait_for(
            "kube-controller-manager /healthz",
            lambda: self._https_ok(url, verify=False),
            self.startup_timeout_seconds,
            process,
        )

    def _start_scheduler(self) -> None:
        process = self._spawn(
            "kube-scheduler", self._component_argv("kube-scheduler", self.ports.scheduler)
        )
        url = f"https://{LOOPBACK}:{self.ports.scheduler}/healthz"
        wait_for(
            "kube-scheduler /healthz",
            lambda: self._https_ok(url, verify=False),
            self.startup_timeout_seconds,
            process,
        )

    def _start_kwok(self) -> None:
        config = self.run_dir / "kwok.yaml"
        config.write_text(kwok.kwok_config(self.toolchain.kwok_module_dir()))
        process = self._spawn(
            "kwok",
            [
                str(self.toolchain.binary("kwok")),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--server-address={LOOPBACK}:{self.ports.kwok}",
                *kwok.kwok_flags(),
            ],
        )
        url = f"http://{LOOPBACK}:{self.ports.kwok}/healthz"
        wait_for("kwok /healthz", lambda: self._http_ok(url), self.startup_timeout_seconds, process)

    def _start_lws(self) -> None:
        module_dir = self.toolchain.lws_module_dir()
        api = self.api_client()
        try:
            lws.install_crds(api, module_dir, self.startup_timeout_seconds)
        finally:
            api.close()
        cert_dir = self.run_dir / "lws-certs"
        cert_dir.mkdir(exist_ok=True)
        issue_serving_cert(
            self.pki.ca_cert,
            self.pki.ca_key,
            cert_dir / "tls.crt",
            cert_dir / "tls.key",
            "lws-webhook",
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
        process = self._spawn(
            "lws-controller",
            [
                str(self.toolchain.binary("lws-controller")),
                f"--config={config}",
                f"--kubeconfig={self.kubeconfig}",
            ],
            env={"KUBECONFIG": str(self.kubeconfig), "POD_NAMESPACE": "lws-system"},
        )
        health = f"http://{LOOPBACK}:{self.ports.lws_health}/readyz"
        wait_for(
            "lws-controller /readyz",
            lambda: self._http_ok(health),
            self.startup_timeout_seconds,
            process,
        )
        wait_for(
            "lws webhook port",
            lambda: _port_open(self.ports.lws_webhook),
            self.startup_timeout_seconds,
            process,
        )
        api = self.api_client()
        try:
            lws.register_webhooks(api, module_dir, self.ports.lws_webhook, self.pki.ca_cert)
        finally:
            api.close()

    def _wait_default_namespace(self) -> None:
        """Wait for the `default` namespace to exist (kube-apiserver creates it at start-up)."""

        def ready() -> bool:
            api = self.api_client()
            try:
                kube.client().CoreV1Api(api).read_namespace("default")
                return True
            finally:
                api.close()

        wait_for("namespace default", ready, self.startup_timeout_seconds)

    def restart_apiserver(self, grace_seconds: float = 3.0) -> None:
        """Stop kube-apiserver and start it again on the same port, flags and etcd data.

        SIGTERM first; kube-apiserver drains in-flight requests at once but, with clients
        still watching, does not exit on its own for a long while, so it gets SIGKILL after
        `grace_seconds` (everything it acknowledged is already in etcd).
        """
        old = self.processes.pop("kube-apiserver")
        old.stop(grace_seconds)
        self._start_apiserver(old.argv)
        if self.detach:
            self._save_state()

    # ---- clients and tools -----------------------------------------------------------------

    def _write_kubeconfig(
        self, path: Path, token: str, user: str, namespace: str = "default"
    ) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tpuserve-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "tpuserve-local",
                    "context": {"cluster": "tpuserve-local", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "tpuserve-local",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def api_client(self) -> Any:
        """A new `kubernetes.client.ApiClient` for the admin user; close it when done."""
        config = kube.config()
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def service_account_kubeconfig(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount (TokenRequest), to test RBAC."""
        api = self.api_client()
        try:
            response = (
                kube.client()
                .CoreV1Api(api)
                .create_namespaced_service_account_token(
                    name,
                    namespace,
                    {"spec": {"expirationSeconds": expiration_seconds}},
                )
            )
        finally:
            api.close()
        path = self.run_dir / f"kubeconfig-sa-{namespace}-{name}"
        self._write_kubeconfig(path, response.status.token, f"{namespace}-{name}", namespace)
        return path

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
        return self._run(
            [str(self.toolchain.tool("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            check=check,
            input=input,
            timeout_seconds=timeout_seconds,
        )

    def helm(
        self, *args: str, check: bool = True, input: str | None = None, timeout_seconds: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster, with its config/cache/data kept inside run_dir."""
        helm_home = self.run_dir / "helm"
        env = {
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }
        return self._run(
            [str(self.toolchain.tool("helm")), f"--kubeconfig={self.kubeconfig}", *args],
            check=check,
            input=input,
            timeout_seconds=timeout_seconds,
            env=env,
        )

    def _run(
        self,
        argv: list[str],
        *,
        check: bool,
        input: str | None,
        timeout_seconds: float,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **(env or {})}
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout_seconds,
            check=False,
        )
        if check and result.returncode != 0:
            raise CommandError(result.returncode, argv, result.stdout, result.stderr)
        return result

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
        api = self.api_client()
        try:
            core = kube.client().CoreV1Api(api)
            existing = core.list_node(label_selector=f"{topology.NODE_POOL_LABEL}={pool.name}")
            if existing.items:
                raise ValueError(f"pool: a node pool named {pool.name!r} already exists")
            for manifest in pool.node_manifests():
                core.create_node(manifest)
        finally:
            api.close()
        if pool not in self.pools:
            self.pools.append(pool)
        names = pool.node_names()
        if wait:
            self.wait_nodes_ready(names)
        return names

    def remove_node_pool(self, name: str, *, wait: bool = True) -> list[str]:
        """Delete the pool's Nodes; returns their names. Pods bound to them are orphaned and
        garbage-collected by kube-controller-manager, as when GKE deletes a node pool."""
        api = self.api_client()
        try:
            core = kube.client().CoreV1Api(api)
            selector = f"{topology.NODE_POOL_LABEL}={name},{FAKE_NODE_LABEL}=true"
            nodes = [n.metadata.name for n in core.list_node(label_selector=selector).items]
            if not nodes:
                raise ValueError(f"pool: no node pool named {name!r}")
            for node in nodes:
                core.delete_node(node)
            if wait:
                wait_for(
                    f"nodes of pool {name} to be deleted",
                    lambda: not core.list_node(label_selector=selector).items,
                    self.startup_timeout_seconds,
                )
        finally:
            api.close()
        self.pools = [p for p in self.pools if p.name != name]
        return nodes

    def wait_nodes_ready(self, names: Sequence[str], timeout_seconds: float | None = None) -> None:
        """Wait until the nodes are Ready and free of the not-ready taint (pods can land)."""
        wanted = set(names)

        def all_ready() -> bool:
            api = self.api_client()
            try:
                nodes = (
                    kube.client().CoreV1Api(api).list_node(label_selector=f"{FAKE_NODE_LABEL}=true")
                )
            finally:
                api.close()
            ready = {n.metadata.name for n in nodes.items if _schedulable(n)}
            return wanted <= ready

        wait_for(
            f"{len(wanted)} nodes Ready",
            all_ready,
            timeout_seconds or self.startup_timeout_seconds,
            self.processes.get("kwok"),
        )

    # ---- diagnostics -----------------------------------------------------------------------

    def log_report(self, lines: int = 40) -> str:
        """The last lines of every component log, for a failing test's report."""
        parts = []
        for name, path in self.log_paths().items():
            state = "running" if self.processes[name].alive() else "NOT RUNNING"
            parts.append(f"---- {name} ({state}) {path}\n{tail(path, lines)}")
        return "\n".join(parts)


# Taints the node-lifecycle controller puts on nodes that are not (yet) Ready.
_NODE_HEALTH_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _schedulable(node: Any) -> bool:
    """Ready, and the node-lifecycle controller has lifted its not-ready taint."""
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    return ready and not any(t.key in _NODE_HEALTH_TAINTS for t in node.spec.taints or [])


def _port_open(port: int) -> bool:
    with socket.create_connection((LOOPBACK, port), timeout=2):
        return True


def default_run_dir() -> Path:
    """Where `tpuserve cluster up|down` keep a cluster unless told otherwise."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "tpuserve" / "cluster"
