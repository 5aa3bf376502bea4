"""A tiny randomly initialised Qwen3 with the local tokenizer, built offline for SGLang-JAX on CPU.

SGLang-JAX's KV pool pads head_dim to 128, so a model with a smaller head_dim fails on CPU
("dot_general requires contracting dimensions to have the same shape"): this one has head_dim
128 (four query heads, two KV heads, so tensor parallelism 2 splits both), hidden 256, two
layers, and the byte-level BPE tokenizer of `sglang_tpu.tiny_model` (vocabulary 2,048, the
ChatML template the router renders). The weights are seeded normal(0, 0.02) matrices and unit
norms, written with numpy and safetensors under Hugging Face's Qwen3 names: SGLang-JAX's
environment has no torch, so `transformers` only saves the tokenizer here.

`python -m sglang_tpu.tiny_qwen3 --root DIR` builds it once into `DIR/tiny-qwen3-<key>` and prints
that path; later calls only print it (`--check` prints it and fails if it is not built). The key
hashes the parameters and the sources of this module and of `sglang_tpu.tiny_model`. Building
needs numpy, safetensors, tokenizers and transformers (scripts/build-sglang-jax.sh's venv);
`--print-dir` and `--check` need only the standard library.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_tpu import tiny_model
from sglang_tpu.tiny_model import build_tokenizer, ensure_built, model_cli


@dataclass(frozen=True)
class TinyQwen3Spec:
    """What is built; every field is part of the cache key."""

    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 128
    max_position_embeddings: int = 8192
    dtype: str = "float32"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    seed: int = 0
    corpus_lines: int = 20_000

    def key(self) -> str:
        """A hash of these parameters and of the builders' sources."""
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode())
        digest.update(Path(__file__).read_bytes())
        digest.update(Path(tiny_model.__file__).read_bytes())
        return digest.hexdigest()[:16]


def model_dir(root: Path, spec: TinyQwen3Spec) -> Path:
    return root / f"tiny-qwen3-{spec.key()}"


def ensure_model(root: Path, spec: TinyQwen3Spec) -> Path:
    """The built model directory under `root`, building it first if it is not complete."""
    return ensure_built(model_dir(root, spec), lambda out: _build(out, spec), spec)


def weight_shapes(spec: TinyQwen3Spec, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Hugging Face's Qwen3 tensor names and shapes (nn.Linear weights are [out, in])."""
    hidden, head = spec.hidden_size, spec.head_dim
    q_out, kv_out = spec.num_attention_heads * head, spec.num_key_value_heads * head
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab_size, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab_size, hidden),
    }
    for layer in range(spec.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        shapes |= {
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
            f"{prefix}.self_attn.q_proj.weight": (q_out, hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv_out, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv_out, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, q_out),
            f"{prefix}.self_attn.q_norm.weight": (head,),
            f"{prefix}.self_attn.k_norm.weight": (head,),
            f"{prefix}.mlp.gate_proj.weight": (spec.intermediate_size, hidden),
            f"{prefix}.mlp.up_proj.weight": (spec.intermediate_size, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, spec.intermediate_size),
        }
    return shapes


def _build(out: Path, spec: TinyQwen3Spec) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    vocab_size, eos_id = build_tokenizer(
        out,
        vocab_size=spec.vocab_size,
        seed=spec.seed,
        corpus_lines=spec.corpus_lines,
        model_max_length=spec.max_position_embeddings,
    )
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": spec.num_hidden_layers,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "torch_dtype": spec.dtype,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": False}) + "\n"
    )
    rng = np.random.default_rng(spec.seed)
    tensors = {}
    for name, shape in weight_shapes(spec, vocab_size).items():
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shape, dtype=spec.dtype)
        else:
            tensors[name] = rng.normal(0.0, 0.02, size=shape).astype(spec.dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    spec = TinyQwen3Spec()
    return model_cli(
        argv,
        "python -m sglang_tpu.tiny_qwen3",
        __doc__,
        lambda root: model_dir(root, spec),
        lambda root: ensure_model(root, spec),
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
