"""Real SGLang-JAX engines on loopback for component tests (CPU, tiny offline Qwen3).

SGLang-JAX is an opt-in build: `scripts/build-sglang-jax.sh SRC` builds a source checkout
(PyPI's release does not serve) into its own cached venv and builds the tiny model; this module
finds them (`discover()`), starts `python -m sgl_jax.launch_server` from that venv with the
flags of `engine_argv` (CPU, page size 16, cache report, metrics, a small pool, no precompile)
and waits for `/health`. Where the build is absent, a test using these fixtures skips and says
how to build it, under CI too: CI has no SGLang-JAX (its answers are held against the twin
from the committed recordings instead, `tests/component/differential/sglang_jax_recorded.py`).

Fixtures (a test using them carries the markers `component` and `real_sglang_jax`):

- ``real_sglang_jax`` (session): the `SGLangJax` installation, or a skip.
- ``real_jax_engine`` (module): one engine with the default options, stopped after the module.

An engine starts in 30-60 s on a busy 2-core machine; its first request of each batch shape
compiles (5-40 s), later ones take ~0.3 s a decode step there.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.real_sglang import script_paths
from tests.waiting import eventually
from tpuserve.cluster.ports import LOOPBACK, free_port
from tpuserve.cluster.process import ManagedProcess, tail

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "scripts" / "build-sglang-jax.sh"
START_TIMEOUT_SECONDS = 300.0
REQUEST_TIMEOUT_SECONDS = 300.0  # a new batch shape compiles first
STOP_GRACE_SECONDS = 30.0
LOG_TAIL_LINES = 60
SERVED_MODEL_NAME = "tiny-qwen3"
PAGE_SIZE = 16
MAX_TOTAL_TOKENS = 4096
MAX_RUNNING_REQUESTS = 8
CHUNKED_PREFILL_SIZE = 512
CONTEXT_LENGTH = 2048
FIXTURE_NAMES = ("real_sglang_jax", "real_jax_engine")


class SGLangJaxMissing(RuntimeError):
    """The SGLang-JAX venv or its tiny model is not built."""


@dataclass(frozen=True)
class SGLangJax:
    """A built SGLang-JAX: its commit, its venv's python and the tiny model directory."""

    commit: str
    python: Path
    model: Path

    @classmethod
    def discover(cls) -> SGLangJax:
        """Ask the build script where everything is; SGLangJaxMissing if it is not built."""
        paths = script_paths(BUILD_SCRIPT, SGLangJaxMissing)
        return cls(
            commit=paths["SGLANG_JAX_COMMIT"],
            python=Path(paths["SGLANG_JAX_PYTHON"]),
            model=Path(paths["SGLANG_JAX_MODEL"]),
        )

    @property
    def compile_cache(self) -> Path:
        """JAX's persistent compilation cache beside the venv ($TPUSERVE_CACHE/sglang-jax): a
        batch shape compiles once per machine (5-50 s each on a busy CPU), not once per run."""
        return self.python.parents[2] / "jax-cache"

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """JAX on CPU with the compilation cache, no model hub; nothing of the test process's
        PYTHONPATH or venv."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        }
        env.update(
            JAX_PLATFORMS="cpu",
            JAX_COMPILATION_CACHE_DIR=str(self.compile_cache),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
            **(extra or {}),
        )
        return env


def engine_argv(
    installed: SGLangJax, port: int, extra_args: Sequence[str] = (), *, model: Path | None = None
) -> list[str]:
    """`python -m sgl_jax.launch_server` with the tests' flags.

    `--disable-precompile`: its default buckets (4,096 requests by 4,096 tokens) asked the CPU
    for 4.4 TB; the few shapes the tests use compile on first use instead.
    `--skip-server-warmup`: no request of its own before the first client's.
    """
    return [
        str(installed.python),
        *("-m", "sgl_jax.launch_server"),
        *("--model-path", str(model or installed.model)),
        *("--served-model-name", SERVED_MODEL_NAME),
        *("--device", "cpu"),
        *("--host", LOOPBACK, "--port", str(port)),
        *("--page-size", str(PAGE_SIZE)),
        *("--max-total-tokens", str(MAX_TOTAL_TOKENS)),
        *("--max-running-requests", str(MAX_RUNNING_REQUESTS)),
        *("--chunked-prefill-size", str(CHUNKED_PREFILL_SIZE)),
        *("--context-length", str(CONTEXT_LENGTH)),
        *("--mem-fraction-static", "0.1"),
        "--skip-server-warmup",
        "--disable-precompile",
        "--enable-cache-report",
        "--enable-metrics",
        "--sleep-on-idle",  # its idle scheduler otherwise polls ~17 % of a core
        *extra_args,
    ]


@dataclass
class RealJaxEngine:
    """One running `sgl_jax.launch_server` on 127.0.0.1 (`url` is its HTTP base)."""

    name: str
    url: str
    port: int
    model: str
    model_path: Path
    page_size: int
    process: ManagedProcess
    argv: list[str] = field(repr=False)

    def get_json(self, path: str, timeout: float = REQUEST_TIMEOUT_SECONDS) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as response:
            return json.load(response)

    def post_json(
        self, path: str, body: Mapping[str, Any], timeout: float = REQUEST_TIMEOUT_SECONDS
    ) -> Any:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},  # SGLang-JAX refuses anything else
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)

    def alive(self) -> bool:
        return self.process.alive()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return f"last lines of {self.process.log_path}:\n{tail(self.process.log_path, lines)}"

    def flush_cache(self) -> None:
        """Empty the radix cache (SGLang-JAX answers 400 while a request runs)."""

        def flushed() -> bool:
            request = urllib.request.Request(f"{self.url}/flush_cache", method="POST", data=b"")
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return bool(response.status == 200)
            except urllib.error.HTTPError as err:
                if err.code == 400:
                    return False
                raise

        eventually(
            flushed,
            what=f"SGLang-JAX engine {self.name} to flush its cache",
            timeout_seconds=60,
            interval_seconds=0.5,
            context=self.log_tail,
        )

    def wait_healthy(self, timeout_seconds: float = START_TIMEOUT_SECONDS) -> None:
        """Wait for `/health` 200; fail at once, with the log tail, if the engine exits."""

        def healthy() -> bool:
            if not self.alive():
                raise RuntimeError(
                    f"SGLang-JAX engine {self.name} exited with {self.process.exit_code()} "
                    f"before /health answered; {self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        eventually(
            healthy,
            what=f"SGLang-JAX engine {self.name} at {self.url}/health to answer 200",
            timeout_seconds=timeout_seconds,
            interval_seconds=0.5,
            context=self.log_tail,
        )

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        self.process.stop(grace_seconds)


def spawn_engine(
    installed: SGLangJax,
    run_dir: Path,
    *,
    name: str = "engine",
    port: int | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> RealJaxEngine:
    """Start one engine (not yet serving: `RealJaxEngine.wait_healthy`); its log is
    `run_dir/NAME.log`."""
    port = port or free_port()
    argv = engine_argv(installed, port, extra_args)
    process = ManagedProcess.spawn(
        f"sglang-jax-{name}", argv, run_dir / f"{name}.log", env=installed.environment(env)
    )
    return RealJaxEngine(
        name=name,
        url=f"http://{LOOPBACK}:{port}",
        port=port,
        model=SERVED_MODEL_NAME,
        model_path=installed.model,
        page_size=PAGE_SIZE,
        process=process,
        argv=argv,
    )


def start_engine(
    installed: SGLangJax,
    run_dir: Path,
    *,
    name: str = "engine",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> RealJaxEngine:
    """One engine, serving when this returns (stopped again if it never does)."""
    engine = spawn_engine(installed, run_dir, name=name, extra_args=extra_args, env=env)
    try:
        engine.wait_healthy()
    except BaseException:
        engine.stop()
        raise
    return engine


def installation() -> SGLangJax:
    """The built SGLang-JAX, or a skip saying how to build it (CI has none: never a failure)."""
    try:
        return SGLangJax.discover()
    except SGLangJaxMissing as err:
        pytest.skip(
            f"{err}; SGLang-JAX is an opt-in build: scripts/build-sglang-jax.sh SRC, SRC a "
            "checkout of sgl-project/sglang-jax at the pinned commit (docs/development.md)"
        )


PYTHON_ENV = "TPUSERVE_SGLANG_JAX_PYTHON"
"""An interpreter with sgl_jax (and JAX) that tests use instead of the opt-in build's."""


def sgl_jax_python() -> str:
    """``$TPUSERVE_SGLANG_JAX_PYTHON``, else the opt-in build's interpreter, else a skip that
    says how to build it (`installation`)."""
    return os.environ.get(PYTHON_ENV) or str(installation().python)


@pytest.fixture(scope="session", name="real_sglang_jax")
def real_sglang_jax_installation() -> SGLangJax:
    return installation()


@pytest.fixture(scope="module")
def real_jax_engine(
    real_sglang_jax: SGLangJax, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealJaxEngine]:
    engine = start_engine(real_sglang_jax, tmp_path_factory.mktemp("sglang-jax"), name="shared")
    try:
        yield engine
    finally:
        with contextlib.suppress(ProcessLookupError):
            engine.stop()
