"""The TPU lane's SGLang-JAX rows next to the performance model (issue 67, item 4).

    python bench/sglang_jax_vs_model.py LANE_JSONL [--out results.json]

Reads the rows `bench/tpu_sglang_jax.py` wrote on the chip and puts beside each decode and
prefill row what `sglang_tpu.sgl_jax_predict.predict_row` predicts for it (the server's own
buckets: ``--precompile-bs-paddings 1 8 32``, ``--precompile-token-paddings 1024 4096``), and
the model's error, ``(predicted - measured) / measured``. A decode row's context is the mean
per sequence over its measured window (the prompt plus half the new tokens). Also sums up the
tokens, the cached tokens and the compile seconds, so `results.json` is the lane's one summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from sglang_tpu.sgl_jax_predict import predict_row

BS_BUCKETS = (1, 8, 32)
TOKEN_BUCKETS = (1024, 4096)


def against_model(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per decode and prefill row, with the server start it ran on."""
    table = []
    start = None
    for row in rows:
        if row["kind"] == "perf_start":
            start = row["start"]
        if row["kind"] == "decode" and row.get("step_ms") is not None:
            context = row["prompt_tokens"] + row["new_tokens"] // 2
            predicted = predict_row(
                "decode", batch=row["batch"], context=context, bs_buckets=BS_BUCKETS
            )
            measured = row["step_ms"] / 1e3
            what = f"decode batch {row['batch']} (context {context})"
        elif row["kind"] == "prefill":
            predicted = predict_row("prefill", tokens=row["tokens"], token_buckets=TOKEN_BUCKETS)
            measured = row["latency_ms"] / 1e3
            what = f"prefill {row['tokens']} tokens + 1"
        else:
            continue
        table.append(
            {
                "row": what,
                "server": start,
                "measured_ms": round(measured * 1e3, 3),
                "predicted_ms": round(predicted * 1e3, 3),
                "error": round((predicted - measured) / measured, 4),
                **({"tokens_per_s": row["tokens_per_s"]} if "tokens_per_s" in row else {}),
            }
        )
    return table


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = [r for r in rows if r["kind"] == "tiny_tokens"]
    cold_then_warm = [r for r in rows if r["kind"] == "perf_start"]
    table = against_model(rows)
    grid = [r for r in table if r["server"] == "cold"]  # the grid; the warm server ran one row
    return {
        "tokens_equal": {r["request"]: f"{r['equal']}/{r['compared']}" for r in tokens},
        "cached_tokens": {
            r["engine"]: [(a["cached_tokens"], a["prompt_tokens"]) for a in r["answers"]]
            for r in rows
            if r["kind"] == "cached_tokens"
        },
        "starts": [
            {k: r[k] for k in ("start", "ready_s", "precompile_s", "cache_files_after")}
            for r in cold_then_warm
        ],
        "against_model": table,
        "median_abs_error_of_the_grid": round(statistics.median(abs(r["error"]) for r in grid), 4)
        if grid
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("lane", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.lane.read_text().splitlines() if line.strip()]
    result = summary(rows)
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
