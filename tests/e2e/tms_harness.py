"""Shared pieces of the end-to-end tests (the fixtures that use them are in conftest.py).

- `install_operator_rbac`: the CRDs (generated files) and, in namespace `tpuserve-e2e`, a
  ServiceAccount bound to exactly the generated RBAC rules; the operator runs with its
  token, so a missing permission fails the tests (least privilege checked for real);
- `OperatorProcess`: `tpuserve operator` as a local process on loopback ports, logs to a
  file that is shown when a wait fails; start, stop, kill -9, restart; `run_operator` runs
  one for a fixture, and `workload_kind(operator)` names what its replica groups are made of;
- `while_running` and `wait_until`: `tests.waiting.eventually` for checks that read a cluster
  while a process of ours serves it (fail at once when it exits, show its log on timeout);
- helpers to apply TPUModelServers and wait for their conditions.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.waiting import eventually
from tpuserve.cluster import Cluster
from tpuserve.cluster.ports import free_port
from tpuserve.cluster.process import ManagedProcess, tail
from tpuserve_operator import labels, rbac

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "charts/tpuserve/crds"
OPERATOR_NAMESPACE = "tpuserve-e2e"
OPERATOR_ACCOUNT = "tpuserve-operator"
TIMEOUT_SECONDS = 90.0
# A check reads a cluster or a process that may be restarting or not listening yet: any error
# it raises means "not yet" (a process of ours exiting is caught by `while_running` instead).
NOT_YET = (Exception,)
# Checks run kubectl or list objects: poll at a pace the shared 2-core machine can carry.
POLL_SECONDS = 0.3

T = TypeVar("T")


def while_running(process: ManagedProcess | None, check: Callable[[], T]) -> Callable[[], T]:
    """`check`, but failing the test at once once `process` has exited, with its log's end.

    It fails with `pytest.fail`, which is no `Exception`, so `eventually(..., ignore=NOT_YET)`
    does not take it for "not yet".
    """

    def checked() -> T:
        if process is not None and not process.alive():
            pytest.fail(
                f"{process.name} exited (code {process.exit_code()}); "
                f"last lines of {process.log_path}:\n{tail(process.log_path)}"
            )
        return check()

    return checked


@dataclass
class OperatorProcess:
    """The operator under test, run as `tpuserve operator` against the e2e cluster."""

    cluster: Cluster
    kubeconfig: Path
    log_dir: Path
    extra_args: tuple[str, ...] = ()
    process: ManagedProcess | None = None
    restarts: int = 0
    metrics_port: int = field(default_factory=free_port)
    liveness_port: int = field(default_factory=free_port)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.restarts}.log"

    def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "tpuserve",
            "operator",
            "--all-namespaces",
            "--kubeconfig",
            str(self.kubeconfig),
            "--listen-address",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--liveness-port",
            str(self.liveness_port),
            "--standalone",
            # kwok's pod IPs are fake: never dial them for cold-start reports
            "--skip-cold-start-reports",
            "--log-format",
            "plain",
            "--resync-seconds",
            "10",
            "--partial-group-seconds",
            "30",
            "--relist-seconds",
            "15",
            *self.extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        self.process = ManagedProcess.spawn("operator", argv, self.log_path, env=env)
        liveness = f"http://127.0.0.1:{self.liveness_port}/healthz"
        eventually(
            while_running(self.process, lambda: _http_ok(liveness)),
            what="the operator's liveness endpoint",
            timeout_seconds=TIMEOUT_SECONDS,
            interval_seconds=POLL_SECONDS,
            ignore=NOT_YET,
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies mid-reconcile."""
        assert self.process is not None
        assert self.process.popen is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.popen.wait(30)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            text: str = r.read().decode()
        return text

    def log_tail(self) -> str:
        return tail(self.log_path, 60)

    def log_report(self) -> str:
        """The end of the operator's log, for a failed wait's message."""
        return f"--- operator log ---\n{self.log_tail()}"


def _http_ok(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def install_operator_rbac(cluster: Cluster) -> Path:
    """CRDs, plus a ServiceAccount with exactly the generated rules; its kubeconfig."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS))
    cluster.wait_crds_established(
        [
            "tpumodelservers.serving.tpuserve.dev",
            "tpumodelserverroles.serving.tpuserve.dev",
            "tpugateways.serving.tpuserve.dev",
            "clusterkopfpeerings.kopf.dev",
        ]
    )
    every = (*rbac.OPERATOR_RULES, *rbac.OPERATOR_CLUSTER_RULES, *rbac.OPERATOR_CLUSTER_WIDE_RULES)
    rules = [r.as_policy_rule() for r in every]
    name = "tpuserve-e2e-operator"
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": OPERATOR_ACCOUNT, "namespace": OPERATOR_NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": OPERATOR_ACCOUNT,
                    "namespace": OPERATOR_NAMESPACE,
                }
            ],
        },
    ]
    cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(objects))
    return cluster.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)


def run_operator(
    cluster: Cluster, kubeconfig: Path, log_dir: Path, *extra_args: str
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(cluster, kubeconfig, log_dir, tuple(extra_args))
    process.start()
    try:
        yield process
    finally:
        process.stop()


WORKLOADS = {"leaderworkerset": "LeaderWorkerSet", "statefulset": "StatefulSet"}
"""`tpuserve operator --workload` values and the kind each makes a replica group of."""


def workload_kind(operator: OperatorProcess) -> str:
    """LeaderWorkerSet or StatefulSet: what this operator makes replica groups of."""
    return WORKLOADS[operator.extra_args[operator.extra_args.index("--workload") + 1]]


# -- TPUModelServers --------------------------------------------------------------------------


def server(
    name: str,
    generation: str,
    topology: str,
    *,
    replicas: int = 1,
    engine: str = "sglang",
    model: str = "hf://Qwen/Qwen3-8B",
    **spec: Any,
) -> dict[str, Any]:
    tpu = {"generation": generation, "topology": topology, **spec.pop("tpu", {})}
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {"source": model, "quantization": "fp8", "contextLength": 8192},
            "tpu": tpu,
            "replicas": replicas,
            "engine": {"type": engine},
            **spec,
        },
    }


def apply(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))


def get(cluster: Cluster, namespace: str, kind: str, name: str = "", selector: str = "") -> Any:
    args = ["get", kind, "-n", namespace, "-o", "yaml"]
    if name:
        args.insert(2, name)
    if selector:
        args += ["-l", selector]
    return yaml.safe_load(cluster.kubectl(*args).stdout)


def tms(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get(cluster, namespace, "tpumodelservers", name)
    return found


def condition(body: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def wait_until(
    what: str,
    check: Callable[[], T],
    operator: OperatorProcess,
    timeout_seconds: float = TIMEOUT_SECONDS,
) -> T:
    """`eventually(check)` while the operator runs; a timeout shows the operator's log tail."""
    return eventually(
        while_running(operator.process, check),
        what=what,
        timeout_seconds=timeout_seconds,
        interval_seconds=POLL_SECONDS,
        context=operator.log_report,
        ignore=NOT_YET,
    )


def wait_condition(
    cluster: Cluster,
    namespace: str,
    name: str,
    type_: str,
    status: str,
    operator: OperatorProcess,
    reason: str | None = None,
    timeout_seconds: float = TIMEOUT_SECONDS,
) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def check() -> bool:
        seen.clear()
        seen.update(tms(cluster, namespace, name))
        c = condition(seen, type_)
        return c.get("status") == status and (reason is None or c.get("reason") == reason)

    wait_until(
        f"{namespace}/{name} {type_}={status} {reason or ''}", check, operator, timeout_seconds
    )
    return seen


def children(cluster: Cluster, namespace: str, name: str) -> dict[str, list[str]]:
    """Names of the server's children by kind (operator-made objects only)."""
    selector = f"{labels.INSTANCE}={name},{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
    kinds = ",".join(
        (
            "statefulsets",
            "deployments",
            "services",
            "configmaps",
            "serviceaccounts",
            "roles",
            "rolebindings",
            "poddisruptionbudgets",
            "networkpolicies",
            "horizontalpodautoscalers",
            "leaderworkersets",
            labels.ROLE_PLURAL,
        )
    )
    listing = get(cluster, namespace, kinds, selector=selector)
    out: dict[str, list[str]] = {}
    for item in listing.get("items") or []:
        out.setdefault(item["kind"], []).append(item["metadata"]["name"])
    return {k: sorted(v) for k, v in out.items()}


def engine_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"{labels.INSTANCE}={name},{labels.COMPONENT}={labels.COMPONENT_MODEL_SERVER}"
    items: list[dict[str, Any]] = get(cluster, namespace, "pods", selector=selector)["items"]
    return items
