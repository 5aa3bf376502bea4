"""The committed table of SGLang-JAX's server flags is what its source says.

`sglang_tpu/sgl_jax_server_args.py` is generated from `ServerArgs.add_cli_args` of
sgl-project/sglang-jax (`python -m sglang_tpu.sgl_jax_args_gen`). With a source checkout
(`TPUSERVE_SGLANG_JAX_SRC`: the checkout the opt-in SGLang-JAX build uses, or any clone at
the pinned commit) the generator reads it again and the committed file must be what it
writes; the parser itself is tested here on source text of the same form.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_tpu import sgl_jax_args_gen
from sglang_tpu.sgl_jax_server_args import SERVER_FLAGS, SOURCE_COMMIT

pytestmark = pytest.mark.unit

SOURCE_ENV = "TPUSERVE_SGLANG_JAX_SRC"

SAMPLE = """
import argparse

@dataclasses.dataclass
class ServerArgs:
    model_path: str

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", "--model", type=str, required=True)
        parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=1)
        parser.add_argument("--enable-x", action="store_true")
        parser.add_argument("--no-y", dest="y", action="store_false")
        parser.add_argument("--buckets", type=int, nargs="+")
        parser.add_argument("--mode", type=str, choices=["a", "b"])
        parser.add_argument("--parser", type=str, choices=list(TABLE.keys()))
        parser.add_argument("--pd", dest="pd", nargs="?", const="x", choices=["", "x"])
        parser.add_argument("positional")

def add_cli_args(parser):  # not ServerArgs': ignored
    parser.add_argument("--elsewhere")
"""


def test_the_parser_reads_names_kinds_types_and_literal_choices() -> None:
    flags = {f.names[0]: f for f in sgl_jax_args_gen.parse_server_args(SAMPLE)}
    assert list(flags) == ["--model-path", "--tensor-parallel-size", "--enable-x", "--no-y",
                           "--buckets", "--mode", "--parser", "--pd"]  # fmt: skip
    assert flags["--tensor-parallel-size"].names == ("--tensor-parallel-size", "--tp-size")
    assert flags["--tensor-parallel-size"].value_type == "int"
    assert (flags["--enable-x"].kind, flags["--enable-x"].value_type) == ("switch", "bool")
    assert (flags["--no-y"].kind, flags["--no-y"].dest) == ("switch", "y")
    assert flags["--buckets"].kind == "list"
    assert flags["--mode"].choices == ("a", "b")
    assert flags["--parser"].choices is None  # computed at import: not literal
    assert (flags["--pd"].kind, flags["--pd"].choices) == ("optional", ("", "x"))


def test_source_without_server_args_is_refused() -> None:
    with pytest.raises(sgl_jax_args_gen.SourceError, match="no class ServerArgs"):
        sgl_jax_args_gen.parse_server_args("def add_cli_args(parser): pass\n")


def test_the_committed_table_is_the_generators_output_for_its_own_rows() -> None:
    # The table round-trips: the rows it holds are what table_text writes for them.
    text = sgl_jax_args_gen.TABLE_PATH.read_text(encoding="utf-8")
    assert f'SOURCE_COMMIT = "{SOURCE_COMMIT}"' in text
    assert len(SOURCE_COMMIT) == 40
    names = [name for flag in SERVER_FLAGS for name in flag.names]
    assert len(names) == len(set(names)), "an option string appears twice"
    assert {"--model-path", "--tp-size", "--nnodes", "--node-rank", "--dist-init-addr",
            "--device", "--page-size", "--precompile-token-paddings"} <= set(names)  # fmt: skip


def test_the_committed_table_is_current_with_the_source_checkout() -> None:
    source = os.environ.get(SOURCE_ENV)
    if not source:
        pytest.skip(
            f"{SOURCE_ENV} is unset: point it at an SGLang-JAX source checkout (the opt-in "
            "build's, under ~/.cache/tpuserve/sglang-jax, or a clone of "
            f"sgl-project/sglang-jax at {SOURCE_COMMIT[:8]}) to check the flag table "
            "against ServerArgs"
        )
    text, commit = sgl_jax_args_gen.read_checkout(Path(source))
    expected = sgl_jax_args_gen.table_text(text, commit)
    current = sgl_jax_args_gen.TABLE_PATH.read_text(encoding="utf-8")
    assert current == expected, (
        f"sglang_tpu/sgl_jax_server_args.py differs from ServerArgs at {commit} (the table was "
        f"read at {SOURCE_COMMIT}); run python -m sglang_tpu.sgl_jax_args_gen --checkout "
        f"{source} and review what changed"
    )
