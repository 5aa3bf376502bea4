"""The published TPU serving benchmarks `perf_model_validation.py` replays: each one's model,
slice, formats, batching flags and client load (`Workload`) with the figures it reported
(`Figure`): `FIGURES` (fitted), `HELD_OUT` (never fitted) and the per-chip anchors
(`PER_CHIP`). Two MoE models without a catalog profile are built here from their config.json."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from sglang_tpu.perf_model import ModelProfile, get_profile
from sglang_tpu.topology import SliceShape, get_generation, lookup

Scheduler = Literal["sglang", "vllm"]
Metric = Literal["tpot_ms", "ttft_ms", "output_tok_s", "requests_s"]
METRIC_LABELS: dict[str, str] = {
    "tpot_ms": "mean TPOT (ms)",
    "ttft_ms": "mean TTFT (ms)",
    "output_tok_s": "output tok/s",
    "requests_s": "requests/s",
}

# Two MoE models with published TPU figures but no profile in the catalog; their facts are
# from their Hugging Face config.json (experts x 3 x hidden x moe_intermediate x layers).
QWEN3_30B_A3B = ModelProfile(
    name="qwen3-30b-a3b",
    hf_ids=("Qwen/Qwen3-30B-A3B",),
    layers=48, hidden_size=2048, attention_heads=32, kv_heads=4, head_dim=128,
    parameters=30.5e9, active_parameters=3.3e9, vocab_size=151936, context_length=40960,
    experts=128, experts_per_token=8, expert_parameters=48 * 128 * 3 * 2048 * 768,
)  # fmt: skip
QWEN3_CODER_480B_A35B = ModelProfile(
    name="qwen3-coder-480b-a35b",
    hf_ids=("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8",),
    layers=62, hidden_size=6144, attention_heads=96, kv_heads=8, head_dim=128,
    parameters=480e9, active_parameters=35e9, vocab_size=151936, context_length=262144,
    experts=160, experts_per_token=8, expert_parameters=62 * 160 * 3 * 6144 * 2560,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Lengths:
    """Request lengths as the benchmark client draws them: integers uniform in [low, high]."""

    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


def fixed(n: int) -> Lengths:
    return Lengths(n, n)


def ratio_range(n: int, ratio: float) -> Lengths:
    """`--random-range-ratio` of SGLang's and InferenceX's clients: uniform in [n x ratio, n]."""
    return Lengths(max(1, int(n * ratio)), n)


@dataclass(frozen=True, slots=True)
class Workload:
    scheduler: Scheduler
    token_budget: int  # --chunked-prefill-size (sglang) / --max-num-batched-tokens (vllm)
    max_running: int  # --max-running-requests / --max-num-seqs
    concurrency: int  # client --max-concurrency (all prompts at once: = prompts)
    prompts: int
    input_len: Lengths
    output_len: Lengths
    mem_fraction: float  # --mem-fraction-static / --gpu-memory-utilization: HBM for weights+KV


@dataclass(frozen=True, slots=True)
class Figure:
    """One published benchmark run and the values it reported."""

    key: str
    source: str
    url: str
    engine: str
    profile: ModelProfile
    generation: str
    topology: str
    quantization: str
    kv_cache_dtype: str
    workload: Workload
    published: tuple[tuple[Metric, float], ...]
    note: str = ""
    shape: SliceShape | None = None  # a slice outside the operator's catalog (else looked up)

    def slice_shape(self) -> SliceShape:
        return self.shape or lookup(self.generation, self.topology)

    def setup(self) -> str:
        w = self.workload
        kv = "" if self.kv_cache_dtype == "auto" else f", {self.kv_cache_dtype} KV"
        return (
            f"{self.profile.name} {self.quantization}{kv}, {self.generation} {self.topology}, "
            f"{self.engine}, in/out {w.input_len}/{w.output_len}, C={w.concurrency}"
        )


def _sglang_jax(url_page: str) -> str:
    return (
        "https://github.com/sgl-project/sglang-jax/blob/cddbf6f1cc33cbdd453bd8f36ff7051cf46ca176"
        "/docs/cookbook/autoregressive/" + url_page
    )


_VLLM_LLAMA = "https://github.com/AI-Hypercomputer/tpu-recipes/blob/c8cfe2f689081d36701a101cd73a70965d80926b/inference/trillium/vLLM/Llama3.x/README.md"
_VLLM_CODER = "https://github.com/AI-Hypercomputer/tpu-recipes/blob/8f0a9d2b23f6a28cfc8ba395c94fec7c1e87ca37/inference/ironwood/vLLM/Qwen3-Coder-480B-A35B/README.md"


def _sgl(
    c: int,
    prompts: int,
    isl: Lengths,
    osl: Lengths,
    *,
    mem: float = 0.8,
    budget: int = 2048,
    running: int = 256,
) -> Workload:
    """SGLang-JAX cookbook flags: --chunked-prefill-size 2048 --max-running-requests 256
    --mem-fraction-static 0.8 unless a row says otherwise (0.88 is SGLang-JAX's default)."""
    return Workload("sglang", budget, running, c, prompts, isl, osl, mem)


def _vllm_llama70b(c: int, tpot: float, out: float) -> Figure:
    return Figure(
        f"vllm-llama70b-v6e8-c{c}", "tpu-recipes: vLLM TPU, Llama 3.x", _VLLM_LLAMA,
        "vLLM TPU 0.12", get_profile("llama-3.3-70b"), "v6e", "2x4", "bf16", "auto",
        Workload("vllm", 512, 256, c, 3000, fixed(1000), fixed(1000), 0.98),
        (("tpot_ms", tpot), ("output_tok_s", out)),
    )  # fmt: skip


# The SGLang-JAX Qwen3 sweep (Qwen3-8B and Qwen3-32B, v6e-4, TP 4, sglang-jax 0.1.0): every
# cell the cookbook publishes, (profile, input, concurrency) -> (ITL ms, output tok/s).
_QWEN3_SWEEP: dict[tuple[str, int, int], tuple[float, float]] = {
    ("qwen3-8b", 1024, 64): (11.11, 5296.60),
    ("qwen3-8b", 1024, 256): (30.00, 7571.84),
    ("qwen3-8b", 4096, 64): (21.13, 2528.79),
    ("qwen3-8b", 8192, 64): (31.98, 1458.77),
    ("qwen3-32b", 1024, 64): (29.48, 1977.45),
    ("qwen3-32b", 1024, 256): (34.27, 2122.98),
    ("qwen3-32b", 4096, 64): (35.32, 785.30),
    ("qwen3-32b", 8192, 64): (33.43, 435.25),
}


def _qwen3_sweep(profile: str, isl: int, c: int) -> Figure:
    itl, out = _QWEN3_SWEEP[(profile, isl, c)]
    return Figure(
        f"sgljax-{profile}-v6e4-{isl // 1024}k-c{c}", "SGLang-JAX cookbook: Qwen3 (v6e-4 sweep)",
        _sglang_jax("Qwen/Qwen3.md"), "SGLang-JAX 0.1.0", get_profile(profile), "v6e", "2x2",
        "bf16", "auto", _sgl(c, 3 * c, fixed(isl), fixed(1024)),
        (("tpot_ms", itl), ("output_tok_s", out)),
        note="published mean ITL compared with modelled mean TPOT",
    )  # fmt: skip


def _sgljax_v7x(profile: ModelProfile, title: str, page: str, tpot: float, out: float) -> Figure:
    # Qwen3-8B's row sets --mem-fraction-static 0.90; the 70B and MoE rows keep the default.
    mem = 0.9 if profile.name == "qwen3-8b" else 0.88
    return Figure(
        f"sgljax-{profile.name}-tpu7x4-c128", f"SGLang-JAX cookbook: {title} (v7x-4 row)",
        _sglang_jax(page), "SGLang-JAX main", profile, "tpu7x", "2x2x1", "bf16", "auto",
        _sgl(128, 384, fixed(1024), fixed(1024), mem=mem),
        (("tpot_ms", tpot), ("output_tok_s", out)),
    )  # fmt: skip


def _vllm_coder(isl: int, osl: int, out: float) -> Figure:
    return Figure(
        f"vllm-coder480b-tpu7x4-{isl // 1024}k{osl // 1024}k",
        "tpu-recipes: vLLM TPU, Qwen3-Coder-480B (Ironwood)", _VLLM_CODER,
        "vLLM TPU nightly 2026-06", QWEN3_CODER_480B_A35B, "tpu7x", "2x2x1", "fp8", "fp8",
        Workload("vllm", 8192, 512, 64, 320, ratio_range(isl, 0.8), ratio_range(osl, 0.8), 0.8),
        (("output_tok_s", out),),
        note="InferenceX client, --random-range-ratio 0.8; profile built here from config.json",
    )  # fmt: skip


FIGURES: tuple[Figure, ...] = (
    _vllm_llama70b(64, 25.35, 2494.80),
    _vllm_llama70b(128, 35.12, 3544.46),
    *(_qwen3_sweep(p, isl, c) for p, isl, c in _QWEN3_SWEEP),
    Figure(
        "sgljax-llama8b-v6e4-c16", "SGLang-JAX cookbook: Llama 3.1",
        _sglang_jax("Llama/Llama3.1.md"), "SGLang-JAX 0.1.0",
        get_profile("llama-3.1-8b"), "v6e", "2x2", "bf16", "auto",
        _sgl(16, 100, ratio_range(512, 0.0), ratio_range(512, 0.0), mem=0.88, budget=4096,
             running=64),
        (("tpot_ms", 9.94), ("ttft_ms", 35.33), ("output_tok_s", 1448.91)),
        note="client default --random-range-ratio 0: lengths uniform in 1-512 "
        "(published totals: 265 in, 258 out per request)",
    ),
    _sgljax_v7x(get_profile("qwen3-8b"), "Qwen3", "Qwen/Qwen3.md", 14.09, 8521.48),
    _sgljax_v7x(
        get_profile("llama-3.3-70b"), "Llama 3.3 70B", "Llama/Llama3.3-70B.md", 30.78, 3609.65
    ),
    _sgljax_v7x(QWEN3_30B_A3B, "Qwen3 MoE", "Qwen/Qwen3-MoE.md", 18.91, 6179.45),
    _vllm_coder(1024, 1024, 1996.00),
    _vllm_coder(8192, 1024, 1053.10),
    _vllm_coder(1024, 8192, 2075.47),
    Figure(
        "vllm-llama8b-v6e1-prefill", "vLLM PR #16458 (TPU block sizes)",
        "https://github.com/vllm-project/vllm/pull/16458", "vLLM V1 TPU 2025-04",
        get_profile("llama-3.1-8b"), "v6e", "1x1", "bf16", "auto",
        Workload("vllm", 512, 512, 1000, 1000, fixed(1800), fixed(128), 0.95),
        (("requests_s", 8.37),),
        note="all 1000 prompts at once; prefill-bound (1800-token prompts, 512-token steps)",
    ),
)  # fmt: skip


# Published after the host knobs were fitted and kept out of the fit (`FIGURES` is the fit
# set): a prediction, not a calibration. vLLM TPU on ONE Ironwood chip (tpu7x-standard-1t,
# topology 1x1x1, TP 2 over its two TensorCores), Qwen3-32B with FP8 weights and activations
# (qwix float8_e4m3fn) and FP8 KV, --max-num-batched-tokens 4096 --max-num-seqs 135
# --gpu-memory-utilization 0.98; InferenceX client, random 1024/1024 at range ratio 0.8, 320
# prompts at concurrency 320. The operator's catalog starts tpu7x at 2x2x1, so the one-chip
# slice is built here.
_VLLM_QWEN32B_IRONWOOD = "https://github.com/AI-Hypercomputer/tpu-recipes/blob/63744192492ed9cb88bcea9e16d4df63be751fcd/inference/ironwood/vLLM/Qwen3-32B/README.md"
TPU7X_ONE_CHIP = SliceShape(get_generation("tpu7x"), "1x1x1", "tpu7x-standard-1t", 1, 1)
HELD_OUT: tuple[Figure, ...] = (
    Figure(
        "vllm-qwen3-32b-fp8-tpu7x1-1k1k", "tpu-recipes: vLLM TPU, Qwen3-32B (Ironwood, 1 chip)",
        _VLLM_QWEN32B_IRONWOOD, "vLLM TPU nightly 2026-03", get_profile("qwen3-32b"), "tpu7x",
        "1x1x1", "fp8", "fp8",
        Workload("vllm", 4096, 135, 320, 320, ratio_range(1024, 0.8), ratio_range(1024, 0.8),
                 0.98),
        (("output_tok_s", 6556.72),),
        note="published per chip (one chip); InferenceX client, --random-range-ratio 0.8; "
        "not in the fit",
        shape=TPU7X_ONE_CHIP,
    ),
)  # fmt: skip

# The per-chip anchors of issue 58: (figure key, label). Output tok/s per chip = the run's
# output tok/s / its chips, published and modelled alike.
PER_CHIP: tuple[tuple[str, str], ...] = (
    ("vllm-qwen3-32b-fp8-tpu7x1-1k1k", "Qwen3-32B FP8, 1 tpu7x chip, vLLM TPU, 1k/1k"),
    ("vllm-llama70b-v6e8-c64", "Llama-3.3-70B bf16, v6e-8, vLLM TPU, 1k/1k C=64"),
    ("vllm-llama70b-v6e8-c128", "Llama-3.3-70B bf16, v6e-8, vLLM TPU, 1k/1k C=128"),
    ("sgljax-llama-3.3-70b-tpu7x4-c128", "Llama-3.3-70B bf16, v7x-4, SGLang-JAX, 1k/1k C=128"),
    ("sgljax-qwen3-30b-a3b-tpu7x4-c128", "Qwen3-30B-A3B bf16, v7x-4, SGLang-JAX, 1k/1k C=128"),
)
