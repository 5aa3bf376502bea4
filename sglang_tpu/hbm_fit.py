"""The HBM fit rule, and the measured fits and failures it is checked against.

What one replica needs in HBM (per slice; the model is sharded over its chips):

- **the static budget**: weights + the KV cache (the pool; for the admission check, one full
  context) must fit in `static_fraction` of the slice's HBM, SGLang's `mem_fraction_static`
  (0.88). The rest is left to the runtime and the compiler.
- **the step**: weights + the KV cache x `kv_copies[kv_update]` + `compiler_temporaries_bytes`
  must fit in what the runtime gives programs (`runtime_fraction` of the HBM: XLA reported
  15.75 GiB of a v5e's 16 GiB). A compiled step that updates the KV cache in place (donated
  buffers, JAX's way) holds it once; TorchTPU's `torch.compile` of an in-place `index_copy_`
  into the cache (`functional`) holds it twice: Qwen3-4B (7.49 GiB of weights) decoding 8 x
  4,096 tokens (4.5 GiB of KV) failed to compile needing 16.54 GiB of 15.75 (7.49 + 2 x 4.5
  = 16.49, plus 0.05 GiB of temporaries), while JAX ran it and TorchTPU ran Qwen3-0.6B at
  64 x 1,024 (1.11 + 2 x 7 + 0.05 = 15.16 GiB).

`MEASURED` holds every (model, step, batch, context) the project's v5e ran or refused
(the TPU lane, docs/tpu-lane.md); `tests/unit/sglang_tpu/test_hbm_fit.py` checks the rule puts
each on its side, and every decode step `bench/tpu_steps.py` ran or was refused on the chip
(`bench/tpu_results/`: 26 ran, 8 refused with RESOURCE_EXHAUSTED, among them the reference's
"does not fit" shapes, so those are measured refusals too). Caveats: only v5e was measured, so
`runtime_fraction` and the temporaries are assumed to carry over to other generations;
prefills were measured with materialised f32 attention scores, whose temporaries a serving
engine's flash attention does not have, so the rule does not model them. The operator
admits `engine: sglang` as `in-place` (SGLang's KV pool is preallocated and written by its
attention backend; whether SGLang-TorchTPU's compiled step aliases it is unconfirmed).

SGLang-JAX (`engine: sglang-jax`) is admitted by the same rule: its `mem_fraction_static`
defaults to the same 0.88 on TPU (`ServerArgs.__post_init__` at the pinned commit), its
compiled step donates the KV pool (JAX, `in-place`), and its KV pool pads the head dim up to
`SGL_JAX_KV_HEAD_DIM` (128; a head dim of 64 takes twice the KV bytes: seen on CPU, where a
head dim below 128 failed with "dot_general requires contracting dimensions to have the same
shape, got (512,) and (128,)"; docs/sglang-jax.md). `kv_head_dim` is that padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from sglang_tpu.topology import GIB, SliceShape

KVUpdate = Literal["in-place", "functional"]
KIB = 1024
SGL_JAX_KV_HEAD_DIM = 128


def kv_head_dim(head_dim: int, engine: str = "sglang") -> int:
    """The head dim the engine's KV pool stores: SGLang-JAX pads it up to 128."""
    return max(head_dim, SGL_JAX_KV_HEAD_DIM) if engine == "sglang-jax" else head_dim


@dataclass(frozen=True, slots=True)
class FitRule:
    """The parameters of the fit rule (see the module docstring); one instance, `RULE`."""

    static_fraction: float = 0.88
    runtime_fraction: float = 15.75 / 16  # what XLA gave programs on a v5e
    compiler_temporaries_bytes: float = 0.05 * GIB  # beyond weights and KV copies (v5e, 4B)
    kv_copies: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({"in-place": 1, "functional": 2})
    )

    def budget_bytes(self, shape: SliceShape) -> float:
        """The static budget for weights and the KV cache."""
        return shape.hbm_bytes * self.static_fraction

    def runtime_bytes(self, shape: SliceShape) -> float:
        """What the runtime lets a compiled program use."""
        return shape.hbm_bytes * self.runtime_fraction

    def step_bytes(self, weight_bytes: float, kv_bytes: float, kv_update: str) -> float:
        """What one compiled step over `kv_bytes` of cache needs at once."""
        return weight_bytes + kv_bytes * self.copies(kv_update) + self.compiler_temporaries_bytes

    def copies(self, kv_update: str) -> int:
        try:
            return self.kv_copies[kv_update]
        except KeyError:
            allowed = ", ".join(self.kv_copies)
            raise ValueError(
                f"kv_update: {kv_update!r} is not allowed; allowed: {allowed}"
            ) from None

    def shortfall_bytes(
        self, shape: SliceShape, weight_bytes: float, kv_bytes: float, kv_update: str = "in-place"
    ) -> float:
        """How far weights + `kv_bytes` of KV are over the rule (<= 0: they fit)."""
        static = weight_bytes + kv_bytes - self.budget_bytes(shape)
        step = self.step_bytes(weight_bytes, kv_bytes, kv_update) - self.runtime_bytes(shape)
        return max(static, step)

    def fits(
        self, shape: SliceShape, weight_bytes: float, kv_bytes: float, kv_update: str = "in-place"
    ) -> bool:
        return self.shortfall_bytes(shape, weight_bytes, kv_bytes, kv_update) <= 0

    def pool_bytes(
        self, shape: SliceShape, weight_bytes: float, kv_update: str = "in-place"
    ) -> float:
        """The largest KV cache that fits with these weights (>= 0)."""
        static = self.budget_bytes(shape) - weight_bytes
        step = (
            self.runtime_bytes(shape) - weight_bytes - self.compiler_temporaries_bytes
        ) / self.copies(kv_update)
        return max(0.0, min(static, step))


RULE = FitRule()


@dataclass(frozen=True, slots=True)
class MeasuredFit:
    """One step a chip ran (fits) or refused; `kv_tokens` = batch x context."""

    model: str
    weight_bytes: float
    kv_bytes_per_token: float
    step: Literal["prefill", "decode"]
    batch: int
    context: int
    framework: str
    kv_update: KVUpdate
    fits: bool
    generation: str = "v5e"
    topology: str = "1x1"
    note: str = ""

    @property
    def kv_bytes(self) -> float:
        return self.kv_bytes_per_token * self.batch * self.context

    @property
    def label(self) -> str:
        return (
            f"{self.model} {self.step} b{self.batch} x {self.context} {self.framework} "
            f"({self.kv_update})"
        )


# Weights and KV per token as the reference states them (bf16; 2 x layers x KV heads x head
# dim x 2 bytes per token).
_MODELS = {
    "qwen3-0.6b": (1.11 * GIB, 112 * KIB),
    "llama-3.2-1b": (2.30 * GIB, 32 * KIB),
    "qwen3-4b": (7.49 * GIB, 144 * KIB),
}
_PREFILL_TOKENS = (128, 512, 2048, 8192)
_BATCHES = (1, 8, 32, 64)
_CONTEXTS = (1024, 4096)
# Decode steps JAX did not run ("does not fit" in the reference).
_JAX_REFUSED = {
    ("qwen3-0.6b", 32, 4096),
    ("qwen3-0.6b", 64, 4096),
    ("qwen3-4b", 64, 1024),
    ("qwen3-4b", 32, 4096),
    ("qwen3-4b", 64, 4096),
}
# TorchTPU compiled with the KV written into the cache inside the graph.
_TORCH_TPU_FUNCTIONAL: tuple[tuple[str, int, int, bool, str], ...] = (
    ("qwen3-0.6b", 1, 1024, True, ""),
    ("qwen3-0.6b", 8, 1024, True, ""),
    ("qwen3-0.6b", 32, 1024, True, ""),
    ("qwen3-0.6b", 64, 1024, True, ""),
    ("qwen3-0.6b", 1, 4096, True, ""),
    ("qwen3-0.6b", 8, 4096, True, ""),
    ("qwen3-0.6b", 32, 4096, False, "does not fit"),
    ("qwen3-0.6b", 64, 4096, False, "does not fit"),
    ("qwen3-4b", 1, 1024, True, ""),
    (
        "qwen3-4b",
        8,
        4096,
        False,
        "XLA: HLO temporaries need 16.54G, available HBM 15.75G",
    ),
)


def _measured() -> tuple[MeasuredFit, ...]:
    rows: list[MeasuredFit] = []
    for model, (weights, kv) in _MODELS.items():
        for tokens in _PREFILL_TOKENS:
            rows.append(
                MeasuredFit(model, weights, kv, "prefill", 1, tokens, "jax", "in-place", True)
            )
        for context in _CONTEXTS:
            for batch in _BATCHES:
                refused = (model, batch, context) in _JAX_REFUSED
                rows.append(
                    MeasuredFit(
                        model, weights, kv, "decode", batch, context, "jax", "in-place",
                        not refused, note="does not fit" if refused else "",
                    )
                )  # fmt: skip
    for tokens in _PREFILL_TOKENS:
        rows.append(
            MeasuredFit(
                "qwen3-0.6b", *_MODELS["qwen3-0.6b"], "prefill", 1, tokens, "torch_tpu",
                "functional", True,
            )
        )  # fmt: skip
    for model, batch, context, fits, note in _TORCH_TPU_FUNCTIONAL:
        rows.append(
            MeasuredFit(
                model, *_MODELS[model], "decode", batch, context, "torch_tpu", "functional",
                fits, note=note,
            )
        )  # fmt: skip
    # KV written outside the compiled graph (one eager index_copy_): the cache once.
    for batch, context in ((64, 1024), (8, 4096)):
        rows.append(
            MeasuredFit(
                "qwen3-0.6b", *_MODELS["qwen3-0.6b"], "decode", batch, context, "torch_tpu",
                "in-place", True, note="KV written outside the graph",
            )
        )  # fmt: skip
    return tuple(rows)


MEASURED: tuple[MeasuredFit, ...] = _measured()
"""Every step measured on the project's v5e (2026-12-06): 52 rows, 8 of them refused."""
