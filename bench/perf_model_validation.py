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
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Run as a script (`python bench/perf_model_validation.py`): the checkout's root first, so
# `bench.*` is this checkout's even when another one is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.perf_model_figures import (
    FIGURES,
    HELD_OUT,
    METRIC_LABELS,
    PER_CHIP,
    Figure,
    Metric,
    Workload,
)
from sglang_tpu.perf_model import CALIBRATED, Efficiency, StepTimer, get_profile, kv_pool_tokens
from sglang_tpu.topology import lookup


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
