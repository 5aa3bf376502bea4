"""Pods' DNS names without cluster DNS: one hosts file the runner keeps, seen as /etc/hosts.

In a cluster, a pod with `spec.subdomain` (every pod of a LeaderWorkerSet; a StatefulSet's
under its headless Service) is known by `HOSTNAME.SUBDOMAIN.NAMESPACE.svc.cluster.local`
(`HOSTNAME` defaulting to the pod's name), and its peers dial that name: a multi-host
engine's `--dist-init-addr` and `TPU_WORKER_HOSTNAMES` name the leader that way. There is no
cluster DNS here, so the pod runner keeps one hosts file, `RUN_DIR/hosts`: the machine's own
/etc/hosts, then a line per running pod with a subdomain, its loopback address and its name
with and without `.cluster.local` and without `.svc` (what a pod's DNS search path resolves).

Containers of a pod with a subdomain see that file as their /etc/hosts, as the kubelet mounts
a pod's /etc/hosts: `container_init.py --hosts FILE` enters a user and mount namespace of its
own and bind-mounts FILE there, so every resolver in the container finds the names (glibc's,
gRPC's c-ares in JAX's distributed runtime, libzmq's). Arguments and environment keep the
real DNS names. The file is rewritten in place (the bind mount holds its inode) whenever a pod
gets or gives up its address; a name that is not there yet fails to resolve, as a DNS record
not yet published does. Where the kernel refuses unprivileged user namespaces, the container
runs with the machine's /etc/hosts and its log says why.

Not emulated: the records exist whether or not a headless Service named SUBDOMAIN exists,
and Service names (`NAME.NS.svc`) are not in the file (clients use the local addresses).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

HOSTS_FILE = "hosts"
SYSTEM_HOSTS = Path("/etc/hosts")
CLUSTER_DOMAIN = "cluster.local"
HEADER = "# pods of the local cluster (tpuserve.cluster.pods.dns): name -> pod address"


def pod_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The pod's DNS names, longest first; none without `spec.subdomain`."""
    spec = pod.get("spec") or {}
    subdomain = spec.get("subdomain")
    if not subdomain:
        return ()
    metadata = pod["metadata"]
    hostname = spec.get("hostname") or metadata["name"]
    namespace = metadata.get("namespace", "default")
    short = f"{hostname}.{subdomain}.{namespace}"
    return (f"{short}.svc.{CLUSTER_DOMAIN}", f"{short}.svc", short)


def hosts_text(base: str, pods: Iterable[tuple[Mapping[str, Any], str]]) -> str:
    """`base` (the machine's hosts file), then `ADDRESS NAME...` for each (pod, address)."""
    lines = [base.rstrip("\n"), HEADER]
    for pod, address in sorted(pods, key=lambda p: pod_names(p[0])):
        names = pod_names(pod)
        if names and address:
            lines.append(f"{address} {' '.join(names)}")
    return "\n".join(lines) + "\n"


class HostsFile:
    """The runner's hosts file: `refresh` rewrites it when its pods' names or addresses
    change, in place, never through an empty file."""

    def __init__(self, path: Path, system_hosts: Path = SYSTEM_HOSTS) -> None:
        self.path = path
        try:
            self.base = system_hosts.read_text()
        except OSError:
            self.base = "127.0.0.1 localhost\n::1 localhost\n"
        self._written: str | None = None
        self.refresh(())

    def refresh(self, pods: Iterable[tuple[Mapping[str, Any], str]]) -> None:
        text = hosts_text(self.base, pods)
        if text == self._written:
            return
        data = text.encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        with self.path.open("r+b") as file:  # same inode: bind mounts of it see the change
            file.write(data)
            file.truncate(len(data))
        self._written = text


def needs_hosts(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's containers get the hosts file as /etc/hosts (pods with a subdomain,
    whose peers are known by DNS names)."""
    return bool(pod_names(pod))
