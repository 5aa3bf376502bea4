"""GroupContract: what every pod of one replica group is told, with every check the launcher makes.

Each field is one environment variable: its name (`Var`), type, default, the values allowed
and a description live on the field (`fields.var`); validators run in field order and see
the fields validated before them.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from sglang_tpu import (
    hicache,
    lora,
    model_config,
    model_source,
    perf_model,
    sgl_jax_flags,
    sglang_flags,
)
from sglang_tpu.contract.env_names import REPLICA_PLACEHOLDER, Var
from sglang_tpu.contract.fields import (
    ABSOLUTE_PATH,
    DNS_NAME,
    ENV_NAME,
    PORTS_ALLOWED,
    ArgList,
    CommaList,
    HostnameList,
    Index,
    Port,
    check_absolute,
    env_name,
    is_ipv4,
    render,
    var,
)
from sglang_tpu.topology import (
    CatalogError,
    SliceShape,
    generation_names,
    get_generation,
    lookup,
    topologies_for,
)

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
    "torch_tpu_handshake_port": 1,
}


def _port_width(field_name: str, info: ValidationInfo) -> int:
    width = _PORT_WIDTHS[field_name]
    if width == 0:
        shape = _shape_from(info)
        return shape.devices_per_host if shape else 1
    return width


def _shape_from(info: ValidationInfo) -> SliceShape | None:
    """The slice shape when generation and topology already validated, else None."""
    generation, topology = info.data.get("generation"), info.data.get("topology")
    if generation is None or topology is None:
        return None
    return lookup(generation, topology)


# What SGLang-JAX accepts of the contract's engine settings (field -> values, allowed text).
_SGL_JAX_ALLOWED: dict[str, tuple[tuple[object, ...], str]] = {
    "execution_mode": (("compiled",), "compiled (JAX compiles every step; the eager modes "
                       "are TorchTPU's)"),
    "quantization": (("none", "fp8"), "none or fp8"),
    "host_kv_size_gb": ((), f"unset, with {Var.HOST_KV_RATIO} instead (SGLang-JAX sizes its "
                        "host pool as a ratio of the device pool)"),
}  # fmt: skip


def _span(ports: range) -> str:
    return str(ports.start) if len(ports) == 1 else f"{ports.start}-{ports.stop - 1}"


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
    engine: Literal["sglang", "sglang-jax", "simulated"] = var(
        Var.ENGINE,
        "sglang, sglang-jax, simulated",
        "sglang runs SGLang on TorchTPU; sglang-jax runs SGLang-JAX (`sgl_jax`, SGLang's "
        "JAX engine; docs/sglang-jax.md); simulated runs `tpuserve engine sim` with the "
        "same topology and ports (CPU-only clusters).",
        default="sglang",
    )
    device: Literal["tpu", "cpu"] = var(
        Var.DEVICE,
        "tpu, cpu",
        "Where SGLang runs: tpu (TorchTPU; JAX's TPU platform for sglang-jax) or cpu, a "
        "development target that starts the real engine on this machine's CPU (one host; "
        "with sglang-jax, one CPU device per host and as many hosts as the slice has).",
        default="tpu",
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
    torch_tpu_handshake_port: Port = var(
        Var.TORCH_TPU_HANDSHAKE_PORT,
        PORTS_ALLOWED,
        "TORCH_TPU_INTERNAL_HANDSHAKE_PORT: the TorchTPU handshake on the leader "
        "(MASTER_ADDR); pinned so the pod can declare it.",
        default=36423,
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
    host_kv_cache: hicache.WritePolicy | None = var(
        Var.HOST_KV_CACHE,
        ", ".join(hicache.WRITE_POLICIES),
        "A host-memory KV tier (SGLang's --enable-hierarchical-cache) with this write policy "
        "(--hicache-write-policy); unset: HBM only (docs/host-kv-tier.md).",
        default=None,
    )
    host_kv_size_gb: int | None = var(
        Var.HOST_KV_SIZE_GB,
        "an integer >= 1; only with TPUSERVE_HOST_KV_CACHE; not with TPUSERVE_HOST_KV_RATIO",
        "Host pool per rank in GB (--hicache-size); unset with the ratio unset: SGLang sizes "
        "it (ratio 2.0, lowered to fit the memory it finds free).",
        default=None,
        ge=1,
    )
    host_kv_ratio: float | None = var(
        Var.HOST_KV_RATIO,
        "a number > 0; only with TPUSERVE_HOST_KV_CACHE; not with TPUSERVE_HOST_KV_SIZE_GB",
        "Host pool as a multiple of the device pool (--hicache-ratio).",
        default=None,
        gt=0,
    )
    lora_adapters: CommaList = var(
        Var.LORA_ADAPTERS,
        f"comma-separated NAME=SOURCE, at most {lora.MAX_ADAPTERS}; NAME: "
        f"{lora.ADAPTER_NAME_ALLOWED}; SOURCE: {model_source.ALLOWED_FORMS}, without ','",
        "LoRA adapters the server preloads (SGLang's --enable-lora --lora-paths NAME=PATH, "
        "fetched like the model; the twin lists them); clients ask for MODEL:NAME.",
        default=(),
    )
    sglang_extra_args: ArgList = var(
        Var.SGLANG_EXTRA_ARGS,
        "shell-quoted SGLang arguments, none of the flags the launcher sets, no secrets",
        "Appended to the SGLang command line (with TPUSERVE_ENGINE=simulated: the twin's own "
        "flags, e.g. --startup-time-scale).",
        default=(),
    )
    sglang_python: str | None = var(
        Var.SGLANG_PYTHON,
        "an absolute path or a command name on PATH",
        "The Python interpreter that runs the engine (SGLang, or SGLang-JAX with "
        "sglang-jax); default: python3 on tpu (the image's), the launcher's own interpreter "
        "on cpu.",
        default=None,
    )
    cpu_kernel_shim_dir: str | None = var(
        Var.CPU_KERNEL_SHIM_DIR,
        f"{ABSOLUTE_PATH}; only with TPUSERVE_DEVICE=cpu",
        "Put first on SGLang's PYTHONPATH on cpu: a directory with a pure-torch `sgl_kernel` "
        "stand-in; default: `sglang_tpu.cpu_shim`'s when it is installed.",
        default=None,
    )
    sim_model_profile: str | None = var(
        Var.SIM_MODEL_PROFILE,
        "a profile of sglang_tpu.perf_model or a known HF model id",
        "Model profile of the simulated engine; default: looked up from the HF model id.",
        default=None,
    )
    model_architecture: str | None = var(
        Var.MODEL_ARCHITECTURE,
        "a JSON object of config.json keys (sglang_tpu.model_config.KEYS) of a decoder",
        "The model's config.json facts (spec.model.architecture) for the performance model: "
        "the simulated engine's profile when set; default: a built-in profile.",
        default=None,
        max_length=4096,
    )
    compile_cache_dir: str | None = var(
        Var.COMPILE_CACHE_DIR,
        ABSOLUTE_PATH,
        "Persistent compilation cache (share it between replicas of the same model and "
        "topology); unset: no persistent cache.",
        default=None,
    )
    engine_version: str = var(
        Var.ENGINE_VERSION,
        "any non-empty text without whitespace, e.g. the engine image reference",
        "What makes compiled programs incompatible: the engine image (its SGLang, TorchTPU "
        "and libtpu). Part of the compile cache key, so a new engine never reuses an old "
        "engine's programs.",
        default="unversioned",
        pattern=r"^\S+$",
        max_length=512,
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
    termination_message_path: str | None = var(
        Var.TERMINATION_MESSAGE_PATH,
        ABSOLUTE_PATH,
        "Where the launcher writes why it refused to start (the pre-flight's reasons, one "
        "`Reason: message` per line): the container's terminationMessagePath, so Kubernetes "
        "and the operator show it; unset: not written.",
        default=None,
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

    @field_validator("host_kv_size_gb", "host_kv_ratio")
    @classmethod
    def _host_kv_size(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None:
            return value
        if info.data.get("host_kv_cache") is None:
            raise ValueError(f"set only with {Var.HOST_KV_CACHE}")
        if info.field_name == "host_kv_ratio" and info.data.get("host_kv_size_gb") is not None:
            raise ValueError(f"exclusive with {Var.HOST_KV_SIZE_GB}")
        return value

    @field_validator("generation")
    @classmethod
    def _generation(cls, value: str) -> str:
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
        multi_host_cpu = info.data.get("engine") == "sglang-jax"  # JAX's distributed runtime
        if info.data.get("device") == "cpu" and value > 1 and not multi_host_cpu:
            raise ValueError(f"{Var.DEVICE}=cpu runs on one host; choose a one-host topology")
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
            if not (DNS_NAME.match(concrete) or is_ipv4(concrete)):
                raise ValueError(f"{name!r} is not a DNS name or IPv4 address")
        if len(set(value)) != len(value):
            raise ValueError("names repeat")
        return value

    @field_validator("bind_host")
    @classmethod
    def _bind_host(cls, value: str) -> str:
        if value != "::" and not is_ipv4(value):
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
                other = env_name(cls.model_fields[name])
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

    @field_validator("lora_adapters")
    @classmethod
    def _lora_adapters(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            if "=" not in item:
                raise ValueError(f"{item!r} is not NAME=SOURCE")
        pairs = lora.parse_lora_paths(value)
        for _, source in pairs:
            model_source.parse_model_source(source)
        problem = lora.adapters_problem([name for name, _ in pairs])
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("execution_mode", "quantization", "host_kv_size_gb")
    @classmethod
    def _sgl_jax_refuses(cls, value: object, info: ValidationInfo) -> object:
        """What SGLang-JAX does not have: TorchTPU's eager modes, the 4-bit formats, a host
        pool sized in GB (it takes a ratio)."""
        if info.data.get("engine") != "sglang-jax" or value is None:
            return value
        values, allowed = _SGL_JAX_ALLOWED[str(info.field_name)]
        if value not in values:
            raise ValueError(f"with {Var.ENGINE}=sglang-jax it must be {allowed}")
        return value

    @field_validator("sglang_extra_args")
    @classmethod
    def _extra_args(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if info.data.get("engine") == "sglang-jax":
            problems = sgl_jax_flags.extra_args_problems(value)
            if problems:
                raise ValueError("; ".join(problems))
            return value
        owned = sorted({f for f in map(sglang_flags.owned_flag, value) if f is not None})
        secret = sorted({a.split("=", 1)[0] for a in value} & sglang_flags.SECRET_FLAGS)
        lora_flags = sorted({a.split("=", 1)[0] for a in value} & set(lora.LORA_FLAGS))
        reasons = []
        if owned:
            reasons.append(f"sets {', '.join(owned)}, which the launcher sets from the contract")
        if lora_flags and info.data.get("lora_adapters"):
            reasons.append(
                f"sets {', '.join(lora_flags)}, which the launcher sets from "
                f"{Var.LORA_ADAPTERS}; give adapters in one place"
            )
        if secret:
            reasons.append(f"passes {', '.join(secret)}; secrets must not be on a command line")
        if reasons:
            raise ValueError("; ".join(reasons))
        return value

    @field_validator("sglang_python")
    @classmethod
    def _sglang_python(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value or any(c.isspace() for c in value):
            raise ValueError("not an absolute path or a command name")
        if "/" in value:
            check_absolute(value)
        return value

    @field_validator("cpu_kernel_shim_dir")
    @classmethod
    def _cpu_kernel_shim_dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        check_absolute(value)
        if value is not None and info.data.get("device") != "cpu":
            raise ValueError(f"set while {Var.DEVICE} is not cpu")
        return value

    @field_validator("model_architecture")
    @classmethod
    def _model_architecture(cls, value: str | None) -> str | None:
        if value is not None:
            model_config.architecture_from_json(value, Var.MODEL_ARCHITECTURE.value)
        return value

    @field_validator("sim_model_profile")
    @classmethod
    def _sim_model_profile(cls, value: str | None) -> str | None:
        if value is not None:
            perf_model.get_profile(value, Var.SIM_MODEL_PROFILE.value)
        return value

    @field_validator("compile_cache_dir", "gcs_fuse_root", "termination_message_path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return check_absolute(value)

    @field_validator("weights_cache_dir")
    @classmethod
    def _weights_cache_dir(cls, value: str | None, info: ValidationInfo) -> str | None:
        check_absolute(value)
        if value is None:
            gcs_fuse = info.data.get("gcs_fuse_root") is not None
            texts = [info.data.get("model"), info.data.get("speculative_draft_model")]
            texts += [path for _, path in lora.parse_lora_paths(info.data.get("lora_adapters", ()))]
            for text in texts:
                if text is None:
                    continue
                source = model_source.parse_model_source(text)
                if source.scheme == "hf" or (source.scheme == "gs" and not gcs_fuse):
                    raise ValueError(f"required to download {text}")
        return value

    @field_validator("hf_token_env")
    @classmethod
    def _hf_token_env(cls, value: str) -> str:
        if not ENV_NAME.match(value):
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

    @cached_property
    def adapter_sources(self) -> tuple[tuple[str, model_source.ModelSource], ...]:
        """``(name, source)`` of each LoRA adapter, in the contract's order."""
        pairs = lora.parse_lora_paths(self.lora_adapters)
        return tuple((name, model_source.parse_model_source(path)) for name, path in pairs)

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
            env[env_name(field)] = render(value, shell=name == "sglang_extra_args")
        return env
