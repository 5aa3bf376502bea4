"""A pod's launch-contract environment, as the operator renders it, for tests of the launcher.

`contract_env()` gives the variables every pod gets (model, slice, host index); a test adds
the rest with `| {...}`. Names are spelled out, not taken from `Var`, so a renamed variable
fails the tests that use them. `contract_ports()` draws free loopback ports a launched
contract can use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.problems import ContractError
from tpuserve.cluster.ports import free_ports

PORT_DRAWS = 20


def contract_env(
    generation: str = "v6e",
    topology: str = "2x4",
    hosts: int = 1,
    chips_per_host: int = 8,
    host_index: int = 0,
    *,
    model: str = "/models/llama",
    worker_hostnames: Sequence[str] = (),
) -> dict[str, str]:
    """The contract of host `host_index` of a slice; `TPUSERVE_WORKER_HOSTNAMES` only when
    `worker_hostnames` is given (a multi-host slice needs it)."""
    env = {
        "TPUSERVE_MODEL": model,
        "TPUSERVE_TPU_GENERATION": generation,
        "TPUSERVE_TPU_TOPOLOGY": topology,
        "TPUSERVE_HOSTS": str(hosts),
        "TPUSERVE_CHIPS_PER_HOST": str(chips_per_host),
        "TPUSERVE_HOST_INDEX": str(host_index),
    }
    if worker_hostnames:
        env["TPUSERVE_WORKER_HOSTNAMES"] = ",".join(worker_hostnames)
    return env


def contract_ports(count: int, env_of: Callable[[list[int]], Mapping[str, str]]) -> list[int]:
    """`count` free ports with which `env_of(ports)` is a valid contract.

    Free ports are drawn where the contract's default ports lie too (SGLang's dist-init port
    20000 and the next 6, MASTER_PORT 29500, ...), and the launcher refuses a port that
    overlaps one of them (a CI run drew 20003): such a draw is made again. Any other problem
    of the contract is raised."""
    for _ in range(PORT_DRAWS):
        ports = free_ports(count)
        try:
            LaunchContract.from_env(env_of(ports))
        except ContractError as err:
            if all("overlaps" in problem.message for problem in err.problems):
                continue
            raise
        return ports
    raise RuntimeError(f"no {count} free ports clear of the contract's own in {PORT_DRAWS} draws")
