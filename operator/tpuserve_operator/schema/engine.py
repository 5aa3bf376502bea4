"""`spec.engine`: the model server (type, image, execution mode, flags, speculative decoding,
compile cache, resources and environment)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from tpuserve_operator.schema.base import (
    DNS_LABEL,
    ENGINE_ARGS_SCHEMA,
    GCS_PREFIX_PATTERN,
    Schema,
    free_form,
    rules,
    source_rule,
)


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
