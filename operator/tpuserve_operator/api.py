"""The TPUModelServer API: the one schema source.

These pydantic models are the single definition of the resource. From them come:

- the CRD's OpenAPI v3 schema, with every description, default, enum, bound and CEL rule
  (`build/crd.py`, written to `charts/tpuserve/crds/` by
  `python -m tpuserve_operator.build.generate`);
- the resource reference in docs/operator.md (same generator);
- the operator's typed view of a spec (`TPUModelServerSpec.model_validate(spec)`), and
  `tpuserve render`'s validation with no cluster (pydantic for types and bounds, the CRD's
  own CEL rules evaluated by `build/cel.py`).

Descriptions start with the JSON name and say what the field controls, its default and
how it interacts with other fields (the LeaderWorkerSet API style), so `kubectl explain`
documents the resource. Rules that need the topology catalog or the performance model are
not CEL: the operator checks them (`validation.py`) and reports `Valid=False`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from sglang_tpu import disaggregation, hicache, lora
from sglang_tpu import model_config as config_json
from sglang_tpu.topology import SLICE_SHAPES, generation_names
from tpuserve_operator import scaling_behavior as sb

# Bounds that also keep the apiserver's CEL cost estimate small (every string a rule reads
# has a maxLength, every list a maxItems).
MAX_NAME_LENGTH = 40  # leaves room for `-r<k>-w-<i>` and the controller-revision-hash suffix
SERVER_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # children include Services: DNS-1035 labels
NAME_RULE = (
    f"size(self.metadata.name) <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{SERVER_NAME}')"
)
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
LABEL_VALUE = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"  # a key of a Secret's data
TOPOLOGY_PATTERN = r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}(x[1-9][0-9]{0,2})?$"
TOPOLOGY_2D = "^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$"
TOPOLOGY_3D = "^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}x[1-9][0-9]{0,2}$"
# GKE drains a node for at most an hour; a pod's grace (preStop pause <= 5 s + the longest
# request + a 5 s kill margin, render/pod.py `termination`) must fit in it.
MAX_GRACE_SECONDS = 3600
MAX_REQUEST_SECONDS = MAX_GRACE_SECONDS - 10
GCS_BUCKET = "gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"
SOURCE_PATTERNS = (
    "^hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9][A-Za-z0-9._/-]*)?$",
    f"^{GCS_BUCKET}(/.*)?$",
    "^pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/.*)?$",
)
# A gs:// prefix without ',': it goes into the FUSE mount's comma-separated options.
GCS_PREFIX_PATTERN = f"^{GCS_BUCKET}(/[^,]*)?$"
# No ',' in an adapter's source: the launcher takes the adapters as one comma-separated list.
NO_COMMA = "^[^,]*$"


def source_rule(field: str, api_path: str) -> tuple[str, str]:
    """The CEL rule (and its message) for a weights location: hf://, gs:// or pvc://."""
    rule = " || ".join(f"self.{field}.matches('{p}')" for p in SOURCE_PATTERNS)
    return (
        rule,
        f"{api_path} must be hf://ORG/NAME[@REVISION], gs://BUCKET/PATH or pvc://CLAIM/PATH",
    )


# Generations whose slices are 3-D tori (topology AxBxC); the others are 2-D (AxB).
THREE_DIMENSIONAL = tuple(
    g
    for g in generation_names()
    if all(len(s.dims) == 3 for s in SLICE_SHAPES if s.generation.name == g)
)
THREE_DIMENSIONAL_CEL = "[" + ", ".join(f"'{g}'" for g in THREE_DIMENSIONAL) + "]"


def rules(*pairs: tuple[str, str]) -> dict[str, Any]:
    """CEL rules for a model's schema node: (rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in pairs]}


def free_form(kind: Literal["object", "array"], **extra: Any) -> dict[str, Any]:
    """Schema extras for a field passed through to Kubernetes as written (pod overrides)."""
    return {"type": kind, "x-kubernetes-preserve-unknown-fields": True, **extra}


ENGINE_ARGS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True},
    "maxProperties": 64,
}
"""The schema of SGLang flags as a map (spec.engine.args and each PD role's args)."""


class Schema(BaseModel):
    """Base of every API model: camelCase JSON names, unknown fields rejected, and values of
    the declared JSON type only (strict: ``replicas: true`` or ``"3"`` is refused, as the
    apiserver refuses it, not read as 1 or 3)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True
    )


def section(model: type[Schema], description: str) -> Any:
    """A field holding a sub-object that defaults to its own defaults (`{}` in the CRD)."""
    return Field(default_factory=model, json_schema_extra={"default": {}}, description=description)


class SecretKeyRef(Schema):
    name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="name is the Secret's name, in the TPUModelServer's namespace.",
    )
    key: str = Field(
        default="token",
        max_length=253,
        description="key is the key inside the Secret holding the value. Default: token.",
    )


class LoraAdapterSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(source_rule("source", "model.loraAdapters[].source"))
    )

    name: str = Field(
        max_length=lora.MAX_ADAPTER_NAME_LENGTH,
        pattern=lora.ADAPTER_NAME_PATTERN,
        description=(
            "name is what clients ask for: `model: SERVEDNAME:NAME` (or `lora_path: NAME`). "
            f"Unique in the list; {lora.ADAPTER_NAME_ALLOWED}."
        ),
    )
    source: str = Field(
        max_length=512,
        pattern=NO_COMMA,
        description=(
            "source is where the adapter's weights come from, same schemes as model.source "
            "(fetched like the model), without ','. Example: hf://ORG/NAME-lora."
        ),
    )


ARCHITECTURE_MAX = config_json.MAX_COUNT


def _count(what: str, default: str = "") -> Any:
    """An optional count of spec.model.architecture (config.json's key in camelCase)."""
    return Field(
        default=None,
        ge=1,
        le=ARCHITECTURE_MAX,
        description=f"{what}.{' Default: ' + default + '.' if default else ''}",
    )


class ModelArchitecture(Schema):
    """The decoder facts of the model's Hugging Face config.json that the performance model
    reads (`sglang_tpu.model_config`), each under its config.json key in camelCase."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "!has(self.numKeyValueHeads) || self.numKeyValueHeads <= self.numAttentionHeads",
                "model.architecture.numKeyValueHeads must be at most numAttentionHeads",
            ),
            (
                "!has(self.numExpertsPerTok) || "
                "(has(self.numExperts) && self.numExpertsPerTok <= self.numExperts)",
                "model.architecture.numExpertsPerTok needs numExperts and must be at most it",
            ),
            (
                "has(self.intermediateSize) || "
                "(has(self.numExperts) && has(self.moeIntermediateSize))",
                "model.architecture.intermediateSize is required (a mixture of experts may "
                "give numExperts and moeIntermediateSize instead)",
            ),
        )
    )

    num_hidden_layers: int = Field(
        ge=1, le=ARCHITECTURE_MAX, description="numHiddenLayers: config.json's num_hidden_layers."
    )
    hidden_size: int = Field(
        ge=1, le=ARCHITECTURE_MAX, description="hiddenSize: config.json's hidden_size."
    )
    num_attention_heads: int = Field(
        ge=1,
        le=ARCHITECTURE_MAX,
        description="numAttentionHeads: config.json's num_attention_heads (query heads).",
    )
    num_key_value_heads: int | None = _count(
        "numKeyValueHeads: config.json's num_key_value_heads (KV heads)", "numAttentionHeads"
    )
    head_dim: int | None = _count(
        "headDim: config.json's head_dim", "hiddenSize / numAttentionHeads"
    )
    intermediate_size: int | None = _count("intermediateSize: config.json's intermediate_size")
    vocab_size: int = Field(
        ge=1, le=ARCHITECTURE_MAX, description="vocabSize: config.json's vocab_size."
    )
    max_position_embeddings: int | None = _count(
        "maxPositionEmbeddings: config.json's max_position_embeddings, the model's longest "
        "context (contextLength's default)",
        str(config_json.DEFAULT_CONTEXT),
    )
    tie_word_embeddings: bool = Field(
        default=False,
        description=(
            "tieWordEmbeddings: config.json's tie_word_embeddings (the LM head is the input "
            "embedding). Default: false."
        ),
    )
    num_experts: int | None = _count(
        "numExperts: routed experts of a mixture of experts (config.json's num_experts, "
        "num_local_experts or n_routed_experts)"
    )
    num_experts_per_tok: int | None = _count(
        "numExpertsPerTok: config.json's num_experts_per_tok (experts per token)"
    )
    moe_intermediate_size: int | None = _count(
        "moeIntermediateSize: config.json's moe_intermediate_size (one expert's MLP width)"
    )

    def hf_config(self) -> dict[str, Any]:
        """The config.json keys these fields stand for (what `model_config` reads)."""
        return self.model_dump(exclude_none=True)


class ModelSpec(Schema):
    model_config = ConfigDict(json_schema_extra=rules(source_rule("source", "model.source")))

    source: str = Field(
        max_length=512,
        description=(
            "source is where the weights come from: hf://ORG/NAME[@REVISION] (Hugging Face; "
            "tokenSecretRef supplies the token for gated models), gs://BUCKET/PATH (read with "
            "the pod's Workload Identity, see template.serviceAccountName) or "
            "pvc://CLAIM/PATH (a PersistentVolumeClaim in this namespace, mounted read-only). "
            "Example: hf://Qwen/Qwen3-8B."
        ),
    )
    served_name: str | None = Field(
        default=None,
        max_length=63,
        pattern=LABEL_VALUE,
        description=(
            "servedName is the model name clients send in the OpenAI `model` field, also the "
            "`model` pod label and the `model_name` series label. Default: the last path "
            "segment of source, lower-cased (hf://Qwen/Qwen3-8B gives qwen3-8b). Letters, "
            "digits, '.', '_' and '-', at most 63 characters."
        ),
    )
    quantization: Literal["none", "fp8", "mxfp4", "nvfp4"] = Field(
        default="none",
        description=(
            "quantization of the weights as served: none (checkpoint dtype), fp8, mxfp4 or "
            "nvfp4. It changes the HBM the weights need, so the operator's fit check uses it. "
            "Default: none."
        ),
    )
    context_length: int | None = Field(
        default=None,
        ge=1,
        le=10_485_760,
        description=(
            "contextLength is the longest sequence (prompt + output tokens) one request may "
            "use. Default: the model's own maximum. The fit check sizes the KV cache for at "
            "least one sequence of this length."
        ),
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description=(
            "architecture gives the performance model a model it does not know by name: the "
            "decoder facts of the model's Hugging Face config.json (numHiddenLayers, "
            "hiddenSize, numAttentionHeads, numKeyValueHeads, headDim, intermediateSize, "
            "vocabSize, maxPositionEmbeddings, tieWordEmbeddings; for a mixture of experts "
            "numExperts, numExpertsPerTok, moeIntermediateSize), each config.json's key in "
            "camelCase. The operator cannot read the Hub, so the facts are here; `tpuserve "
            "plan --hf-config FILE --emit` writes them. With it the HBM fit check, the "
            "autoscaler's prefill figure, the host KV tier's weighting and the simulated "
            "engine use this profile instead of a built-in one. Without it a model outside "
            "the built-in profiles gets no fit check with engine sglang and is refused by "
            "the simulated engine. Default: none (the profile is looked up from source)."
        ),
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "tokenSecretRef names the Secret key holding a Hugging Face token. It reaches the "
            "pod as HF_TOKEN through secretKeyRef, never as a plain value. Example: "
            "{name: hf-token, key: token}."
        ),
    )
    lora_adapters: list[LoraAdapterSpec] = Field(
        default_factory=list,
        max_length=lora.MAX_ADAPTERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description=(
            "loraAdapters are LoRA adapters every replica preloads (SGLang's --enable-lora "
            "--lora-paths NAME=PATH; the simulated engine serves and lists them too). /v1/models "
            "lists each as SERVEDNAME:NAME and the router sends an adapter's requests to the "
            "replicas where it is warm. spec.engine.args may then not set enable-lora or "
            f"lora-paths. At most {lora.MAX_ADAPTERS}. Default: none. Example: "
            "[{name: sql, source: hf://ORG/sql-lora}]."
        ),
    )


class TPUSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                f"!(self.generation in {THREE_DIMENSIONAL_CEL}) || "
                f"self.topology.matches('{TOPOLOGY_3D}')",
                "tpu.topology for v5p and tpu7x has three dimensions, for example 2x2x2",
            ),
            (
                f"self.generation in {THREE_DIMENSIONAL_CEL} || "
                f"self.topology.matches('{TOPOLOGY_2D}')",
                "tpu.topology for v5e and v6e has two dimensions, for example 4x4",
            ),
        )
    )

    generation: str = Field(
        max_length=16,
        json_schema_extra={"enum": list[Any](generation_names())},
        description=(
            "generation is the TPU generation: v5e, v5p, v6e (Trillium) or tpu7x (Ironwood). "
            "With topology it selects the node pool (cloud.google.com/gke-tpu-accelerator)."
        ),
    )
    topology: str = Field(
        max_length=11,
        pattern=TOPOLOGY_PATTERN,
        description=(
            "topology is the slice shape of one replica as GKE labels it "
            "(cloud.google.com/gke-tpu-topology). (generation, topology) is looked up in the "
            "topology catalog, which gives hosts and chips per host: v6e 4x4 is 4 hosts of 4 "
            "chips, v6e 2x4 is one 8-chip host, tpu7x 2x2x2 is 2 hosts of 4 chips. A pair not "
            "in the catalog sets Valid=False, reason UnsupportedTopology, listing valid ones."
        ),
    )
    spot: bool = Field(
        default=False,
        description=(
            "spot schedules onto Spot TPU node pools (node selector cloud.google.com/gke-spot). "
            "Spot VMs get 30 s notice before preemption, which caps the pods' drain then; "
            "engine pods pause 2 s in preStop (5 s on demand). Default: false."
        ),
    )
    reservation: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description=(
            "reservation pins the pods to a specific Compute Engine reservation (node selector "
            "cloud.google.com/reservation-name). Default: none."
        ),
    )

    @field_validator("generation")
    @classmethod
    def _known_generation(cls, value: str) -> str:
        allowed = generation_names()
        if value not in allowed:
            raise ValueError(f"{value!r} is not allowed; allowed: {', '.join(allowed)}")
        return value


class SpeculativeSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "self.algorithm != 'EAGLE3' || has(self.draftModel)",
                "engine.speculative.draftModel is required when algorithm is EAGLE3",
            ),
            (
                "!has(self.draftModel) || "
                + source_rule("draftModel", "engine.speculative.draftModel")[0],
                source_rule("draftModel", "engine.speculative.draftModel")[1],
            ),
        )
    )

    algorithm: Literal["EAGLE3", "MTP"] = Field(
        description=(
            "algorithm is the speculative-decoding method: EAGLE3 (a separate draft head, "
            "needs draftModel) or MTP (the model's own multi-token-prediction layers)."
        ),
    )
    draft_model: str | None = Field(
        default=None,
        max_length=512,
        description=(
            "draftModel is the draft model's source, same schemes as model.source. Required "
            "for EAGLE3. Example: hf://lmsys/SGLang-EAGLE3-Llama-3.1-8B-Instruct-SpecForge."
        ),
    )
    num_steps: int = Field(
        default=3,
        ge=1,
        le=16,
        description="numSteps is how many tokens the draft proposes per step. Default: 3.",
    )


class CompileCacheSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "has(self.persistentVolumeClaim) != has(self.gcs)",
                "engine.compileCache needs exactly one of persistentVolumeClaim and gcs",
            )
        )
    )

    persistent_volume_claim: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_LABEL,
        description=(
            "persistentVolumeClaim is a PersistentVolumeClaim in this namespace holding the XLA "
            "compilation cache. It turns a 10-30 minute first compile into 1-3 minutes on "
            "later starts; every host of every replica mounts it (ReadWriteMany or ReadOnlyMany "
            "after a warm-up)."
        ),
    )
    gcs: str | None = Field(
        default=None,
        max_length=1024,
        pattern=GCS_PREFIX_PATTERN,
        description=(
            "gcs is a gs://BUCKET/PREFIX (without ',') holding the cache instead, mounted on "
            "every host with GKE's Cloud Storage FUSE CSI driver (the pods' service account "
            "needs read and write on the bucket). Example: gs://my-models/xla-cache."
        ),
    )


class HostKvCacheSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "!(has(self.sizeGB) && has(self.ratio))",
                "kvCache.host takes one of sizeGB and ratio, not both",
            )
        )
    )

    size_gb: int | None = Field(
        default=None,
        alias="sizeGB",
        ge=1,
        le=4096,
        description=(
            "sizeGB is the host pool of each engine rank in GB (10^9 bytes), SGLang's "
            "--hicache-size; a host runs one rank per TPU device, so a v5e 2x4 host holds 8 x "
            "sizeGB. It must fit the engine's memory (spec.engine.resources, default 90% of "
            "what GKE leaves to pods on the machine type) less what the engine itself needs and "
            "SGLang's 10 GiB reserve; a larger value is refused naming the largest allowed "
            "(docs/host-kv-tier.md lists it per machine type). Exclusive with ratio."
        ),
    )
    ratio: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description=(
            "ratio sizes the host pool as a multiple of the device (HBM) KV pool, SGLang's "
            "--hicache-ratio. Checked against the host's memory when the model's profile is "
            "known. Unset with sizeGB unset: SGLang's default, 2.0 lowered until the pools fit "
            "80% of the memory it finds free. Exclusive with sizeGB."
        ),
    )
    write_policy: hicache.WritePolicy = Field(
        default=hicache.DEFAULT_WRITE_POLICY,
        description=(
            "writePolicy is when a KV page gets its host copy, SGLang's --hicache-write-policy: "
            "write_through (as soon as it is cached), write_through_selective (on its second "
            "hit) or write_back (only when HBM evicts it). Default: write_through."
        ),
    )


class KvCacheSpec(Schema):
    host: HostKvCacheSpec | None = Field(
        default=None,
        description=(
            "host adds a host-memory tier below HBM (SGLang's hierarchical cache, "
            "--enable-hierarchical-cache): pages HBM evicts are kept in host memory and loaded "
            "back instead of computed again, and the router routes to an engine holding a "
            "prompt's prefix in either tier (docs/host-kv-tier.md). Unset: HBM only."
        ),
    )


TPU_ENGINE_TYPES = ("sglang", "sglang-jax")
"""Engine types that run on TPU nodes (node selectors, tolerations, google.com/tpu)."""


class EngineSpec(Schema):
    type: Literal["sglang", "sglang-jax", "simulated"] = Field(
        default="sglang",
        description=(
            "type is sglang (SGLang on TorchTPU, needs TPU nodes), sglang-jax (SGLang-JAX, "
            "SGLang's JAX engine for TPUs, `python -m sgl_jax.launch_server`, needs TPU "
            "nodes; docs/sglang-jax.md) or simulated (the tpuserve engine twin: same API, "
            "metrics and topology, no TPU, for CPU-only clusters; pods get no TPU node "
            "selectors, tolerations or google.com/tpu requests). Default: sglang."
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description=(
            "image is the engine container image. Default: the operator's --engine-image for "
            "sglang, its --sglang-jax-engine-image for sglang-jax, its --router-image (the "
            "plain tpuserve image) for simulated."
        ),
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None,
        description="imagePullPolicy of the engine container. Default: Kubernetes' default.",
    )
    execution_mode: Literal["compiled", "eager", "eager-defer-and-fuse", "eager-debug"] = Field(
        default="compiled",
        description=(
            "executionMode is how TorchTPU runs the model: compiled (XLA graphs, fastest, "
            "long first compile), eager, eager-defer-and-fuse or eager-debug. The eager modes "
            "dispatch every op from Python: measured on a v5e, about 8.6 ms per layer and step "
            "more than compiled (the simulated engine adds the same). sglang-jax takes compiled "
            "only (JAX compiles every step). Default: compiled."
        ),
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto",
        description=(
            "kvCacheDtype is the KV-cache element type: auto (the model's dtype) or fp8 (half "
            "the HBM per token). Default: auto."
        ),
    )
    speculative: SpeculativeSpec | None = Field(
        default=None,
        description="speculative enables speculative decoding. Default: off.",
    )
    compile_cache: CompileCacheSpec | None = Field(
        default=None,
        description=(
            "compileCache mounts a persistent XLA compilation cache, keyed by model, slice "
            "shape and engine image (status.compileCache.key). The first replica to start "
            "with a new key compiles and writes it; later ones load it. Default: an emptyDir "
            "per pod (every start compiles from scratch)."
        ),
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra=ENGINE_ARGS_SCHEMA,
        description=(
            "args are extra SGLang server flags (SGLang-JAX's with type sglang-jax, each "
            "checked against its server's flags: an unknown one is rejected, and a flag taking "
            "several values gets them from one string, split on spaces and commas; the twin's own "
            "flags with type simulated, e.g. startup-time-scale), name without dashes to a "
            "scalar value: "
            "{mem-fraction-static: 0.85, enable-mixed-chunk: true} gives "
            "--mem-fraction-static 0.85 --enable-mixed-chunk (false omits a flag). Flags the "
            "operator sets itself (model path, ports, parallelism, multi-node rendezvous) are "
            "rejected with Valid=False."
        ),
    )
    resources: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra=free_form("object"),
        description=(
            "resources of the engine container (a core/v1 ResourceRequirements). On TPU "
            "(type sglang) cpu and memory default to 90% of what GKE leaves to pods on the "
            "host's machine type (requests = limits); any of requests/limits cpu/memory set "
            "here replaces its default (a limit alone lowers the request with it) and may not "
            "exceed one host's allocatable. The simulated engine gets exactly what is set here. "
            "google.com/tpu is set by the operator to the chips of one host and must not "
            "appear here."
        ),
    )
    env: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"items": free_form("object")},
        description=(
            "env adds core/v1 EnvVar entries to the engine container. Variables of the launch "
            "contract (TPU_*, TORCH_TPU_*, TPUSERVE_*, HF_TOKEN, ...) are owned by the operator "
            "and rejected with Valid=False."
        ),
    )


class ApiKeysSecret(Schema):
    secret_name: str = Field(
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="secretName is the Secret holding the keys file, in the server's namespace.",
    )
    key: str = Field(
        default="keys.json",
        max_length=253,
        pattern=SECRET_KEY,
        description="key is the Secret's key holding the keys file (JSON). Default: keys.json.",
    )


class HoldSpec(Schema):
    max_requests: int = Field(
        default=256,
        ge=1,
        le=100000,
        description=(
            "maxRequests is how many requests per model the router holds while the server "
            "has no routable replica (scaled to zero, or every replica starting); they are "
            "sent in arrival order once one is Ready. Beyond it a request gets 503 with "
            "Retry-After at once (`tpuserve router --hold-max-requests`). Used when "
            "autoscaling.minReplicas is 0. Default: 256."
        ),
    )
    max_seconds: int = Field(
        default=600,
        ge=1,
        le=3600,
        description=(
            "maxSeconds is how long a request may be held; then it gets 503 with Retry-After "
            "(`--hold-max-seconds`). Set it above the time a slice takes to start from zero "
            "(weights, then compilation). Default: 600."
        ),
    )


class RouterSpec(Schema):
    enabled: bool = Field(
        default=True,
        description=(
            "enabled runs a tpuserve router Deployment in front of the replica leaders. When "
            "false the endpoint Service selects the leaders directly (no prefix awareness). "
            "Default: true."
        ),
    )
    policy: str | None = Field(
        default=None,
        max_length=63,
        pattern=r"^[a-z][a-z0-9_]*$",
        description=(
            "policy is the router's routing policy, as `tpuserve router --policy` spells it "
            "(for example precise, cost, cache_aware, least_load, power_of_two, round_robin, "
            "random). Default: the operator's --router-policy (chart value router.policy); "
            "when that is unset too, the router's own default policy (docs/router.md)."
        ),
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "replicas of the router Deployment, spread over nodes, with a PodDisruptionBudget "
            "of one. Every replica publishes its routing decisions and request ends to the "
            "others (`tpuserve router --peer-port`, the container port named peers; found "
            "through the headless Service <name>-router-peers), so several replicas route as "
            "one would; a replica that starts takes a peer's KV-cache index first (the "
            "container port named peer-snapshot, the next one). Default: the operator's "
            "--router-replicas (chart value router.replicas)."
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="image of the router container. Default: the operator's --router-image.",
    )
    kv_events: bool | None = Field(
        default=None,
        description=(
            "kvEvents makes the router rebuild each replica's prefix cache from the engines' "
            "KV events (ZMQ, the leaders' kv-events port) instead of learning it from routed "
            "requests: true subscribes (`tpuserve router --kv-events`), false never does "
            "(--no-kv-events). Default: unset, the router decides: it subscribes when its "
            "policy uses KV events (precise, cost)."
        ),
    )
    max_request_seconds: int = Field(
        default=600,
        ge=5,
        le=MAX_REQUEST_SECONDS,
        description=(
            "maxRequestSeconds is the longest a request (a whole stream included) may take. "
            "The router gives up on a request after it (`tpuserve router --request-timeout`), "
            "and engine pods get it to drain after SIGTERM: terminationGracePeriodSeconds is "
            "the preStop pause + maxRequestSeconds + 5 s, so a rollout, scale-down or "
            "maintenance move lets every request in flight finish; router pods get the same "
            "pause and grace and drain for as long (`tpuserve router --drain-seconds`). At "
            "most 3590, so the grace stays within GKE's 1-hour drain. A Spot "
            "preemption cuts the grace to what the node's shutdown leaves (GKE: about 30 s "
            "of notice). Default: 600."
        ),
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP",
        description="serviceType of the endpoint Service. Default: ClusterIP.",
    )
    resources: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra=free_form("object"),
        description=(
            "resources of the router container (core/v1 ResourceRequirements). Default: the "
            "operator's router resources (chart value router.resources)."
        ),
    )
    hold: HoldSpec = section(
        HoldSpec,
        "hold bounds the requests the router holds while the server is at zero replicas "
        "(autoscaling.minReplicas 0): per model, and in time.",
    )
    api_keys: ApiKeysSecret | None = Field(
        default=None,
        description=(
            "apiKeys makes clients authenticate: the router reads its API keys (tenants, "
            "priority classes, rate limits, admin role; docs/router.md, Authentication) from "
            "this Secret, mounted into its pods, and reloads them when the Secret changes. "
            "Rate limits are counted by each router replica on its own: behind router.replicas "
            "N a key may take up to N times its limits (set them to limit / N for a hard "
            "bound). Default: unset, no keys (anyone who reaches the router is served)."
        ),
    )


class ScaleToZeroSpec(Schema):
    idle_seconds: int = Field(
        default=600,
        ge=30,
        le=86400,
        description=(
            "idleSeconds is how long the server must see no request (none arriving, in "
            "flight or held at the router) before the operator sets replicas to 0; the next "
            "request is held by the router and scales it back to 1. Used when minReplicas "
            "is 0. Default: 600."
        ),
    )


AUTOSCALERS = ("hpa", "keda")
"""`autoscaling.engine` values: who scales the server."""
KEDA_METRICS = ("backlogSeconds", "kvCacheUsage")
"""`autoscaling.metric` values only KEDA's Prometheus triggers read (the HPA path's metrics
adapter does not serve them)."""
KEDA_ONLY_MESSAGE = (
    "autoscaling.metric backlogSeconds and kvCacheUsage need autoscaling.engine keda (the "
    "HPA path's metrics adapter does not serve them); allowed with engine hpa: queue, "
    "tokensInFlight, ttft"
)
KEDA_SETTINGS_MESSAGE = (
    "autoscaling.keda is set with autoscaling.engine hpa: one autoscaler per scale "
    "subresource (KEDA runs an HPA of its own on it, and two would fight); allowed: "
    "autoscaling.engine keda, or no autoscaling.keda"
)

SCALE_UP_MESSAGE = (
    "autoscaling.scaleUpPods and autoscaling.scaleUpPercent are both 0, which would never "
    "scale up; allowed: at least one of them above 0"
)
SCALE_DOWN_MESSAGE = (
    "autoscaling.scaleDownPods and autoscaling.scaleDownPercent are both 0, which would never "
    "scale down; allowed: at least one of them above 0"
)


class PredictiveFloorSpec(Schema):
    requests_per_replica: float = Field(
        gt=0,
        le=1e6,
        description=(
            "requestsPerReplica is the request rate (requests/s) one replica serves within "
            "the SLO, e.g. `tpuserve plan`'s capacity for the model, slice and workload."
        ),
    )
    horizon_seconds: int = Field(
        default=300,
        ge=30,
        le=3600,
        description=(
            "horizonSeconds is how far ahead the floor looks: one cold start of a replica "
            "(node, image, weights, compile). Default: 300."
        ),
    )
    window_seconds: int = Field(
        default=600,
        ge=120,
        le=3600,
        description=(
            "windowSeconds is the recent window the request-rate trend is fitted over. "
            "Default: 600."
        ),
    )
    peak_window_seconds: int | None = Field(
        default=None,
        ge=300,
        le=86400,
        description=(
            "peakWindowSeconds makes the floor hold the recent peak too: the highest one-minute "
            "request rate of the last peakWindowSeconds, carried along yesterday's shape like "
            "the rate now. For bursts shorter than a cold start, which no replica started at "
            "the burst serves; costs idle replicas between bursts. Unset: no peak hold."
        ),
    )


class KedaSpec(Schema):
    predictive_floor: PredictiveFloorSpec | None = Field(
        default=None,
        description=(
            "predictiveFloor adds a second trigger that keeps the replicas the request rate "
            "one horizon ahead needs: the larger of the trend over windowSeconds (the line "
            "through the median rates of the window's two halves, so a burst shorter than a "
            "quarter of the window is not read as a ramp; at most 4x the window's mean) and "
            "the rate now carried along yesterday's shape "
            "(yesterday's rate one horizon later / yesterday's rate now); KEDA scales to the "
            "larger of the two triggers, so the floor only ever adds replicas "
            "(tpuserve_operator.predictive_floor is the same rule). Unset: no floor."
        ),
    )
    polling_interval_seconds: int = Field(
        default=15,
        ge=5,
        le=600,
        description=(
            "pollingIntervalSeconds is how often KEDA runs the trigger's Prometheus query "
            "(the ScaledObject's pollingInterval). Default: 15."
        ),
    )


class AutoscalingSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must be less than or equal to autoscaling.maxReplicas",
            ),
            ("!has(self.keda) || self.engine == 'keda'", KEDA_SETTINGS_MESSAGE),
            (
                "self.engine == 'keda' || !(self.metric in "
                + "["
                + ", ".join(f"'{m}'" for m in KEDA_METRICS)
                + "])",
                KEDA_ONLY_MESSAGE,
            ),
            (
                "self.scaleUpPods > 0 || self.scaleUpPercent > 0",
                SCALE_UP_MESSAGE,
            ),
            (
                "self.scaleDownPods > 0 || self.scaleDownPercent > 0",
                SCALE_DOWN_MESSAGE,
            ),
            (
                "self.metric != 'kvCacheUsage' || self.target <= 1.0",
                "autoscaling.target of metric kvCacheUsage is a share of the KV pool; "
                "allowed: more than 0 and at most 1",
            ),
        )
    )

    engine: Literal["hpa", "keda"] = Field(
        default="hpa",
        description=(
            "engine is the autoscaler: hpa (a HorizontalPodAutoscaler fed by the cluster's "
            "metrics adapter, Prometheus Adapter) or keda (a KEDA ScaledObject whose "
            "Prometheus trigger carries the query; needs KEDA's CRDs, keda.sh/v1alpha1). "
            "Both scale the same scale subresource, so one at a time. Default: hpa."
        ),
    )
    keda: KedaSpec | None = Field(
        default=None,
        description="keda holds KEDA's own settings (engine keda only). Unset: the defaults.",
    )
    prefill_tokens_per_second: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description=(
            "prefillTokensPerSecond is one replica's peak prefill throughput (uncached prompt "
            "tokens/s) that metric backlogSeconds divides the queued prefill tokens by. "
            "Unset: the performance model's figure for the model and slice (the model must "
            "be one it knows). Set it from a calibration run to override."
        ),
    )

    min_replicas: int = Field(
        default=1,
        ge=0,
        le=1024,
        description=(
            "minReplicas is the fewest replicas the autoscaler keeps. 0 scales to zero: "
            "after scaleToZero.idleSeconds without requests the operator sets replicas to "
            "0, the router holds the requests that arrive (router.hold) and the first one "
            "makes the operator set replicas to 1; the HorizontalPodAutoscaler (whose own "
            "minimum is then 1) scales from 1 to maxReplicas. With engine keda, KEDA owns "
            "0 <-> 1 instead: its activation on the router's held and answered requests, "
            "its cooldown scaleToZero.idleSeconds. Needs router.enabled. Default: 1."
        ),
    )
    max_replicas: int = Field(
        ge=1,
        le=1024,
        description="maxReplicas is the most replicas (slices) the autoscaler may run.",
    )
    metric: Literal["queue", "ttft", "tokensInFlight", "backlogSeconds", "kvCacheUsage"] = Field(
        default="queue",
        description=(
            "metric drives scaling: queue (requests waiting per replica: the engines' "
            "sglang:num_queue_reqs), tokensInFlight (KV-cache tokens in use per chip: "
            "sglang:num_used_tokens), ttft (p90 time to first token over 5 minutes: "
            "model:sglang_ttft_seconds:p90_5m of the served model; with engine keda the "
            "trigger scales on p90 / target, the SLO mode), and, engine keda only, "
            "backlogSeconds (queued prefill tokens / the replica's peak prefill throughput, "
            "prefillTokensPerSecond: seconds of prefill waiting per replica) or kvCacheUsage "
            "(share of the KV pool in use per replica: sglang:token_usage). Default: queue."
        ),
    )
    target: float = Field(
        default=8,
        gt=0,
        description=(
            "target value of metric: waiting requests per replica (queue), tokens per chip "
            "(tokensInFlight), seconds (ttft: the p90 TTFT SLO; backlogSeconds: seconds of "
            "prefill backlog per replica, e.g. half the TTFT SLO) or a share 0-1 "
            "(kvCacheUsage). Default: 8."
        ),
    )
    scale_to_zero: ScaleToZeroSpec = section(
        ScaleToZeroSpec,
        "scaleToZero says when an idle server goes to zero replicas (minReplicas 0 only).",
    )
    scale_down_stabilization_seconds: int = Field(
        default=sb.DEFAULT_STABILIZATION_SECONDS,
        ge=0,
        le=sb.MAX_STABILIZATION_SECONDS,
        description=(
            "scaleDownStabilizationSeconds is how long demand must stay lower before the "
            "autoscaler removes slices (the HorizontalPodAutoscaler's scale-down "
            "stabilization window: it scales down to the highest count the window asked "
            "for); slices then go at scaleDownPods / scaleDownPercent. Scale-up never waits. "
            f"Default: {sb.DEFAULT_STABILIZATION_SECONDS}."
        ),
    )
    scale_up_pods: int = Field(
        default=sb.DEFAULT_SCALE_UP_PODS,
        ge=0,
        le=1024,
        description=(
            "scaleUpPods is how many slices scale-up may add per "
            f"{sb.SCALE_UP_PERIOD_SECONDS} s whatever the fleet's size (a Pods policy of the "
            "HPA's behavior); scale-up takes the larger of it and scaleUpPercent. 0 leaves "
            f"the policy out. Default: {sb.DEFAULT_SCALE_UP_PODS} (Kubernetes' default)."
        ),
    )
    scale_up_percent: int = Field(
        default=sb.DEFAULT_SCALE_UP_PERCENT,
        ge=0,
        le=1000,
        description=(
            "scaleUpPercent is how much scale-up may grow the fleet per "
            f"{sb.SCALE_UP_PERIOD_SECONDS} s, in percent of its replicas (a Percent policy; "
            "100 doubles it). 0 leaves the policy out. Default: "
            f"{sb.DEFAULT_SCALE_UP_PERCENT} (Kubernetes' default)."
        ),
    )
    scale_down_pods: int = Field(
        default=sb.DEFAULT_SCALE_DOWN_PODS,
        ge=0,
        le=1024,
        description=(
            "scaleDownPods is how many slices scale-down may remove per "
            f"{sb.SCALE_DOWN_PERIOD_SECONDS} s whatever the fleet's size, after "
            "scaleDownStabilizationSeconds; scale-down takes the larger of it and "
            "scaleDownPercent. 0 leaves the policy out. Default: "
            f"{sb.DEFAULT_SCALE_DOWN_PODS}."
        ),
    )
    scale_down_percent: int = Field(
        default=sb.DEFAULT_SCALE_DOWN_PERCENT,
        ge=0,
        le=100,
        description=(
            "scaleDownPercent is how much scale-down may shrink the fleet per "
            f"{sb.SCALE_DOWN_PERIOD_SECONDS} s, in percent of its replicas: a fleet of any "
            "size sheds a burst's excess in minutes (10 halves it in about 7, about one "
            "cold start of a TPU slice), while one low reading costs at most that share. "
            f"0 leaves the policy out. Default: {sb.DEFAULT_SCALE_DOWN_PERCENT}."
        ),
    )


class RolloutSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "self.maxUnavailable + self.maxSurge >= 1",
                "rollout.maxUnavailable and rollout.maxSurge cannot both be 0",
            )
        )
    )

    max_unavailable: int = Field(
        default=1,
        ge=0,
        le=1024,
        description=(
            "maxUnavailable is how many replica groups may be down at once while a change "
            "rolls out. With 2 or more replicas the operator always keeps at least one ready "
            "group serving, whatever this says. Default: 1."
        ),
    )
    max_surge: int = Field(
        default=0,
        ge=0,
        le=1024,
        description=(
            "maxSurge is how many extra replica groups (whole slices) may run above replicas "
            "during a rollout. Default: 0, since no spare slice is assumed; set it only when "
            "the node pools have room for an extra slice. With spec.disaggregation it counts "
            "per role, and a role of one group surges one anyway, so a prefill and a decode "
            "that pair keep serving (docs/pd.md)."
        ),
    )


class MonitoringSpec(Schema):
    pod_monitor: bool = Field(
        default=False,
        description=(
            "podMonitor creates a PodMonitor (monitoring.coreos.com/v1) for this server's "
            "engine pods, when that CRD is installed. The tpuserve chart's fleet-wide monitors "
            "already scrape every TPUModelServer; enable this only without them, or series "
            "are scraped twice. Default: false."
        ),
    )
    service_monitor: bool = Field(
        default=False,
        description=(
            "serviceMonitor creates a ServiceMonitor for this server's router (port metrics "
            "of the endpoint Service), when that CRD is installed. Same caveat as podMonitor. "
            "Default: false."
        ),
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "labels added to the monitors so a Prometheus with a monitor selector finds them, "
            "for example {release: kube-prometheus-stack}."
        ),
    )


class PodTemplateOverrides(Schema):
    annotations: dict[str, str] = Field(
        default_factory=dict, description="annotations added to engine and router pods."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "labels added to engine and router pods; keys the operator sets (app.kubernetes.io/"
            "*, model, tpu-*, serving.tpuserve.dev/*) are rejected with Valid=False."
        ),
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="nodeSelector entries added to the catalog's TPU node selector.",
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={"items": free_form("object")},
        description="tolerations added to the google.com/tpu toleration (core/v1 Toleration).",
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra=free_form("object"),
        description="affinity of engine pods (core/v1 Affinity).",
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, description="priorityClassName of engine pods."
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description=(
            "serviceAccountName of engine pods, e.g. one bound to a Google service account by "
            "Workload Identity for gs:// sources. Default: the namespace's default account."
        ),
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="imagePullSecrets: names of Secrets for pulling engine and router images.",
    )


PEER_FIELDS = ("ipBlock", "namespaceSelector", "podSelector")
"""A NetworkPolicyPeer's fields: declared, so CEL can see them (an object that only keeps
unknown fields hides them from CEL: `size()` of it does not compile on the apiserver)."""
GATEWAY_FROM_RULE = (
    "!has(self.gatewayFrom) || (size(self.gatewayFrom) > 0 && self.gatewayFrom.all(p, "
    "has(p.ipBlock) || has(p.podSelector)))",
    "inferencePool.gatewayFrom: an empty list, an empty peer or a peer without podSelector or "
    "ipBlock admits any source, or every pod of whole namespaces, to the engines' HTTP port and "
    "the picker; allowed: NetworkPolicy peers of the gateway's own pods (a podSelector of "
    "their labels, with a namespaceSelector for another namespace) or of its data plane's "
    "addresses (ipBlock), or unset (then gatewayName)",
)
GATEWAY_NAMED_RULE = (
    "has(self.gatewayName) != has(self.gatewayFrom)",
    "inferencePool: name the gateway with exactly one of gatewayName (the Gateway whose pods, "
    "labelled gateway.networking.k8s.io/gateway-name, are admitted) and gatewayFrom (its "
    "NetworkPolicy peers); the engines' HTTP port and the picker are open to that gateway alone",
)
GATEWAY_ONE_WAY_RULE = (
    "!has(self.gatewayNamespace) || has(self.gatewayName)",
    "inferencePool: gatewayNamespace is the namespace of gatewayName's pods; allowed with "
    "gatewayName only (gatewayFrom names its own namespaces)",
)
TOKEN_AUTH_RULE = (
    "!has(self.tokenSecretRef) || !has(self.pickerAuth) || self.pickerAuth == 'Token'",
    "inferencePool: tokenSecretRef with pickerAuth NetworkPolicyOnly; allowed: pickerAuth "
    "Token with or without tokenSecretRef, or NetworkPolicyOnly without it",
)
GATEWAY_POD_LABEL = "gateway.networking.k8s.io/gateway-name"
"""The label Gateway API implementations put on the pods they deploy for a Gateway (GEP-1762:
Istio, kgateway, NGINX Gateway Fabric, agentgateway)."""


class InferencePoolSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            GATEWAY_FROM_RULE, GATEWAY_NAMED_RULE, GATEWAY_ONE_WAY_RULE, TOKEN_AUTH_RULE
        )
    )

    failure_mode: Literal["FailClose", "FailOpen"] = Field(
        default="FailClose",
        description=(
            "failureMode is what the gateway does when the endpoint picker (the router) does "
            "not answer: FailClose refuses the request, FailOpen sends it to any endpoint of "
            "the pool (the InferencePool's endpointPickerRef.failureMode). Default: FailClose."
        ),
    )
    gateway_name: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description=(
            "gatewayName is the Gateway (gateway.networking.k8s.io) whose HTTPRoute sends to "
            "this pool: the pods its implementation deploys for it, labelled "
            f"{GATEWAY_POD_LABEL}: <gatewayName> (GEP-1762: Istio, kgateway, NGINX Gateway "
            "Fabric, agentgateway), in gatewayNamespace, are admitted to the leaders' HTTP "
            "port (the gateway sends requests to the endpoints the router picks) and to the "
            "router's picker port; nothing else is. One of gatewayName and gatewayFrom is "
            "required."
        ),
    )
    gateway_from: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=16,
        json_schema_extra={
            "items": free_form(
                "object",
                properties={
                    field: free_form(
                        "object",
                        description=f"{field} of a networking/v1 NetworkPolicyPeer, as written.",
                    )
                    for field in PEER_FIELDS
                },
            )
        },
        description=(
            "gatewayFrom are the NetworkPolicy peers (networking/v1 NetworkPolicyPeer) of the "
            "gateway's data plane, admitted to the leaders' HTTP port and to the router's "
            "picker port, for a gateway whose pods gatewayName does not select (other labels; "
            "GKE's managed gateways, outside the cluster: an ipBlock of the proxy-only "
            "subnet). Each peer has a podSelector (the gateway's own pods) or an ipBlock: a "
            "namespaceSelector alone would admit every pod of those namespaces. One of "
            "gatewayName and gatewayFrom is required."
        ),
    )
    gateway_namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description=(
            "gatewayNamespace is the namespace of gatewayName's pods (where the Gateway is). "
            "Default: the server's own namespace."
        ),
    )
    picker_auth: Literal["Token", "NetworkPolicyOnly"] = Field(
        default="Token",
        description=(
            "pickerAuth is how the router's picker knows its gateway. Token (the default): "
            "every ext_proc stream must carry the gRPC metadata 'authorization: Bearer "
            "<token>' (UNAUTHENTICATED otherwise), the token from tokenSecretRef, else from "
            "the Secret <name>-router-picker (key token) the operator creates with a random "
            "value; the gateway sends it (Envoy: the ext_proc filter's "
            "grpc_service.initial_metadata, from the same Secret). NetworkPolicyOnly: no "
            "token, for the gateways that build their ext_proc configuration from the "
            "InferencePool (GKE, Istio, kgateway, NGINX Gateway Fabric offer no way to add "
            "metadata); the NetworkPolicy admitting only gatewayName's pods (or gatewayFrom) "
            "is then the picker's only fence (docs/gateway.md)."
        ),
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description=(
            "tokenSecretRef names the Secret key holding the gateway's token (16 to 4096 "
            "printable characters) when pickerAuth is Token: mounted read-only into the "
            "router's pods (--picker-token-file). The picker then counts the gateway's answer "
            "statuses for outlier ejection. A router restart reads a new token. Default: the "
            "Secret <name>-router-picker the operator creates (key token)."
        ),
    )


class PdRoleSpec(Schema):
    tpu: TPUSpec | None = Field(
        default=None,
        description=(
            "tpu is the slice of one replica of this role, looked up in the topology catalog "
            "as spec.tpu is. Default: spec.tpu. The larger role's tensor parallelism (chips) "
            "must be a multiple of the smaller's: SGLang maps KV ranks by integer division."
        ),
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1024,
        description=(
            "replicas is the number of replica groups (whole slices) of this role; with "
            "autoscaling, the count it starts from. Default: 1."
        ),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description=(
            "image of this role's engine container. Default: spec.engine.image. Both roles "
            "must run the same image: KV layouts of different engine versions cannot pair."
        ),
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra=ENGINE_ARGS_SCHEMA,
        description=(
            "args are extra SGLang flags for this role's engines, over spec.engine.args (same "
            "form). The disaggregation flags are the operator's; page-size and kv-cache-dtype "
            "must match between roles."
        ),
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "autoscaling scales this role on its own: the operator creates a "
            "TPUModelServerRole <name>-<role> and a HorizontalPodAutoscaler <name>-<role> that "
            "scales it through its scale subresource (kubectl scale works on it too); the "
            "role's replica groups follow its spec.replicas, and replicas here only seeds it "
            "(within minReplicas..maxReplicas). metric: queue or ttft for prefill (ttft: the "
            "prefill engines' own p90 time to first token), queue or tokensInFlight for decode; "
            "minReplicas at least 1 (no scale to zero with roles). Removing it deletes the "
            "TPUModelServerRole: replicas is the count again. Unset: replicas is the count."
        ),
    )


class DisaggregationSpec(Schema):
    transfer_backend: Literal["mooncake", "mori", "nixl", "ascend", "fake"] = Field(
        default="mooncake",
        description=(
            "transferBackend is SGLang's --disaggregation-transfer-backend: mooncake, mori, "
            "nixl, ascend or fake. SGLang 0.5.23 has none that moves KV between TPU slices "
            "(they are RDMA GPU/NPU backends; fake moves nothing), so with engine.type sglang "
            "every value sets Valid=False, reason UnsupportedTransferBackend; the simulated "
            "engine times the transfer over the data-centre network whatever the value. "
            "Default: mooncake."
        ),
    )
    bootstrap_port: int = Field(
        default=disaggregation.DEFAULT_BOOTSTRAP_PORT,
        ge=1024,
        le=65535,
        description=(
            "bootstrapPort is the prefill engines' bootstrap server port "
            "(--disaggregation-bootstrap-port), advertised on their pods as the "
            "sglang.ai/bootstrap-port annotation. Default: 8998."
        ),
    )
    policy: Literal["conditional", "always"] = Field(
        default="conditional",
        description=(
            "policy is the router's --pd-policy: conditional disaggregates prompts whose "
            "uncached tokens reach the performance model's threshold when colocated replicas "
            "exist (none here: every request is disaggregated), always every request. "
            "Default: conditional."
        ),
    )
    prefill: PdRoleSpec = section(
        PdRoleSpec, "prefill is the role that computes prompts and sends their KV."
    )
    decode: PdRoleSpec = section(
        PdRoleSpec, "decode is the role that receives the KV and generates the answers."
    )


class SloSpec(Schema):
    ttft_p99_seconds: float = Field(
        gt=0,
        le=3600,
        description=(
            "ttftP99Seconds is the 99th percentile of time to first token the server must meet "
            "at spec.demand, in seconds. Example: 2."
        ),
    )
    itl_p99_seconds: float = Field(
        gt=0,
        le=60,
        description=(
            "itlP99Seconds is the 99th percentile of inter-token latency (each request's mean "
            "time between output tokens), in seconds. Example: 0.1."
        ),
    )
    ttft_p50_seconds: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="ttftP50Seconds is a median time to first token to meet too. Default: none.",
    )
    itl_p50_seconds: float | None = Field(
        default=None,
        gt=0,
        le=60,
        description="itlP50Seconds is a median inter-token latency to meet too. Default: none.",
    )


class DemandSpec(Schema):
    requests_per_second: float = Field(
        gt=0,
        le=1_000_000,
        description=(
            "requestsPerSecond is the request rate at the daily peak the server must serve "
            "within spec.slo. Example: 20."
        ),
    )
    prompt_tokens: int = Field(
        ge=1, le=10_000_000, description="promptTokens is the mean prompt length, in tokens."
    )
    output_tokens: int = Field(
        ge=1, le=10_000_000, description="outputTokens is the mean output length, in tokens."
    )
    prefix_reuse: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description=(
            "prefixReuse is the share of each prompt found in the prefix cache (a shared "
            "system prompt, earlier turns of a conversation). Default: 0."
        ),
    )
    trough: float = Field(
        default=0.35,
        ge=0,
        le=1,
        description=(
            "trough is the daily low as a share of the peak: with spec.autoscaling the plan's "
            "minReplicas is the peak's replicas times it (at least 1). Default: 0.35."
        ),
    )


class TPUModelServerSpec(Schema):
    model_config = ConfigDict(
        json_schema_extra=rules(
            (
                "has(self.tpu) || (has(self.slo) && has(self.demand))",
                "tpu is required unless slo and demand are set (the operator then sizes the "
                "server)",
            ),
            ("has(self.slo) == has(self.demand)", "slo and demand are set together"),
            (
                "!has(self.slo) || !has(self.disaggregation)",
                "slo sizes a colocated server; not with disaggregation",
            ),
        )
    )

    model: ModelSpec = Field(description="model is what to serve.")
    # Unset only with slo and demand: `slo_plan.resolve` fills it in before anything reads it
    # (`validation.validate`), so every validated spec has one and the type says so.
    tpu: TPUSpec = Field(  # type: ignore[assignment]
        default=None,
        description=(
            "tpu is the TPU slice serving one replica. Required unless slo and demand are set: "
            "then the operator chooses the slice (status.plan); set with them, the slice is "
            "yours and the operator sizes only the replicas."
        ),
    )
    replicas: int = Field(
        default=1,
        ge=0,
        le=1024,
        description=(
            "replicas is the number of replica groups; each is one whole slice (hosts of the "
            "topology, one pod per host). 0 keeps the router and Services but no engines. "
            "The scale subresource sets it (kubectl scale, HPA, KEDA). Default: 1."
        ),
    )
    engine: EngineSpec = section(
        EngineSpec, "engine configures the model server (SGLang on TorchTPU or the simulator)."
    )
    router: RouterSpec = section(
        RouterSpec, "router configures the prefix-aware router in front of the replicas."
    )
    kv_cache: KvCacheSpec | None = Field(
        default=None,
        description=(
            "kvCache configures the engines' KV cache beyond HBM: host adds a host-memory "
            "tier. Unset: HBM only."
        ),
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "autoscaling makes the operator create a HorizontalPodAutoscaler (engine hpa) or a "
            "KEDA ScaledObject (engine keda) that scales this server's replicas (whole slices) "
            "through its scale subresource. It then owns spec.replicas: leave replicas out of "
            "applied manifests. Unset: no autoscaler."
        ),
    )
    rollout: RolloutSpec = section(
        RolloutSpec,
        "rollout controls how spec changes and restarts roll over replica groups: one group "
        "at a time by default, restarting every host of a slice together.",
    )
    monitoring: MonitoringSpec = section(
        MonitoringSpec, "monitoring objects for the Prometheus Operator."
    )
    template: PodTemplateOverrides = section(
        PodTemplateOverrides,
        "template holds pod overrides: annotations, labels, nodeSelector, tolerations, "
        "affinity, priorityClassName, serviceAccountName, imagePullSecrets.",
    )
    inference_pool: InferencePoolSpec | None = Field(
        default=None,
        description=(
            "inferencePool puts the server behind a gateway of the Gateway API Inference "
            "Extension: the operator creates an InferencePool (inference.networking.k8s.io/v1) "
            "named after the server, selecting its serving leaders on the engine port, whose "
            "endpoint picker is the server's router (`tpuserve router --picker-port`, the "
            "Service <name>-picker, port 9002). Route to it with an HTTPRoute backendRef of "
            "kind InferencePool (docs/gateway.md). Needs the router and the InferencePool CRD; "
            "not with spec.disaggregation (docs/pd.md). An InferencePool of that name the "
            "operator did not create is left alone. Default: unset, no pool."
        ),
    )
    disaggregation: DisaggregationSpec | None = Field(
        default=None,
        description=(
            "disaggregation splits the server into a prefill and a decode role, each its own "
            "replica groups (slices) with its own TPU shape, replicas and engine flags, routed "
            "as pairs (docs/pd.md). It then owns the replica count: spec.replicas is ignored "
            "and spec.autoscaling is not allowed (each role has its own autoscaling). Unset: "
            "every replica serves whole requests."
        ),
    )
    slo: SloSpec | None = Field(
        default=None,
        description=(
            "slo sizes the server, with demand: the operator's planner (the performance model, "
            'analytic: docs/capacity-planning.md, "The fit check") chooses the slice among '
            "the operator's --plan-slices (unless tpu is set) and the replicas for the peak, and "
            "writes its choice and operating point to status.plan; it plans again when the spec "
            "changes. Without autoscaling, replicas is the peak's count; with it, "
            "minReplicas and maxReplicas are the plan's bounds (maxReplicas as written stays a "
            "cap; minReplicas 0 stays 0). Needs a model the performance "
            "model knows (a built-in profile's source, or model.architecture). Unset: tpu and "
            "replicas are the size."
        ),
    )
    demand: DemandSpec | None = Field(
        default=None,
        description="demand is the load slo must hold at: the peak rate and the mean lengths.",
    )


# ---- status ---------------------------------------------------------------------------------


class Condition(Schema):
    type: str = Field(
        max_length=316,
        description="type of the condition: Valid, Progressing, Ready or Degraded.",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="status of the condition.")
    reason: str = Field(
        max_length=1024,
        description="reason is a CamelCase identifier for programs, e.g. Unschedulable.",
    )
    message: str = Field(
        default="",
        max_length=32768,
        description="message is a sentence for humans, naming fields and allowed values.",
    )
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"},
        description="lastTransitionTime is when status last changed.",
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="observedGeneration is the metadata.generation the condition was set for.",
    )


class GroupStatus(Schema):
    role: Literal["prefill", "decode"] | None = Field(
        default=None,
        description="role of the group on a disaggregated server (its index is the role's).",
    )
    index: int = Field(ge=0, description="index of the replica group (within its role).")
    name: str = Field(description="name of the group's workload (LeaderWorkerSet/StatefulSet).")
    state: Literal["Pending", "Starting", "Ready", "Degraded", "Terminating"] = Field(
        description=(
            "state: Pending (pods not all scheduled), Starting (all scheduled, loading or "
            "compiling), Ready (every host up, leader serving), Degraded (partly up for too "
            "long, crash-looping or unschedulable), Terminating."
        ),
    )
    hosts: int = Field(ge=0, description="hosts is the pods the group needs.")
    ready_hosts: int = Field(ge=0, description="readyHosts is the group's ready pods.")
    updated: bool = Field(description="updated is true when all pods run the current revision.")
    reason: str = Field(default="", description="reason for the state, CamelCase.")
    message: str = Field(default="", description="message explaining the state.")
    since: str = Field(
        json_schema_extra={"format": "date-time"}, description="since is when state last changed."
    )


class RoleStatus(Schema):
    role: Literal["prefill", "decode"] = Field(description="role of these replica groups.")
    desired: int = Field(
        default=0,
        ge=0,
        description=(
            "desired: the replica groups the role should have: its replicas, or its "
            "TPUModelServerRole's spec.replicas when it autoscales."
        ),
    )
    replicas: int = Field(default=0, ge=0, description="replicas: the role's groups that exist.")
    ready_replicas: int = Field(
        default=0, ge=0, description="readyReplicas: the role's groups ready to serve."
    )
    updated_replicas: int = Field(
        default=0,
        ge=0,
        description="updatedReplicas: the role's wanted groups on the role's revision.",
    )
    revision: str = Field(
        default="",
        description=(
            "revision: the hash of the role's own pod templates; a change to one role's "
            "templates rolls that role's groups only."
        ),
    )
    groups: list[int] = Field(
        default_factory=list, description="groups: indices of the role's replica groups."
    )


class OperatingPointStatus(Schema):
    requests_per_second: float = Field(
        ge=0, description="requestsPerSecond one replica serves within the SLO."
    )
    concurrency: float = Field(
        ge=0, description="concurrency: requests in one replica there (waiting and running)."
    )
    decode_batch: int = Field(ge=0, description="decodeBatch: requests generating at once.")
    ttft_p50_seconds: float = Field(ge=0, description="ttftP50Seconds there.")
    ttft_p99_seconds: float = Field(ge=0, description="ttftP99Seconds there.")
    itl_seconds: float = Field(ge=0, description="itlSeconds: mean inter-token latency there.")
    tokens_per_second_per_chip: float = Field(
        ge=0, description="tokensPerSecondPerChip: prompt + output tokens per chip there."
    )


class ErrorBandStatus(Schema):
    median: float = Field(ge=0, description="median |error| of the performance model.")
    worst: float = Field(ge=0, description="worst |error| of the performance model.")
    figures: int = Field(ge=0, description="figures: published TPU serving figures compared.")


class PlanStatus(Schema):
    workload: Literal["LeaderWorkerSet", "StatefulSet"] = Field(
        description="workload kind used for each replica group."
    )
    machine_type: str = Field(description="machineType of each host, e.g. ct6e-standard-4t.")
    hosts: int = Field(ge=1, description="hosts (pods) per replica.")
    chips_per_host: int = Field(ge=1, description="chipsPerHost: google.com/tpu per pod.")
    chips: int = Field(ge=1, description="chips per replica.")
    source: Literal["Spec", "Planned"] = Field(
        default="Spec",
        description=(
            "source: Spec when spec.tpu gave the slice, Planned when the operator chose it "
            "from spec.slo and spec.demand."
        ),
    )
    generation: str = Field(default="", description="generation of the slice.")
    topology: str = Field(default="", description="topology of the slice.")
    min_replicas: int | None = Field(
        default=None, ge=0, description="minReplicas: the plan's bound for the trough (slo)."
    )
    max_replicas: int | None = Field(
        default=None, ge=0, description="maxReplicas: the plan's replicas for the peak (slo)."
    )
    operating_point: OperatingPointStatus | None = Field(
        default=None, description="operatingPoint: one replica at the plan's SLO load (slo)."
    )
    error_band: ErrorBandStatus | None = Field(
        default=None,
        description="errorBand: the performance model's error the plan carries (slo).",
    )
    message: str = Field(default="", description="message: the plan in a sentence (slo).")
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="observedGeneration: the metadata.generation the plan was made for (slo).",
    )


class ColdStartStatus(Schema):
    pod: str = Field(description="pod is the leader whose start this was.")
    cache_result: Literal["hit", "miss"] = Field(
        description="cacheResult: hit when the compile cache held the key, else miss."
    )
    pull_seconds: float = Field(ge=0, description="pullSeconds: the image pull.")
    weights_seconds: float = Field(ge=0, description="weightsSeconds: reading the weights.")
    compile_seconds: float = Field(ge=0, description="compileSeconds: XLA compilation.")
    warmup_seconds: float = Field(ge=0, description="warmupSeconds: the warmup request.")


class CompileCacheStatus(Schema):
    key: str = Field(
        description=(
            "key is the compile cache key, <generation>-<topology>/<model>/<engine version>: "
            "replicas with the same key share compiled programs."
        )
    )
    location: str = Field(
        default="",
        description=(
            "location is where the cache is (pvc/<claim>); empty: none, every start compiles."
        ),
    )
    hits: int = Field(default=0, ge=0, description="hits: leader starts that found the key.")
    misses: int = Field(default=0, ge=0, description="misses: leader starts that compiled cold.")
    last_cold_start: ColdStartStatus | None = Field(
        default=None, description="lastColdStart is the last leader start's seconds by phase."
    )


class GatewayParentStatus(Schema):
    gateway: str = Field(description="gateway is the parent Gateway, namespace/name.")
    accepted: bool = Field(description="accepted: the gateway's Accepted condition is True.")
    reason: str = Field(default="", description="reason of the gateway's Accepted condition.")
    message: str = Field(default="", description="message of the gateway's Accepted condition.")


class InferencePoolStatus(Schema):
    name: str = Field(description="name of the InferencePool.")
    managed: bool = Field(
        description=(
            "managed: the operator created the pool and keeps it; false when a pool of that "
            "name existed that the operator did not create (it is left alone)."
        )
    )
    accepted: bool = Field(
        default=False, description="accepted: at least one gateway accepted the pool."
    )
    parents: list[GatewayParentStatus] = Field(
        default_factory=list,
        max_length=32,
        description="parents: the gateways that report on the pool (its status.parents).",
    )


FloorReason = Literal[
    "FloorDecides", "ReactiveDecides", "AtMinReplicas", "AtMaxReplicas", "NotMeasured"
]


class PredictiveFloorStatus(Schema):
    scaled_object: str = Field(
        description="scaledObject is the KEDA ScaledObject whose predictive-floor trigger this is."
    )
    role: str = Field(
        default="", description="role: prefill or decode for a disaggregated server's role."
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        description=(
            "replicas is the floor now: ceil(forecast / requestsPerReplica), within the "
            "ScaledObject's minReplicaCount..maxReplicaCount; unset until KEDA's "
            "HorizontalPodAutoscaler reports the trigger."
        ),
    )
    forecast_requests_per_second: float | None = Field(
        default=None,
        ge=0,
        description=(
            "forecastRequestsPerSecond is the request rate the floor expects horizonSeconds "
            "ahead (the larger of the trend and yesterday's shape), as KEDA last read it."
        ),
    )
    requests_per_replica: float = Field(
        gt=0, description="requestsPerReplica: the trigger's threshold (the spec's)."
    )
    horizon_seconds: int = Field(ge=0, description="horizonSeconds: how far ahead it looks.")
    reactive_replicas: int | None = Field(
        default=None,
        ge=0,
        description="reactiveReplicas: what the reactive trigger alone asks for now.",
    )
    current_replicas: int | None = Field(
        default=None, ge=0, description="currentReplicas: KEDA's HPA's count now."
    )
    reason: FloorReason = Field(
        description=(
            "reason: which decides the count: the floor (above the reactive trigger), the "
            "reactive trigger, the bounds, or NotMeasured (KEDA has not reported the trigger)."
        )
    )
    message: str = Field(default="", description="message says why, with the figures.")


class TPUModelServerStatus(Schema):
    observed_generation: int | None = Field(
        default=None, description="observedGeneration is the generation last reconciled."
    )
    replicas: int = Field(default=0, description="replicas is the number of replica groups.")
    ready_replicas: int = Field(
        default=0, description="readyReplicas is the number of groups ready to serve."
    )
    updated_replicas: int = Field(
        default=0, description="updatedReplicas is the number of groups on the current revision."
    )
    endpoint: str = Field(
        default="", description="endpoint is the in-cluster URL of the OpenAI-compatible API."
    )
    served_name: str = Field(
        default="", description="servedName is the resolved model name clients send."
    )
    selector: str = Field(
        default="",
        description="selector of the leader pods, for the scale subresource (HPA).",
    )
    revision: str = Field(default="", description="revision is the current pod-template hash.")
    plan: PlanStatus | None = Field(
        default=None, description="plan is the resolved slice: workload, hosts and chips."
    )
    groups: list[GroupStatus] = Field(
        default_factory=list, description="groups is the state of each replica group."
    )
    compile_cache: CompileCacheStatus | None = Field(
        default=None,
        description=(
            "compileCache is the compile cache key and, as the leaders report them once "
            "Ready, its hits and misses and the last cold start by phase."
        ),
    )
    inference_pool: InferencePoolStatus | None = Field(
        default=None,
        description=(
            "inferencePool is the server's InferencePool and whether a gateway accepted it "
            "(spec.inferencePool)."
        ),
    )
    roles: list[RoleStatus] = Field(
        default_factory=list,
        description=(
            "roles: with spec.disaggregation, each role's replica groups and how many are "
            "ready (prefill first, then decode); empty otherwise."
        ),
    )
    predictive_floor: list[PredictiveFloorStatus] = Field(
        default_factory=list,
        max_length=2,
        description=(
            "predictiveFloor: with autoscaling.keda.predictiveFloor, the floor now and why, per "
            "ScaledObject (the server's, or each role's), read from KEDA's "
            "HorizontalPodAutoscaler; empty otherwise."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        description="conditions: Valid, Progressing, Ready, Degraded.",
    )


# ---- TPUModelServerRole: an autoscaled role's count, for its HorizontalPodAutoscaler ----------


class TPUModelServerRoleSpec(Schema):
    role: Literal["prefill", "decode"] = Field(
        description="role is the disaggregated server's role whose replica groups this counts."
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1024,
        description=(
            "replicas is the role's replica groups (whole slices), set through the scale "
            "subresource by the role's HorizontalPodAutoscaler (or kubectl scale); the operator "
            "renders that many groups of the role. The operator sets it once, when it creates "
            "this object, to the role's replicas within autoscaling.minReplicas..maxReplicas."
        ),
    )


class TPUModelServerRoleStatus(Schema):
    replicas: int = Field(
        default=0, ge=0, description="replicas: the role's replica groups that exist."
    )
    selector: str = Field(
        default="",
        description=(
            "selector of the role's leader pods, for the scale subresource (the HPA's Pods "
            "metrics average over them)."
        ),
    )
