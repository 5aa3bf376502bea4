"""The SGLang-JAX server of one host of a slice: its environment and command line.

`TPUSERVE_ENGINE=sglang-jax` runs `python -m sgl_jax.launch_server` (the flags it gets are
named in `sglang_tpu.sgl_jax_flags`). Tensor parallelism spans the whole slice (`--tp-size`
= its chips); a multi-host slice joins through SGLang-JAX's own distributed initialisation
(`--nnodes`, `--node-rank`, `--dist-init-addr`: `jax.distributed.initialize` with the leader
as coordinator), the leader's address and each pod's rank coming from the LeaderWorkerSet
as on the SGLang path. Only the leader serves the API (ranks >= 1 answer a bare /health).

The environment: libtpu's view of the slice (`TPU_WORKER_HOSTNAMES`, `TPU_WORKER_ID`,
`TPU_ACCELERATOR_TYPE`, pinned so every host agrees without asking the metadata server),
`JAX_PLATFORMS` equal to `--device` (SGLang-JAX asserts they agree), and JAX's persistent
compilation cache on the managed compile cache (`compile_cache.jax_cache_env`). None of
TorchTPU's variables are set. On the cpu development device, `sglang_tpu.sgl_jax_cpu_shim`
goes on its PYTHONPATH: its Pallas TPU kernels run in JAX's TPU interpret mode there.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_tpu import compile_cache, hicache, lora, sgl_jax_cpu_shim
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.sgl_jax_flags import (
    CPU_ENV,
    DEFAULT_PYTHON,
    HOST_KV_STORAGE,
    KV_CACHE_DTYPES,
    QUANTIZATION_METHODS,
    SGL_JAX_MODULE,
    SPECULATIVE_ALGORITHMS,
    cpu_flags,
    default_flags,
)
from sglang_tpu.sglang_command import model_format_flags

__all__ = ["DEFAULT_PYTHON", "sgl_jax_command", "sgl_jax_env", "tensor_parallel_size"]


def tensor_parallel_size(contract: LaunchContract) -> int:
    """The slice's devices on tpu (the catalog's: one per chip, two per tpu7x chip); one CPU
    device per host on cpu."""
    shape = contract.shape
    return shape.hosts if contract.device == "cpu" else shape.devices


def sgl_jax_env(contract: LaunchContract) -> dict[str, str]:
    """The server's environment beyond what it inherits (no secrets)."""
    if contract.device == "cpu":
        env = dict(CPU_ENV)
        # Pallas TPU kernels (the host tier's load back, PD's KV write) in TPU interpret
        # mode in every process of the server; `server_env` puts it before any inherited
        # PYTHONPATH.
        env["PYTHONPATH"] = str(sgl_jax_cpu_shim.PYTHONPATH_ENTRY)
    else:
        shape = contract.shape
        env = {
            "JAX_PLATFORMS": "tpu",
            "TPU_WORKER_HOSTNAMES": ",".join(contract.hostnames),
            "TPU_WORKER_ID": str(contract.host_index),
            "TPU_ACCELERATOR_TYPE": shape.accelerator_type,
        }
    return env | compile_cache.jax_cache_env(contract)


def host_kv_flags(contract: LaunchContract) -> list[str]:
    """SGLang-JAX's host tier: a pinned host pool behind the device cache (`none` storage)."""
    if contract.host_kv_cache is None:
        return []
    flags = ["--hicache-storage", HOST_KV_STORAGE]
    flags += [hicache.FLAG_WRITE_POLICY, contract.host_kv_cache]  # spelled alike
    if contract.host_kv_ratio is not None:
        flags += ["--hicache-ratio", f"{contract.host_kv_ratio:g}"]
    return flags


def sgl_jax_command(
    contract: LaunchContract,
    model_path: str,
    draft_path: str | None,
    python: str = DEFAULT_PYTHON,
    adapter_paths: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """The SGLang-JAX server command for one host; paths are already local."""
    shape = contract.shape
    command = [
        python,
        *SGL_JAX_MODULE,
        "--model-path",
        model_path,
        "--served-model-name",
        contract.served_name,
        "--device",
        contract.device,
        "--tp-size",
        str(tensor_parallel_size(contract)),
    ]
    if shape.multi_host:
        command += [
            "--nnodes",
            str(shape.hosts),
            "--node-rank",
            str(contract.host_index),
            "--dist-init-addr",
            f"{contract.leader_address}:{contract.dist_init_port}",
        ]
    command += ["--host", contract.bind_host, "--port", str(contract.http_port)]
    command += ["--enable-metrics", "--enable-cache-report"]
    command += model_format_flags(
        contract, draft_path, QUANTIZATION_METHODS, KV_CACHE_DTYPES, SPECULATIVE_ALGORITHMS
    )
    command += host_kv_flags(contract)
    command += lora.lora_args(adapter_paths)
    extra = list(contract.sglang_extra_args)
    command += default_flags(extra)
    if contract.device == "cpu":
        command += cpu_flags(extra)
    return command + extra
