"""SGLang 0.5.23's engine (scheduler, radix cache, tokenizer and detokenizer) in one process,
its model on the CPU or on a TorchTPU chip (issue 71, item 2; docs/tpu-lane.md).

    python bench/sglang_engine_chip.py --model DIR --device cpu|tpu [--bridge] [--compile] \
        [--phases tokens perf] --out FILE.jsonl

`--device cpu` without `--bridge` is SGLang's own CPU engine (the reference tokens);
`--bridge` moves the model's forward to `--device` (`sglang_tpu.sglang_device_bridge`). Phase
``tokens``: a prompt, then a batch of four prompts sharing its prefix, greedy: every output
id and each answer's `cached_tokens`. Phase ``perf``: random-id prompts at batch 1, 8 and 32
with `ignore_eos`; the bridge's decode steps of exactly that batch give the step time (median).
Writes JSON lines as it goes. `--no-tcp` refuses Python's internet sockets (the TPU machine's
rule) for the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PREFIX = (
    "The operator keeps a compile cache per model and slice, and the router sends every "
    "request with a known prefix to the replica that already holds it in its radix cache. "
)
SUFFIXES = ["Why is that faster?", "What does it cost?", "When does it miss?", "Who decides?"]
PERF_BATCHES = (1, 8, 32)
STUB_PACKAGES_CHIP = {
    # SGLang imports these at load; on the engine's path they are never called or only as
    # no-ops (the TPU machine lacks them; bench/tpu_real_model.py's STUBBABLE, minus zmq,
    # psutil, orjson, pybase64, setproctitle, partial_json_parser, which the run carries).
    "IPython", "aiohttp", "compressed_tensors", "cuda", "distro", "einops", "gguf",
    "jsonschema", "loguru", "mistral_common", "openai", "opentelemetry", "pycountry",
    "pynvml", "python_multipart", "requests", "sentencepiece", "soundfile", "starlette",
    "fastapi", "uvicorn", "uvloop", "tiktoken", "torch_memory_saver", "torchvision", "tvm_ffi",
    "triton", "xgrammar", "zstandard", "soxr", "llguidance", "interegular", "xxhash", "blobfile",
    "anthropic", "openai_harmony", "timm", "kernels", "numba", "prometheus_client",
    "watchfiles", "easydict", "dateutil", "smg_grpc_servicer", "grpc", "grpc_health",
    "grpc_reflection", "outlines", "decord", "av", "librosa", "nvidia", "pydantic_extra_types",
    "multidict", "yarl", "aiosignal", "frozenlist", "propcache", "referencing", "rpds",
    "jsonschema_specifications", "traitlets", "urllib3", "charset_normalizer",
}  # fmt: skip


def emit(out: Path, rec: dict[str, Any]) -> None:
    rec.setdefault("t", round(time.time(), 3))
    line = json.dumps(rec, default=str)
    print(line[:2000], flush=True)
    with out.open("a") as f:
        f.write(line + "\n")


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    rec: dict[str, Any] = {}
    # SGLang's CPU engine: every CustomOp on its native torch path (also under the bridge,
    # whose device ops are plain torch ops).
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    if args.hide_installed:
        _hide(STUB_PACKAGES_CHIP)
    if args.stubs:
        from sglang_tpu.sglang_torchtpu import (
            install_missing_module_stubs,
            tolerate_missing_processor_backends,
        )

        rec["stubbed_modules"] = install_missing_module_stubs(STUB_PACKAGES_CHIP)
        rec["skipped_registrations"] = tolerate_missing_processor_backends()
    import torch

    if args.precision:
        torch.set_float32_matmul_precision(args.precision)
    if args.device == "tpu":
        import torch_tpu

        rec["torch_tpu"] = getattr(torch_tpu, "__version__", "?")
        modes = {"eager": "DEFER_NEVER", "fuse": "DEFER_AND_FUSE"}
        torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, modes[args.eager_mode]))

    rec["torch"] = torch.__version__
    return rec


def _hide(names: set[str]) -> None:
    """Make installed packages of `names` look absent (a CPU rehearsal of the TPU machine,
    where none of them is installed): their imports and `find_spec` fail."""
    import importlib.abc

    class _Hider(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname.split(".")[0] in names:
                raise ModuleNotFoundError(f"No module named {fullname!r} (hidden)")
            return None

    for name in list(sys.modules):
        if name.split(".")[0] in names:
            del sys.modules[name]
    sys.meta_path.insert(0, _Hider())


def server_args(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        model_path=str(args.model),
        tokenizer_path=str(args.model),
        device="cpu",
        attention_backend="torch_native",
        sampling_backend="pytorch",
        grammar_backend="none",
        enable_cache_report=True,
        dtype=args.dtype,
        load_format=args.load_format,
        page_size=1,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running,
        chunked_prefill_size=args.chunked_prefill,
        context_length=args.context_length,
        disable_cuda_graph=True,
        skip_server_warmup=True,
        random_seed=1,
        log_level=args.log_level,
    )


def tokens_phase(engine: Any, out: Path, new_tokens: int) -> None:
    greedy = {"temperature": 0.0, "max_new_tokens": new_tokens}
    first = engine.generate(prompt=PREFIX + "Begin.", sampling_params=greedy)
    emit(out, {"phase": "tokens", "kind": "first", **_answer(first)})
    batch = engine.generate(prompt=[PREFIX + s for s in SUFFIXES], sampling_params=greedy)
    for i, ans in enumerate(batch):
        emit(out, {"phase": "tokens", "kind": "shared-prefix", "i": i, **_answer(ans)})


def _answer(ans: dict[str, Any]) -> dict[str, Any]:
    meta = ans.get("meta_info", {})
    return {
        "output_ids": ans.get("output_ids"),
        "text": ans.get("text"),
        "prompt_tokens": meta.get("prompt_tokens"),
        "cached_tokens": meta.get("cached_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
    }


def perf_phase(engine: Any, bridge: Any, out: Path, args: argparse.Namespace) -> None:
    import random

    rng = random.Random(7)
    vocab = args.perf_vocab
    for b in args.batches:
        if time.monotonic() > args.deadline:
            emit(out, {"phase": "perf", "batch": b, "skipped": "budget"})
            continue
        for round_ in ("warm", "timed"):
            ids = [[rng.randrange(10, vocab) for _ in range(args.perf_prompt)] for _ in range(b)]
            before = len(bridge.steps) if bridge else 0
            t0 = time.perf_counter()
            engine.generate(
                input_ids=ids,
                sampling_params={
                    "temperature": 0.0,
                    "max_new_tokens": args.perf_new,
                    "ignore_eos": True,
                },
            )
            wall = time.perf_counter() - t0
            steps = bridge.steps[before:] if bridge else []
            dec = [s.seconds * 1e3 for s in steps if s.mode == "decode" and s.batch == b]
            ext = [s.seconds * 1e3 for s in steps if s.mode == "extend"]
            emit(
                out,
                {
                    "phase": "perf",
                    "round": round_,
                    "batch": b,
                    "wall_s": round(wall, 3),
                    "decode_steps_at_batch": len(dec),
                    "decode_ms_median": round(statistics.median(dec), 3) if dec else None,
                    "decode_ms_min": round(min(dec), 3) if dec else None,
                    "decode_ms_first": round(dec[0], 3) if dec else None,
                    "extend_ms": [round(x, 2) for x in ext][:8],
                    "tokens_per_s": round(b * args.perf_new / wall, 1),
                },
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--bridge", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--precision", default="highest")
    p.add_argument("--eager-mode", default="eager", choices=["eager", "fuse"])
    p.add_argument("--stubs", action="store_true")
    p.add_argument("--hide-installed", action="store_true", help="rehearse the TPU machine")
    p.add_argument("--no-tcp", action="store_true")
    p.add_argument("--phases", nargs="+", default=["tokens"])
    p.add_argument("--new-tokens", type=int, default=12)
    p.add_argument("--batches", type=int, nargs="+", default=list(PERF_BATCHES))
    p.add_argument("--perf-prompt", type=int, default=64)
    p.add_argument("--perf-new", type=int, default=12)
    p.add_argument("--perf-vocab", type=int, default=2000)
    p.add_argument("--max-total-tokens", type=int, default=8192)
    p.add_argument("--max-running", type=int, default=32)
    p.add_argument("--chunked-prefill", type=int, default=2048)
    p.add_argument("--context-length", type=int, default=1024)
    p.add_argument("--log-level", default="error")
    p.add_argument("--budget-s", type=float, default=1e9)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--label", default="")
    args = p.parse_args(argv)
    args.deadline = time.monotonic() + args.budget_s
    out = args.out
    base = {"label": args.label, "device": args.device, "bridge": args.bridge,
            "compile": args.compile, "model": args.model.name}  # fmt: skip
    t0 = time.perf_counter()
    rec = dict(base, phase="start")
    try:
        rec.update(prepare(args))
        from sglang_tpu import sglang_device_bridge, sglang_one_process

        bridge = None
        if args.bridge:
            bridge = sglang_device_bridge.install(
                sglang_device_bridge.DeviceBridge(device=args.device, compile=args.compile)
            )
        if args.no_tcp:
            guard = sglang_one_process.refuse_internet_sockets()
            refused = guard.__enter__()
        engine = sglang_one_process.start_engine(**server_args(args))
        rec["ready_s"] = round(time.perf_counter() - t0, 2)
        emit(out, rec)
        if "tokens" in args.phases:
            tokens_phase(engine, out, args.new_tokens)
        if "perf" in args.phases:
            perf_phase(engine, bridge, out, args)
        end = dict(base, phase="end", total_s=round(time.perf_counter() - t0, 2))
        if args.no_tcp:
            end["refused_internet_sockets"] = refused
        if bridge is not None:
            end["bridge_steps"] = len(bridge.steps)
            end["first_steps_ms"] = [
                (s.mode, s.batch, s.tokens, round(s.seconds * 1e3, 1)) for s in bridge.steps[:6]
            ]
        emit(out, end)
        code = 0
    except BaseException as e:  # the error is the result: record it exactly
        emit(out, dict(rec, phase="error", error=f"{type(e).__name__}: {e}",
                       traceback=traceback.format_exc()[-6000:]))  # fmt: skip
        code = 1
    sys.stdout.flush()
    os._exit(code)  # the scheduler and detokenizer threads never return


if __name__ == "__main__":
    sys.exit(main())
