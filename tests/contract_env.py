"""A pod's launch-contract environment, as the operator renders it, for tests of the launcher.

`contract_env()` gives the variables every pod gets (model, slice, host index); a test adds
the rest with `| {...}`. Names are spelled out, not taken from `Var`, so a renamed variable
fails the tests that use them.
"""

from __future__ import annotations

from collections.abc import Sequence


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
