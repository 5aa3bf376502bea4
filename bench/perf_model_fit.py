"""Benchmark: the performance model's device half against steps measured on a TPU v5e chip.

`sglang_tpu.perf_model.StepTimer.device_seconds` is what a bare compiled step takes on the
chips. This program compares it with the steps `bench/tpu_steps.py` measured (JAX, on the
project's v5e machine; rows under ``bench/tpu_results/``), fits the device knobs of
`Efficiency` to them (``--fit``: coordinate descent on the mean squared log error), and
prints the error of every row, prefill and decode separately.

Which measured rows the fit uses (``fit_rows``; every other row is still printed, marked):

- the fastest JAX median per (model, step, tokens, context) over the runs: a tuned engine's
  kernels are what the model stands for;
- prefill: Pallas flash attention; the reference's materialised-score rows only up to 2,048
  tokens (at 8,192 the materialised scores dominate: they describe that kernel, not the chip);
- decode: materialised-score attention. The Pallas paged-attention kernel (pages of 16,
  ``pages_per_compute_block`` 32) was slower on the Qwen3 shapes (16 of 8 KV heads: 53 ms
  against 14.5 ms at 64 x 1,024 for Qwen3-0.6B) and is reported, not fitted;
- shapes that did not fit HBM are rows of `sglang_tpu.hbm_fit`, not of this fit.

TorchTPU rows (`torch.compile(backend="tpu")`) are printed beside their JAX row as a ratio:
the model stands for the chip, and SGLang-TorchTPU's kernels are not JAX's.

    .venv/bin/python bench/perf_model_fit.py            # the table against CALIBRATED
    .venv/bin/python bench/perf_model_fit.py --fit      # refit the device knobs
    .venv/bin/python bench/perf_model_fit.py --update-docs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_tpu.perf_model import CALIBRATED, Efficiency, StepTimer, get_profile
from sglang_tpu.topology import lookup

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "tpu_results"
DOCS = ROOT / "docs" / "engine-sim.md"
DEVICE_KNOBS: dict[str, tuple[float, float]] = {
    "matmul_mfu": (0.05, 1.0),
    "attention_mfu": (0.05, 1.0),
    "weight_mbu": (0.05, 1.0),
    "kv_mbu": (0.05, 1.0),
    "device_step_seconds": (0.0, 0.01),
    "device_layer_seconds": (0.0, 0.001),
}
PREFILL_MATERIALISED_LIMIT = 2048


@dataclass(frozen=True)
class Measured:
    model: str
    step: str
    tokens: int
    context: int
    median_ms: float
    source: str  # the file's folder and name
    kernel: bool  # a Pallas kernel (flash or paged) did the attention
    torch_ms: float | None = None

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.model, self.step, self.tokens, self.context)


def read_rows(folder: Path = RESULTS) -> list[Measured]:
    """Every timed JAX row under `folder` (rows with an error are left out)."""
    rows: list[Measured] = []
    torch: dict[tuple[str, str, int, int], float] = {}
    for path in sorted(folder.glob("*/*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "header" in record or "median_ms" not in record:
                continue
            key = (record["model"], record["step"], record["tokens"], record["context"])
            if record["framework"] == "torch":
                if record.get("tag") in ("cold", ""):
                    torch[key] = min(torch.get(key, math.inf), record["median_ms"])
                continue
            rows.append(
                Measured(
                    *key,
                    median_ms=record["median_ms"],
                    source=f"{path.parent.name}/{path.name}",
                    kernel=bool(record.get("kernel")),
                    torch_ms=record.get("torch_median_ms"),
                )
            )
    return [
        dataclasses.replace(r, torch_ms=torch.get(r.key, r.torch_ms)) if r.key in torch else r
        for r in rows
    ]


def usable(row: Measured) -> bool:
    if row.step == "prefill":
        return row.kernel or row.tokens <= PREFILL_MATERIALISED_LIMIT
    return not row.kernel


def fit_rows(rows: Iterable[Measured]) -> list[Measured]:
    """The fastest usable row per shape (see the module docstring)."""
    best: dict[tuple[str, str, int, int], Measured] = {}
    for row in rows:
        if usable(row) and (row.key not in best or row.median_ms < best[row.key].median_ms):
            best[row.key] = row
    return sorted(best.values(), key=lambda r: r.key)


def modelled_ms(row: Measured, efficiency: Efficiency = CALIBRATED) -> float:
    timer = StepTimer(lookup("v5e", "1x1"), get_profile(row.model), efficiency=efficiency)
    if row.step == "prefill":
        attention = row.tokens * (row.tokens + 1) // 2
        seconds = timer.device_seconds(
            prefill_tokens=row.tokens, prefill_attention_context=attention
        )
    else:
        seconds = timer.device_seconds(
            decode_batch=row.tokens, decode_context=row.tokens * row.context
        )
    return seconds * 1e3


def log_loss(rows: Sequence[Measured], efficiency: Efficiency) -> float:
    return statistics.fmean(math.log(modelled_ms(r, efficiency) / r.median_ms) ** 2 for r in rows)


def fit(rows: Sequence[Measured], start: Efficiency = CALIBRATED) -> Efficiency:
    """Coordinate descent over the device knobs, multiplicative steps shrinking to 0.1%."""
    current, loss, step = start, log_loss(rows, start), 1.5
    while step > 1.001:
        improved = False
        for knob, (low, high) in DEVICE_KNOBS.items():
            value = getattr(current, knob)
            for candidate in (value * step, value / step) if value > 0 else (high / 100,):
                trial = dataclasses.replace(current, **{knob: min(high, max(low, candidate))})
                trial_loss = log_loss(rows, trial)
                if trial_loss < loss - 1e-9:
                    current, loss, improved = trial, trial_loss, True
                    break
        if not improved:
            step = math.sqrt(step)
    return current


def errors(rows: Sequence[Measured], step: str, efficiency: Efficiency) -> list[float]:
    return [modelled_ms(r, efficiency) / r.median_ms - 1 for r in rows if r.step == step]


def summary(rows: Sequence[Measured], efficiency: Efficiency = CALIBRATED) -> dict[str, float]:
    out: dict[str, float] = {}
    for step in ("prefill", "decode"):
        errs = [abs(e) for e in errors(rows, step, efficiency)]
        out[f"{step}_rows"] = len(errs)
        out[f"{step}_median_abs_error"] = round(statistics.median(errs), 4)
        out[f"{step}_max_abs_error"] = round(max(errs), 4)
    return out


def markdown(all_rows: Sequence[Measured], efficiency: Efficiency = CALIBRATED) -> str:
    fitted = {r.key: r for r in fit_rows(all_rows)}
    lines = [
        "| model | step | JAX ms | source | modelled ms | error | in fit | TorchTPU ms (/JAX) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(all_rows, key=lambda r: (r.key, r.median_ms)):
        best = fitted.get(row.key)
        if best is not None and best is not row and usable(row):
            continue  # a slower run of a fitted shape
        shape = (
            f"prefill {row.tokens}"
            if row.step == "prefill"
            else f"decode {row.tokens} x {row.context}"
        )
        model = modelled_ms(row, efficiency)
        torch = f"{row.torch_ms:.2f} ({row.torch_ms / row.median_ms:.2f})" if row.torch_ms else "—"
        kernel = " (kernel)" if row.kernel else ""
        lines.append(
            f"| {row.model} | {shape} | {row.median_ms:.2f} | {row.source}{kernel} "
            f"| {model:.2f} | {model / row.median_ms - 1:+.0%} "
            f"| {'yes' if best is row else 'no'} | {torch} |"
        )
    s = summary(list(fitted.values()), efficiency)
    lines += [
        "",
        f"Fitted rows: prefill {s['prefill_rows']:.0f}, median absolute error "
        f"{s['prefill_median_abs_error']:.1%} (worst {s['prefill_max_abs_error']:.1%}); decode "
        f"{s['decode_rows']:.0f}, median {s['decode_median_abs_error']:.1%} "
        f"(worst {s['decode_max_abs_error']:.1%}).",
    ]
    return "\n".join(lines)


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the generated block `name` (between its begin and end markers) set to `body`.
    The same markers as bench/perf_model_validation.py's blocks in the same page."""
    begin, end = f"<!-- {name}:begin -->\n", f"<!-- {name}:end -->"
    head, found, rest = text.partition(begin)
    if not found or end not in rest:
        raise ValueError(f"{DOCS}: no {begin.strip()} ... {end} block")
    return head + begin + body + "\n" + end + rest.split(end, 1)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fit", action="store_true", help="refit the device knobs")
    parser.add_argument("--json", action="store_true", help="the summary as JSON")
    parser.add_argument(
        "--update-docs", action="store_true", help="rewrite the table in docs/engine-sim.md"
    )
    args = parser.parse_args()
    rows = read_rows()
    if args.fit:
        efficiency = fit(fit_rows(rows))
        knobs = {k: round(getattr(efficiency, k), 7) for k in DEVICE_KNOBS}
        print(json.dumps({"fitted": knobs, **summary(fit_rows(rows), efficiency)}))
        return
    if args.update_docs:
        DOCS.write_text(replace_block(DOCS.read_text(), "perf-model-device", markdown(rows)))
        return
    if args.json:
        print(json.dumps(summary(fit_rows(rows))))
        return
    print(markdown(rows))


if __name__ == "__main__":
    main()
