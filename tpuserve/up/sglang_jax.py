"""`tpuserve up --engine sglang-jax`: real SGLang-JAX engines on CPU instead of engine twins.

SGLang-JAX is an opt-in build (`scripts/build-sglang-jax.sh SRC` in a checkout of tpuserve):
a Python 3.12 venv with `sgl_jax` and a tiny random-weight Qwen3 under
``$TPUSERVE_CACHE/sglang-jax``. `find_build` finds them (the environment variables
``TPUSERVE_SGLANG_JAX_PYTHON`` and ``TPUSERVE_SGLANG_JAX_MODEL`` name others); `spawn_engine`
starts ``python -m sgl_jax.launch_server`` from that venv on a free loopback port and waits
for its ``/health``. It publishes no KV events, so the router in front of it routes by
approximate prefix (`ROUTER_ARGS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuserve.up.errors import UpError
from tpuserve.up.fleet import Child

STAMP = ".tpuserve-installed"  # scripts/build-sglang-jax.sh writes it last into a complete venv
COMPLETE = ".complete"  # sglang_tpu.tiny_qwen3 writes it last into a complete model
START_TIMEOUT_SECONDS = 600.0  # loading and a first compile on a busy 2-core machine: 1-3 min
LOG_LINES = 40
SERVED_MODEL_NAME = "tiny-qwen3"
BUILD_HINT = (
    "build it with scripts/build-sglang-jax.sh SRC (SRC: a checkout of sgl-project/sglang-jax "
    "at the pinned commit; docs/development.md), or name a build with "
    "TPUSERVE_SGLANG_JAX_PYTHON and TPUSERVE_SGLANG_JAX_MODEL"
)
# The engine's flags on a CPU: a small pool and batch, no precompile of its default buckets
# (4,096 requests by 4,096 tokens), cached tokens in usage and its metrics.
ENGINE_ARGS = (
    "--device", "cpu", "--page-size", "16", "--max-total-tokens", "8192",
    "--max-running-requests", "8", "--chunked-prefill-size", "512", "--context-length", "4096",
    "--mem-fraction-static", "0.1", "--skip-server-warmup", "--disable-precompile",
    "--enable-cache-report", "--enable-metrics", "--sleep-on-idle",
)  # fmt: skip
# No KV events from SGLang-JAX: the router's approximate prefix policy, no subscriptions. A
# batch shape the engine has not run yet compiles before it answers (5-50 s on a CPU): the
# router waits that long for a first byte and between streamed chunks.
ROUTER_ARGS = (
    "--policy", "cache_aware", "--no-kv-events",
    "--first-byte-timeout-floor", "300", "--stream-idle-timeout", "300",
)  # fmt: skip


@dataclass(frozen=True)
class Build:
    python: Path
    model: Path


def _cache_root() -> Path:
    cache = os.environ.get("TPUSERVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tpuserve"
    )
    return Path(cache) / "sglang-jax"


def _newest(paths: Sequence[Path]) -> Path | None:
    return max(paths, key=lambda p: p.stat().st_mtime, default=None)


def find_build(root: Path | None = None) -> Build:
    """The SGLang-JAX venv's python and the tiny model, or UpError saying how to build them."""
    python_env = os.environ.get("TPUSERVE_SGLANG_JAX_PYTHON")
    model_env = os.environ.get("TPUSERVE_SGLANG_JAX_MODEL")
    root = root or _cache_root()
    if python_env:
        python = Path(python_env)
        if not python.is_file():
            raise UpError(f"TPUSERVE_SGLANG_JAX_PYTHON: {python_env!r} is not a file")
    else:
        venv = _newest([v for v in root.glob("venv-*") if (v / STAMP).is_file()])
        if venv is None:
            raise UpError(f"--engine sglang-jax: no SGLang-JAX build in {root}; {BUILD_HINT}")
        python = venv / "bin" / "python"
    if model_env:
        model = Path(model_env)
        if not (model / "config.json").is_file():
            raise UpError(f"TPUSERVE_SGLANG_JAX_MODEL: {model_env!r} has no config.json")
    else:
        found = _newest([m for m in root.glob("models/tiny-qwen3-*") if (m / COMPLETE).is_file()])
        if found is None:
            raise UpError(f"--engine sglang-jax: no tiny model in {root / 'models'}; {BUILD_HINT}")
        model = found
    return Build(python, model)


def engine_argv(build: Build, port: int, extra: Sequence[str] = ()) -> list[str]:
    return [
        str(build.python), "-m", "sgl_jax.launch_server",
        "--model-path", str(build.model), "--served-model-name", SERVED_MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(port), *ENGINE_ARGS, *extra,
    ]  # fmt: skip


def engine_env(build: Build) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        JAX_PLATFORMS="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    # compiled batch shapes kept across runs, beside the venv ($TPUSERVE_CACHE/sglang-jax)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(build.python.parents[2] / "jax-cache"))
    return env


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


async def _keep_tail(stream: asyncio.StreamReader, lines: deque[str]) -> None:
    with contextlib.suppress(Exception):
        while line := await stream.readline():
            lines.append(line.decode(errors="replace").rstrip())


async def spawn_engine(
    name: str, build: Build, port: int, extra: Sequence[str] = (),
    timeout_seconds: float = START_TIMEOUT_SECONDS,
) -> Child:  # fmt: skip
    """Start one engine; return once its /health answers 200 (UpError, with its last lines,
    if it exits or is not ready within `timeout_seconds`)."""
    proc = await asyncio.create_subprocess_exec(
        *engine_argv(build, port, extra),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=engine_env(build),
        start_new_session=True,  # Ctrl-C reaches `tpuserve up` only; it stops us in order
    )
    assert proc.stdout is not None
    lines: deque[str] = deque(maxlen=LOG_LINES)
    child = Child(name, proc, url=f"http://127.0.0.1:{port}")
    child.drains.append(asyncio.ensure_future(_keep_tail(proc.stdout, lines)))
    deadline = time.monotonic() + timeout_seconds
    while not await asyncio.to_thread(_healthy, child.url):
        if proc.returncode is not None:
            raise UpError(f"{name} exited with {proc.returncode} before it was ready:\n"
                          + "\n".join(lines))  # fmt: skip
        if time.monotonic() > deadline:
            proc.kill()
            raise UpError(f"{name} was not ready within {timeout_seconds:g} s:\n"
                          + "\n".join(lines))  # fmt: skip
        await asyncio.sleep(0.5)
    return child
