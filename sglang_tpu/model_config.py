"""A model's performance profile from its Hugging Face ``config.json``: one reading, two doors.

The performance model and the HBM fit rule know nine models by name (`perf_model.PROFILES`);
any other decoder gets its profile from the facts of its ``config.json`` that the model uses:
layers, hidden size, attention and KV heads, head dim, MLP width, vocabulary, context and,
for a mixture of experts, the experts. Two callers read them here, so both count the same
parameters and refuse the same values with the same words:

- `tpuserve plan --hf-config FILE` (the file itself; `tpuserve.plan.planner`);
- the operator, from ``spec.model.architecture`` (the same keys in camelCase, validated by the
  CRD's schema; `tpuserve_operator.model_profile`): an operator pod cannot reach the Hub, so
  the facts are in the spec, where `kubectl apply` checks them and `tpuserve plan --emit`
  writes them.

Every value is checked before any arithmetic (a string where a count goes would multiply).
A config that is not a decoder's (``is_encoder_decoder: true``, or ``architectures`` naming
no ``...ForCausalLM`` / ``...ForConditionalGeneration`` class) is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sglang_tpu.perf_model import ModelProfile

MAX_COUNT = 1 << 31
"""The largest count (layers, sizes, heads, experts) a config may give."""
DEFAULT_CONTEXT = 8192
"""The context length of a config without ``max_position_embeddings``."""
DECODER_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")
"""Class names of decoders that generate text (the second: multimodal wrappers whose
``text_config`` is the decoder, e.g. Gemma 3, Mistral 3, Llama 4)."""

# (config.json key, what the key means): the keys read, in the order of the spec's fields.
KEYS: tuple[tuple[str, str], ...] = (
    ("num_hidden_layers", "decoder layers"),
    ("hidden_size", "the hidden (model) width"),
    ("num_attention_heads", "query heads"),
    ("num_key_value_heads", "KV heads (grouped-query attention); default: num_attention_heads"),
    ("head_dim", "dimension of one head; default: hidden_size / num_attention_heads"),
    (
        "intermediate_size",
        "the MLP's width (dense models; MoE: the experts' if moe_intermediate_size is absent)",
    ),
    ("vocab_size", "vocabulary (the embedding and the LM head)"),
    ("max_position_embeddings", f"the longest context; default: {DEFAULT_CONTEXT}"),
    ("tie_word_embeddings", "whether the LM head is the input embedding; default: false"),
    ("num_experts", "routed experts (MoE; also num_local_experts, n_routed_experts)"),
    ("num_experts_per_tok", "experts each token is routed to (MoE)"),
    ("moe_intermediate_size", "one expert's MLP width (MoE)"),
)


class ModelConfigError(ValueError):
    """A config.json (or spec.model.architecture) the performance model cannot use; the
    message names the field, its value and what is allowed."""


def text_config(cfg: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """The decoder's part of a config: ``text_config`` when there is one (multimodal)."""
    text = cfg.get("text_config", cfg)
    if not isinstance(text, Mapping):
        raise ModelConfigError(f"{where}: text_config must be a JSON object")
    return text


def decoder_problem(cfg: Mapping[str, Any]) -> str | None:
    """Why ``cfg`` (a whole config.json) is not a text decoder's, None when it is."""
    if cfg.get("is_encoder_decoder") is True:
        return (
            "is_encoder_decoder: True is not allowed; allowed: a decoder-only model "
            "(an encoder-decoder such as T5 is not served)"
        )
    names = cfg.get("architectures")
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return f"architectures: {names!r:.60} is not allowed; allowed: a list of class names"
    if names and not any(n.endswith(DECODER_SUFFIXES) for n in names):
        return (
            f"architectures: {names!r:.80} is not allowed; allowed: a decoder "
            f"({' or '.join('...' + s for s in DECODER_SUFFIXES)}); this is not a model "
            "that generates text"
        )
    return None


def canonical(cfg: Mapping[str, Any], where: str) -> dict[str, int | bool]:
    """The keys of `KEYS` that ``cfg`` (a whole config.json, or its decoder part) gives, each
    checked, by their main name (``n_layer`` read as ``num_hidden_layers``, ...); a missing
    required key, a value of the wrong type and a config that is not a decoder's are refused
    (`ModelConfigError` naming the key, the value and what is allowed)."""
    problem = decoder_problem(cfg)
    if problem is not None:
        raise ModelConfigError(f"{where}: {problem}")
    cfg = text_config(cfg, where)
    allowed = f"an integer from 1 to {MAX_COUNT}"
    out: dict[str, int | bool] = {}

    def count(key: str, value: object) -> int:
        if type(value) is int and 0 < value <= MAX_COUNT:  # bool is no count
            return value
        raise ModelConfigError(f"{where}: {key}: {value!r:.40} is not allowed; allowed: {allowed}")

    def take(key: str, *alts: str, required: bool = False) -> None:
        """The first of ``key``, ``alts`` given (null, or 0 for an optional key, counts as not
        given)."""
        for k in (key, *alts):
            if cfg.get(k) is not None and (required or cfg.get(k) != 0):
                out[key] = count(k, cfg[k])
                return
        if required:
            raise ModelConfigError(
                f"{where}: {key} is missing or not a positive integer; allowed: a decoder's "
                "config.json (num_hidden_layers, hidden_size, num_attention_heads, "
                "intermediate_size, vocab_size)"
            )

    take("num_hidden_layers", "n_layer", "num_layers", required=True)
    take("hidden_size", "n_embd", "d_model", required=True)
    take("num_attention_heads", "n_head", required=True)
    take("num_key_value_heads")
    take("head_dim")
    take("vocab_size", required=True)
    take("max_position_embeddings")
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ModelConfigError(
            f"{where}: tie_word_embeddings: {tied!r:.40} is not allowed; allowed: true or false"
        )
    out["tie_word_embeddings"] = tied
    take("num_experts", "num_local_experts", "n_routed_experts")
    take("num_experts_per_tok")
    take("moe_intermediate_size")
    take("intermediate_size", required=not out.get("num_experts") or "moe_intermediate_size"
         not in out)  # fmt: skip
    heads = int(out["num_attention_heads"])
    if int(out.get("num_key_value_heads", heads)) > heads:
        raise ModelConfigError(
            f"{where}: num_key_value_heads: {out['num_key_value_heads']} is not allowed; "
            f"allowed: at most num_attention_heads ({heads})"
        )
    experts = int(out.get("num_experts", 0))
    per_token = int(out.get("num_experts_per_tok", 0))
    if experts and per_token > experts:
        raise ModelConfigError(
            f"{where}: num_experts_per_tok: {per_token} is not allowed; allowed: at most the "
            f"experts ({experts})"
        )
    return out


def profile_from_config(cfg: Mapping[str, Any], where: str, name: str) -> ModelProfile:
    """The `ModelProfile` of a decoder from its config.json's keys (see `KEYS`); ``where``
    prefixes every refusal (e.g. ``--hf-config: PATH`` or ``spec.model.architecture``)."""
    c = canonical(cfg, where)
    layers = int(c["num_hidden_layers"])
    hidden = int(c["hidden_size"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads", heads))
    head_dim = int(c.get("head_dim", max(1, hidden // heads)))
    vocab = int(c["vocab_size"])
    context = int(c.get("max_position_embeddings", DEFAULT_CONTEXT))
    tied = bool(c["tie_word_embeddings"])
    experts = int(c.get("num_experts", 0))
    per_token = int(c.get("num_experts_per_tok", 0))
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    embedding = vocab * hidden * (1 if tied else 2)
    if experts:
        moe = int(c.get("moe_intermediate_size") or c["intermediate_size"])
        expert_params = layers * experts * 3 * hidden * moe
        shared = layers * attention + embedding
        total = shared + expert_params
        active = shared + layers * max(1, per_token) * 3 * hidden * moe
    else:
        mlp = 3 * hidden * int(c["intermediate_size"])
        total = active = layers * (attention + mlp) + embedding
        expert_params = 0
    return ModelProfile(
        name=name or "custom", hf_ids=(), layers=layers, hidden_size=hidden,
        attention_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        parameters=float(total), active_parameters=float(active), vocab_size=vocab,
        context_length=context, experts=experts, experts_per_token=per_token,
        expert_parameters=float(expert_params), tied_embeddings=tied,
    )  # fmt: skip


def architecture_from_json(text: str, where: str, name: str = "") -> ModelProfile:
    """The profile of a JSON object of config.json keys (the launch contract's
    ``TPUSERVE_MODEL_ARCHITECTURE``, the twin's ``--model-architecture``)."""
    try:
        cfg = json.loads(text)
    except ValueError as err:
        raise ModelConfigError(f"{where}: not valid JSON: {err}") from None
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{where}: {text!r:.40} is not allowed; allowed: a JSON object")
    unknown = sorted(set(cfg) - {key for key, _ in KEYS})
    if unknown:
        raise ModelConfigError(
            f"{where}: {unknown[0]!r:.40} is not allowed; allowed: the keys "
            f"{', '.join(key for key, _ in KEYS)}"
        )
    return profile_from_config(cfg, where, name)
