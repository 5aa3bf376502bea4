"""The TorchTPU and libtpu environment of one host, derived from its launch contract."""

from __future__ import annotations

from sglang_tpu.contract.launch_contract import LaunchContract


def torch_tpu_env(contract: LaunchContract) -> dict[str, str]:
    """The TorchTPU/libtpu rendezvous environment of one host, pinned from the contract.

    TorchTPU's `set_tpu_launch_env` never overwrites a variable that is set, so pinning all
    of them makes every host agree without TorchTPU querying device coordinates, reading
    `JOB_COMPLETION_INDEX` or falling back to 8 devices per host. `TORCH_TPU_TOPOLOGY` is
    the host-local topology, the value TorchTPU itself leaves there after ranking hosts
    (a slice topology set from outside would only be used to rank hosts, which `NODE_RANK`
    already does). libtpu reads `TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES` and
    `TPU_ACCELERATOR_TYPE` and asks the GCE metadata server (30 retries) for any it lacks;
    the handshake port is pinned so the pod can declare it.
    """
    shape = contract.shape
    hosts = contract.hostnames
    env = {
        "TPU_WORKER_HOSTNAMES": ",".join(hosts),
        "TPU_WORKER_ID": str(contract.host_index),
        "TPU_ACCELERATOR_TYPE": shape.accelerator_type,
        "TPU_PROCESS_PORT": str(contract.tpu_process_port),
        "TPU_PROCESS_ADDRESSES": ",".join(f"{h}:{contract.tpu_process_port}" for h in hosts),
        "TORCH_TPU_TOPOLOGY": shape.host_topology,
        "TORCH_TPU_DEVICES_PER_HOST": str(shape.devices_per_host),
        "TORCH_TPU_BASE_PORT": str(contract.slicebuilder_base_port),
        "TORCH_TPU_XPROF_SESSION_ID": contract.xprof_session_id,
        "TORCH_TPU_INTERNAL_HANDSHAKE_PORT": str(contract.torch_tpu_handshake_port),
    }
    if shape.multi_host:
        base = contract.slicebuilder_base_port
        env |= {
            "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(
                f"{h}:{base + i}" for h in hosts for i in range(shape.devices_per_host)
            ),
            "NNODES": str(shape.hosts),
            "NODE_RANK": str(contract.host_index),
            "MASTER_ADDR": contract.leader_address,
            "MASTER_PORT": str(contract.master_port),
        }
    return env
