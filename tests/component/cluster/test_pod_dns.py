"""Pods find each other by their DNS names: the pod runner's hosts file as their /etc/hosts.

Two pods of one subdomain (as a LeaderWorkerSet's are): a server binding the wildcard (its pod
address) and a client dialling `server.grp.ns.svc` from its environment through the system
resolver, with real processes on loopback (`tests.fakes.FakePodHost` keeps the runner's hosts
file, `tpuserve.cluster.pods.dns.HostsFile`). A pod without a subdomain keeps the machine's
/etc/hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakePodHost, pod_manifest
from tests.waiting import eventually_async
from tpuserve.cluster.pods import dns
from tpuserve.cluster.pods.container import INIT
from tpuserve.cluster.pods.pod import PodSupervisor
from tpuserve.cluster.ports import free_port

pytestmark = pytest.mark.component

IMAGE = "ghcr.io/tpuserve/tpuserve:test"
TIMEOUT_SECONDS = 120.0
LEADER = "server.grp.ns.svc"

CLIENT = """
import os, socket, sys, time, urllib.request
name = os.environ["LEADER"]
for _ in range(600):
    try:
        address = socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
        with urllib.request.urlopen(f"http://{name}:{os.environ['PORT']}/", timeout=5) as r:
            print("resolved", address, "status", r.status, flush=True)
            sys.exit(0)
    except OSError as err:
        print("not yet:", err, flush=True)
        time.sleep(0.2)
sys.exit(1)
"""


def user_namespaces() -> str | None:
    """None when container_init.py can mount a hosts file here, else why not."""
    probe = subprocess.run(
        [sys.executable, "-I", str(INIT), "--hosts", "/dev/null", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return probe.stderr.strip() or None


@pytest.fixture(scope="module", autouse=True)
def namespaces_allowed() -> None:
    problem = user_namespaces()
    if problem is not None:
        pytest.skip(
            f"this kernel refuses what the pod runner's DNS stand-in needs ({problem}); enable "
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
            "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04)"
        )


def python(name: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "command": ["python", "-c", code], **extra}


async def test_a_pod_reaches_a_peer_by_its_dns_name(tmp_path: Path) -> None:
    host = FakePodHost(tmp_path)
    host.dns = dns.HostsFile(tmp_path / dns.HOSTS_FILE)
    port = free_port()
    env = [{"name": "LEADER", "value": LEADER}, {"name": "PORT", "value": str(port)}]
    handler = "h.SimpleHTTPRequestHandler"
    serve = f"import http.server as h; h.test({handler}, port={port}, bind='0.0.0.0')"
    server = pod_manifest("server", [python("main", serve)], subdomain="grp")
    client = pod_manifest(
        "client", [python("main", CLIENT, env=env)], restart_policy="Never", subdomain="grp"
    )
    outsider = pod_manifest(
        "outsider",
        [python("main", "print(open('/etc/hosts').read())")],
        restart_policy="Never",
    )
    supervisors = [PodSupervisor(host, p) for p in (server, client, outsider)]
    tasks = [asyncio.create_task(s.run()) for s in supervisors]
    try:
        server_pod, client_pod, outsider_pod = supervisors

        async def client_done() -> bool:
            state = client_pod.containers[0].state.state
            return "terminated" in state

        await eventually_async(
            client_done,
            what="the client pod to reach the server by name and exit",
            timeout_seconds=TIMEOUT_SECONDS,
            interval_seconds=0.1,
        )
        log = (client_pod.pod_dir / "main.log").read_text()
        assert client_pod.containers[0].state.state["terminated"]["exitCode"] == 0, log
        assert f"resolved {server_pod.pod_ip} status 200" in log
        hosts = (tmp_path / dns.HOSTS_FILE).read_text()
        assert f"{server_pod.pod_ip} server.grp.ns.svc.cluster.local {LEADER} server.grp.ns" in (
            hosts
        )
        assert "outsider" not in hosts  # no subdomain, no name

        async def outsider_done() -> bool:
            return "terminated" in outsider_pod.containers[0].state.state

        await eventually_async(
            outsider_done, what="the outsider pod", timeout_seconds=TIMEOUT_SECONDS
        )
        assert dns.HEADER not in (outsider_pod.pod_dir / "main.log").read_text()
    finally:
        for supervisor in supervisors:
            supervisor.gone()
        for task in tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, TIMEOUT_SECONDS)


def test_the_hosts_file_keeps_its_inode_and_the_machines_entries(tmp_path: Path) -> None:
    system = tmp_path / "etc-hosts"
    system.write_text("127.0.0.1 localhost\n10.1.2.3 vm\n")
    hosts = dns.HostsFile(tmp_path / "hosts", system_hosts=system)
    inode = hosts.path.stat().st_ino
    pod = pod_manifest("w-0-1", [], subdomain="w-0", hostname="w-0-1", namespace="llm")
    hosts.refresh([(pod, "127.244.0.9")])
    text = hosts.path.read_text()
    assert text.startswith("127.0.0.1 localhost\n10.1.2.3 vm\n")
    names = "w-0-1.w-0.llm.svc.cluster.local w-0-1.w-0.llm.svc w-0-1.w-0.llm"
    assert text.endswith(f"{dns.HEADER}\n127.244.0.9 {names}\n")
    hosts.refresh([])
    assert "w-0-1" not in hosts.path.read_text()
    assert hosts.path.stat().st_ino == inode
