"""The launch contract (`sglang_tpu.contract`) as the operator fills it in from a spec.

The one place the operator meets the contract: everything a model-server pod is told
(environment variables, the SGLang flags the launcher owns) comes through here, built with
the contract's own types and validators, so render code never spells a contract variable and
a spec the launcher would refuse is refused by validation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from sglang_tpu import lora, sgl_jax_flags, sglang_flags
from sglang_tpu.contract import pod_env
from sglang_tpu.contract.env_names import ENV_PREFIX, Var
from sglang_tpu.contract.group_contract import GroupContract
from sglang_tpu.contract.pod_env import FieldRef
from sglang_tpu.topology import lookup
from tpuserve_operator.api import TPUModelServerSpec
from tpuserve_operator.errors import InvalidSpec, Problem

# Variables the launcher derives from the contract (TorchTPU / libtpu / torch.distributed);
# a user value would silently win over the contract, so they are refused like TPUSERVE_*.
OWNED_ENV_PREFIXES = (ENV_PREFIX, "TPU_", "TORCH_TPU_", "LWS_")
OWNED_ENV_NAMES = frozenset(
    {"NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "HF_TOKEN"}
    | {"JAX_PLATFORMS", "JAX_COMPILATION_CACHE_DIR"}  # what SGLang-JAX's launch sets
)
# Flags a user may not pass in spec.engine.args: the launcher sets them, or they carry secrets.
OWNED_FLAG_NAMES = sglang_flags.OWNED_FLAGS | sglang_flags.SECRET_FLAGS
# The same for engine.type sglang-jax (SGLang-JAX's own flag names).
SGL_JAX_OWNED_FLAG_NAMES = sgl_jax_flags.OWNED_FLAGS | sgl_jax_flags.SECRET_FLAGS

# Where a contract variable comes from in the spec, for error messages.
_SPEC_FIELD: Mapping[str, str] = {
    Var.MODEL: "spec.model.source",
    Var.SERVED_MODEL_NAME: "spec.model.servedName",
    Var.QUANTIZATION: "spec.model.quantization",
    Var.CONTEXT_LENGTH: "spec.model.contextLength",
    Var.MODEL_ARCHITECTURE: "spec.model.architecture",
    Var.KV_CACHE_DTYPE: "spec.engine.kvCacheDtype",
    Var.EXECUTION_MODE: "spec.engine.executionMode",
    Var.SPECULATIVE_ALGORITHM: "spec.engine.speculative.algorithm",
    Var.SPECULATIVE_DRAFT_MODEL: "spec.engine.speculative.draftModel",
    Var.SPECULATIVE_NUM_STEPS: "spec.engine.speculative.numSteps",
    Var.LORA_ADAPTERS: "spec.model.loraAdapters",
    Var.HOST_KV_CACHE: "spec.kvCache.host.writePolicy",
    Var.HOST_KV_SIZE_GB: "spec.kvCache.host.sizeGB",
    Var.HOST_KV_RATIO: "spec.kvCache.host.ratio",
    Var.SGLANG_EXTRA_ARGS: "spec.engine.args",
    Var.TPU_GENERATION: "spec.tpu.generation",
    Var.TPU_TOPOLOGY: "spec.tpu.topology",
    Var.ENGINE_VERSION: "spec.engine.image",
}

HTTP_PORT = int(GroupContract.model_fields["http_port"].default)
KV_EVENTS_PORT = int(GroupContract.model_fields["kv_events_port"].default)
KV_REPLAY_PORT = KV_EVENTS_PORT + 1
"""The leaders' KV-event replay socket (SGLang's `replay_endpoint`; the contract leaves it off
by default): a router that subscribes late or misses batches catches up from it."""
HF_TOKEN_ENV = str(GroupContract.model_fields["hf_token_env"].default)
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
"""The engine container's terminationMessagePath (the kubelet's default), where the launcher
writes why its pre-flight refused to start (`TPUSERVE_TERMINATION_MESSAGE_PATH`)."""

# Per-pod values from the downward API, re-exported so render code imports them from here.
STATEFULSET_POD_INDEX = pod_env.STATEFULSET_POD_INDEX
LWS_WORKER_INDEX = pod_env.LWS_WORKER_INDEX
LWS_GROUP_KEY = pod_env.LWS_GROUP_KEY


@dataclass(frozen=True, slots=True)
class PodPaths:
    """Where the pod's writable volumes are mounted (the root filesystem is read-only)."""

    weights_cache_dir: str
    compile_cache_dir: str | None


def is_owned_env(name: str) -> bool:
    return name in OWNED_ENV_NAMES or name.startswith(OWNED_ENV_PREFIXES)


def is_owned_flag(flag: str, engine: str = "sglang") -> bool:
    """`flag` as written in spec.engine.args, with or without leading dashes, for the engine
    type `engine` (SGLang's flags, or SGLang-JAX's for sglang-jax)."""
    arg = "--" + flag.lstrip("-")
    name = arg.split("=", 1)[0]
    if engine == "sglang-jax":
        return sgl_jax_flags.canonical(name) in SGL_JAX_OWNED_FLAG_NAMES or (
            name in SGL_JAX_OWNED_FLAG_NAMES
        )
    return name in OWNED_FLAG_NAMES


def unknown_flag(flag: str, engine: str) -> str | None:
    """Why `flag` of spec.engine.args is no flag of the engine's server (None when it is, or
    when the engine's flags are not known: SGLang-TorchTPU is not public)."""
    if engine != "sglang-jax":
        return None
    name = "--" + flag.lstrip("-").split("=", 1)[0]
    found = sgl_jax_flags.unknown_flag(name)
    if found is None:
        return None
    return f"{found} is not a flag of SGLang-JAX's server; allowed: {sgl_jax_flags.ALLOWED_TEXT}"


def extra_args(args: Mapping[str, Any], engine: str = "sglang") -> tuple[str, ...]:
    """spec.engine.args as SGLang arguments: `{a: 1, b: true, c: false}` -> `--a 1 --b`.
    With sglang-jax, a value of a flag that takes a list (`--precompile-bs-paddings`) is
    split on spaces and commas: `"8 16, 32"` -> `--precompile-bs-paddings 8 16 32`."""
    out: list[str] = []
    for name, value in args.items():
        flag = "--" + name.lstrip("-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            if engine == "sglang-jax" and sgl_jax_flags.takes_list(flag):
                out += [flag, *str(value).replace(",", " ").split()]
            else:
                out += [flag, str(value)]
    return tuple(out)


def group_contract(
    spec: TPUModelServerSpec,
    *,
    served_name: str,
    replica: int,
    hostnames: tuple[str, ...],
    paths: PodPaths,
    drain_timeout_seconds: float,
    engine_version: str,
) -> GroupContract:
    """The contract every pod of replica group `replica` shares, validated by the contract.

    Raises InvalidSpec (field-named) when the contract refuses a value from the spec.
    """
    values: dict[str, Any] = {
        "model": spec.model.source,
        "served_model_name": served_name,
        "engine": spec.engine.type,
        "generation": spec.tpu.generation,
        "topology": spec.tpu.topology,
        "replica_index": replica,
        "execution_mode": spec.engine.execution_mode,
        "quantization": spec.model.quantization,
        "kv_cache_dtype": spec.engine.kv_cache_dtype,
        "context_length": spec.model.context_length,
        "model_architecture": (
            None
            if spec.model.architecture is None
            else json.dumps(spec.model.architecture.hf_config(), separators=(",", ":"))
        ),
        "lora_adapters": tuple(lora.lora_path(a.name, a.source) for a in spec.model.lora_adapters),
        "sglang_extra_args": extra_args(spec.engine.args, spec.engine.type),
        "weights_cache_dir": paths.weights_cache_dir,
        "compile_cache_dir": paths.compile_cache_dir,
        "engine_version": engine_version,
        "hf_token_env": HF_TOKEN_ENV,
        "kv_replay_port": KV_REPLAY_PORT,
        "drain_timeout_seconds": drain_timeout_seconds,
        "termination_message_path": TERMINATION_MESSAGE_PATH,
    }
    shape = lookup(spec.tpu.generation, spec.tpu.topology)
    values |= {"hosts": shape.hosts, "chips_per_host": shape.chips_per_host}
    if shape.multi_host:
        values["worker_hostnames"] = hostnames
    host_kv = spec.kv_cache.host if spec.kv_cache is not None else None
    if host_kv is not None:
        values |= {
            "host_kv_cache": host_kv.write_policy,
            "host_kv_size_gb": host_kv.size_gb,
            "host_kv_ratio": host_kv.ratio,
        }
    if spec.engine.speculative is not None:
        values |= {
            "speculative_algorithm": spec.engine.speculative.algorithm,
            "speculative_draft_model": spec.engine.speculative.draft_model,
            "speculative_num_steps": spec.engine.speculative.num_steps,
        }
    try:
        return GroupContract.model_validate({k: v for k, v in values.items() if v is not None})
    except pydantic.ValidationError as err:
        raise InvalidSpec([_problem(e) for e in err.errors()]) from None


def for_replica(group0: GroupContract, replica: int, hostnames: tuple[str, ...]) -> GroupContract:
    """Replica group `replica`'s contract from group 0's, with no validation (cannot fail).

    Groups differ only in their index and host names, which the API's bounds (name length,
    replicas plus surge) keep within what the contract accepts once group 0's names passed.
    """
    update: dict[str, Any] = {"replica_index": replica}
    if group0.worker_hostnames:
        update["worker_hostnames"] = hostnames
    return group0.model_copy(update=update)


def engine_env(
    group: GroupContract, *, host_index: FieldRef | int, group_key: FieldRef | None = None
) -> list[dict[str, Any]]:
    """The engine container's contract `env` (group values literal, per-pod values by fieldRef)."""
    return pod_env.pod_env(group, host_index=host_index, group_key=group_key)


def _problem(error: Mapping[str, Any]) -> Problem:
    loc = str(error["loc"][0]) if error["loc"] else ""
    field = GroupContract.model_fields.get(loc)
    variable = loc
    if field is not None and isinstance(field.validation_alias, str):
        variable = field.validation_alias
    where = _SPEC_FIELD.get(variable, "spec")
    message = str(error["msg"]).removeprefix("Value error, ")
    return Problem(where, f"the launch contract refuses it ({variable}): {message}")
