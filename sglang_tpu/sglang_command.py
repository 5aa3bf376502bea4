"""The SGLang command of one host of a slice, from its launch contract and the flag table
(`sglang_tpu.sglang_flags`, which names every flag the launcher owns and the contract reads;
this module reads the contract, so the table stays a leaf the contract can import)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sglang_tpu import hicache, lora
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.sglang_flags import (
    DEFAULT_PYTHON,
    KV_CACHE_DTYPES,
    QUANTIZATION_METHODS,
    SGLANG_MODULE,
    SPECULATIVE_ALGORITHMS,
    TPU_SGLANG_MODULE,
    cpu_flags,
)


def kv_events_config(contract: LaunchContract) -> str:
    """SGLang's `--kv-events-config` JSON: a bound ZMQ PUB (and optional replay ROUTER)."""
    host = "*" if contract.bind_host in ("0.0.0.0", "::") else contract.bind_host
    config: dict[str, object] = {
        "publisher": "zmq",
        "endpoint": f"tcp://{host}:{contract.kv_events_port}",
        "bind": True,
    }
    if contract.kv_replay_port is not None:
        config["replay_endpoint"] = f"tcp://{host}:{contract.kv_replay_port}"
    return json.dumps(config, separators=(",", ":"), sort_keys=True)


def host_kv_flags(contract: LaunchContract) -> list[str]:
    """The host-memory KV tier's flags (none when TPUSERVE_HOST_KV_CACHE is unset)."""
    if contract.host_kv_cache is None:
        return []
    return hicache.flags(contract.host_kv_size_gb, contract.host_kv_ratio, contract.host_kv_cache)


def model_format_flags(
    contract: LaunchContract,
    draft_path: str | None,
    quantization_methods: Mapping[str, str],
    kv_cache_dtypes: Mapping[str, str],
    speculative_algorithms: Mapping[str, str],
) -> list[str]:
    """The flags SGLang and SGLang-JAX spell alike for the model's format: quantization, KV
    cache dtype, context length and speculative decoding, each engine's values given by its
    own tables (`sglang_flags`, `sgl_jax_flags`)."""
    command: list[str] = []
    if contract.quantization != "none":
        command += ["--quantization", quantization_methods[contract.quantization]]
    if contract.kv_cache_dtype != "auto":
        command += ["--kv-cache-dtype", kv_cache_dtypes[contract.kv_cache_dtype]]
    if contract.context_length is not None:
        command += ["--context-length", str(contract.context_length)]
    if contract.speculative_algorithm != "none":
        command += [
            "--speculative-algorithm",
            speculative_algorithms[contract.speculative_algorithm],
        ]
        if draft_path is not None:
            command += ["--speculative-draft-model-path", draft_path]
        if contract.speculative_num_steps is not None:
            command += ["--speculative-num-steps", str(contract.speculative_num_steps)]
    return command


def sglang_command(
    contract: LaunchContract,
    model_path: str,
    draft_path: str | None,
    python: str = DEFAULT_PYTHON,
    adapter_paths: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """The SGLang server command for one host of the slice; paths (of the model, the draft
    model and each LoRA adapter by name) are already local. On a TPU the server starts
    through the TorchTPU adapter's entry (`TPU_SGLANG_MODULE`) with the same flags."""
    shape = contract.shape
    cpu = contract.device == "cpu"
    command = [
        python,
        *(SGLANG_MODULE if cpu else TPU_SGLANG_MODULE),
        "--model-path",
        model_path,
        "--served-model-name",
        contract.served_name,
        "--device",
        contract.device,
        "--tp-size",
        "1" if cpu else str(shape.devices),
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
    command += ["--kv-events-config", kv_events_config(contract)]
    command += model_format_flags(
        contract, draft_path, QUANTIZATION_METHODS, KV_CACHE_DTYPES, SPECULATIVE_ALGORITHMS
    )
    command += host_kv_flags(contract)
    command += lora.lora_args(adapter_paths)
    if cpu:
        command += cpu_flags()
    elif contract.execution_mode == "compiled":
        command.append("--enable-torch-compile")
    return command + list(contract.sglang_extra_args)
