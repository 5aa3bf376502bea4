"""kwok's configuration: the upstream "fast" stages, read from kwok's module in the Go cache.

Standalone kwok exits with "no stages found" unless stages are given. The stages used are the
ones of kwok's `kustomize/stage/fast` bundle: nodes become Ready at once and keep a lease
heartbeat; pods bound to a kwok node go straight to Running with Ready=True (so Endpoints and
EndpointSlices list them), Job pods complete, and deleted pods are released (no kubelet).

Pod IPs come from `POD_CIDR` and node IPs are `NODE_IP`: both are fake, private addresses that
exist only in API objects. Nothing may ever dial them.
"""

from __future__ import annotations

from pathlib import Path

POD_CIDR = "10.244.0.0/16"
NODE_IP = "10.255.0.1"
NODE_LEASE_DURATION_SECONDS = 40
NODE_STAGE_FILES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
)
POD_STAGE_FILES = (
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


def kwok_config(kwok_module_dir: Path, *, pod_stages: bool = True) -> str:
    """A multi-document Stage file for `kwok --config`.

    Without `pod_stages` kwok only keeps the nodes Ready and leaves pods alone: the pod runner
    (`tpuserve.cluster.pods`) then runs them and writes their status.

    It holds no KwokConfiguration: kwok v0.8.0 applies its option defaults (parallelism of
    the lease and stage workers among them) only when the config file has none, and exits
    with "node leases parallelism must be greater than 0" otherwise. Options go in as flags.
    """
    stage_dir = kwok_module_dir / "kustomize" / "stage"
    names = NODE_STAGE_FILES + (POD_STAGE_FILES if pod_stages else ())
    docs = [(stage_dir / name).read_text() for name in names]
    return "---\n".join(doc if doc.endswith("\n") else doc + "\n" for doc in docs)


def kwok_flags() -> list[str]:
    return [
        f"--cidr={POD_CIDR}",
        f"--node-ip={NODE_IP}",
        f"--node-lease-duration-seconds={NODE_LEASE_DURATION_SECONDS}",
    ]
