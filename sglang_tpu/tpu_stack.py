"""Which torch, torch-tpu and libtpu versions work together: the table, and the check.

The one place the TPU software stack's compatibility is written down. `tpuserve engine
launch` checks it before it starts SGLang (`sglang_tpu.preflight`), from the versions the
installed distributions declare (`importlib.metadata`), never by importing torch_tpu: the
import itself is what fails on an incompatible libtpu, with a traceback instead of a reason.

Sources: the torch_tpu 0.2.0 wheel (its `Requires-Dist`: `torch>=2.11.0,<=2.15.0`, glue
libraries for torch 2.11 to 2.15, `libtpu>=0.0.50`) and what was seen on a TPU v5e
(the TPU lane, docs/tpu-lane.md): libtpu `0.0.42.1` makes `import torch_tpu` raise
`RuntimeError: set_libtpu_version(): expected version string to be of the format
<major>[.<minor>[.<patch>]][.dev<build>][<suffix>], got '0.0.42.1'`.

Pure: no imports beyond the standard library (the pre-flight runs where little else is).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

Release = tuple[int, ...]

# What torch_tpu 0.2.0's set_libtpu_version() accepts: at most three numeric parts, an
# optional `.devN`, and a suffix that does not start with a dot or a digit ("0.0.50rc1").
LIBTPU_VERSION_FORMAT = re.compile(r"^\d+(?:\.\d+(?:\.\d+)?)?(?:\.dev\d+)?(?:[^.\d][^.]*)?$")
LIBTPU_FORMAT_TEXT = "<major>[.<minor>[.<patch>]][.dev<build>][<suffix>] (at most three parts)"
# Distribution names libtpu is published under; the first one installed counts.
LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")
# The engine image's pin (pyproject's `tpu` extra, sglang_tpu/Dockerfile): what the fix names.
IMAGE_PIN = "torch-tpu==0.2.0 with torch==2.14.1 from the PyTorch CPU index (it brings libtpu)"
# SGLang-JAX's image pin (sglang_tpu/Dockerfile.sglang-jax; sgl_jax's own pyproject at the
# pinned commit asks for the same JAX).
JAX_VERSION = "0.10.2"
JAX_IMAGE_PIN = f"jax[tpu]=={JAX_VERSION} (it brings libtpu)"


@dataclass(frozen=True, slots=True)
class StackRule:
    """The torch and libtpu one torch-tpu release series works with."""

    torch_tpu_series: Release  # (0, 2) matches torch-tpu 0.2.x
    torch_at_least: Release
    torch_below: Release
    libtpu_at_least: Release
    source: str

    @property
    def torch_tpu_text(self) -> str:
        return ".".join(map(str, self.torch_tpu_series)) + ".x"

    @property
    def torch_text(self) -> str:
        last = (*self.torch_below[:-1], self.torch_below[-1] - 1)
        return f"{_text(self.torch_at_least)} to {_text(last)}"

    @property
    def libtpu_text(self) -> str:
        return f">= {_text(self.libtpu_at_least)}, {LIBTPU_FORMAT_TEXT}"


STACK_RULES: tuple[StackRule, ...] = (
    StackRule(
        torch_tpu_series=(0, 2),
        torch_at_least=(2, 11),
        torch_below=(2, 16),
        libtpu_at_least=(0, 0, 50),
        source="torch_tpu 0.2.0 wheel (Requires-Dist, glue libraries); docs/tpu-lane.md",
    ),
)


# An engine image whose SGLang keeps the KV pool's writes out of the compiled graph
# (`sglang_tpu.sglang_torchtpu.keep_kv_pool_writes_eager`, which the engine image's TPU entry,
# `sglang_tpu.sglang_tpu_server`, applies before SGLang starts) says so in this variable:
# "eager". Unset, or "graph", the writes are compiled into the step with the rest of SGLang's
# forward.
KV_WRITES_ENV = "TPUSERVE_SGLANG_KV_WRITES"
KV_WRITES_VALUES = ("eager", "graph")


@dataclass(frozen=True, slots=True)
class WrongTokenRule:
    """A torch-tpu series whose compiled SGLang step gives wrong tokens with the KV pool's
    writes inside the graph, and where that was seen."""

    torch_tpu_series: Release
    seen: str


WRONG_TOKEN_RULES: tuple[WrongTokenRule, ...] = (
    WrongTokenRule(
        torch_tpu_series=(0, 2),
        seen=(
            "torch-tpu 0.2.0 on a v5e: SGLang 0.5.23's step under torch.compile(backend='tpu') "
            "with the KV pool's writes in the graph gave token 0 for every token (its last "
            "layer's keys read back NaN); with the writes kept eager it gave the CPU's tokens "
            "(device calls 6-8 of 2026-12-07, docs/tpu-lane.md)"
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class StackVersions:
    """What the interpreter that will run SGLang has installed (None: not installed)."""

    python: str
    torch: str | None
    torch_tpu: str | None
    libtpu: str | None
    jax: str | None = None  # shown, never checked

    def describe(self) -> str:
        return ", ".join(
            f"{name} {value or 'not installed'}"
            for name, value in (
                ("torch", self.torch),
                ("torch-tpu", self.torch_tpu),
                ("libtpu", self.libtpu),
            )
        )


@dataclass(frozen=True, slots=True)
class StackProblem:
    """One way the stack cannot work: which package, what was found, what is allowed."""

    missing: bool  # a package is not installed at all
    package: str
    found: str | None
    allowed: str
    detail: str


def release(version: str) -> Release:
    """The leading numeric parts: `2.13.0+cpu` -> (2, 13, 0); `0.0.50rc1` -> (0, 0, 50)."""
    match = re.match(r"^\d+(?:\.\d+)*", version.strip())
    if match is None:
        return ()
    return tuple(int(p) for p in match.group(0).split("."))


def _text(parts: Release) -> str:
    return ".".join(map(str, parts))


def _pad(parts: Release, n: int) -> Release:
    return parts + (0,) * (n - len(parts))


def at_least(version: Release, bound: Release) -> bool:
    n = max(len(version), len(bound))
    return _pad(version, n) >= _pad(bound, n)


def rule_for(torch_tpu: str, rules: Sequence[StackRule] = STACK_RULES) -> StackRule | None:
    """The rule of torch-tpu's release series, or None when the table does not know it."""
    parts = release(torch_tpu)
    return next((r for r in rules if parts[: len(r.torch_tpu_series)] == r.torch_tpu_series), None)


def check_stack(
    versions: StackVersions, rules: Sequence[StackRule] = STACK_RULES
) -> list[StackProblem]:
    """Every reason the versions cannot work together; empty when they can (or when the
    table does not know this torch-tpu: then only the libtpu format is checked)."""
    problems: list[StackProblem] = []
    for package, value in (
        ("torch-tpu", versions.torch_tpu),
        ("torch", versions.torch),
        ("libtpu", versions.libtpu),
    ):
        if value is None:
            problems.append(
                StackProblem(True, package, None, "installed", f"{package} is not installed")
            )
    if versions.libtpu is not None and not LIBTPU_VERSION_FORMAT.match(versions.libtpu):
        problems.append(
            StackProblem(
                False,
                "libtpu",
                versions.libtpu,
                LIBTPU_FORMAT_TEXT,
                f"torch-tpu's import rejects the version string {versions.libtpu!r} "
                "(set_libtpu_version() raises RuntimeError)",
            )
        )
    rule = rule_for(versions.torch_tpu) if versions.torch_tpu else None
    if rule is None:
        return problems
    if versions.torch is not None:
        torch = release(versions.torch)
        if not (at_least(torch, rule.torch_at_least) and not at_least(torch, rule.torch_below)):
            problems.append(
                StackProblem(
                    False,
                    "torch",
                    versions.torch,
                    rule.torch_text,
                    f"torch-tpu {versions.torch_tpu} ships glue for torch {rule.torch_text} only",
                )
            )
    if versions.libtpu is not None and not at_least(release(versions.libtpu), rule.libtpu_at_least):
        problems.append(
            StackProblem(
                False,
                "libtpu",
                versions.libtpu,
                f">= {_text(rule.libtpu_at_least)}",
                f"torch-tpu {versions.torch_tpu} requires libtpu >= {_text(rule.libtpu_at_least)}",
            )
        )
    return problems


def compiled_wrong_tokens(
    torch_tpu: str | None,
    kv_writes: str | None,
    rules: Sequence[WrongTokenRule] = WRONG_TOKEN_RULES,
) -> WrongTokenRule | None:
    """The rule saying this torch-tpu compiles SGLang's step to wrong tokens with the KV pool's
    writes as `kv_writes` says (None: unset, in the graph); None when none is known."""
    if kv_writes == "eager" or torch_tpu is None:
        return None
    parts = release(torch_tpu)
    return next((r for r in rules if parts[: len(r.torch_tpu_series)] == r.torch_tpu_series), None)


def fix_text(problems: Sequence[StackProblem], versions: StackVersions) -> str:
    """What to do about `problems`, naming the versions to install."""
    rule = rule_for(versions.torch_tpu) if versions.torch_tpu else None
    rule = rule or STACK_RULES[0]
    wants = []
    packages = {p.package for p in problems}
    if "libtpu" in packages:
        wants.append(f"'libtpu>={_text(rule.libtpu_at_least)}' (three-part version)")
    if "torch" in packages:
        wants.append(f"torch {rule.torch_text} (the CPU build)")
    if "torch-tpu" in packages:
        wants.append(f"torch-tpu {rule.torch_tpu_text}")
    return (
        f"fix: install {' and '.join(wants)} in the engine image for {versions.python}; "
        f"the tpuserve engine image pins {IMAGE_PIN}"
    )
