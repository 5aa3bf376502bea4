"""`spec.model`: what to serve (weights source, served name, architecture, LoRA adapters)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from sglang_tpu import lora
from sglang_tpu import model_config as config_json
from tpuserve_operator.schema.base import (
    LABEL_VALUE,
    NO_COMMA,
    Schema,
    SecretKeyRef,
    rules,
    source_rule,
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
