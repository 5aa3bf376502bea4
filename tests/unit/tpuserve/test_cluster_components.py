"""The control plane's pure parts: component command lines, kubeconfig files and the state file
a detached `tpuserve cluster up` leaves for `down` (nothing is started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tpuserve.cluster import components, kubeconfig
from tpuserve.cluster.cluster import STATE_FILE, Cluster
from tpuserve.cluster.components import Ports
from tpuserve.cluster.pki import PKI, create_pki
from tpuserve.cluster.pods.addresses import Network
from tpuserve.cluster.process import ManagedProcess, process_start_time
from tpuserve.cluster.toolchain import Toolchain

pytestmark = pytest.mark.unit

PORTS = Ports(2379, 2380, 6443, 10257, 10259, 10247, 9443, 8081)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return create_pki(tmp_path_factory.mktemp("pki"))


def toolchain(root: Path) -> Toolchain:
    return Toolchain(
        root / "k8s", root / "tools", "v1.36.3", "v3.6.16", "v0.8.0", "v0.9.0", "v0.85.0"
    )


def flags(argv: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in argv[1:] if "=" in a)


def test_etcd_listens_on_loopback_only(tmp_path: Path) -> None:
    argv = components.etcd_argv(Path("/bin/etcd"), tmp_path / "data", PORTS)
    got = flags(argv)
    assert argv[0] == "/bin/etcd"
    assert got["listen-client-urls"] == "http://127.0.0.1:2379"
    assert got["listen-peer-urls"] == "http://127.0.0.1:2380"
    assert got["data-dir"] == str(tmp_path / "data")


def test_apiserver_serves_tls_on_loopback_with_rbac_and_the_token_file(pki: PKI) -> None:
    got = flags(components.apiserver_argv(Path("apiserver"), PORTS, pki, default_route=True))
    assert (got["bind-address"], got["secure-port"]) == ("127.0.0.1", "6443")
    assert got["etcd-servers"] == "http://127.0.0.1:2379"
    assert got["tls-cert-file"] == str(pki.apiserver_cert)
    assert got["token-auth-file"] == str(pki.token_file)
    assert got["authorization-mode"] == "RBAC"
    assert got["disable-admission-plugins"] == "ServiceAccount"
    assert "advertise-address" not in got


def test_apiserver_advertises_a_never_dialled_address_without_a_default_route(pki: PKI) -> None:
    got = flags(components.apiserver_argv(Path("apiserver"), PORTS, pki, default_route=False))
    assert got["advertise-address"] == components.FALLBACK_ADVERTISE_ADDRESS


def test_default_route_is_read_from_the_route_table(tmp_path: Path) -> None:
    header = "Iface\tDestination\tGateway\tFlags\n"
    table = tmp_path / "route"
    table.write_text(header + "eth0\t00000000\t0100A8C0\t0003\n")
    assert components.has_default_route(table)
    table.write_text(header + "eth0\t0000A8C0\t00000000\t0001\n")
    assert not components.has_default_route(table)
    assert components.has_default_route(tmp_path / "missing")  # not Linux: apiserver decides


def test_controllers_bind_loopback_without_leader_election(pki: PKI, tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    manager = flags(components.controller_manager_argv(Path("kcm"), config, PORTS, pki))
    scheduler = flags(components.controller_argv(Path("sched"), config, PORTS.scheduler))
    for got, port in ((manager, "10257"), (scheduler, "10259")):
        assert (got["bind-address"], got["secure-port"]) == ("127.0.0.1", port)
        assert got["leader-elect"] == "false"
        assert got["kubeconfig"] == str(config)
    assert manager["root-ca-file"] == str(pki.ca_cert)


def test_kwok_manages_only_the_annotated_fake_nodes(tmp_path: Path) -> None:
    got = flags(components.kwok_argv(Path("kwok"), tmp_path / "k", tmp_path / "c.yaml", PORTS))
    assert got["manage-all-nodes"] == "false"
    assert got["manage-nodes-with-annotation-selector"] == "kwok.x-k8s.io/node=fake"
    assert got["server-address"] == "127.0.0.1:10247"


def test_kubeconfig_trusts_the_ca_holds_the_token_and_is_private(pki: PKI, tmp_path: Path) -> None:
    path = kubeconfig.write_kubeconfig(
        tmp_path / "kc", "https://127.0.0.1:6443", pki.ca_cert, "tok", "ns-reader", "ns"
    )
    config = yaml.safe_load(path.read_text())
    (cluster,) = config["clusters"]
    assert cluster["cluster"] == {
        "server": "https://127.0.0.1:6443",
        "certificate-authority": str(pki.ca_cert),
    }
    assert config["users"] == [{"name": "ns-reader", "user": {"token": "tok"}}]
    (context,) = config["contexts"]
    assert context["context"]["namespace"] == "ns"
    assert config["current-context"] == context["name"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_detached_cluster_is_attached_again_from_its_state_file(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = Cluster(run_dir, pools=[], lws=False, detach=True, toolchain=toolchain(tmp_path))
    started._create_pki()
    me = ManagedProcess(
        "etcd",
        ["etcd"],
        run_dir / "logs" / "etcd.log",
        os.getpid(),
        process_start_time(os.getpid()),
    )
    started.processes["etcd"] = me
    started.start_seconds = {"pki": 0.5}
    started._save_state()

    attached = Cluster.attach(run_dir, toolchain(tmp_path))
    assert attached.ports == started.ports
    assert attached.server == started.server
    assert attached.token == started.token
    assert (attached.lws_enabled, attached.detach) == (False, True)
    assert attached.start_seconds == {"pki": 0.5}
    assert attached.alive_processes() == ["etcd"]
    assert attached.processes["etcd"].popen is None  # re-attached by pid and start time
    assert (run_dir / STATE_FILE).exists()


def test_attach_without_a_state_file_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tpuserve cluster up"):
        Cluster.attach(tmp_path, toolchain(tmp_path))


def test_a_cluster_on_another_network_takes_its_service_range_and_pod_addresses(pki: PKI) -> None:
    network = Network(2)
    argv = components.apiserver_argv(
        Path("apiserver"), PORTS, pki, default_route=True, network=network
    )
    assert flags(argv)["service-cluster-ip-range"] == "10.98.0.0/16"
    runner = components.pod_runner_argv(Path("run"), Path("kubeconfig"), "https://x", pki, network)
    assert "--network=2" in runner
