"""TPU performance model: model profiles, per-slice step times and the HBM fit check.

The engine twin's scheduler asks it how long each step takes; the operator asks it whether a
model fits a slice; `tpuserve plan` asks it what a replica can serve. Hardware
facts (HBM, bandwidth, FLOP/s per chip) come from `sglang_tpu.topology`; nothing here
re-spells them.

The model: a step is the device's time plus the host's (`StepTimer.device_seconds` +
`host_seconds`):

- **weights** = parameters x bytes per parameter of the quantization (`WEIGHT_BYTES`: the
  block-scaled 4-bit formats count their scales, MXFP4 4.25 and NVFP4 4.5 bits);
- **KV bytes per token** = 2 (K and V) x layers x KV heads x head dim x KV-cache dtype bytes;
- **device**, for a step that prefills ``p`` new tokens (attending to ``a`` context tokens in
  total) and decodes one token for ``b`` running sequences holding ``c`` context tokens: a
  fixed cost (``device_step_seconds`` + layers x ``device_layer_seconds``), plus the larger of
  the weight matmuls (``2 x body params x (p + b)`` FLOPs and the LM head for the positions
  that need logits, at ``matmul_mfu`` of the chips' peak, the 8-bit peak for fp8/int8/w8a8
  weights) and the weight stream (weights touched at ``weight_mbu`` of HBM bandwidth), plus
  the KV reads (``KV bytes x (c + a / p)`` at ``kv_mbu``), plus the attention's
  ``4 x layers x heads x head_dim x (a + c)`` FLOPs at ``attention_mfu`` of the bf16 peak
  scaled by head dim / 128 (the MXU's width);
- **host**: ``host_step_seconds`` per step plus ``host_sequence_seconds`` per sequence in it,
  ``multi_host_step_seconds`` more on a multi-host slice, and in TorchTPU's eager modes
  ``eager_layer_seconds`` per layer (ops dispatched one by one from Python; measured on real
  model code, Transformers' Qwen3 on a v5e: ``bench/real_model_gap.py``);
- for MoE models a step touches the shared weights plus, per layer, the experts its tokens
  route to (at most all of them), so small decode batches read far less than all weights;
- **fit** (`sglang_tpu.hbm_fit`, checked against every step measured on a v5e): weights + KV
  for one full ``context_length`` sequence must fit in ``MEM_FRACTION_STATIC`` of the slice's
  HBM, and a compiled step's weights, KV copies and compiler temporaries in what the runtime
  gives programs; the rest of the budget is the KV pool.

**Calibration.** `Efficiency` holds every knob; `CALIBRATED` is the fitted set. The six device
knobs (matmuls at 71% of peak FLOP/s, attention at 57%, weights and KV at 86% of HBM
bandwidth, 0.65 ms per step and 34 us per layer) are fitted to bare decoder steps of four
model shapes timed on one TPU v5e chip (``bench/perf_model_fit.py --fit`` over
``bench/tpu_results/``; median error 6.8% on prefill, 3.0% on decode). The host knobs (8.0 ms
per step, 29 us per sequence) are fitted, with the device knobs held, to 33 published
end-to-end values from vLLM TPU and SGLang-JAX reports on v6e and tpu7x
(``bench/perf_model_validation.py --fit``; median error 11%, worst 59%); the +1 ms per step on
multi-host slices is not fitted (no published multi-host figure). The eager modes' 8.6 ms
per layer and step is measured on real model code (Transformers' Qwen3 on a v5e, eager and
DeferAndFuse over ``torch.compile``: ``bench/real_model_gap.py``). Other generations use the
v5e's fractions of their own published peaks, unvalidated on their silicon. Tables, sources
and what the model leaves out: ``docs/engine-sim.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sglang_tpu import hbm_fit, sgl_jax_steps
from sglang_tpu.topology import GIB, SliceShape


@dataclass(frozen=True, slots=True)
class Efficiency:
    """The model's tuning knobs: what the chip reaches (device) and what the engine adds (host).

    Device knobs are fitted to bare decoder steps measured on a TPU v5e chip
    (``bench/perf_model_fit.py`` over ``bench/tpu_results/``); host knobs to published
    end-to-end serving figures with the device knobs held (``bench/perf_model_validation.py
    --fit``). Both fits and their errors: ``docs/engine-sim.md``.
    """

    # Device: fractions of the chip's peak FLOP/s and HBM bandwidth, and fixed costs.
    matmul_mfu: float = 0.71  # the weight matmuls (prefill is bound by these)
    attention_mfu: float = 0.57  # a flash-attention kernel at head dim >= 128 (the MXU's width)
    weight_mbu: float = 0.86  # streaming the weights (decode is bound by this)
    kv_mbu: float = 0.86  # reading the KV cache
    device_step_seconds: float = 0.00065  # per step: launch, synchronisation
    device_layer_seconds: float = 0.0000337  # per layer and step: kernel boundaries
    # Host: what the engine adds per step (scheduling, sampling, detokenising, transfers).
    host_step_seconds: float = 0.0080
    host_sequence_seconds: float = 0.000029  # per sequence in the step (sampling, output)
    multi_host_step_seconds: float = 0.001  # extra per step on a multi-host slice [unfitted]
    # Host: per layer and step in TorchTPU's eager modes (every op dispatched from Python):
    # Transformers' Qwen3 on a v5e, eager and DeferAndFuse over torch.compile, two shapes
    # (bench/real_model_gap.py over bench/tpu_results/v5e-2026-12-06b; median of 6, 7.6-10.0).
    eager_layer_seconds: float = 0.0086

    def __post_init__(self) -> None:
        for name in ("matmul_mfu", "attention_mfu", "weight_mbu", "kv_mbu"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name}: {value!r} is not allowed; allowed: 0 < value <= 1")
        for name in (
            "device_step_seconds",
            "device_layer_seconds",
            "host_step_seconds",
            "host_sequence_seconds",
            "multi_host_step_seconds",
            "eager_layer_seconds",
        ):
            value = getattr(self, name)
            if value < 0.0:
                raise ValueError(f"{name}: {value!r} is not allowed; allowed: >= 0")


CALIBRATED = Efficiency()
EXECUTION_MODES = ("compiled", "eager", "eager-defer-and-fuse", "eager-debug")
"""How TorchTPU runs the model (the launch contract's TPUSERVE_EXECUTION_MODE): the device
half is the compiled step's in every mode; the eager modes add `eager_layer_seconds` per layer
to the host half (measured eager and DeferAndFuse alike; eager-debug blocks on every launch
and is slower still, unmeasured: the same figure is its lower bound)."""
ENGINES = ("sglang", "sglang-jax")
"""Whose host terms and padding a step gets: SGLang's (`Efficiency`'s host knobs, fitted to
published serving figures) or SGLang-JAX's (`sgl_jax_steps`, measured on a v5e); the device
step is the same bare compiled step for both."""
# The MXU multiplies 128-wide tiles: a head dim of 64 fills half of one in attention.
MXU_WIDTH = 128
MEM_FRACTION_STATIC = hbm_fit.RULE.static_fraction

# Block-scaled 4-bit formats: 4-bit elements plus one 8-bit scale per block. MXFP4 (OCP
# Microscaling): E2M1 elements, one E8M0 scale per 32 -> 4 + 8/32 = 4.25 bits. NVFP4: E2M1
# elements, one FP8 E4M3 scale per 16 -> 4 + 8/16 = 4.5 bits (its one FP32 scale per tensor is
# negligible).
MXFP4_BYTES_PER_PARAM = (4 + 8 / 32) / 8
NVFP4_BYTES_PER_PARAM = (4 + 8 / 16) / 8

# Weight formats whose matmuls run on the chip's 8-bit peak (where it has one); the 4-bit
# formats are weight-only on TPUs (dequantised to bf16 for the matmul).
EIGHT_BIT_COMPUTE = frozenset({"fp8", "int8", "w8a8"})

WEIGHT_BYTES: Mapping[str, float] = MappingProxyType(
    {
        "bf16": 2.0,
        "none": 2.0,
        "fp8": 1.0,
        "int8": 1.0,
        "w8a8": 1.0,
        "int4": 0.5,
        "awq": 0.5,
        "mxfp4": MXFP4_BYTES_PER_PARAM,
        "nvfp4": NVFP4_BYTES_PER_PARAM,
    }
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
    tied_embeddings: bool = False  # the LM head is the input embedding (small models)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def weight_bytes(self, quantization: str = "bf16") -> float:
        return self.parameters * _weight_bytes_per_param(quantization)

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto", engine: str = "sglang") -> float:
        head_dim = hbm_fit.kv_head_dim(self.head_dim, engine)  # SGLang-JAX pads it to 128
        return 2.0 * self.layers * self.kv_heads * head_dim * _kv_bytes(kv_cache_dtype)

    @property
    def embedding_parameters(self) -> float:
        """One vocabulary x hidden table: the input embedding, and the LM head."""
        return float(self.vocab_size * self.hidden_size)

    @property
    def body_parameters(self) -> float:
        """Active parameters every token multiplies through (no embedding, no LM head)."""
        tables = 1 if self.tied_embeddings else 2
        return self.active_parameters - tables * self.embedding_parameters


PROFILES: Mapping[str, ModelProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            # The shapes measured on a v5e chip (bench/tpu_steps.py; tied embeddings).
            ModelProfile(
                name="qwen3-0.6b", hf_ids=("Qwen/Qwen3-0.6B",),
                layers=28, hidden_size=1024, attention_heads=16, kv_heads=8, head_dim=128,
                parameters=0.596e9, active_parameters=0.596e9, vocab_size=151936,
                context_length=40960, tied_embeddings=True,
            ),
            ModelProfile(
                name="llama-3.2-1b",
                hf_ids=("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B"),
                layers=16, hidden_size=2048, attention_heads=32, kv_heads=8, head_dim=64,
                parameters=1.236e9, active_parameters=1.236e9, vocab_size=128256,
                context_length=131072, tied_embeddings=True,
            ),
            ModelProfile(
                name="qwen3-1.7b", hf_ids=("Qwen/Qwen3-1.7B",),
                layers=28, hidden_size=2048, attention_heads=16, kv_heads=8, head_dim=128,
                parameters=1.720e9, active_parameters=1.720e9, vocab_size=151936,
                context_length=40960, tied_embeddings=True,
            ),
            ModelProfile(
                name="qwen3-4b", hf_ids=("Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Instruct-2507"),
                layers=36, hidden_size=2560, attention_heads=32, kv_heads=8, head_dim=128,
                parameters=4.022e9, active_parameters=4.022e9, vocab_size=151936,
                context_length=40960, tied_embeddings=True,
            ),
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
    """The static budget for weights and KV (`hbm_fit.FitRule.budget_bytes`)."""
    return hbm_fit.RULE.budget_bytes(shape)


def kv_pool_tokens(
    shape: SliceShape,
    profile: ModelProfile,
    quantization: str = "bf16",
    kv_cache_dtype: str = "auto",
    kv_update: str = "in-place",
    engine: str = "sglang",
) -> int:
    """Tokens of KV the slice holds after weights (SGLang's ``max_total_num_tokens``); >= 0."""
    free = hbm_fit.RULE.pool_bytes(shape, profile.weight_bytes(quantization), kv_update)
    return max(0, int(free // profile.kv_bytes_per_token(kv_cache_dtype, engine)))


def check_fits(
    shape: SliceShape,
    model: str | ModelProfile,
    quantization: str,
    kv_cache_dtype: str,
    context_length: int,
    kv_update: str = "in-place",
    engine: str = "sglang",
) -> None:
    """Raise ModelDoesNotFit when weights + one `context_length` sequence do not fit the
    rule (`hbm_fit.RULE`: the static budget, and a compiled step's copies and temporaries).
    ``model``: a profile's name, or a profile (one made from a config.json); ``engine``
    sglang-jax stores KV with its head dim padded to 128 (`hbm_fit.kv_head_dim`)."""
    profile = model if isinstance(model, ModelProfile) else get_profile(model, "model")
    if context_length <= 0:
        raise ValueError(f"contextLength: {context_length!r} is not allowed; allowed: >= 1")
    weights = profile.weight_bytes(quantization)
    kv = profile.kv_bytes_per_token(kv_cache_dtype, engine) * context_length
    usable = usable_hbm_bytes(shape)
    missing = hbm_fit.RULE.shortfall_bytes(shape, weights, kv, kv_update)
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
    """Step times of one model on one slice; coefficients precomputed so a call is cheap.

    A step is the device's time plus the host's (see the module docstring): `device_seconds`
    is what a bare compiled step takes on the chips, `host_seconds` what the engine adds.
    """

    def __init__(
        self,
        shape: SliceShape,
        profile: ModelProfile,
        quantization: str = "bf16",
        kv_cache_dtype: str = "auto",
        efficiency: Efficiency = CALIBRATED,
        execution_mode: str = "compiled",
        engine: str = "sglang",
        sgl_jax: sgl_jax_steps.SglJaxSteps = sgl_jax_steps.STEPS,
    ) -> None:
        if execution_mode not in EXECUTION_MODES:
            raise ValueError(
                f"execution_mode: {execution_mode!r} is not allowed; allowed: "
                f"{', '.join(EXECUTION_MODES)}"
            )
        if engine not in ENGINES:
            raise ValueError(f"engine: {engine!r} is not allowed; allowed: {', '.join(ENGINES)}")
        if engine == "sglang-jax" and execution_mode != "compiled":
            raise ValueError(
                f"execution_mode: {execution_mode!r} is not allowed with engine sglang-jax; "
                "allowed: compiled (the eager modes are TorchTPU's)"
            )
        self.engine = engine
        self.sgl_jax = sgl_jax if engine == "sglang-jax" else None
        self.shape = shape
        self.execution_mode = execution_mode
        self.profile = profile
        self.efficiency = efficiency
        gen = shape.generation
        chips = shape.chips
        self.weight_bytes = profile.weight_bytes(quantization)
        self.kv_bytes_per_token = profile.kv_bytes_per_token(kv_cache_dtype, engine)
        peak = gen.peak_bf16_flops_per_chip
        if quantization in EIGHT_BIT_COMPUTE and gen.peak_8bit_flops_per_chip:
            peak = gen.peak_8bit_flops_per_chip
        self.flops_per_second = chips * peak * efficiency.matmul_mfu
        # Attention runs in bf16 whatever the weights' format.
        self.attention_flops_per_second = (
            chips
            * gen.peak_bf16_flops_per_chip
            * efficiency.attention_mfu
            * min(1.0, profile.head_dim / MXU_WIDTH)
        )
        hbm = chips * gen.hbm_bandwidth_bytes_per_second
        self.host_to_device_bytes_per_second = chips * gen.host_to_device_bytes_per_second
        self.bytes_per_second = hbm * efficiency.weight_mbu
        self.kv_bytes_per_second = hbm * efficiency.kv_mbu
        self._body_flops_per_token = 2.0 * profile.body_parameters
        self._head_flops_per_token = 2.0 * profile.embedding_parameters
        self._attn_flops_per_ctx = 4.0 * profile.layers * profile.attention_heads * profile.head_dim
        self.device_fixed_seconds = (
            efficiency.device_step_seconds + profile.layers * efficiency.device_layer_seconds
        )
        self.overhead_seconds = efficiency.host_step_seconds + (
            efficiency.multi_host_step_seconds if shape.multi_host else 0.0
        )
        if execution_mode != "compiled":  # each op dispatched from Python, layer by layer
            self.overhead_seconds += profile.layers * efficiency.eager_layer_seconds
        self.sequence_seconds = efficiency.host_sequence_seconds
        self.prefill_request_seconds = 0.0
        if self.sgl_jax is not None:  # SGLang-JAX's own host terms (sgl_jax_steps)
            self.overhead_seconds = self.sgl_jax.host_step_seconds + (
                efficiency.multi_host_step_seconds if shape.multi_host else 0.0
            )
            self.sequence_seconds = self.sgl_jax.host_sequence_seconds
            self.prefill_request_seconds = self.sgl_jax.prefill_request_seconds
        wpb = _weight_bytes_per_param(quantization)
        # The input embedding is gathered row by row, not streamed; a tied one is the LM head.
        gathered = 0.0 if profile.tied_embeddings else profile.embedding_parameters * wpb
        if profile.is_moe:
            shared = profile.parameters - profile.expert_parameters
            self._shared_weight_bytes = shared * wpb - gathered
            self._expert_weight_bytes = profile.expert_parameters * wpb / profile.experts
        else:
            self._shared_weight_bytes = self.weight_bytes - gathered
            self._expert_weight_bytes = 0.0

    def _weights_touched(self, tokens: int) -> float:
        p = self.profile
        if not p.is_moe:
            return self._shared_weight_bytes
        experts = min(p.experts, max(1, tokens) * p.experts_per_token)
        return self._shared_weight_bytes + experts * self._expert_weight_bytes

    def device_seconds(
        self,
        prefill_tokens: int = 0,
        prefill_attention_context: int = 0,
        decode_batch: int = 0,
        decode_context: int = 0,
    ) -> float:
        """The chips' time for one step: fixed costs, the weight matmuls or the weight
        stream (whichever is longer), the KV reads and the attention's FLOPs. SGLang-JAX's
        padded rows (its batch and token buckets) cost matmuls, not KV reads."""
        if self.sgl_jax is not None:
            prefill_tokens = sgl_jax_steps.pad(prefill_tokens, self.sgl_jax.token_buckets)
            decode_batch = sgl_jax_steps.pad(decode_batch, self.sgl_jax.bs_buckets)
        tokens = prefill_tokens + decode_batch
        if tokens == 0:
            return 0.0
        head_tokens = decode_batch + (1 if prefill_tokens else 0)  # logits: last position
        matmuls = (
            self._body_flops_per_token * tokens + self._head_flops_per_token * head_tokens
        ) / self.flops_per_second
        weights = self._weights_touched(tokens) / self.bytes_per_second
        kv_read = decode_context + prefill_attention_context / max(1, prefill_tokens)
        attention = (
            self._attn_flops_per_ctx * (prefill_attention_context + decode_context)
        ) / self.attention_flops_per_second
        return (
            self.device_fixed_seconds
            + max(matmuls, weights)
            + self.kv_bytes_per_token * kv_read / self.kv_bytes_per_second
            + attention
        )

    def host_seconds(self, sequences: int) -> float:
        """What the engine adds to a step of `sequences` sequences."""
        return self.overhead_seconds + self.sequence_seconds * sequences

    def step_seconds(
        self,
        prefill_tokens: int = 0,
        prefill_attention_context: int = 0,
        decode_batch: int = 0,
        decode_context: int = 0,
    ) -> float:
        """One scheduler step (see the module docstring); 0 work costs only the host's step."""
        sequences = decode_batch + (1 if prefill_tokens else 0)
        return self.host_seconds(sequences) + self.device_seconds(
            prefill_tokens, prefill_attention_context, decode_batch, decode_context
        )

    def prefill_seconds(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """One request's prefill of `new_tokens` after a cached prefix of `cached_tokens`
        (with SGLang-JAX, its per-request cost to the first token too)."""
        attention = new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2
        step = self.step_seconds(prefill_tokens=new_tokens, prefill_attention_context=attention)
        return step + self.prefill_request_seconds

    def load_back_seconds(self, tokens: int) -> float:
        """Copying `tokens` of KV from the host tier back to HBM: every chip loads its shard
        over its own host link at the catalog's host-to-device bandwidth (docs/host-kv-tier.md)."""
        return tokens * self.kv_bytes_per_token / self.host_to_device_bytes_per_second

    def host_hit_value(self, tokens: int = 2048) -> float:
        """What a prompt token found in the host tier is worth against one found in HBM (0..1):
        the share of its prefill (a `tokens`-token prompt's, past the engine's fixed step cost)
        that loading it back instead saves. 0 when loading back is no faster than computing."""
        prefill = self.prefill_seconds(tokens) - self.prefill_seconds(0)
        if prefill <= 0:
            return 0.0
        return max(0.0, 1.0 - self.load_back_seconds(tokens) / prefill)

    def decode_step_seconds(self, batch: int, context_tokens: int) -> float:
        """One decode step for `batch` sequences holding `context_tokens` tokens in total."""
        return self.step_seconds(decode_batch=batch, decode_context=context_tokens)


BACKLOG_CHUNK_TOKENS = 8192
"""SGLang's default ``--chunked-prefill-size``: the prompt tokens one prefill step takes."""
BACKLOG_PROMPT_TOKENS = 2048
"""The prompt length the backlog throughput assumes (attention grows with it)."""


def peak_prefill_tokens_per_second(
    shape: SliceShape,
    profile: ModelProfile,
    quantization: str = "bf16",
    kv_cache_dtype: str = "auto",
    chunk_tokens: int = BACKLOG_CHUNK_TOKENS,
    prompt_tokens: int = BACKLOG_PROMPT_TOKENS,
) -> float:
    """Uncached prompt tokens per second one replica prefills when its queue is full: steps of
    ``chunk_tokens`` new tokens, packed from prompts of ``prompt_tokens`` (no cached prefix),
    nothing decoding. What llm-d's autoscaling guide calls the peak prefill throughput and
    measures with a calibration run per model and accelerator; here the calibrated step time
    gives it. Queued prefill tokens / this = seconds of backlog for one replica."""
    if chunk_tokens < 1 or prompt_tokens < 1:
        raise ValueError("chunk_tokens and prompt_tokens must be at least 1")
    timer = StepTimer(shape, profile, quantization, kv_cache_dtype)
    prompts, rest = divmod(chunk_tokens, prompt_tokens)
    attention = prompts * prompt_tokens * (prompt_tokens + 1) // 2 + rest * (rest + 1) // 2
    step = timer.step_seconds(prefill_tokens=chunk_tokens, prefill_attention_context=attention)
    return chunk_tokens / step
