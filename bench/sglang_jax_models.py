"""Model directories for SGLang-JAX on the TPU lane (issue 67, item 4), built offline.

- ``tiny``: a Qwen3 of 2 layers, hidden 256, 4 query and 2 KV heads of head_dim 128 (SGLang-JAX's
  KV pool pads head_dim to 128, so a smaller one fails), vocabulary 2,048, float32 weights drawn
  from a seeded numpy generator and saved with safetensors: the CPU and the chip load the same
  bytes, so their greedy tokens can be compared.
- ``qwen3-0.6b``: Qwen3-0.6B's shape (28 layers, hidden 1,024, 16/8 heads of 128, vocabulary
  151,936, tied embeddings) with no weights: the server is started with ``--load-format dummy``
  (random bf16 weights), enough for step times.

Both carry the tiny byte-level BPE tokenizer of `sglang_tpu.tiny_model` (trained here on its
generated corpus, ChatML template). Needs numpy, safetensors, tokenizers and transformers (what
SGLang-JAX needs anyway); no torch.

    python bench/sglang_jax_models.py --root DIR    # prints DIR/tiny and DIR/qwen3-0.6b
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any

from sglang_tpu.tiny_model import TinyModelSpec, build_tokenizer

QWEN3_COMMON: dict[str, Any] = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    hidden_act="silu",
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    rope_scaling=None,
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
    sliding_window=None,
    initializer_range=0.02,
    use_cache=True,
)
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        torch_dtype="float32",
    ),
    "qwen3-0.6b": dict(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        max_position_embeddings=40960,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    ),
}
SEED = 0


def write_tokenizer(out: Path) -> int:
    """Train and save the tiny BPE tokenizer (`tiny_model.build_tokenizer`); its EOS id."""
    spec = TinyModelSpec()
    _, eos = build_tokenizer(
        out,
        vocab_size=spec.vocab_size,
        seed=spec.seed,
        corpus_lines=spec.corpus_lines,
        model_max_length=8192,
    )
    return eos


def qwen3_weights(shape: dict[str, Any], seed: int = SEED) -> dict[str, Any]:
    """Seeded float32 weights with Qwen3's names (norms at 1, the rest N(0, 0.02))."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    heads, kv, dim = shape["num_attention_heads"], shape["num_key_value_heads"], 128
    vocab = shape["vocab_size"]

    def normal(*dims: int) -> Any:
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(heads * dim, hidden),
            p + "self_attn.k_proj.weight": normal(kv * dim, hidden),
            p + "self_attn.v_proj.weight": normal(kv * dim, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, heads * dim),
            p + "self_attn.q_norm.weight": np.ones(dim, np.float32),
            p + "self_attn.k_norm.weight": np.ones(dim, np.float32),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
            p + "input_layernorm.weight": np.ones(hidden, np.float32),
            p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
        }
    weights["model.norm.weight"] = np.ones(hidden, np.float32)
    if not shape["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal(vocab, hidden)
    return weights


def build(root: Path, name: str) -> Path:
    """Build ``root/name`` (config, tokenizer, and weights for ``tiny``); its path."""
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    eos = write_tokenizer(out)
    shape = SHAPES[name]
    config = QWEN3_COMMON | shape | dict(bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    if name == "tiny":
        save_file = importlib.import_module("safetensors.numpy").save_file
        save_file(qwen3_weights(shape), str(out / "model.safetensors"), {"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--names", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args(argv)
    for name in args.names:
        print(build(args.root, name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
