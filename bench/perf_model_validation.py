"""Benchmark: the TPU performance model against published TPU serving figures.

Each figure is a serving benchmark someone ran on real TPUs and published with enough detail
to repeat: model, TPU generation and topology, weight and KV-cache formats, the engine's
batching flags, the client's concurrency, prompt count and request lengths. For each one
this program replays the same client load against `sglang_tpu.perf_model.StepTimer`: a
closed loop (``--max-concurrency`` C: C requests in flight, the next one sent as soon as one
finishes), the engine's batching rule, and every step timed by the perf model. It reports
what the benchmark client reported (mean TTFT, mean TPOT, output tokens/s, requests/s) and
the error of the model against the published value.

The replay is a benchmark harness, not the engine twin's scheduler
(`sglang_tpu.sim.engine`): it only needs the two batching rules the published runs used.

- ``sglang`` (SGLang and SGLang-JAX defaults): a step either prefills (new requests first,
  FCFS, up to ``--chunked-prefill-size`` tokens, a long prompt split over steps) or decodes
  every running request; prefill steps pause decoding.
- ``vllm`` (vLLM V1, also on TPU): every step decodes every running request and fills the rest
  of ``--max-num-batched-tokens`` with prefill chunks, FCFS.

A request admitted needs a KV reservation for its prompt and output; requests wait when the
run's KV pool (its memory fraction of HBM, less the weights) or the running bound is full.
Two MoE models with published figures but no catalog profile are built here from their
config.json (`QWEN3_30B_A3B`, `QWEN3_CODER_480B_A35B`).

``--fit`` searches the `Efficiency` knobs (by default prefill MFU, decode MBU and the per-step
overhead) that minimise the mean squared log error over all rows by coordinate descent and
prints them; `perf_model.CALIBRATED` holds the result, rounded. One set of values serves every
generation: the figures do not justify more (see docs/engine-sim.md).
``--leave-one-source-out`` refits without each source in turn and predicts its rows, so the
error it reports is out of sample. ``--update-docs`` rewrites the two generated tables of
docs/engine-sim.md (a unit test fails when they are stale).

    .venv/bin/python bench/perf_model_validation.py            # the table (markdown)
    .venv/bin/python bench/perf_model_validation.py --json     # one JSON object per row
    .venv/bin/python bench/perf_model_validation.py --fit      # refit the knobs
    .venv/bin/python bench/perf_model_validation.py --update-docs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sglang_tpu.perf_model import (
    CALIBRATED,
    Efficiency,
    ModelProfile,
    StepTimer,
    get_profile,
    kv_pool_tokens,
)
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


def per_chip_markdown() -> str:
    """Output tokens/s per chip, published vs modelled, for the `PER_CHIP` anchors."""
    by_key = {f.key: f for f in (*FIGURES, *HELD_OUT)}
    lines = [
        "| run | chips | published out tok/s per chip | modelled | error | in the fit | source |",
        "|---|---|---|---|---|---|---|",
    ]
    fitted = {f.key for f in FIGURES}
    for key, label in PER_CHIP:
        fig = by_key[key]
        chips = fig.slice_shape().chips
        (row,) = [r for r in evaluate([fig]) if r.metric == "output_tok_s"]
        lines.append(
            f"| {label} | {chips} | {row.published / chips:,.0f} | {row.modelled / chips:,.0f} "
            f"| {row.error:+.0%} | {'yes' if key in fitted else 'no'} | <{fig.url}> |"
        )
    return "\n".join(lines)


@dataclass(slots=True)
class _Req:
    prompt: int
    output: int
    arrival: float
    prefilled: int = 0
    generated: int = 0
    first_token: float = math.nan


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the benchmark client would report for the replayed run."""

    ttft_ms: float
    tpot_ms: float
    output_tok_s: float
    requests_s: float
    duration_s: float
    steps: int

    def value(self, metric: Metric) -> float:
        return float(getattr(self, metric))


def replay(timer: StepTimer, workload: Workload, pool_tokens: int, seed: int = 0) -> Outcome:
    """Run the closed-loop client load through the batching rule, timing steps with `timer`."""
    w = workload
    rng = random.Random(seed)
    lengths = deque((w.input_len.draw(rng), w.output_len.draw(rng)) for _ in range(w.prompts))
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    ttfts: list[float] = []
    tpots: list[float] = []
    out_tokens = 0
    reserved = 0
    now = 0.0
    steps = 0

    def send(at: float) -> None:
        if lengths:
            prompt, output = lengths.popleft()
            waiting.append(_Req(prompt, output, at))

    for _ in range(w.concurrency):
        send(0.0)
    while waiting or running:
        while (
            waiting
            and len(running) < w.max_running
            and reserved + waiting[0].prompt + waiting[0].output <= pool_tokens
        ):
            req = waiting.popleft()
            reserved += req.prompt + req.output
            running.append(req)
        if not running:
            raise ValueError(f"a request of {waiting[0].prompt} tokens never fits the KV pool")
        decoding = [r for r in running if r.prefilled >= r.prompt]
        prefilling = [r for r in running if r.prefilled < r.prompt]
        if w.scheduler == "sglang":
            budget = w.token_budget if prefilling else 0
            if prefilling:
                decoding = []
        else:
            budget = max(0, w.token_budget - len(decoding))
        chunks: list[tuple[_Req, int]] = []
        attention = 0
        for req in prefilling:
            if budget <= 0:
                break
            take = min(budget, req.prompt - req.prefilled)
            chunks.append((req, take))
            attention += take * req.prefilled + take * (take + 1) // 2
            budget -= take
        context = sum(r.prompt + r.generated for r in decoding)
        if not chunks and not waiting and decoding:
            # Pure decode until the next request finishes: time each step, update once.
            k = min(r.output - r.generated for r in decoding)
            batch = len(decoding)
            for i in range(k):
                now += timer.step_seconds(decode_batch=batch, decode_context=context + i * batch)
            steps += k
            advance = k
        else:
            now += timer.step_seconds(
                prefill_tokens=sum(t for _, t in chunks),
                prefill_attention_context=attention,
                decode_batch=len(decoding),
                decode_context=context,
            )
            steps += 1
            advance = 1
        for req in decoding:
            req.generated += advance
        for req, take in chunks:
            req.prefilled += take
            if req.prefilled >= req.prompt:
                req.generated = 1
                req.first_token = now
        still: list[_Req] = []
        for req in running:
            if req.generated >= req.output:
                reserved -= req.prompt + req.output
                out_tokens += req.output
                ttfts.append(req.first_token - req.arrival)
                if req.output > 1:
                    tpots.append((now - req.first_token) / (req.output - 1))
                send(now)
            else:
                still.append(req)
        running = still
    return Outcome(
        ttft_ms=1e3 * statistics.fmean(ttfts),
        tpot_ms=1e3 * statistics.fmean(tpots) if tpots else math.nan,
        output_tok_s=out_tokens / now,
        requests_s=len(ttfts) / now,
        duration_s=now,
        steps=steps,
    )


@dataclass(frozen=True, slots=True)
class Row:
    figure: Figure
    metric: Metric
    published: float
    modelled: float

    @property
    def error(self) -> float:
        """Signed relative error of the model: (modelled - published) / published."""
        return (self.modelled - self.published) / self.published


def kv_pool(fig: Figure) -> int:
    """KV tokens the published run had: its memory fraction of HBM, less the weights."""
    shape = fig.slice_shape()
    free = shape.hbm_bytes * fig.workload.mem_fraction - fig.profile.weight_bytes(fig.quantization)
    return max(0, int(free // fig.profile.kv_bytes_per_token(fig.kv_cache_dtype)))


def evaluate(figures: Iterable[Figure], efficiency: Efficiency = CALIBRATED) -> list[Row]:
    rows: list[Row] = []
    for fig in figures:
        shape = fig.slice_shape()
        timer = StepTimer(shape, fig.profile, fig.quantization, fig.kv_cache_dtype, efficiency)
        pool = kv_pool(fig)
        outcome = replay(timer, fig.workload, pool)
        for metric, published in fig.published:
            rows.append(Row(fig, metric, published, outcome.value(metric)))
    return rows


def log_loss(rows: Sequence[Row]) -> float:
    """Mean squared log error: a model 2x too slow costs the same as one 2x too fast."""
    return statistics.fmean(math.log(r.modelled / r.published) ** 2 for r in rows)


def summary(rows: Sequence[Row]) -> dict[str, float]:
    errors = [abs(r.error) for r in rows]
    return {
        "rows": len(rows),
        "median_abs_error": statistics.median(errors),
        "mean_abs_error": statistics.fmean(errors),
        "max_abs_error": max(errors),
        "mean_signed_error": statistics.fmean(r.error for r in rows),
    }


def markdown(rows: Sequence[Row]) -> str:
    """The validation table, then its sources (numbered) with each run's caveats."""
    lines = [
        "| # | model, formats | slice | engine | in/out tokens, C | quantity | published "
        "| modelled | error | src |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    figures: dict[str, int] = {}
    sources: dict[str, list[Figure]] = {}
    for row in rows:
        fig, w = row.figure, row.figure.workload
        n = figures.setdefault(fig.key, len(figures) + 1)
        sources.setdefault(fig.source, []).append(fig)
        src = list(sources).index(fig.source) + 1
        kv = "" if fig.kv_cache_dtype == "auto" else f", {fig.kv_cache_dtype} KV"
        lines.append(
            f"| {n} | {fig.profile.name} {fig.quantization}{kv} | {fig.generation} {fig.topology} "
            f"| {fig.engine} | {w.input_len}/{w.output_len}, {w.concurrency} "
            f"| {METRIC_LABELS[row.metric]} | {_fmt(row.published)} | {_fmt(row.modelled)} "
            f"| {row.error:+.0%} | [{src}] |"
        )
    lines.append("")
    for i, (source, figs) in enumerate(sources.items(), 1):
        urls = list(dict.fromkeys(f.url for f in figs))
        links = ", ".join(f"<{u}>" for u in urls)
        notes = "; ".join(dict.fromkeys(f.note for f in figs if f.note))
        lines.append(f"{i}. {source}: {links}" + (f" ({notes})" if notes else ""))
    return "\n".join(lines)


def predictions_markdown(context: int = 2048, batch: int = 64) -> str:
    """What the calibrated model predicts for a few catalog setups (docs/engine-sim.md)."""
    lines = [
        f"| profile | slice | weights | KV pool (tokens) | prefill {context} (ms) "
        f"| decode b=1 (ms/step) | decode b={batch} (ms/step) | decode tok/s at b={batch} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, generation, topology, quantization in PREDICTION_SETUPS:
        shape, profile = lookup(generation, topology), get_profile(name)
        timer = StepTimer(shape, profile, quantization)
        wide = timer.decode_step_seconds(batch, batch * context)
        lines.append(
            f"| {name} | {generation} {topology} | {quantization} "
            f"| {kv_pool_tokens(shape, profile, quantization):,} "
            f"| {1e3 * timer.prefill_seconds(context):.1f} "
            f"| {1e3 * timer.decode_step_seconds(1, context):.1f} | {1e3 * wide:.1f} "
            f"| {batch / wide:,.0f} |"
        )
    return "\n".join(lines)


PREDICTION_SETUPS: tuple[tuple[str, str, str, str], ...] = (
    ("llama-3.1-8b", "v6e", "1x1", "bf16"),
    ("llama-3.1-8b", "v5e", "2x4", "bf16"),
    ("qwen3-32b", "v6e", "2x4", "bf16"),
    ("llama-3.3-70b", "v5e", "4x4", "int8"),
    ("llama-3.3-70b", "v6e", "2x4", "bf16"),
    ("llama-3.3-70b", "v6e", "2x2", "mxfp4"),
    ("qwen3-235b-a22b", "tpu7x", "2x2x2", "fp8"),
)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


FIT_KNOBS: dict[str, tuple[float, float]] = {
    # knob: (lowest, highest) the search may use. The device knobs are fitted to the chip
    # (bench/perf_model_fit.py) and held here; refitting them to end-to-end figures is allowed
    # for comparison only.
    "host_step_seconds": (0.0, 0.05),
    "host_sequence_seconds": (0.0, 0.001),
    "multi_host_step_seconds": (0.0, 0.05),
    "matmul_mfu": (0.05, 1.0),
    "weight_mbu": (0.05, 1.0),
}


# The engine's host work is what end-to-end figures add to the chip's steps. No published
# figure here ran on a multi-host slice, so the multi-host overhead is not fitted by default.
DEFAULT_FIT_KNOBS = ["host_step_seconds", "host_sequence_seconds"]


def fit(
    figures: Sequence[Figure], knobs: Sequence[str], start: Efficiency = CALIBRATED
) -> tuple[Efficiency, float]:
    """Coordinate descent on `knobs` (multiplicative steps, halved until 1%) minimising
    `log_loss`; the other knobs keep their `start` values. Deterministic; 1-2 minutes."""
    current = start
    loss = log_loss(evaluate(figures, current))
    step = 1.5
    while step > 1.01:
        improved = False
        for knob in knobs:
            low, high = FIT_KNOBS[knob]
            value = getattr(current, knob)
            candidates = [value * step, value / step] if value > 0 else [high / 100]
            if value > 0 and knob.endswith("_seconds"):
                candidates.append(0.0)
            for candidate in candidates:
                candidate = min(high, max(low, candidate))
                trial = dataclasses.replace(current, **{knob: candidate})
                trial_loss = log_loss(evaluate(figures, trial))
                if trial_loss < loss - 1e-6:
                    current, loss, improved = trial, trial_loss, True
                    break
        if not improved:
            step = math.sqrt(step)
    return current, loss


DOCS = Path(__file__).resolve().parent.parent / "docs" / "engine-sim.md"


def docs_blocks() -> dict[str, str]:
    """The generated blocks of docs/engine-sim.md, by marker name."""
    return {
        "perf-model-predictions": predictions_markdown(),
        "perf-model-validation": markdown(evaluate(FIGURES)),
        "perf-model-per-chip": per_chip_markdown(),
    }


def replace_block(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
    head, found, rest = text.partition(begin)
    if not found or end not in rest:
        raise ValueError(f"{DOCS}: no {begin.strip()} ... {end} block")
    return head + begin + body + "\n" + end + rest.split(end, 1)[1]


def leave_one_source_out(figures: Sequence[Figure]) -> list[Row]:
    """Each source's rows as predicted by knobs fitted to every other source."""
    rows: list[Row] = []
    for source in dict.fromkeys(f.source for f in figures):
        held_out = [f for f in figures if f.source == source]
        efficiency, _ = fit([f for f in figures if f.source != source], DEFAULT_FIT_KNOBS)
        rows += evaluate(held_out, efficiency)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    parser.add_argument(
        "--predictions", action="store_true", help="the calibrated model's predictions table"
    )
    parser.add_argument(
        "--per-chip", action="store_true", help="the per-chip anchors (issue 58), published vs "
        "modelled, the held-out figures included",
    )  # fmt: skip
    parser.add_argument(
        "--update-docs",
        action="store_true",
        help=f"rewrite the generated tables in {DOCS.relative_to(DOCS.parent.parent)}",
    )
    parser.add_argument(
        "--fit",
        nargs="*",
        metavar="KNOB",
        help=f"refit these knobs (default: {' '.join(DEFAULT_FIT_KNOBS)}; allowed: "
        f"{', '.join(FIT_KNOBS)}); the rest keep their calibrated values",
    )
    parser.add_argument(
        "--leave-one-source-out",
        action="store_true",
        help="predict each source's rows with knobs fitted to the other sources (~10 min)",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    if args.predictions:
        print(predictions_markdown())
        return
    if args.per_chip:
        print(per_chip_markdown())
        return
    if args.update_docs:
        text = DOCS.read_text()
        for name, body in docs_blocks().items():
            text = replace_block(text, name, body)
        DOCS.write_text(text)
        return
    if args.fit is not None:
        knobs = args.fit or DEFAULT_FIT_KNOBS
        unknown = sorted(set(knobs) - set(FIT_KNOBS))
        if unknown:
            parser.error(f"--fit: {unknown} not allowed; allowed: {', '.join(FIT_KNOBS)}")
        eff, loss = fit(FIGURES, knobs)
        rows = evaluate(FIGURES, eff)
        print(markdown(rows))
        print(
            json.dumps(
                {
                    "fitted": dataclasses.asdict(eff),
                    **{k: round(v, 4) for k, v in summary(rows).items()},
                    "log_loss": round(loss, 4),
                    "calibrated_log_loss": round(log_loss(evaluate(FIGURES)), 4),
                    "wall_seconds": round(time.perf_counter() - start, 1),
                }
            )
        )
        return
    rows = leave_one_source_out(FIGURES) if args.leave_one_source_out else evaluate(FIGURES)
    if args.json:
        for row in rows:
            print(
                json.dumps(
                    {
                        "figure": row.figure.key,
                        "metric": row.metric,
                        "published": row.published,
                        "modelled": round(row.modelled, 3),
                        "error": round(row.error, 4),
                    }
                )
            )
    else:
        print(markdown(rows))
    print(
        json.dumps(
            {
                "efficiency": "refitted without each held-out source"
                if args.leave_one_source_out
                else dataclasses.asdict(CALIBRATED),
                **{k: round(v, 4) for k, v in summary(rows).items()},
                "log_loss": round(log_loss(rows), 4),
                "wall_seconds": round(time.perf_counter() - start, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
