"""The launch contract: every variable the operator sets on a model-server pod, defined once.

The operator builds a `GroupContract` (what every pod of a replica group shares) and turns it
into a pod template's `env` with `pod_env`; per-pod values (host index, replica index under
LeaderWorkerSet, pod name and IP) come from the downward API. Inside the pod,
`tpuserve engine launch` reads the same variables back with `LaunchContract.from_env`, which
reports every problem at once, and derives the TorchTPU environment (`torch_tpu_env`) and the
SGLang command (`sglang_tpu.sglang_flags`).

Each field below is one environment variable: its name (`Var`), type, default, the values
allowed and a description live on the field, and `variables()` lists them for the docs.

Hostnames. A replica group's hosts reach each other by stable DNS names in a headless
Service; `TPUSERVE_WORKER_HOSTNAMES` lists them in host-index order, so every host derives
the same `TPU_WORKER_HOSTNAMES` and `MASTER_ADDR` (the first name). Under LeaderWorkerSet
one pod template serves every group, so the list may contain `{replica}`, replaced by the
pod's `TPUSERVE_REPLICA_INDEX`; `statefulset_hostnames` and `lws_hostnames` build the lists.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticUndefined

from sglang_tpu import model_source, perf_model, sglang_flags
from sglang_tpu.topology import (
    CatalogError,
    SliceShape,
    generation_names,
    lookup,
    topologies_for,
)

log = logging.getLogger(__name__)

ENV_PREFIX = "TPUSERVE_"
REPLICA_PLACEHOLDER = "{replica}"


class Var(StrEnum):
    """The environment variable names of the contract (the only place they are spelled)."""

    MODEL = "TPUSERVE_MODEL"
    SERVED_MODEL_NAME = "TPUSERVE_SERVED_MODEL_NAME"
    ENGINE = "TPUSERVE_ENGINE"
    TPU_GENERATION = "TPUSERVE_TPU_GENERATION"
    TPU_TOPOLOGY = "TPUSERVE_TPU_TOPOLOGY"
    HOSTS = "TPUSERVE_HOSTS"
    CHIPS_PER_HOST = "TPUSERVE_CHIPS_PER_HOST"
    REPLICA_INDEX = "TPUSERVE_REPLICA_INDEX"
    WORKER_HOSTNAMES = "TPUSERVE_WORKER_HOSTNAMES"
    GROUP_KEY = "TPUSERVE_GROUP_KEY"
    BIND_HOST = "TPUSERVE_BIND_HOST"
    HTTP_PORT = "TPUSERVE_HTTP_PORT"
    METRICS_PORT = "TPUSERVE_METRICS_PORT"
    KV_EVENTS_PORT = "TPUSERVE_KV_EVENTS_PORT"
    KV_REPLAY_PORT = "TPUSERVE_KV_REPLAY_PORT"
    DIST_INIT_PORT = "TPUSERVE_DIST_INIT_PORT"
    MASTER_PORT = "TPUSERVE_MASTER_PORT"
    TPU_PROCESS_PORT = "TPUSERVE_TPU_PROCESS_PORT"
    SLICEBUILDER_BASE_PORT = "TPUSERVE_SLICEBUILDER_BASE_PORT"
    EXECUTION_MODE = "TPUSERVE_EXECUTION_MODE"
    QUANTIZATION = "TPUSERVE_QUANTIZATION"
    KV_CACHE_DTYPE = "TPUSERVE_KV_CACHE_DTYPE"
    CONTEXT_LENGTH = "TPUSERVE_CONTEXT_LENGTH"
    SPECULATIVE_ALGORITHM = "TPUSERVE_SPECULATIVE_ALGORITHM"
    SPECULATIVE_DRAFT_MODEL = "TPUSERVE_SPECULATIVE_DRAFT_MODEL"
    SPECULATIVE_NUM_STEPS = "TPUSERVE_SPECULATIVE_NUM_STEPS"
    SGLANG_EXTRA_ARGS = "TPUSERVE_SGLANG_EXTRA_ARGS"
    SIM_MODEL_PROFILE = "TPUSERVE_SIM_MODEL_PROFILE"
    COMPILE_CACHE_DIR = "TPUSERVE_COMPILE_CACHE_DIR"
    GCS_FUSE_ROOT = "TPUSERVE_GCS_FUSE_ROOT"
    WEIGHTS_CACHE_DIR = "TPUSERVE_WEIGHTS_CACHE_DIR"
    HF_TOKEN_ENV = "TPUSERVE_HF_TOKEN_ENV"
    DRAIN_TIMEOUT_SECONDS = "TPUSERVE_DRAIN_TIMEOUT_SECONDS"
    HOST_INDEX = "TPUSERVE_HOST_INDEX"
    POD_NAME = "TPUSERVE_POD_NAME"
    POD_IP = "TPUSERVE_POD_IP"


# -- problems -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the contract: the variable, its value and what is allowed."""

    variable: str
    value: str | None  # None: the variable is not set
    message: str
    allowed: str

    def __str__(self) -> str:
        shown = "unset" if self.value is None else repr(self.value)
        return f"{self.variable}={shown}: {self.message}; allowed: {self.allowed}"


class ContractError(ValueError):
    """The pod's launch contract is missing values or inconsistent; lists every problem."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = f"{len(self.problems)} problem" + ("s" if len(self.problems) != 1 else "")
        super().__init__(f"invalid launch contract ({count}):\n{lines}")


# -- field types ----------------------------------------------------------------------------


def _split_list(value: object) -> object:
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


def _split_args(value: object) -> object:
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as err:  # unbalanced quotes
            raise ValueError(f"not a shell-quoted argument list ({err})") from None
    return value


Port = Annotated[int, Field(ge=1, le=65535)]
Index = Annotated[int, Field(ge=0, le=100_000)]
HostnameList = Annotated[tuple[str, ...], BeforeValidator(_split_list)]
ArgList = Annotated[tuple[str, ...], BeforeValidator(_split_args)]

_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

PORTS_ALLOWED = "an integer from 1 to 65535"
# Port fields in validation order and the ports each occupies: SGLang binds --dist-init-addr's
# port and the next 6; TorchTPU binds one slicebuilder port per device of the host (0 here:
# resolved from the slice shape by `_port_width`).
_PORT_WIDTHS = {
    "http_port": 1,
    "kv_events_port": 1,
    "kv_replay_port": 1,
    "dist_init_port": 7,
    "master_port": 1,
    "tpu_process_port": 1,
    "slicebuilder_base_port": 0,
}


def _port_width(field_name: str, info: ValidationInfo) -> int:
    width = _PORT_WIDTHS[field_name]
    if width == 0:
        shape = _shape_from(info)
        return shape.devices_per_host if shape else 1
    return width


ABSOLUTE_PATH = "an absolute path"


def var(
    name: Var,
    allowed: str,
    doc: str,
    *,
    default: Any = PydanticUndefined,
    scope: Literal["group", "pod"] = "group",
    **constraints: Any,
) -> Any:
    """A field bound to its environment variable (name, allowed values, description)."""
    return Field(
        default,
        validation_alias=name.value,
        description=doc,
        json_schema_extra={"env": name.value, "allowed": allowed, "scope": scope},
        **constraints,
    )


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _check_absolute(value: str | None) -> str | None:
    if value is not None and (not value.startswith("/") or "/../" in f"{value}/"):
        raise ValueError("not an absolute path")
    return value


def _shape_from(info: ValidationInfo) -> SliceShape | None:
    """The slice shape when generation and topology already validated, else None."""
    generation, topology = info.data.get("generation"), info.data.get("topology")
    if generation is None or topology is None:
        return None
    return lookup(generation, topology)


# -- the contract ---------------------------------------------------------------------------


class GroupContract(BaseModel):
    """What every pod of one replica group shares (plus the replica index)."""

    # validate_default: consistency checks (hostnames for a multi-host slice, port overlaps, a
    # weights cache for downloads) must also run when a variable is left at its default.
    model_config = ConfigDict(
        frozen=True, populate_by_name=True, extra="ignore", validate_default=True
    )

    model: str = var(
        Var.MODEL,
        model_source.ALLOWED_FORMS,
        "Where the weights come from. hf:// downloads into the weights cache; gs:// reads "
        "the GCS FUSE mount or downloads; pvc:// reads the claim the operator mounted.",
    )
    served_model_name: str | None = var(
        Var.SERVED_MODEL_NAME,
        "any non-empty name; default: the HF repo id or the last path segment",
        "The `model` clients send (`/v1/models`).",
        default=None,
    )
    engine: Literal["sglang", "simulated"] = var(
        Var.ENGINE,
        "sglang, simulated",
        "sglang runs SGLang on TorchTPU; simulated runs `tpuserve engine sim` with the "
        "same topology and ports (CPU-only clusters).",
        default="sglang",
    )
    generation: str = var(
        Var.TPU_GENERATION, ", ".join(generation_names()), "TPU generation (topology catalog)."
    )
    topology: str = var(
        Var.TPU_TOPOLOGY,
        "a topology of that generation in the catalog",
        "Slice shape as GKE labels it (cloud.google.com/gke-tpu-topology).",
    )
    hosts: int = var(
        Var.HOSTS,
        "the catalog's host count for generation and topology",
        "TPU VMs (pods) in the slice; checked against the catalog so an operator and an "
        "image with different catalogs fail here, not at rendezvous.",
        ge=1,
    )
    chips_per_host: int = var(
        Var.CHIPS_PER_HOST,
        "the catalog's chips per host for generation and topology",
        "TPU chips each pod requests (google.com/tpu); checked against the catalog.",
        ge=1,
    )
    replica_index: Index = var(
        Var.REPLICA_INDEX,
        "an integer >= 0",
        "Which replica (group) of the TPUModelServer this pod belongs to.",
        scope="pod",
        default=0,
    )
    worker_hostnames: HostnameList = var(
        Var.WORKER_HOSTNAMES,
        "comma-separated DNS names or IPv4 addresses, one per host, in host-index order; "
        f"may contain {REPLICA_PLACEHOLDER}; required when hosts > 1",
        "Stable names of the group's hosts; the first is the leader (MASTER_ADDR, "
        "--dist-init-addr). Default for one host: localhost.",
        default=(),
    )
    group_key: str | None = var(
        Var.GROUP_KEY,
        "any string up to 253 characters, the same on every pod of the group",
        "A key every pod of the group shares (LWS: the group-key label); seeds the "
        "shared TorchTPU profiling session id. Default: the leader hostname and replica.",
        scope="pod",
        default=None,
        max_length=253,
    )
    bind_host: str = var(
        Var.BIND_HOST, "an IPv4 address or ::", "Address the servers listen on.", default="0.0.0.0"
    )
    http_port: Port = var(
        Var.HTTP_PORT, PORTS_ALLOWED, "SGLang HTTP API and /metrics.", default=30000
    )
    metrics_port: Port | None = var(
        Var.METRICS_PORT,
        "unset or equal to TPUSERVE_HTTP_PORT",
        "Where /metrics is served; SGLang serves it on the HTTP port.",
        default=None,
    )
    kv_events_port: Port = var(
        Var.KV_EVENTS_PORT, PORTS_ALLOWED, "ZMQ PUB port of KV-cache events.", default=5557
    )
    kv_replay_port: Port | None = var(
        Var.KV_REPLAY_PORT,
        PORTS_ALLOWED,
        "ZMQ ROUTER port replaying recent KV events.",
        default=None,
    )
    dist_init_port: Port = var(
        Var.DIST_INIT_PORT,
        "an integer from 1 to 65528",
        "Port of SGLang's --dist-init-addr on the leader; SGLang also uses the next 6.",
        default=20000,
    )
    master_port: Port = var(
        Var.MASTER_PORT, PORTS_ALLOWED, "torch.distributed MASTER_PORT.", default=29500
    )
    tpu_process_port: Port = var(
        Var.TPU_PROCESS_PORT, PORTS_ALLOWED, "libtpu TPU_PROCESS_PORT.", default=8476
    )
    slicebuilder_base_port: Port = var(
        Var.SLICEBUILDER_BASE_PORT,
        PORTS_ALLOWED,
        "TORCH_TPU_BASE_PORT: TorchTPU uses base .. base + devices per host - 1 on each host.",
        default=8070,
    )
    execution_mode: Literal["compiled", "eager", "eager-defer-and-fuse", "eager-debug"] = var(
        Var.EXECUTION_MODE,
        "compiled, eager, eager-defer-and-fuse, eager-debug",
        "How TorchTPU runs the model: torch.compile graphs, eager op by op, eager with "
        "deferred fused launches, or eager with blocking launches for debugging.",
        default="compiled",
    )
    quantization: Literal["none", "fp8", "mxfp4", "nvfp4"] = var(
        Var.QUANTIZATION, "none, fp8, mxfp4, nvfp4", "Weight quantization.", default="none"
    )
    kv_cache_dtype: Literal["auto", "fp8"] = var(
        Var.KV_CACHE_DTYPE, "auto, fp8", "KV-cache data type.", default="auto"
    )
    context_length: int | None = var(
        Var.CONTEXT_LENGTH,
        "an integer >= 1",
        "Maximum context length in tokens.",
        default=None,
        ge=1,
    )
    speculative_algorithm: Literal["none", "EAGLE3", "MTP"] = var(
        Var.SPECULATIVE_ALGORITHM,
        "none, EAGLE3, MTP",
        "Speculative decoding: EAGLE-3 with a draft model, or the model's own MTP heads.",
        default="none",
    )
    speculative_draft_model: str | None = var(
        Var.SPECULATIVE_DRAFT_MODEL,
        f"{model_source.ALLOWED_FORMS}; required for EAGLE3, unset when speculation is off",
        "Draft model for speculative decoding.",
        default=None,
    )
    speculative_num_steps: int | None = var(
        Var.SPECULATIVE_NUM_STEPS,
        "an integer from 1 to 64; unset when speculation is off",
        "Draft steps per verification.",
        default=None,
        ge=1,
        le=64,
    )
    sglang_extra_args: ArgList = var(
        Var.SGLANG_EXTRA_ARGS,
        "shell-quoted SGLang arguments, none of the flags the launcher sets, no secrets",
        "Appended to the SGLang command line.",
        default=(),
    )
    sim_model_profile: str | None = var(
        Var.SIM_MODEL_PROFILE,
        "a profile of sglang_tpu.perf_model or a known HF model id",
        "Model profile of the simulated engine; default: looked up from the HF model id.",
        default=None,
    )
    compile_cache_dir: str | None = var(
        Var.COMPILE_CACHE_DIR,
        ABSOLUTE_PATH,
        "Persistent compilation cache (share it between replicas of the same model and "
        "topology); unset: no persistent cache.",
        default=None,
    )
    gcs_fuse_root: str | None = var(
        Var.GCS_FUSE_ROOT,
        ABSOLUTE_PATH,
        "Where the operator mounted gs:// buckets with GCS FUSE (bucket b at <root>/b); "
        "unset: gs:// models are downloaded into the weights cache.",
        default=None,
    )
    weights_cache_dir: str | None = var(
        Var.WEIGHTS_CACHE_DIR,
        f"{ABSOLUTE_PATH}; required for hf:// and for gs:// without TPUSERVE_GCS_FUSE_ROOT",
        "Where downloaded weights land; a volume that survives container restarts.",
        default=None,
    )
    hf_token_env: str = var(
        Var.HF_TOKEN_ENV,
        "an environment variable name",
        "Name of the variable holding the Hugging Face token (from a Secret); the token "
        "itself is never logged or printed.",
        default="HF_TOKEN",
    )
    drain_timeout_seconds: float = var(
        Var.DRAIN_TIMEOUT_SECONDS,
        "a number of seconds > 0 and <= 3600",
        "After SIGTERM, how long the engine may drain before it is killed; keep it below "
        "the pod's terminationGracePeriodSeconds.",
        default=25.0,
        gt=0,
        le=3600,
    )

    # -- validators (run in field order; `info.data` holds the fields validated so far) ----

    @field_validator("model", "speculative_draft_model")
    @classmethod
    def _model_source(cls, value: str | None) -> str | None:
        if value is not None:
            model_source.parse_model_source(value)
        return value

    @field_validator("served_model_name", "group_key", "sim_model_profile")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("blank")
        return value

    @field_validator("generation")
    @classmethod
    def _generation(cls, value: str) -> str:
        from sglang_tpu.topology import get_generation

        get_generation(value)
        return value

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: str, info: ValidationInfo) -> str:
        generation = info.data.get("generation")
        if generation is not None:
            try:
                lookup(generation, value)
            except CatalogError as err:
                allowed = ", ".join(topologies_for(generation))
                raise ValueError(
                    f"not a {generation} topology ({generation} has {allowed})"
                ) from err
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: int, info: ValidationInfo) -> int:
        shape = _shape_from(info)
        if shape is not None and value != shape.hosts:
            raise ValueError(f"{shape.key} has {shape.hosts} hosts, not {value}")
        return value

    @field_validator("chips_per_host")
    @classmethod
    def _chips_per_host(cls, value: int, info: ValidationInfo) -> int:
        shape = _shape_from(info)
        if shape is not None and value != shape.chips_per_host:
            raise ValueError(f"{shape.key} has {shape.chips_per_host} chips per host, not {value}")
        return value

    @field_validator("worker_hostnames")
    @classmethod
    def _worker_hostnames(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        hosts = info.data.get("hosts")
        if hosts is not None and hosts > 1 and not value:
            raise ValueError(f"required: the slice has {hosts} hosts")
        if hosts is not None and value and len(value) != hosts:
            raise ValueError(f"{len(value)} names for {hosts} hosts")
        for name in value:
            concrete = name.replace(REPLICA_PLACEHOLDER, "0")
            if not (_DNS_NAME.match(concrete) or _is_ipv4(concrete)):
                raise ValueError(f"{name!r} is not a DNS name or IPv4 address")
        if len(set(value)) != len(value):
            raise ValueError("names repeat")
        return value

    @field_validator("bind_host")
    @classmethod
    def _bind_host(cls, value: str) -> str:
        if value != "::" and not _is_ipv4(value):
            raise ValueError("not an IPv4 address or ::")
        return value

    @field_validator("metrics_port")
    @classmethod
    def _metrics_port(cls, value: int | None, info: ValidationInfo) -> int | None:
        http_port = info.data.get("http_port")
        if value is not None and http_port is not None and value != http_port:
            raise ValueError(f"the engines serve /metrics on the HTTP port {http_port}")
        return value

    @field_validator("dist_init_port")
    @classmethod
    def _dist_init_port(cls, value: int) -> int:
        if value > 65535 - 7:
            raise ValueError("SGLang needs this port and the next 6")
        return value

    @field_validator(*_PORT_WIDTHS)
    @classmethod
    def _ports_distinct(cls, value: int | None, info: ValidationInfo) -> int | None:
        """A port range may not overlap the ranges of the port fields validated before it."""
        if value is None or info.field_name is None:
            return value
        mine = range(value, value + _port_width(info.field_name, info))
        for name in _PORT_WIDTHS:
            if name == info.field_name:
                break
            port = info.data.get(name)
            if port is None:
                continue
            theirs = range(port, port + _port_width(name, info))
            if set(mine) & set(theirs):
                other = _env_name(cls.model_fields[name])
                raise ValueError(f"overlaps {other} ({_span(theirs)}); this uses {_span(mine)}")
        return value

    @field_validator("speculative_draft_model")
    @classmethod
    def _draft_model(cls, value: str | None, info: ValidationInfo) -> str | None:
        algorithm = info.data.get("speculative_algorithm")
        if algorithm == "EAGLE3" and value is None:
            raise ValueError("required for EAGLE3")
        if algorithm == "none" and value is not None:
            raise ValueError(f"set while {Var.SPECULATIVE_ALGORITHM}=none")
        return value

    @field_validator("speculative_num_steps")
    @classmethod
    def _num_steps(cls, value: int | None, info: ValidationInfo) -> int | None:
        if info.data.get("speculative_algorithm") == "none" and value is not None:
            raise ValueError(f"set while {Var.SPECULATIVE_ALGORITHM}=none")
        return value

    @field_validator("sglang_extra_args")
    @classmethod
    def _extra_args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        owned = sorted({f for f in map(sglang_flags.owned_flag, value) if f is not None})
        secret = sorted({a.split("=", 1)[0] for a in value} & sglang_flags.SECRET_FLAGS)
        reasons = []
        if owned:
            reasons.append(f"sets {', '.join(owned)}, which the launcher sets from the contract")
        if secret:
            reasons.append(f"passes {', '.join(secret)}; secrets must not be on a command line")
        if reasons:
            raise ValueError("; ".join(reasons))
        return value

    @field_validator("sim_model_profile")
    @classmethod
    def _sim_model_profile(cls, value: str | None) -> str | None:
        if value is not None:
            perf_model.get_profile(value, Var.SIM_MODEL_PROFILE.value)
        return value

    @field_validator("compile_cache_dir", "gcs_fuse_root")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return _check_absolute(value)

    @field_validator("weights_cache_dir")
    @classmethod
    def _weights_cache_dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        _check_absolute(value)
        if value is None:
            gcs_fuse = info.data.get("gcs_fuse_root") is not None
            for name in ("model", "speculative_draft_model"):
                text = info.data.get(name)
                if text is None:
                    continue
                source = model_source.parse_model_source(text)
                if source.scheme == "hf" or (source.scheme == "gs" and not gcs_fuse):
                    raise ValueError(f"required to download {text}")
        return value

    @field_validator("hf_token_env")
    @classmethod
    def _hf_token_env(cls, value: str) -> str:
        if not _ENV_NAME.match(value):
            raise ValueError("not an environment variable name")
        return value

    # -- derived values ---------------------------------------------------------------------

    @cached_property
    def shape(self) -> SliceShape:
        return lookup(self.generation, self.topology)

    @cached_property
    def source(self) -> model_source.ModelSource:
        return model_source.parse_model_source(self.model)

    @cached_property
    def draft_source(self) -> model_source.ModelSource | None:
        if self.speculative_draft_model is None:
            return None
        return model_source.parse_model_source(self.speculative_draft_model)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.source.default_served_name

    @property
    def hostnames(self) -> tuple[str, ...]:
        """The group's hostnames in host-index order, for this pod's replica."""
        names = self.worker_hostnames or ("localhost",)
        return tuple(n.replace(REPLICA_PLACEHOLDER, str(self.replica_index)) for n in names)

    @property
    def leader_address(self) -> str:
        return self.hostnames[0]

    @property
    def xprof_session_id(self) -> str:
        """A decimal id every host of the group derives identically (TorchTPU wants one)."""
        seed = self.group_key or f"{self.leader_address}/{self.replica_index}"
        return str(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:7], "big"))

    def to_env(self) -> dict[str, str]:
        """The contract's variables with their values as strings; unset fields are omitted."""
        env: dict[str, str] = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value is None or value == ():
                continue
            env[_env_name(field)] = _render(value, shell=name == "sglang_extra_args")
        return env


class LaunchContract(GroupContract):
    """The whole contract of one pod: the group's values plus this pod's host index."""

    host_index: Index = var(
        Var.HOST_INDEX,
        "an integer from 0 to hosts - 1",
        "This pod's host in the slice (NODE_RANK, TPU_WORKER_ID); 0 is the leader.",
        scope="pod",
    )
    pod_name: str | None = var(
        Var.POD_NAME, "a DNS subdomain name", "This pod's name (logs).", scope="pod", default=None
    )
    pod_ip: str | None = var(
        Var.POD_IP, "an IP address", "This pod's IP (logs).", scope="pod", default=None
    )

    @field_validator("pod_name")
    @classmethod
    def _pod_name(cls, value: str | None) -> str | None:
        if value is not None and not _DNS_NAME.match(value):
            raise ValueError("not a DNS subdomain name")
        return value

    @field_validator("pod_ip")
    @classmethod
    def _pod_ip(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError("not an IP address") from None
        return value

    @field_validator("host_index")
    @classmethod
    def _host_index(cls, value: int, info: ValidationInfo) -> int:
        hosts = info.data.get("hosts")
        if hosts is not None and value >= hosts:
            raise ValueError(f"the slice has {hosts} hosts (0 to {hosts - 1})")
        return value

    @property
    def is_leader(self) -> bool:
        return self.host_index == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """Read the contract from the environment; ContractError lists every problem."""
        known = {_env_name(f): f for f in cls.model_fields.values()}
        problems: list[Problem] = []
        raw: dict[str, str] = {}
        for name, value in env.items():
            if not name.startswith(ENV_PREFIX):
                continue
            field = known.get(name)
            if field is None:
                close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.85)
                if close:
                    problems.append(
                        Problem(name, value, f"unknown variable; did you mean {close[0]}", close[0])
                    )
                else:
                    log.warning("%s is not a launch contract variable; ignored", name)
            elif value == "":
                problems.append(
                    Problem(
                        name,
                        value,
                        "empty (an empty variable counts as set); unset it or give a value",
                        _allowed(field),
                    )
                )
            else:
                raw[name] = value
        try:
            contract = cls.model_validate(raw)
        except ValidationError as err:
            problems += [_problem(cls, e, raw) for e in err.errors()]
            raise ContractError(_dedupe(problems)) from None
        if problems:
            raise ContractError(problems)
        return contract


# -- helpers --------------------------------------------------------------------------------


def _env_name(field: Any) -> str:
    alias = field.validation_alias
    assert isinstance(alias, str)
    return alias


def _allowed(field: Any) -> str:
    extra = field.json_schema_extra
    assert isinstance(extra, dict)
    return str(extra["allowed"])


def _render(value: object, *, shell: bool = False) -> str:
    if isinstance(value, tuple):
        return shlex.join(value) if shell else ",".join(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _span(ports: range) -> str:
    return str(ports.start) if len(ports) == 1 else f"{ports.start}-{ports.stop - 1}"


def _problem(cls: type[GroupContract], error: Any, raw: Mapping[str, str]) -> Problem:
    # loc is the variable name for values read from the environment and the field name for
    # defaults (pydantic validates those under the field name)
    loc = str(error["loc"][0]) if error["loc"] else "?"
    field = cls.model_fields.get(loc)
    if field is None:
        field = next((f for f in cls.model_fields.values() if _env_name(f) == loc), None)
    name = _env_name(field) if field is not None else loc
    allowed = _allowed(field) if field is not None else "?"
    if error["type"] == "missing":
        return Problem(name, None, "required", allowed)
    return Problem(name, raw.get(name), str(error["msg"]).removeprefix("Value error, "), allowed)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    unique = []
    for p in problems:
        if (p.variable, p.message) not in seen:
            seen.add((p.variable, p.message))
            unique.append(p)
    return unique


@dataclass(frozen=True, slots=True)
class VariableDoc:
    """One row of the contract table in docs/engine-launch.md."""

    name: str
    scope: str
    required: bool
    default: str
    allowed: str
    description: str


def variables() -> list[VariableDoc]:
    """Every contract variable, in definition order, for docs and tests."""
    rows = []
    for field in LaunchContract.model_fields.values():
        extra = field.json_schema_extra
        assert isinstance(extra, dict)
        required = field.is_required()
        default = "" if required or field.default is None else _render(field.default)
        rows.append(
            VariableDoc(
                name=_env_name(field),
                scope=str(extra["scope"]),
                required=required,
                default=default,
                allowed=str(extra["allowed"]),
                description=field.description or "",
            )
        )
    return rows


# -- what TorchTPU and libtpu get -----------------------------------------------------------


def torch_tpu_env(contract: LaunchContract) -> dict[str, str]:
    """The TorchTPU/libtpu rendezvous environment of one host, pinned from the contract.

    TorchTPU's `set_tpu_launch_env` never overwrites a variable that is set, so pinning all
    of them makes every host agree without TorchTPU querying device coordinates, reading
    `JOB_COMPLETION_INDEX` or falling back to 8 devices per host. `TORCH_TPU_TOPOLOGY` is
    the host-local topology, the value TorchTPU itself leaves there after ranking hosts
    (a slice topology set from outside would only be used to rank hosts, which `NODE_RANK`
    already does).
    """
    shape = contract.shape
    hosts = contract.hostnames
    env = {
        "TPU_WORKER_HOSTNAMES": ",".join(hosts),
        "TPU_WORKER_ID": str(contract.host_index),
        "TPU_PROCESS_PORT": str(contract.tpu_process_port),
        "TPU_PROCESS_ADDRESSES": ",".join(f"{h}:{contract.tpu_process_port}" for h in hosts),
        "TORCH_TPU_TOPOLOGY": shape.host_topology,
        "TORCH_TPU_DEVICES_PER_HOST": str(shape.devices_per_host),
        "TORCH_TPU_BASE_PORT": str(contract.slicebuilder_base_port),
        "TORCH_TPU_XPROF_SESSION_ID": contract.xprof_session_id,
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


# -- what the operator uses -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldRef:
    """A downward-API field of the pod (`valueFrom.fieldRef.fieldPath`)."""

    field_path: str


STATEFULSET_POD_INDEX = FieldRef("metadata.labels['apps.kubernetes.io/pod-index']")
LWS_WORKER_INDEX = FieldRef("metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']")
LWS_GROUP_INDEX = FieldRef("metadata.labels['leaderworkerset.sigs.k8s.io/group-index']")
LWS_GROUP_KEY = FieldRef("metadata.labels['leaderworkerset.sigs.k8s.io/group-key']")
JOB_COMPLETION_INDEX = FieldRef("metadata.annotations['batch.kubernetes.io/job-completion-index']")
POD_NAME = FieldRef("metadata.name")
POD_IP = FieldRef("status.podIP")


def statefulset_hostnames(
    statefulset: str, service: str, namespace: str, hosts: int
) -> tuple[str, ...]:
    """Stable names of a StatefulSet's pods behind the headless Service `service`."""
    return tuple(f"{statefulset}-{i}.{service}.{namespace}.svc" for i in range(hosts))


def lws_hostnames(lws: str, service: str, namespace: str, hosts: int) -> tuple[str, ...]:
    """Names of one LeaderWorkerSet group's pods (leader `<lws>-<g>`, workers `<lws>-<g>-<i>`).

    The group index is left as `{replica}`: one LWS pod template serves every group, and
    each pod fills in its own `TPUSERVE_REPLICA_INDEX` (see `pod_env(replica_index=...)`).
    """
    leader = f"{lws}-{REPLICA_PLACEHOLDER}"
    names = [leader] + [f"{leader}-{i}" for i in range(1, hosts)]
    return tuple(f"{n}.{service}.{namespace}.svc" for n in names)


def pod_env(
    group: GroupContract,
    *,
    host_index: FieldRef | int,
    replica_index: FieldRef | None = None,
    group_key: FieldRef | None = None,
) -> list[dict[str, Any]]:
    """The pod template's `env`: group values as literals, per-pod values from the pod.

    `TPU_WORKER_ID` is set from the same source as the host index so that the LWS webhook,
    which backs off when a container defines it, does not inject its own TPU variables.
    """

    def item(name: str, value: FieldRef | int | str) -> dict[str, Any]:
        if isinstance(value, FieldRef):
            return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": value.field_path}}}
        return {"name": name, "value": str(value)}

    if isinstance(host_index, int) and not 0 <= host_index < group.hosts:
        raise ValueError(f"host_index {host_index} is outside 0..{group.hosts - 1}")
    values = group.to_env()
    per_pod: dict[str, FieldRef | int | str] = {
        Var.HOST_INDEX.value: host_index,
        "TPU_WORKER_ID": host_index,
        Var.POD_NAME.value: POD_NAME,
        Var.POD_IP.value: POD_IP,
    }
    if replica_index is not None:
        per_pod[Var.REPLICA_INDEX.value] = replica_index
        values.pop(Var.REPLICA_INDEX.value, None)
    if group_key is not None:
        per_pod[Var.GROUP_KEY.value] = group_key
        values.pop(Var.GROUP_KEY.value, None)
    return [item(k, v) for k, v in values.items()] + [item(k, v) for k, v in per_pod.items()]
