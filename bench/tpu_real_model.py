"""Real model code on one device: SGLang 0.5.23's Qwen3 and Transformers' Qwen3 (issue 58).

One process runs one implementation on one device in one mode and writes one JSON line:

    python bench/tpu_real_model.py run --impl sglang|hf --device cpu|tpu \
        --mode eager|fuse|compile --out FILE [--oplog FILE] [--cpu-ops OP,OP] [--shape NAME]

- ``sglang``: ``sglang.srt.models.qwen3.Qwen3ForCausalLM`` built from a ``Qwen3Config`` (random
  weights, seed 0, loaded through SGLang's own ``load_weights`` from the Transformers model's
  state dict, so both implementations hold the same weights), driven the way SGLang's CPU
  device drives it: a ``ReqToTokenPool`` and an ``MHATokenToKVPool`` (page size 1) on the
  device, the ``torch_native`` attention backend (``TorchNativeAttnBackend``: SDPA over the
  paged KV gathered through ``req_to_token``), an EXTEND ``ForwardBatch`` for the prefill and
  DECODE batches after it, greedy argmax over ``LogitsProcessor``'s ``next_token_logits``.
  What SGLang's runtime would do around it (the scheduler, the distributed groups) is
  replaced by ``sglang_tpu.sglang_torchtpu`` (the adapter: what SGLang-TorchTPU must provide).
- ``hf``: ``transformers.Qwen3ForCausalLM`` on the device (``.to(device)``), the same prompt,
  a ``DynamicCache``, greedy argmax.

``--oplog`` writes every aten op (name, shapes, dtypes) to a file *before* it runs, line
buffered, so when the TPU compiler aborts the process the last ``START`` line names the op.
``--cpu-ops`` runs the named aten ops on the CPU and moves their results back (the lane's
way past an op the chip's compiler refuses, to see what comes after it).

``drive`` runs the whole lane (CPU references, then the chip, each in its own process,
rediscovering the aborting op after each abort) and writes ``real-model.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# Tiny Qwen3 configs: "tiny" proves the tokens, "small" is a 0.6B-like layer at 4 layers.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    ),
    "qwen3-0.6b-4l": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}


# Packages SGLang 0.5.23 imports when its Qwen3 model, pools and torch-native backend load,
# but never calls on that path (serving, tokenizer front ends, grammar, Triton, CUDA helpers):
# where the machine lacks one, an empty stand-in (sglang_tpu.sglang_torchtpu).
STUBBABLE = {
    "IPython",
    "aiohttp",
    "compressed_tensors",
    "cuda",
    "distro",
    "einops",
    "gguf",
    "jsonschema",
    "loguru",
    "mistral_common",
    "openai",
    "opentelemetry",
    "orjson",
    "partial_json_parser",
    "psutil",
    "pybase64",
    "pycountry",
    "pynvml",
    "python_multipart",
    "requests",
    "sentencepiece",
    "setproctitle",
    "soundfile",
    "starlette",
    "fastapi",
    "uvicorn",
    "uvloop",
    "tiktoken",
    "torch_memory_saver",
    "torchvision",
    "tvm_ffi",
    "triton",
    "xgrammar",
    "zmq",
    "zstandard",
    "llguidance",
    "interegular",
    "xxhash",
    "blobfile",
    "anthropic",
    "openai_harmony",
    "timm",
    "kernels",
    "numba",
    "prometheus_client",
    "watchfiles",
    "easydict",
    "dateutil",
    "smg_grpc_servicer",
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "outlines",
    "decord",
    "av",
    "librosa",
    "nvidia",
    "pydantic_extra_types",
    "multidict",
    "yarl",
    "aiosignal",
    "frozenlist",
    "propcache",
    "attr",
    "attrs",
    "referencing",
    "rpds",
    "jsonschema_specifications",
    "traitlets",
    "urllib3",
    "charset_normalizer",
}


def _describe(x: Any) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}@{x.device.type}"
    if isinstance(x, (list, tuple)):
        return "(" + ",".join(_describe(v) for v in x) + ")"
    if isinstance(x, (int, float, bool)) or x is None:
        return repr(x)
    return type(x).__name__


def op_mode(log_path: str | None, cpu_ops: set[str]) -> Any:
    """A TorchDispatchMode that logs each aten op before it runs and runs `cpu_ops` on the CPU."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115

    class OpMode(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            name = str(func)
            if log:
                log.write(f"START {name} {_describe(args)} {_describe(list(kwargs.values()))}\n")
            if name in cpu_ops:
                devices = [
                    a.device
                    for a in list(args) + list(kwargs.values())
                    if isinstance(a, torch.Tensor) and a.device.type != "cpu"
                ]
                if devices:
                    dev = devices[0]
                    originals: list[tuple[Any, Any]] = []

                    def to_cpu(a: Any) -> Any:
                        if isinstance(a, torch.Tensor) and a.device.type != "cpu":
                            c = a.cpu()
                            originals.append((a, c))
                            return c
                        return a

                    cargs = tree_map(to_cpu, args)
                    ckwargs = tree_map(to_cpu, kwargs)
                    out = func(*cargs, **ckwargs)
                    # Mutated inputs: write the CPU copy back (in-place ops, out=).
                    if name.split(".")[1].endswith("_") or "out" in kwargs:
                        for orig, cpu in originals:
                            orig.copy_(cpu.to(dev))
                    result = tree_map(
                        lambda r: r.to(dev) if isinstance(r, torch.Tensor) else r, out
                    )
                    if log:
                        log.write(f"OK-CPU {name}\n")
                    return result
            out = func(*args, **kwargs)
            if log:
                log.write(f"OK {name}\n")
            return out

    return OpMode()


def sync(device: str) -> None:
    import torch

    if device != "cpu":
        torch.accelerator.synchronize()


def build_hf(shape: str, dtype: Any) -> tuple[Any, Any]:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**SHAPES[shape], torch_dtype="float32")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    # Random weights large enough that greedy tokens are not all the same id.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5 * 4)
    return cfg, model.to(dtype)


class HFRunner:
    def __init__(self, shape: str, device: str, dtype: Any):
        self.cfg, model = build_hf(shape, dtype)
        self.device = device
        self.model = model.to(device)
        self.fwd = self.model

    def compile(self) -> None:
        import torch

        self.fwd = torch.compile(self.model, backend="tpu")

    def prefill(self, ids: Any) -> Any:
        import torch
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.cfg)
        with torch.no_grad():
            out = self.fwd(input_ids=ids, past_key_values=self.cache, use_cache=True)
        self.pos = ids.shape[1]
        return out.logits[:, -1, :]

    def decode(self, next_ids: Any) -> Any:
        import torch

        with torch.no_grad():
            out = self.fwd(input_ids=next_ids[:, None], past_key_values=self.cache, use_cache=True)
        self.pos += 1
        return out.logits[:, -1, :]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    rec: dict[str, Any] = {
        "impl": args.impl,
        "device": args.device,
        "mode": args.mode,
        "shape": args.shape,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "cpu_ops": sorted(args.cpu_ops),
        "torch": torch.__version__,
    }
    if args.device == "tpu":
        import torch_tpu

        rec["torch_tpu"] = getattr(torch_tpu, "__version__", "?")
        modes = {
            "eager": torch.tpu.EagerMode.DEFER_NEVER,
            "fuse": torch.tpu.EagerMode.DEFER_AND_FUSE,
            "blocking": torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
            "compile": torch.tpu.EagerMode.DEFER_NEVER,
        }
        torch.tpu.set_eager_mode(modes[args.mode])
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    rec["dtype"] = args.dtype
    if args.precision:
        torch.set_float32_matmul_precision(args.precision)
        rec["float32_matmul_precision"] = args.precision
    t0 = time.perf_counter()
    if args.impl == "hf":
        runner: Any = HFRunner(args.shape, args.device, dtype)
    else:
        from sglang_tpu.cpu_shim import PYTHONPATH_ENTRY
        from sglang_tpu.sglang_torchtpu import (
            SGLangQwen3Runner,
            install_missing_module_stubs,
            route_integer_cumsum_through_host,
            tolerate_missing_processor_backends,
        )

        sys.path.append(str(PYTHONPATH_ENTRY))  # sgl_kernel's pure-torch stand-ins
        hf_model = build_hf(args.shape, dtype)[1]  # before the stand-ins: transformers probes
        rec["stubbed_modules"] = install_missing_module_stubs(STUBBABLE)
        rec["skipped_registrations"] = tolerate_missing_processor_backends()
        if args.host_cumsum:
            route_integer_cumsum_through_host()
            rec["host_cumsum"] = True
        runner = SGLangQwen3Runner(
            SHAPES[args.shape],
            hf_model,
            device=args.device,
            dtype=dtype,
            max_context=args.prompt_len + args.steps + 8,
            batch=args.batch,
        )
    rec["build_s"] = round(time.perf_counter() - t0, 3)
    if args.mode == "compile":
        if args.impl == "sglang":
            runner.compile(kv_writes_in_graph=args.kv_writes_in_graph)
            rec["kv_writes_in_graph"] = args.kv_writes_in_graph
        else:
            runner.compile()
    gen = torch.Generator().manual_seed(1)
    vocab = SHAPES[args.shape]["vocab_size"]
    prompt = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=gen)
    # The op log and CPU fallbacks are a dispatch mode: eager only (torch.compile refuses one).
    use_mode = (args.oplog or args.cpu_ops) and args.mode != "compile"
    mode = op_mode(args.oplog, set(args.cpu_ops)) if use_mode else None
    tokens: list[list[int]] = []
    step_s: list[float] = []
    rec["sample"] = args.sample

    def greedy(logits: Any) -> Any:
        """Greedy ids, on the device (int64 or int32) or on the host (logits moved first)."""
        if args.sample == "host":
            return torch.argmax(logits.float().cpu(), dim=-1).to(args.device)
        ids = torch.argmax(logits, dim=-1)
        return ids.to(torch.int32) if args.sample == "device-int32" else ids

    if mode is not None:
        mode.__enter__()
    try:
        ids = prompt.to(args.device)
        t = time.perf_counter()
        logits = runner.prefill(ids)
        nxt = greedy(logits)
        tokens.append(nxt.cpu().tolist())
        rec["prefill_first_s"] = round(time.perf_counter() - t, 4)
        for _ in range(args.steps):
            t = time.perf_counter()
            logits = runner.decode(nxt)
            nxt = greedy(logits)
            tokens.append(nxt.cpu().tolist())  # .cpu() synchronises
            step_s.append(time.perf_counter() - t)
        # Timed repeats: prefill again from an empty cache, then decode steps.
        if args.repeats:
            pre = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                logits = runner.prefill(ids)
                nxt = greedy(logits)
                nxt.cpu()
                pre.append(time.perf_counter() - t)
            rec["prefill_ms"] = round(1e3 * sorted(pre)[len(pre) // 2], 3)
            dec = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                logits = runner.decode(nxt)
                nxt = greedy(logits)
                nxt.cpu()
                dec.append(time.perf_counter() - t)
            rec["decode_ms"] = round(1e3 * sorted(dec)[len(dec) // 2], 3)
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)
    rec["tokens"] = tokens
    rec["first_decode_s"] = round(step_s[0], 4) if step_s else None
    rec["ok"] = True
    return rec


def cmd_run(args: argparse.Namespace) -> int:
    args.cpu_ops = [o for o in (args.cpu_ops or "").split(",") if o]
    try:
        rec = run(args)
    except Exception as e:  # a Python error (not an abort): recorded, not raised
        import traceback

        rec = {
            "impl": args.impl,
            "device": args.device,
            "mode": args.mode,
            "shape": args.shape,
            "cpu_ops": args.cpu_ops,
            "ok": False,
            "error": f"{type(e).__name__}: {e}"[:2000],
            "traceback": traceback.format_exc()[-4000:],
        }
    with open(args.out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(json.dumps({k: v for k, v in rec.items() if k != "traceback"})[:3000], flush=True)
    return 0 if rec.get("ok") else 1


def _last_started(oplog: Path) -> str | None:
    if not oplog.exists():
        return None
    last = None
    for line in oplog.read_text(errors="replace").splitlines():
        if line.startswith("START "):
            last = line[6:]
        elif line.startswith("OK"):
            last = None
    return last


def drive(args: argparse.Namespace) -> int:
    """CPU references, then each implementation on the chip, rediscovering aborting ops."""
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "real-model.jsonl"
    deadline = time.monotonic() + args.budget_s

    def child(
        impl: str,
        device: str,
        mode: str,
        shape: str,
        cpu_ops: list[str],
        oplog: Path | None = None,
        extra: Any = (),
        timeout: float = 240,
    ) -> tuple[Any, str]:
        cmd = [
            sys.executable,
            __file__,
            "run",
            "--impl",
            impl,
            "--device",
            device,
            "--mode",
            mode,
            "--shape",
            shape,
            "--out",
            str(results),
            "--cpu-ops",
            ",".join(cpu_ops),
            *extra,
        ]
        if oplog:
            cmd += ["--oplog", str(oplog)]
        left = deadline - time.monotonic()
        if left < 20:
            return None, "skipped: budget"
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=min(timeout, left))
            rc: Any = p.returncode
            tail = (p.stdout + p.stderr)[-6000:]
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            tail = (
                (e.stdout or b"").decode(errors="replace")
                if isinstance(e.stdout, bytes)
                else (e.stdout or "")
            )[-3000:]
        with open(out / "children.log", "a") as f:
            f.write(
                f"\n===== {impl} {device} {mode} {shape} cpu_ops={cpu_ops} rc={rc} "
                f"wall={time.monotonic() - t:.1f}s\n{tail}\n"
            )
        return rc, tail

    oplogs = Path(args.oplog_dir)
    oplogs.mkdir(parents=True, exist_ok=True)
    for shape in [] if args.no_cpu else args.shapes:
        for impl in args.impls:
            child(impl, "cpu", "eager", shape, [], extra=args.extra)
    cpu_ops_of: dict[str, list[str]] = {i: [] for i in args.impls}
    for impl in [] if args.no_discovery else args.impls:
        cpu_ops: list[str] = []
        for attempt in range(args.max_aborts + 1):
            oplog = oplogs / f"oplog-{impl}-{attempt}.txt"
            oplog.unlink(missing_ok=True)
            rc, tail = child(
                impl, "tpu", "blocking", args.shapes[0], cpu_ops, oplog=oplog, extra=args.extra
            )
            if rc in (0, 1) or rc is None:
                break
            op = _last_started(oplog)
            log_tail = (
                oplog.read_text(errors="replace").splitlines()[-12:] if oplog.exists() else []
            )
            with open(results, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "impl": impl,
                            "device": "tpu",
                            "mode": "blocking",
                            "shape": args.shapes[0],
                            "ok": False,
                            "abort": True,
                            "rc": rc,
                            "aborting_op": op,
                            "cpu_ops": list(cpu_ops),
                            "oplog_tail": log_tail,
                            "stderr_tail": tail[-2500:],
                        }
                    )
                    + "\n"
                )
            if not op:
                break
            name = op.split(" ")[0]
            if name in cpu_ops:
                break
            cpu_ops.append(name)
        cpu_ops_of[impl] = cpu_ops
    for shape in args.shapes:
        for impl in args.impls:
            for mode in args.modes:
                cpu_ops = cpu_ops_of[impl]
                rc, tail = child(
                    impl,
                    "tpu",
                    mode,
                    shape,
                    cpu_ops,
                    extra=[*args.extra, "--repeats", str(args.repeats)],
                )
                if rc not in (0, 1) and rc is not None:
                    with open(results, "a") as f:
                        f.write(
                            json.dumps(
                                {
                                    "impl": impl,
                                    "device": "tpu",
                                    "mode": mode,
                                    "shape": shape,
                                    "ok": False,
                                    "abort": True,
                                    "rc": rc,
                                    "cpu_ops": cpu_ops,
                                    "stderr_tail": (tail or "")[-2500:],
                                }
                            )
                            + "\n"
                        )
    summarise(results, out / "summary.json")
    return 0


def summarise(results: Path, summary: Path) -> None:
    """Each chip run's tokens against the CPU's (same implementation, shape and batch)."""
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    cpu = {
        (r["impl"], r["shape"]): r["tokens"]
        for r in rows
        if r.get("device") == "cpu" and r.get("ok")
    }
    out = []
    for r in rows:
        ref = cpu.get((r.get("impl"), r.get("shape")))
        row = {
            k: r.get(k)
            for k in (
                "impl",
                "device",
                "mode",
                "shape",
                "ok",
                "abort",
                "aborting_op",
                "cpu_ops",
                "error",
                "prefill_ms",
                "decode_ms",
                "prefill_first_s",
                "first_decode_s",
                "build_s",
            )
        }
        if r.get("tokens") is not None and ref is not None:
            row["tokens_equal_cpu"] = r["tokens"] == ref
            pairs = enumerate(zip(r["tokens"], ref, strict=False))
            row["tokens_equal_cpu_first_n"] = next((i for i, (a, b) in pairs if a != b), len(ref))
        out.append(row)
    hf = cpu.get(("hf", "tiny"))
    sg = cpu.get(("sglang", "tiny"))
    summary.write_text(
        json.dumps(
            {"rows": out, "cpu_sglang_equals_cpu_hf": (hf == sg if hf and sg else None)}, indent=1
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--impl", choices=["sglang", "hf"], required=True)
    r.add_argument("--device", default="cpu")
    r.add_argument("--mode", default="eager", choices=["eager", "fuse", "blocking", "compile"])
    r.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    r.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        help="default: float32 for tiny, bfloat16 otherwise",
    )
    r.add_argument("--batch", type=int, help="default: 2 for tiny, 8 otherwise")
    r.add_argument("--prompt-len", type=int, help="default: 16 for tiny, 128 otherwise")
    r.add_argument("--steps", type=int, default=6)
    r.add_argument("--repeats", type=int, default=0)
    r.add_argument(
        "--sample",
        default="device",
        choices=["device", "device-int32", "host"],
        help="greedy argmax on the device (int64 ids, or cast to int32) or on the host",
    )
    r.add_argument(
        "--host-cumsum",
        action="store_true",
        help="sglang: integer cumsums of LogitsProcessor on the host (the chip's compiler "
        "aborts on them; sglang_tpu.sglang_torchtpu.route_integer_cumsum_through_host)",
    )
    r.add_argument(
        "--precision",
        choices=["highest", "high", "medium"],
        help="torch.set_float32_matmul_precision before the run",
    )
    r.add_argument(
        "--kv-writes-in-graph",
        action="store_true",
        help="sglang, compile: the KV pool's writes inside the graph (wrong tokens on the v5e)",
    )
    r.add_argument("--oplog")
    r.add_argument("--cpu-ops", default="")
    r.add_argument("--out", required=True)
    d = sub.add_parser("drive")
    d.add_argument("--out-dir", required=True)
    d.add_argument("--impls", nargs="+", default=["hf", "sglang"])
    d.add_argument("--shapes", nargs="+", default=["tiny"])
    d.add_argument("--modes", nargs="+", default=["eager", "fuse", "compile"])
    d.add_argument("--repeats", type=int, default=5)
    d.add_argument("--max-aborts", type=int, default=4)
    d.add_argument("--no-discovery", action="store_true", help="skip the op-logged run")
    d.add_argument("--no-cpu", action="store_true", help="skip the CPU references")
    d.add_argument("--oplog-dir", default="/tmp/tpu-real-model-oplogs")
    d.add_argument("--budget-s", type=float, default=500)
    d.add_argument("--extra", default="", help="more `run` flags, one string")
    args = ap.parse_args()
    if args.cmd == "drive":
        args.extra = args.extra.split()
    if args.cmd == "run":
        tiny = args.shape == "tiny"
        args.dtype = args.dtype or ("float32" if tiny else "bfloat16")
        args.batch = args.batch or (2 if tiny else 8)
        args.prompt_len = args.prompt_len or (16 if tiny else 128)
        return cmd_run(args)
    return drive(args)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    sys.exit(main())
