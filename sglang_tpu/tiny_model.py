"""A tiny randomly initialised Llama with its own tokenizer, built offline for CPU runs of SGLang.

Real SGLang needs a model directory; tests and CPU development runs use this one instead of
anything from a model hub. The tokenizer is a byte-level BPE trained here on generated text
(vocabulary 2,048, tpuserve's special tokens, a ChatML chat template that renders exactly like
`sglang_tpu.tokenizer.render_chatml`); the model is `LlamaForCausalLM` with seeded random
weights, saved with `save_pretrained`.

`python -m sglang_tpu.tiny_model --root DIR` builds it once into `DIR/tiny-llama-<key>` and
prints that path; later calls only print it (`--check` prints it and fails if it is not built).
The key hashes the parameters and this file's source, so a change to either builds a new
directory. Building needs torch, transformers and
tokenizers (the real-SGLang environment, `scripts/install-real-sglang.sh`); `--print-dir` and
`--check` need only the standard library.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_tpu.tokenizer import EOS_TOKEN, SPECIAL_TOKENS

COMPLETE_MARKER = ".complete"  # written last: a directory without it is an interrupted build

# ChatML with the generation prompt, the same rendering as sglang_tpu.tokenizer.render_chatml
# (the router and the engine twin apply that one), so every tokenizer in a test sees one prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """What is built; every field is part of the cache key."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 8192
    dtype: str = "bfloat16"
    seed: int = 0
    corpus_lines: int = 20_000

    def key(self) -> str:
        """A hash of these parameters and of the builder's own source."""
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode())
        digest.update(Path(__file__).read_bytes())
        return digest.hexdigest()[:16]


def model_dir(root: Path, spec: TinyModelSpec) -> Path:
    return root / f"tiny-llama-{spec.key()}"


def is_complete(target: Path) -> bool:
    return (target / COMPLETE_MARKER).is_file()


def ensure_model(root: Path, spec: TinyModelSpec) -> Path:
    """The built model directory under `root`, building it first if it is not complete."""
    return ensure_built(model_dir(root, spec), lambda out: _build(out, spec), spec)


def ensure_built(target: Path, build: Callable[[Path], None], spec: Any) -> Path:
    """`target`, built first by `build(staging directory)` if it is not complete: once per
    machine (a lock beside it), into a staging directory renamed into place with the marker
    (the dataclass `spec` as JSON) written last."""
    if is_complete(target):
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers build it once
        if not is_complete(target):
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
            staging.chmod(0o755)
            try:
                build(staging)
                (staging / COMPLETE_MARKER).write_text(json.dumps(dataclasses.asdict(spec)))
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _corpus(seed: int, lines: int) -> Iterator[str]:
    """Deterministic text with words, numbers, punctuation and chat markup to train BPE on."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [26 - i for i in range(len(letters))]
    words = ["".join(rng.choices(letters, weights, k=rng.randint(1, 9))) for _ in range(3000)]
    punctuation = [".", ",", "?", "!", ":", ";", " -", "\n"]
    for _ in range(lines):
        parts: list[str] = []
        for _ in range(rng.randint(4, 24)):
            roll = rng.random()
            if roll < 0.08:
                parts.append(str(rng.randint(0, 99999)))
            elif roll < 0.15:
                parts.append(rng.choice(words).capitalize())
            else:
                parts.append(rng.choice(words))
        line = " ".join(parts) + rng.choice(punctuation)
        if rng.random() < 0.05:
            line = f"<|im_start|>user\n{line}<|im_end|>\n<|im_start|>assistant\n"
        yield line


def build_tokenizer(
    out: Path, *, vocab_size: int, seed: int, corpus_lines: int, model_max_length: int
) -> tuple[int, int]:
    """Train the byte-level BPE tokenizer and save it into `out`: (vocabulary size, EOS id).

    Needs `tokenizers` and `transformers` (not torch): the SGLang-JAX test model
    (`sglang_tpu.tiny_qwen3`) is built with the same tokenizer in an environment without torch.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed, corpus_lines), trainer=trainer)
    eos_id = bpe.token_to_id(EOS_TOKEN)
    if eos_id is None:  # a special token of the trainer: always in the vocabulary
        raise RuntimeError(f"the trained tokenizer has no {EOS_TOKEN!r}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        chat_template=CHATML_TEMPLATE,
        model_max_length=model_max_length,
    )
    tokenizer.save_pretrained(out)
    return bpe.get_vocab_size(), eos_id


def _build(out: Path, spec: TinyModelSpec) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab_size, eos_id = build_tokenizer(
        out,
        vocab_size=spec.vocab_size,
        seed=spec.seed,
        corpus_lines=spec.corpus_lines,
        model_max_length=spec.max_position_embeddings,
    )
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))  # saved as config.dtype
    model.save_pretrained(out)


def model_cli(
    argv: list[str] | None,
    prog: str,
    description: str | None,
    target: Callable[[Path], Path],
    ensure: Callable[[Path], Path],
) -> int:
    """The command line of a tiny-model builder: ``--root DIR`` and ``--print-dir`` or
    ``--check``; ``target(root)`` is where the model is, ``ensure(root)`` builds it there."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--root", type=Path, required=True, help="cache directory for models")
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--print-dir", action="store_true", help="print the model directory, build nothing"
    )
    action.add_argument(
        "--check",
        action="store_true",
        help="print the model directory; exit 1 if it is not built, build nothing",
    )
    args = parser.parse_args(argv)
    root: Path = args.root
    if args.print_dir or args.check:
        print(target(root))
        return 1 if args.check and not is_complete(target(root)) else 0
    print(ensure(root))
    return 0


def main(argv: list[str] | None = None) -> int:
    spec = TinyModelSpec()
    return model_cli(
        argv,
        "python -m sglang_tpu.tiny_model",
        __doc__,
        lambda root: model_dir(root, spec),
        lambda root: ensure_model(root, spec),
    )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
