"""TPU performance model: model profiles, per-slice step times and the HBM fit check.

The engine twin's scheduler asks it how long each step takes; the operator asks it whether a
model fits a slice; `tpuserve plan` (later) will ask it what a replica can serve. Hardware
facts (HBM, bandwidth, FLOP/s per chip) come from `sglang_tpu.topology`; nothing here
re-spells them.

The model (a roofline with two efficiency factors and a fixed overhead):

- **weights** = parameters x bytes per parameter of the quantization;
- **KV bytes per token** = 2 (K and V) x layers x KV heads x head dim x KV-cache dtype bytes;
- **one scheduler step** that prefills ``p`` new tokens (attending to ``a`` context tokens in
  total) and decodes one token for ``b`` running sequences holding ``c`` context tokens takes
  ``STEP_OVERHEAD + max(compute, memory)`` where
  ``compute = (2 x active_params x (p + b) + 4 x layers x heads x head_dim x (a + c))
  / (chips x peak FLOP/s x PREFILL_MFU)`` and
  ``memory = (weights touched + KV bytes x (c + a)) / (chips x HBM bandwidth x DECODE_MBU)``;
- for MoE models a decode batch touches the shared weights plus, per layer, the experts its
  tokens route to (at most all of them), so small batches read far less than all weights;
- **fit**: weights + KV for one full ``context_length`` sequence must fit in
  ``MEM_FRACTION_STATIC`` of the slice's HBM; the rest of that fraction is the KV pool.

The efficiencies are calibrated against published TPU serving figures; the table and the
error are in ``docs/engine-sim.md``. They are the only tuning knobs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sglang_tpu.topology import GIB, SliceShape

PREFILL_MFU = 0.55
DECODE_MBU = 0.70
STEP_OVERHEAD_SECONDS = 0.002
MULTI_HOST_STEP_OVERHEAD_SECONDS = 0.001  # extra per step when the slice spans several hosts
MEM_FRACTION_STATIC = 0.88

WEIGHT_BYTES: Mapping[str, float] = MappingProxyType(
    {"bf16": 2.0, "none": 2.0, "fp8": 1.0, "int8": 1.0, "w8a8": 1.0, "int4": 0.5, "awq": 0.5}
)
KV_CACHE_BYTES: Mapping[str, float] = MappingProxyType(
    {"auto": 2.0, "bf16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "int8": 1.0}
)


class ModelDoesNotFit(ValueError):
    """Weights plus one full-context sequence of KV exceed the slice's usable HBM."""

    def __init__(self, message: str, missing_bytes: float) -> None:
        super().__init__(message)
        self.missing_bytes = missing_bytes


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Architecture facts of one model (from its Hugging Face config.json)."""

    name: str
    hf_ids: tuple[str, ...]
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    parameters: float
    active_parameters: float
    vocab_size: int
    context_length: int
    experts: int = 0  # 0 for dense models
    experts_per_token: int = 0
    expert_parameters: float = 0.0  # parameters in all routed experts together

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def weight_bytes(self, quantization: str = "bf16") -> float:
        return self.parameters * _weight_bytes_per_param(quantization)

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto") -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * _kv_bytes(kv_cache_dtype)


PROFILES: Mapping[str, ModelProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            ModelProfile(
                name="llama-3.1-8b",
                hf_ids=("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B",
                        "meta-llama/Meta-Llama-3.1-8B-Instruct"),
                layers=32, hidden_size=4096, attention_heads=32, kv_heads=8, head_dim=128,
                parameters=8.03e9, active_parameters=8.03e9, vocab_size=128256,
                context_length=131072,
            ),
            ModelProfile(
                name="qwen3-8b",
                hf_ids=("Qwen/Qwen3-8B", "Qwen/Qwen3-8B-FP8"),
                layers=36, hidden_size=4096, attention_heads=32, kv_heads=8, head_dim=128,
                parameters=8.19e9, active_parameters=8.19e9, vocab_size=151936,
                context_length=40960,
            ),
            ModelProfile(
                name="qwen3-32b",
                hf_ids=("Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8"),
                layers=64, hidden_size=5120, attention_heads=64, kv_heads=8, head_dim=128,
                parameters=32.8e9, active_parameters=32.8e9, vocab_size=151936,
                context_length=40960,
            ),
            ModelProfile(
                name="llama-3.3-70b",
                hf_ids=("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct",
                        "meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
                layers=80, hidden_size=8192, attention_heads=64, kv_heads=8, head_dim=128,
                parameters=70.6e9, active_parameters=70.6e9, vocab_size=128256,
                context_length=131072,
            ),
            ModelProfile(
                name="qwen3-235b-a22b",
                hf_ids=("Qwen/Qwen3-235B-A22B", "Qwen/Qwen3-235B-A22B-Instruct-2507",
                        "Qwen/Qwen3-235B-A22B-FP8", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8"),
                layers=94, hidden_size=4096, attention_heads=64, kv_heads=4, head_dim=128,
                parameters=235.1e9, active_parameters=22.2e9, vocab_size=151936,
                context_length=40960, experts=128, experts_per_token=8,
                expert_parameters=227.0e9,
            ),
        )
    }
)  # fmt: skip
DEFAULT_PROFILE = "llama-3.1-8b"


def profile_names() -> list[str]:
    return list(PROFILES)


def get_profile(name: str, field_path: str = "--model-profile") -> ModelProfile:
    """The profile called `name` (or with that HF id); ValueError naming the allowed ones."""
    found = PROFILES.get(name) or lookup_hf_model(name)
    if found is None:
        raise ValueError(
            f"{field_path}: {name!r} is not allowed; allowed: {', '.join(PROFILES)} "
            "(or a Hugging Face id of one of them)"
        )
    return found


def _normalise(model_id: str) -> str:
    base = model_id.rstrip("/").rsplit("/", 1)[-1].lower()
    base = re.sub(r"^meta-", "", base)
    base = re.sub(r"(-instruct)?(-\d{4})?(-fp8|-awq|-int4|-int8)?$", "", base)
    return base


_BY_HF_ID: Mapping[str, ModelProfile] = MappingProxyType(
    {hf.lower(): p for p in PROFILES.values() for hf in p.hf_ids}
)
_BY_BASE: Mapping[str, ModelProfile] = MappingProxyType(
    {_normalise(hf): p for p in PROFILES.values() for hf in p.hf_ids}
)


def lookup_hf_model(model_id: str) -> ModelProfile | None:
    """The profile for a Hugging Face id (`Qwen/Qwen3-8B`, `meta-llama/Llama-3.1-8B-Instruct`,
    a local path ending in such a name); None when the model is unknown."""
    exact = _BY_HF_ID.get(model_id.lower())
    if exact is not None:
        return exact
    return _BY_BASE.get(_normalise(model_id))


def _weight_bytes_per_param(quantization: str, field_path: str = "quantization") -> float:
    try:
        return WEIGHT_BYTES[quantization]
    except KeyError:
        raise ValueError(
            f"{field_path}: {quantization!r} is not allowed; allowed: {', '.join(WEIGHT_BYTES)}"
        ) from None


def _kv_bytes(kv_cache_dtype: str, field_path: str = "kvCacheDtype") -> float:
    try:
        return KV_CACHE_BYTES[kv_cache_dtype]
    except KeyError:
        raise ValueError(
            f"{field_path}: {kv_cache_dtype!r} is not allowed; allowed: {', '.join(KV_CACHE_BYTES)}"
        ) from None


def usable_hbm_bytes(shape: SliceShape) -> float:
    return shape.hbm_bytes * MEM_FRACTION_STATIC


def kv_pool_tokens(
    shape: SliceShape,
    profile: ModelProfile,
    quantization: str = "bf16",
    kv_cache_dtype: str = "auto",
) -> int:
    """Tokens of KV the slice holds after weights (SGLang's ``max_total_num_tokens``); >= 0."""
    free = usable_hbm_bytes(shape) - profile.weight_bytes(quantization)
    return max(0, int(free // profile.kv_bytes_per_token(kv_cache_dtype)))


def check_fits(
    shape: SliceShape,
    profile_name: str,
    quantization: str,
    kv_cache_dtype: str,
    context_length: int,
) -> None:
    """Raise ModelDoesNotFit when weights + one `context_length` sequence exceed usable HBM."""
    profile = get_profile(profile_name, "model")
    if context_length <= 0:
        raise ValueError(f"contextLength: {context_length!r} is not allowed; allowed: >= 1")
    weights = profile.weight_bytes(quantization)
    kv = profile.kv_bytes_per_token(kv_cache_dtype) * context_length
    usable = usable_hbm_bytes(shape)
    missing = weights + kv - usable
    if missing > 0:
        raise ModelDoesNotFit(
            f"{profile.name} ({quantization} weights {weights / GIB:.1f} GiB + {kv_cache_dtype} "
            f"KV for {context_length} tokens {kv / GIB:.1f} GiB) does not fit {shape.key} "
            f"({shape.chips} chips, {usable / GIB:.1f} GiB usable of {shape.hbm_bytes / GIB:.0f}"
            f" GiB HBM): short by {missing / GIB:.1f} GiB; use a larger topology, "
            "quantization fp8 or a shorter context",
            missing_bytes=missing,
        )


class StepTimer:
    """Step times of one model on one slice; coefficients precomputed so a call is cheap."""

    def __init__(
        self,
        shape: SliceShape,
        profile: ModelProfile,
        quantization: str = "bf16",
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.shape = shape
        self.profile = profile
        gen = shape.generation
        chips = shape.chips
        self.weight_bytes = profile.weight_bytes(quantization)
        self.kv_bytes_per_token = profile.kv_bytes_per_token(kv_cache_dtype)
        peak = gen.peak_bf16_flops_per_chip
        if quantization in ("fp8", "int8", "w8a8") and gen.peak_8bit_flops_per_chip:
            peak = gen.peak_8bit_flops_per_chip
        self._flops_per_second = chips * peak * PREFILL_MFU
        self._bytes_per_second = chips * gen.hbm_bandwidth_bytes_per_second * DECODE_MBU
        self._flops_per_token = 2.0 * profile.active_parameters
        self._attn_flops_per_ctx = 4.0 * profile.layers * profile.attention_heads * profile.head_dim
        self.overhead_seconds = STEP_OVERHEAD_SECONDS + (
            MULTI_HOST_STEP_OVERHEAD_SECONDS if shape.multi_host else 0.0
        )
        wpb = _weight_bytes_per_param(quantization)
        if profile.is_moe:
            self._shared_weight_bytes = (profile.parameters - profile.expert_parameters) * wpb
            self._expert_weight_bytes = profile.expert_parameters * wpb / profile.experts
        else:
            self._shared_weight_bytes = self.weight_bytes
            self._expert_weight_bytes = 0.0

    def _weights_touched(self, tokens: int) -> float:
        p = self.profile
        if not p.is_moe:
            return self.weight_bytes
        experts = min(p.experts, max(1, tokens) * p.experts_per_token)
        return self._shared_weight_bytes + experts * self._expert_weight_bytes

    def step_seconds(
        self,
        prefill_tokens: int = 0,
        prefill_attention_context: int = 0,
        decode_batch: int = 0,
        decode_context: int = 0,
    ) -> float:
        """One scheduler step (see the module docstring); 0 work costs only the overhead."""
        tokens = prefill_tokens + decode_batch
        if tokens == 0:
            return self.overhead_seconds
        compute = (
            self._flops_per_token * tokens
            + self._attn_flops_per_ctx * (prefill_attention_context + decode_context)
        ) / self._flops_per_second
        memory = (
            self._weights_touched(tokens)
            + self.kv_bytes_per_token
            * (decode_context + prefill_attention_context / max(1, prefill_tokens))
        ) / self._bytes_per_second
        return self.overhead_seconds + max(compute, memory)

    def prefill_seconds(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """One request's prefill of `new_tokens` after a cached prefix of `cached_tokens`."""
        attention = new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2
        return self.step_seconds(prefill_tokens=new_tokens, prefill_attention_context=attention)

    def decode_step_seconds(self, batch: int, context_tokens: int) -> float:
        """One decode step for `batch` sequences holding `context_tokens` tokens in total."""
        return self.step_seconds(decode_batch=batch, decode_context=context_tokens)


def prefill_seconds(
    shape: SliceShape,
    profile_name: str,
    new_tokens: int,
    cached_tokens: int = 0,
    quantization: str = "bf16",
    kv_cache_dtype: str = "auto",
) -> float:
    """Seconds to prefill one request alone on the slice (overhead included)."""
    timer = StepTimer(shape, get_profile(profile_name), quantization, kv_cache_dtype)
    return timer.prefill_seconds(new_tokens, cached_tokens)


def decode_step_seconds(
    shape: SliceShape,
    profile_name: str,
    batch: int,
    context_tokens: int,
    quantization: str = "bf16",
    kv_cache_dtype: str = "auto",
) -> float:
    """Seconds of one decode step for `batch` sequences with `context_tokens` in total."""
    timer = StepTimer(shape, get_profile(profile_name), quantization, kv_cache_dtype)
    return timer.decode_step_seconds(batch, context_tokens)
