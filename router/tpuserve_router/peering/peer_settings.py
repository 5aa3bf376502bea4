"""What the peering settings need checked beyond their values: the key file, and whether the
hosts let peers reach each other (`tpuserve_router.config` checks the ports, peers and
names themselves)."""

from __future__ import annotations

from tpuserve_router.config import RouterConfig
from tpuserve_router.engines.worker_networks import is_loopback
from tpuserve_router.peering.peer_auth import key_file_problem


def peering_problems(config: RouterConfig) -> list[str]:
    """What is wrong with ``peer_key_file``, or with peering from ``host`` without it or to
    peers it cannot reach."""
    problems: list[str] = []
    if config.peer_key_file is not None:
        problem = key_file_problem(config.peer_key_file)
        if problem:
            problems.append(problem)
    elif config.peer_port and not is_loopback(config.host):
        problems.append(
            f"peer_port={config.peer_port} with host={config.host!r}: peering on an address "
            "other hosts reach needs peer_key_file (the replicas' shared secret: a peering "
            "port without it would give anyone every routing decision and the KV "
            "snapshot); without it, peering is allowed only on a loopback host"
        )
    remote = [
        e for e in config.peers if not is_loopback(e.removeprefix("tcp://").rpartition(":")[0])
    ]
    if config.peer_port and is_loopback(config.host) and remote:
        problems.append(
            f"host={config.host!r} with a peer on another host ({', '.join(remote)}): "
            "peers could not reach peer_port on a loopback address; allowed: host "
            "0.0.0.0, :: or an address of this host"
        )  # peers_from_dns's addresses are known only once resolved: `peers` warns then
    return problems
