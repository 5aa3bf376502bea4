"""End-to-end fixtures: ONE real control plane per test session, on loopback.

Fixtures for e2e tests (see docs/development.md, "The e2e fixture"):

- ``cluster`` (session): a started `tpuserve.cluster.Cluster` with the default node-pool
  profile (`tpuserve/cluster/profiles/default.yaml`) and, when built, the LWS controller. Use
  ``cluster.kubeconfig``, ``cluster.api_client()``, ``cluster.kubectl(...)``,
  ``cluster.helm(...)``, ``cluster.add_node_pool(...)`` / ``remove_node_pool(...)``,
  ``cluster.restart_apiserver()``. Tests share it: leave the default pools as they were and
  remove any pool you add.
- ``namespace`` (function): a fresh namespace, deleted (and waited for) after the test.
- ``core_v1``: a `kubernetes.client.CoreV1Api` bound to the cluster.
- ``operator_kubeconfig`` (session): the CRDs plus a ServiceAccount with exactly the operator's
  generated RBAC rules; the kubeconfig that authenticates as it.
- ``living_cluster`` (module): a second control plane whose pods really run (the pod runner,
  `Cluster(run_pods=True)`), with one CPU pool: the user's `tpuserve cluster up`. Pods get
  loopback addresses and Services answer at 127.X.A.B (X = 96 + its network, one per xdist
  worker); nothing else is shared with ``cluster``. The living-cluster modules form two xdist
  groups (tests/conftest.py), so two such clusters run side by side on two workers.
  One per worker, shared by the modules that use it: after each module no TPUModelServer, no
  engine pod and no chart release is left in it (the fixture deletes what a failed test left),
  so every module starts from a bare cluster; what a module adds otherwise (a node pool, a
  volume) it removes itself or names uniquely.
- ``operator`` (module): `tpuserve operator` as a local process, run once per workload kind
  (``--workload leaderworkerset``, then ``statefulset``): every test using it runs twice. A
  module that needs one operator parametrizes it: ``pytest.mark.parametrize("operator",
  ["statefulset"], indirect=True)`` (or ``auto``, the operator's default).

Without the control-plane binaries the tests skip, saying how to build them; under CI=true
they fail instead, so CI never counts a skipped e2e suite as a pass. When a test that used the
cluster fails, the tail of every component's log is added to its report.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.tms_harness import (
    NOT_YET,
    POLL_SECONDS,
    WORKLOADS,
    OperatorProcess,
    install_operator_rbac,
    run_operator,
)
from tests.waiting import eventually
from tpuserve.cluster import Cluster, NodePool, Toolchain, ToolchainMissing, kube
from tpuserve.cluster.pods.addresses import NETWORKS, Network
from tpuserve_operator import labels

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
NAMESPACE_DELETE_TIMEOUT_SECONDS = 120.0
LIVING_RESET_TIMEOUT_SECONDS = 240.0
CHART_RELEASE = "tpuserve"  # tests/e2e/fleet_harness.py installs the chart under this name
CHART_NAMESPACE = "tpuserve-system"
_session_clusters: dict[str, Cluster] = {}  # fixture name -> its running cluster


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: e2e tests never skip)", pytrace=False)
    pytest.skip(f"{reason}. `make test` builds them; or run scripts/build-control-plane.sh")


@pytest.fixture(scope="session")
def toolchain() -> Toolchain:
    try:
        found = Toolchain.discover()
    except ToolchainMissing as err:
        _unavailable(str(err))
        raise
    missing = found.missing_binaries()
    if missing:
        _unavailable(
            f"control-plane binaries missing in {found.k8s_bin}: {', '.join(missing)} "
            "(building them needs Go 1.26+)"
        )
    return found


@pytest.fixture(scope="session")
def cluster(toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from _running(
        "cluster", Cluster(tmp_path_factory.mktemp("control-plane"), toolchain=toolchain)
    )


@pytest.fixture(scope="session")
def living_session_cluster(
    toolchain: Toolchain, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from _running(
        "living_cluster",
        Cluster(
            tmp_path_factory.mktemp("living-cluster"),
            pools=[NodePool.cpu_pool("cpu", nodes=2)],
            run_pods=True,
            toolchain=toolchain,
            network=living_network(),
        ),
    )


def living_network() -> Network:
    """Each pytest-xdist worker's living cluster gets address ranges of its own (its pods bind
    their ports on them): network 1 + the worker's number, so none is the default network (0)
    of a `tpuserve cluster up` or a component test's pod runner."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return Network(1 + int(worker.removeprefix("gw")) % (NETWORKS - 1))


@pytest.fixture(scope="module")
def living_cluster(living_session_cluster: Cluster) -> Iterator[Cluster]:
    """The session's living cluster, left bare for the next module (see the module doc)."""
    yield living_session_cluster
    _reset_living(living_session_cluster)


def _reset_living(cluster: Cluster) -> None:
    """Delete every TPUModelServer (while the chart's operator, if installed, still runs), wait
    for the engine and router pods to go, then uninstall the chart."""
    crd = f"{labels.PLURAL}.{labels.GROUP}"
    if cluster.kubectl("get", "crd", crd, check=False).returncode == 0:  # a chart was installed
        cluster.kubectl("delete", labels.PLURAL, "--all", "--all-namespaces", "--wait=false")
    gateways = f"{labels.GATEWAY_PLURAL}.{labels.GROUP}"
    if cluster.kubectl("get", "crd", gateways, check=False).returncode == 0:
        cluster.kubectl("delete", gateways, "--all", "--all-namespaces", "--wait=false")
    managed = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"

    def nothing_left() -> bool:
        servers = cluster.kubectl("get", crd, "-A", "-o", "name", check=False).stdout.split()
        pods = cluster.kubectl("get", "pods", "-A", "-l", managed, "-o", "name").stdout.split()
        routers = cluster.kubectl("get", "pods", "-A", "-l", labels.GATEWAY, "-o", "name").stdout
        return not servers and not pods and not routers.split()

    eventually(
        nothing_left,
        what="the living cluster's TPUModelServers and their pods to be gone",
        timeout_seconds=LIVING_RESET_TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
    )
    cluster.helm(
        "uninstall", CHART_RELEASE, "--namespace", CHART_NAMESPACE, "--ignore-not-found", "--wait"
    )


def _running(role: str, cluster: Cluster) -> Iterator[Cluster]:
    """Start `cluster`, yield it, stop it and check that none of its processes is left."""
    cluster.start()
    _session_clusters[role] = cluster
    try:
        yield cluster
    finally:
        cluster.stop()
        del _session_clusters[role]
        leftovers = cluster.alive_processes()
        assert not leftovers, f"processes left after teardown: {leftovers}"


@pytest.fixture
def core_v1(cluster: Cluster) -> Iterator[Any]:
    api = cluster.api_client()
    try:
        yield kube.client().CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture
def namespace(cluster: Cluster, core_v1: Any) -> Iterator[str]:
    """A fresh namespace. Afterwards it is deleted and its pods are waited for (so their TPU
    capacity is free for the next test); the namespace object itself finishes on its own."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace({"metadata": {"name": name}})
    yield name
    core_v1.delete_namespace(name)
    # The namespace is Terminating, so nothing can recreate pods; removing them now rather than
    # when the namespace controller gets to them saves seconds per test.
    core_v1.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    eventually(
        lambda: not core_v1.list_namespaced_pod(name).items,
        what=f"pods of namespace {name} to be deleted",
        timeout_seconds=NAMESPACE_DELETE_TIMEOUT_SECONDS,
        interval_seconds=POLL_SECONDS,
        ignore=NOT_YET,
    )


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster: Cluster) -> Path:
    return install_operator_rbac(cluster)


@pytest.fixture(scope="module", params=sorted(WORKLOADS))
def operator(
    request: pytest.FixtureRequest,
    cluster: Cluster,
    operator_kubeconfig: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    log_dir = tmp_path_factory.mktemp(f"operator-{request.param}")
    yield from run_operator(cluster, operator_kubeconfig, log_dir, "--workload", request.param)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    names = set(getattr(item, "fixturenames", ()))
    if report.failed:
        for role, used in sorted(_session_clusters.items()):
            if role in names:
                report.sections.append((f"control-plane logs ({role})", used.log_report()))
    return report
