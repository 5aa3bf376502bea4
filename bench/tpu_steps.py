"""Benchmark: bare decoder steps on a TPU chip, JAX and TorchTPU, for the performance model.

The device half of `sglang_tpu.perf_model` is fitted to what this program measures on a real
chip (docs/tpu-lane.md says how to run it there; `bench/perf_model_fit.py` fits and reports).
Each row times one forward step of a decoder with random bf16 weights and the model's real
shape (layers, heads, head dim, MLP, vocabulary; RMSNorm, RoPE, GQA, SwiGLU, tied
embeddings, Qwen3's q/k norms):

- **prefill** of ``T`` tokens at batch 1 (SGLang prefills a batch as one sequence of tokens);
  attention through JAX's Pallas flash-attention kernel for TPUs (``--attention flash``, the
  default) or with materialised scores (``dense``); logits for the last position only, as an
  engine computes them; the K/V of every layer returned (written to HBM) as a cache fill does;
- **decode** of one token for ``b`` sequences over ``ctx`` cached positions each; attention
  through JAX's Pallas paged-attention kernel (pages of 16 tokens, as SGLang's KV pool) or
  dense; the new K/V returned, not written into the cache (one token per sequence per layer:
  bytes that do not change the step).

Timing: ``median`` of ``--repeats`` synchronised calls after two warm-up calls; ``pipelined``:
``--repeats`` calls issued back to back, one synchronisation, divided. The first call's time
minus the median is the compile time. JAX rows also record the compiled program's memory
(arguments, outputs, temporaries: ``memory_analysis()``), which the HBM fit rule is checked
against; a shape that does not compile for lack of HBM is a row with ``error``.

Rows go to ``OUT/steps-<framework>.jsonl`` as they are measured, so a run cut short keeps what
it did. No network, no sockets: it runs on the project's TPU machine as it is.

    python bench/tpu_steps.py --framework jax --out DIR                 # the default grid
    python bench/tpu_steps.py --framework torch --out DIR --rows qwen3-0.6b:prefill:512 ...
    python bench/tpu_steps.py --framework jax --out DIR --device cpu --rows qwen3-0.6b:decode:1:64
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Arch:
    """A decoder's shape, as in its Hugging Face config.json."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    qk_norm: bool

    @property
    def parameters(self) -> int:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.mlp
        return self.layers * (attention + mlp) + self.vocab * self.hidden  # tied embeddings

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


ARCHS = {
    a.name: a
    for a in (
        Arch("qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, True),
        Arch("llama-3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, False),
        Arch("qwen3-1.7b", 28, 2048, 16, 8, 128, 6144, 151936, True),
        Arch("qwen3-4b", 36, 2560, 32, 8, 128, 9728, 151936, True),
    )
}


@dataclass(frozen=True)
class Row:
    model: str
    step: str  # "prefill" or "decode"
    tokens: int  # prefill: new tokens; decode: batch
    context: int = 0  # decode: cached positions per sequence

    @property
    def label(self) -> str:
        if self.step == "prefill":
            return f"{self.model}:prefill:{self.tokens}"
        return f"{self.model}:decode:{self.tokens}:{self.context}"


def parse_row(text: str) -> Row:
    parts = text.split(":")
    if len(parts) not in (3, 4) or parts[0] not in ARCHS or parts[1] not in ("prefill", "decode"):
        raise SystemExit(
            f"--rows: {text!r} is not allowed; allowed: MODEL:prefill:TOKENS or "
            f"MODEL:decode:BATCH:CONTEXT with MODEL one of {', '.join(ARCHS)}"
        )
    if parts[1] == "decode" and len(parts) != 4:
        raise SystemExit(f"--rows: {text!r}: a decode row needs MODEL:decode:BATCH:CONTEXT")
    return Row(parts[0], parts[1], int(parts[2]), int(parts[3]) if len(parts) == 4 else 0)


def default_grid() -> list[Row]:
    rows: list[Row] = []
    for model in ARCHS:
        rows += [Row(model, "prefill", t) for t in (128, 512, 2048, 8192)]
        rows += [Row(model, "decode", b, c) for c in (1024, 4096) for b in (1, 8, 32, 64)]
    # Near the HBM edge: where the fit rule has to draw its line.
    rows += [
        Row("qwen3-0.6b", "prefill", 16384),
        Row("qwen3-0.6b", "decode", 16, 4096),
        Row("qwen3-0.6b", "decode", 24, 4096),
        Row("llama-3.2-1b", "decode", 32, 8192),
        Row("llama-3.2-1b", "decode", 48, 8192),
        Row("qwen3-1.7b", "decode", 16, 4096),
        Row("qwen3-4b", "decode", 16, 4096),
        Row("qwen3-4b", "decode", 12, 4096),
        Row("qwen3-4b", "decode", 8, 8192),
    ]
    return rows


def timed(call: Callable[[], Any], sync: Callable[[Any], None], repeats: int) -> dict[str, float]:
    """First call (compile), two warm-ups, `repeats` synchronised calls, `repeats` pipelined."""
    start = time.perf_counter()
    sync(call())
    first = time.perf_counter() - start
    for _ in range(2):
        sync(call())
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        sync(call())
        samples.append(time.perf_counter() - start)
    start = time.perf_counter()
    out = None
    for _ in range(repeats):
        out = call()
    sync(out)
    pipelined = (time.perf_counter() - start) / repeats
    median = statistics.median(samples)
    return {
        "median_ms": median * 1e3,
        "min_ms": min(samples) * 1e3,
        "max_ms": max(samples) * 1e3,
        "pipelined_ms": pipelined * 1e3,
        "first_call_s": first,
        "compile_s": max(0.0, first - median),
    }


# --------------------------------------------------------------------------------------- JAX


def jax_runner(device: str, attention: str) -> Callable[[Row, int], dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    if device == "cpu":
        jax.config.update("jax_platforms", "cpu")
    bf16 = jnp.bfloat16
    kernels_wanted = attention == "flash" and device != "cpu"

    def rms(x: Any, w: Any) -> Any:
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(bf16) * w

    def rope(x: Any, pos: Any) -> Any:  # x [..., T, H, D], pos [..., T]
        d = x.shape[-1]
        inv = 1.0 / (1e6 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
        ang = pos[..., None].astype(jnp.float32) * inv  # [..., T, D/2]
        cos, sin = jnp.cos(ang)[..., None, :], jnp.sin(ang)[..., None, :]
        x1, x2 = x[..., : d // 2].astype(jnp.float32), x[..., d // 2 :].astype(jnp.float32)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(bf16)

    def params(arch: Arch) -> dict[str, Any]:
        key = jax.random.PRNGKey(0)
        keys = iter(jax.random.split(key, 16))
        l_, h, hd = arch.layers, arch.hidden, arch.head_dim

        def w(*shape: int) -> Any:
            return jax.random.normal(next(keys), shape, bf16) * jnp.asarray(0.02, bf16)

        return {
            "embed": w(arch.vocab, h),
            "wq": w(l_, h, arch.heads * hd),
            "wk": w(l_, h, arch.kv_heads * hd),
            "wv": w(l_, h, arch.kv_heads * hd),
            "wo": w(l_, arch.heads * hd, h),
            "w1": w(l_, h, arch.mlp),
            "w3": w(l_, h, arch.mlp),
            "w2": w(l_, arch.mlp, h),
            "n1": jnp.ones((l_, h), bf16),
            "n2": jnp.ones((l_, h), bf16),
            "qn": jnp.ones((l_, hd), bf16),
            "kn": jnp.ones((l_, hd), bf16),
            "norm": jnp.ones((h,), bf16),
        }

    def layer_weights(p: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in p.items() if k not in ("embed", "norm")}

    def qkv(arch: Arch, lw: dict[str, Any], x: Any, pos: Any) -> tuple[Any, Any, Any]:
        lead = x.shape[:-1]
        q = (x @ lw["wq"]).reshape(*lead, arch.heads, arch.head_dim)
        k = (x @ lw["wk"]).reshape(*lead, arch.kv_heads, arch.head_dim)
        v = (x @ lw["wv"]).reshape(*lead, arch.kv_heads, arch.head_dim)
        if arch.qk_norm:
            q, k = rms(q, lw["qn"]), rms(k, lw["kn"])
        return rope(q, pos), rope(k, pos), v

    def mlp(lw: dict[str, Any], x: Any) -> Any:
        return (jax.nn.silu(x @ lw["w1"]) * (x @ lw["w3"])) @ lw["w2"]

    def prefill_fn(arch: Arch, use_kernels: bool) -> Callable[..., Any]:
        group = arch.heads // arch.kv_heads
        scale = 1.0 / math.sqrt(arch.head_dim)

        def attend(q: Any, k: Any, v: Any) -> Any:  # [T, H, D], [T, KVH, D]
            t = q.shape[0]
            if use_kernels:
                from jax.experimental.pallas.ops.tpu import flash_attention as fa

                block = min(512, t)
                sizes = fa.BlockSizes(block_q=block, block_k_major=block, block_k=block, block_b=1)
                qh = q.transpose(1, 0, 2)[None]
                kh = jnp.repeat(k.transpose(1, 0, 2), group, 0)[None]
                vh = jnp.repeat(v.transpose(1, 0, 2), group, 0)[None]
                out = fa.flash_attention(qh, kh, vh, causal=True, sm_scale=scale, block_sizes=sizes)
                return out[0].transpose(1, 0, 2)
            qg = q.reshape(t, arch.kv_heads, group, arch.head_dim)
            s = jnp.einsum("tkgd,skd->kgts", qg, k, preferred_element_type=jnp.float32) * scale
            mask = jnp.tril(jnp.ones((t, t), bool))
            s = jnp.where(mask, s, -1e30)
            pr = jax.nn.softmax(s, -1).astype(bf16)
            return jnp.einsum("kgts,skd->tkgd", pr, v).reshape(t, arch.heads, arch.head_dim)

        def step(p: dict[str, Any], tokens: Any) -> Any:
            t = tokens.shape[0]
            pos = jnp.arange(t)
            x = p["embed"][tokens]

            def body(x: Any, lw: dict[str, Any]) -> tuple[Any, tuple[Any, Any]]:
                h = rms(x, lw["n1"])
                q, k, v = qkv(arch, lw, h, pos)
                x = x + attend(q, k, v).reshape(t, -1) @ lw["wo"]
                x = x + mlp(lw, rms(x, lw["n2"]))
                return x, (k, v)

            x, kv = jax.lax.scan(body, x, layer_weights(p))
            logits = rms(x[-1:], p["norm"]) @ p["embed"].T
            return jnp.argmax(logits, -1), kv

        return step

    page = 16

    def decode_fn(arch: Arch, batch: int, context: int, use_kernels: bool) -> Callable[..., Any]:
        group = arch.heads // arch.kv_heads
        scale = 1.0 / math.sqrt(arch.head_dim)
        pages_per_seq = context // page

        def attend(q: Any, kc: Any, vc: Any) -> Any:
            # q [B, H, D]; kc/vc [KVH, B*pages, page, D] (the kernel's) or [B, KVH, C, D] (dense)
            if use_kernels:
                from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

                lengths = jnp.full((batch,), context, jnp.int32)
                indices = jnp.arange(batch * pages_per_seq, dtype=jnp.int32).reshape(
                    batch, pages_per_seq
                )
                block = max(1, min(pages_per_seq, 512 // page))
                while pages_per_seq % block:
                    block -= 1
                return paged_attention(
                    q * jnp.asarray(scale, bf16), kc, vc, lengths, indices,
                    pages_per_compute_block=block,
                )  # fmt: skip
            qg = q.reshape(batch, arch.kv_heads, group, arch.head_dim)
            s = jnp.einsum("bkgd,bkcd->bkgc", qg, kc, preferred_element_type=jnp.float32) * scale
            pr = jax.nn.softmax(s, -1).astype(bf16)
            return jnp.einsum("bkgc,bkcd->bkgd", pr, vc).reshape(batch, arch.heads, arch.head_dim)

        def step(p: dict[str, Any], tokens: Any, kcache: Any, vcache: Any) -> Any:
            pos = jnp.full((batch, 1), context)
            x = p["embed"][tokens][:, None, :]  # [B, 1, hidden]

            def body(x: Any, xs: tuple[dict[str, Any], Any, Any]) -> tuple[Any, tuple[Any, Any]]:
                lw, kc, vc = xs
                h = rms(x, lw["n1"])
                q, k, v = qkv(arch, lw, h, pos)  # [B, 1, H, D]
                o = attend(q[:, 0], kc, vc)
                x = x + o.reshape(batch, 1, -1) @ lw["wo"]
                x = x + mlp(lw, rms(x, lw["n2"]))
                return x, (k[:, 0], v[:, 0])

            x, kv = jax.lax.scan(body, x, (layer_weights(p), kcache, vcache))
            logits = rms(x[:, 0], p["norm"]) @ p["embed"].T
            return jnp.argmax(logits, -1), kv

        return step

    cache: dict[str, Any] = {}

    def run(row: Row, repeats: int) -> dict[str, Any]:
        arch = ARCHS[row.model]
        if cache.get("name") != arch.name:
            cache.clear()
            cache["name"] = arch.name
            cache["params"] = params(arch)
        p = cache["params"]

        def build(use_kernels: bool) -> tuple[Any, tuple[Any, ...]]:
            if row.step == "prefill":
                fn = jax.jit(prefill_fn(arch, use_kernels))
                return fn, (p, jnp.zeros((row.tokens,), jnp.int32))
            b, c = row.tokens, row.context
            if use_kernels:
                shape: tuple[int, ...] = (arch.layers, arch.kv_heads, b * (c // page), page,
                                          arch.head_dim)  # fmt: skip
            else:
                shape = (arch.layers, b, arch.kv_heads, c, arch.head_dim)
            kc = jnp.zeros(shape, bf16) + jnp.asarray(0.01, bf16)
            vc = jnp.zeros(shape, bf16) + jnp.asarray(0.01, bf16)
            fn = jax.jit(decode_fn(arch, b, c, use_kernels))
            return fn, (p, jnp.zeros((b,), jnp.int32), kc, vc)

        extra: dict[str, Any] = {"kernel": kernels_wanted}
        compiled = None
        args: tuple[Any, ...] = ()
        for use_kernels in [True, False] if kernels_wanted else [False]:
            extra["kernel"] = use_kernels
            try:
                fn, args = build(use_kernels)
                compiled = fn.lower(*args).compile()
                break
            except Exception as error:  # what did not compile (HBM) is a measured row too
                text = f"{type(error).__name__}: {str(error)[:600]}"
                args = ()
                oom = "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
                if oom or not use_kernels:
                    return {**extra, "error": text}
                extra["kernel_error"] = text
        assert compiled is not None
        ma = compiled.memory_analysis()
        if ma is not None:
            extra["memory"] = {
                name: int(getattr(ma, name))
                for name in (
                    "argument_size_in_bytes",
                    "output_size_in_bytes",
                    "temp_size_in_bytes",
                    "alias_size_in_bytes",
                    "generated_code_size_in_bytes",
                )
                if hasattr(ma, name)
            }

        def sync(out: Any) -> None:
            jax.block_until_ready(out)

        try:
            result = timed(lambda: compiled(*args), sync, repeats)
        except Exception as error:
            return {**extra, "error": f"{type(error).__name__}: {str(error)[:600]}"}
        return {**result, **extra}

    return run


# ----------------------------------------------------------------------------------- TorchTPU


def torch_runner(device: str, attention: str) -> Callable[[Row, int], dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    dev = torch.device("tpu" if device == "tpu" else "cpu")
    bf16 = torch.bfloat16

    def sync(out: Any) -> None:
        if dev.type == "tpu":
            torch.accelerator.synchronize()

    def rms(x: Any, w: Any) -> Any:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf16) * w

    def rope(x: Any, pos: Any) -> Any:  # x [B, H, T, D], pos [T] or [B, 1]
        d = x.shape[-1]
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
        ang = pos[..., None].float() * inv
        cos, sin = ang.cos(), ang.sin()
        while cos.dim() < x.dim():
            cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
        x1, x2 = x[..., : d // 2].float(), x[..., d // 2 :].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(bf16)

    def params(arch: Arch) -> dict[str, Any]:
        torch.manual_seed(0)
        h, hd = arch.hidden, arch.head_dim

        def w(*shape: int) -> Any:
            return (torch.randn(*shape, device=dev, dtype=torch.float32) * 0.02).to(bf16)

        layers = [
            {
                "wq": w(h, arch.heads * hd),
                "wk": w(h, arch.kv_heads * hd),
                "wv": w(h, arch.kv_heads * hd),
                "wo": w(arch.heads * hd, h),
                "w1": w(h, arch.mlp),
                "w3": w(h, arch.mlp),
                "w2": w(arch.mlp, h),
                "n1": torch.ones(h, device=dev, dtype=bf16),
                "n2": torch.ones(h, device=dev, dtype=bf16),
                "qn": torch.ones(hd, device=dev, dtype=bf16),
                "kn": torch.ones(hd, device=dev, dtype=bf16),
            }
            for _ in range(arch.layers)
        ]
        return {
            "embed": w(arch.vocab, h),
            "norm": torch.ones(h, device=dev, dtype=bf16),
            "layers": layers,
        }

    def qkv(arch: Arch, lw: dict[str, Any], x: Any, pos: Any) -> tuple[Any, Any, Any]:
        b, t, _ = x.shape
        q = (x @ lw["wq"]).view(b, t, arch.heads, arch.head_dim).transpose(1, 2)
        k = (x @ lw["wk"]).view(b, t, arch.kv_heads, arch.head_dim).transpose(1, 2)
        v = (x @ lw["wv"]).view(b, t, arch.kv_heads, arch.head_dim).transpose(1, 2)
        if arch.qk_norm:
            q, k = rms(q, lw["qn"]), rms(k, lw["kn"])
        return rope(q, pos), rope(k, pos), v

    def mlp(lw: dict[str, Any], x: Any) -> Any:
        return (F.silu(x @ lw["w1"]) * (x @ lw["w3"])) @ lw["w2"]

    def prefill(arch: Arch, p: dict[str, Any], tokens: Any) -> Any:
        t = tokens.shape[0]
        pos = torch.arange(t, device=dev)
        x = p["embed"][tokens][None]
        kv = []
        for lw in p["layers"]:
            q, k, v = qkv(arch, lw, rms(x, lw["n1"]), pos)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + o.transpose(1, 2).reshape(1, t, -1) @ lw["wo"]
            x = x + mlp(lw, rms(x, lw["n2"]))
            kv.append((k, v))
        logits = rms(x[:, -1], p["norm"]) @ p["embed"].T
        return logits.argmax(-1), kv

    def decode(arch: Arch, p: dict[str, Any], tokens: Any, kcache: Any, vcache: Any) -> Any:
        b = tokens.shape[0]
        pos = torch.full((b, 1), kcache[0].shape[2], device=dev)
        x = p["embed"][tokens][:, None]
        kv = []
        for lw, kc, vc in zip(p["layers"], kcache, vcache, strict=True):
            q, k, v = qkv(arch, lw, rms(x, lw["n1"]), pos)
            o = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            x = x + o.transpose(1, 2).reshape(b, 1, -1) @ lw["wo"]
            x = x + mlp(lw, rms(x, lw["n2"]))
            kv.append((k, v))
        logits = rms(x[:, 0], p["norm"]) @ p["embed"].T
        return logits.argmax(-1), kv

    cache: dict[str, Any] = {}

    def run(row: Row, repeats: int) -> dict[str, Any]:
        arch = ARCHS[row.model]
        if cache.get("name") != arch.name:
            cache.clear()
            cache["name"] = arch.name
            cache["params"] = params(arch)
            sync(None)
        p = cache["params"]
        compile_kwargs: dict[str, Any] = {"backend": "tpu"} if dev.type == "tpu" else {}
        with torch.no_grad():
            if row.step == "prefill":
                tokens = torch.zeros(row.tokens, dtype=torch.long, device=dev)
                fn = torch.compile(lambda: prefill(arch, p, tokens), **compile_kwargs)
            else:
                b, c = row.tokens, row.context
                shape = (b, arch.kv_heads, c, arch.head_dim)
                kc = [torch.full(shape, 0.01, device=dev, dtype=bf16) for _ in p["layers"]]
                vc = [torch.full(shape, 0.01, device=dev, dtype=bf16) for _ in p["layers"]]
                tokens = torch.zeros(b, dtype=torch.long, device=dev)
                fn = torch.compile(lambda: decode(arch, p, tokens, kc, vc), **compile_kwargs)
            try:
                return timed(fn, sync, repeats)
            except Exception as error:
                return {"error": f"{type(error).__name__}: {str(error)[:600]}"}

    return run


# ---------------------------------------------------------------------------------------- main


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "libtpu", "libtpu-nightly", "torch", "torch-tpu", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("jax", "torch"), required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSONL rows")
    parser.add_argument("--rows", nargs="*", type=parse_row, help="default: the whole grid")
    parser.add_argument("--models", nargs="*", choices=list(ARCHS), help="grid rows of these")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--attention", choices=("flash", "dense"), default="flash")
    parser.add_argument("--device", choices=("tpu", "cpu"), default="tpu")
    parser.add_argument("--tag", default="", help="added to every row (e.g. the cache state)")
    parser.add_argument("--budget-s", type=float, default=0.0, help="stop starting rows after")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats} is not allowed; allowed: >= 1")
    rows: Iterable[Row] = args.rows or default_grid()
    if args.models:
        rows = [r for r in rows if r.model in args.models]
    args.out.mkdir(parents=True, exist_ok=True)
    runner = (jax_runner if args.framework == "jax" else torch_runner)(args.device, args.attention)
    header = {
        "framework": args.framework,
        "attention": args.attention,
        "device": args.device,
        "versions": versions(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TPU_", "TORCH_TPU_"))},
        "date": time.strftime("%Y-%m-%d"),
    }
    if args.framework == "jax" and args.device == "tpu":
        import jax

        chip = jax.devices()[0]
        header["device_kind"] = chip.device_kind
        stats = chip.memory_stats() or {}
        header["bytes_limit"] = stats.get("bytes_limit")
    path = args.out / f"steps-{args.framework}.jsonl"
    began = time.monotonic()
    with path.open("a") as sink:
        sink.write(json.dumps({"header": header}) + "\n")
        for row in rows:
            if args.budget_s and time.monotonic() - began > args.budget_s:
                print(f"budget spent: {row.label} and after not run", flush=True)
                break
            began_row = time.monotonic()
            try:
                result = runner(row, args.repeats)
            except Exception as error:
                traceback.print_exc()
                result = {"error": f"{type(error).__name__}: {str(error)[:600]}"}
            record = {
                **asdict(row),
                "framework": args.framework,
                "attention": args.attention,
                "tag": args.tag,
                "wall_s": round(time.monotonic() - began_row, 3),
                **result,
            }
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            shown = record.get("median_ms", record.get("error", "?"))
            print(f"{row.label:34} {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
