"""Real SGLang engines on loopback for component tests (CPU, tiny offline model).

`scripts/install-real-sglang.sh` installs the pinned SGLang into its own cached venv and builds
the tiny model; this module finds them (`discover()`), starts `python -m sglang.launch_server`
from that venv with the flags of docs/development.md (CPU engine, cache report, metrics, page
size 16, KV events bound on loopback with a replay endpoint) and waits for `/health`.

Fixtures (registered in tests/conftest.py; a test using them carries the markers `component`
and `real_sglang`):

- ``real_sglang`` (session): the `RealSGLang` installation. Missing, the test skips saying how
  to install it; under CI=true it fails instead.
- ``real_engine_pool`` (session): an `EnginePool`: ``.engine(EngineOptions(...))`` is the one
  engine of those launch options that the whole session shares, started on first use and
  stopped at the end of the session; every module gets it with an empty cache.
- ``real_engine`` (module): the pool's engine with the default options.
- ``real_engines`` (module): an `EngineFactory` for engines of the module's own (one it kills,
  for example): ``.start(...) -> RealEngine`` for one engine, ``.start_many(n, ...)`` for
  several started side by side; every engine it started is stopped (all at once) when the
  module's tests are done.

An engine costs 25-50 s to start and ~3.6 GiB of RSS, hence the pool: modules that need an
engine of the same launch options share one instead of starting their own. A test that
changes an engine beyond its cache (kills it, say) takes it from ``real_engines``. An engine
that dies because another process took one of its free ports before it bound them is started
again on new ports (`PORT_RACE_ATTEMPTS`). Under pytest-xdist every real-SGLang test runs on
one worker (tests/conftest.py puts them in one `xdist_group`), so the pool is one per run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu.cpu_shim import PYTHONPATH_ENTRY as SHIM_PYTHONPATH
from tests.waiting import eventually
from tpuserve.cluster.ports import LOOPBACK, free_ports
from tpuserve.cluster.process import ManagedProcess, tail

REPO = Path(__file__).resolve().parents[1]
INSTALL_SCRIPT = REPO / "scripts" / "install-real-sglang.sh"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
START_TIMEOUT_SECONDS = 180.0
STOP_GRACE_SECONDS = 30.0
LOG_TAIL_LINES = 60
REQUEST_TIMEOUT_SECONDS = 120.0
DEFAULT_MAX_TOTAL_TOKENS = 20000
PAGE_SIZE = 16
POLL_ACCESS = re.compile(r'"GET /(v1/loads|health|metrics|server_info)[ ?]')
KV_TOPIC = "kv"
SERVED_MODEL_NAME = "tiny-llama"
FIXTURE_NAMES = ("real_sglang", "real_engine_pool", "real_engines", "real_engine")
FLUSH_TIMEOUT_SECONDS = 60.0
PORT_TAKEN = "Address already in use"
PORT_RACE_ATTEMPTS = 3


class RealSGLangMissing(RuntimeError):
    """The real-SGLang venv or the tiny model is not installed."""


def script_paths(script: Path, missing: type[Exception]) -> dict[str, str]:
    """The ``NAME=value`` lines an install script's ``--check`` prints (where it installed
    what); ``missing`` with the script's own words when it says nothing is installed."""
    checked = subprocess.run(
        ["bash", str(script), "--check"], capture_output=True, text=True, check=False, timeout=60
    )
    if checked.returncode != 0:
        raise missing(checked.stderr.strip() or checked.stdout.strip())
    return dict(line.split("=", 1) for line in checked.stdout.splitlines() if "=" in line)


@dataclass(frozen=True)
class RealSGLang:
    """An installed real SGLang: its venv's python, its version and the tiny model directory."""

    version: str
    python: Path
    model: Path

    @classmethod
    def discover(cls) -> RealSGLang:
        """Ask the install script where everything is; RealSGLangMissing if not installed."""
        paths = script_paths(INSTALL_SCRIPT, RealSGLangMissing)
        return cls(
            version=paths["SGLANG_VERSION"],
            python=Path(paths["SGLANG_PYTHON"]),
            model=Path(paths["TINY_MODEL"]),
        )

    def environment(self) -> dict[str, str]:
        """The environment a real engine (or any script needing SGLang) runs with.

        CPU engine, no GPU, no model hub, and the pure-torch `sgl_kernel` stand-in on the path;
        nothing of the test process's PYTHONPATH or venv leaks in.
        """
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        }
        env.update(
            SGLANG_USE_CPU_ENGINE="1",
            CUDA_VISIBLE_DEVICES="",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(SHIM_PYTHONPATH),
        )
        return env


def flush_cache_when_idle(
    url: str,
    *,
    what: str,
    timeout_seconds: float = FLUSH_TIMEOUT_SECONDS,
    context: Callable[[], str] | None = None,
) -> None:
    """POST `/flush_cache` until the engine takes it. SGLang (and the twin, as it) answers 400
    while a request runs, and its scheduler may still count one for a moment after the answer
    went out, or after the client hung up on it (seen on a loaded machine)."""

    def flushed() -> bool:
        request = urllib.request.Request(f"{url}/flush_cache", method="POST", data=b"")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError as err:
            if err.code == 400:
                return False
            raise

    eventually(
        flushed,
        what=f"{what} to flush its cache",
        timeout_seconds=timeout_seconds,
        interval_seconds=0.5,
        context=context,
    )


@dataclass
class RealEngine:
    """One running `sglang.launch_server` on 127.0.0.1.

    `url` is the HTTP base (`http://127.0.0.1:PORT`; the OpenAI routes are under `/v1`);
    `kv_events_endpoint` is the bound ZMQ PUB socket (frames `[topic, seq, payload]`, topic
    `kv_topic`) and `replay_endpoint` its ROUTER socket for replay requests; `model` is the
    served model name and `model_path` the tiny model's directory.
    """

    name: str
    url: str
    port: int
    kv_events_endpoint: str
    replay_endpoint: str
    kv_topic: str
    page_size: int
    model: str
    model_path: Path
    process: ManagedProcess
    argv: list[str] = field(repr=False)
    spawned_at: float = field(repr=False, default=0.0)  # time.monotonic() at spawn
    start_seconds: float = 0.0  # from spawn to /health 200 (set once it is serving)

    @property
    def pid(self) -> int:
        return self.process.pid

    def get_json(self, path: str, timeout: float = REQUEST_TIMEOUT_SECONDS) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as response:
            return json.load(response)

    def post_json(
        self, path: str, body: Mapping[str, Any], timeout: float = REQUEST_TIMEOUT_SECONDS
    ) -> Any:
        """POST a JSON body (e.g. to `/generate`) and return the decoded answer."""
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)

    def alive(self) -> bool:
        return self.process.alive()

    def flush_cache(self, timeout_seconds: float = FLUSH_TIMEOUT_SECONDS) -> None:
        """Empty the radix cache once no request runs (a previous module's may be finishing)."""
        flush_cache_when_idle(
            self.url,
            what=f"real SGLang engine {self.name}",
            timeout_seconds=timeout_seconds,
            context=self.log_tail,
        )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The log's last lines, less the access lines of the polls tests make (a wait on
        ``/v1/loads`` writes one every 50 ms and would fill the tail with nothing else)."""
        path = self.process.log_path
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return tail(path, lines)  # says there is no log
        kept = [line for line in text.splitlines() if not POLL_ACCESS.search(line)]
        polls = text.count("\n") - len(kept)
        return f"last lines of {path} ({polls} poll access lines left out):\n" + "\n".join(
            kept[-lines:]
        )

    def terminate(self) -> None:
        """Send SIGTERM: SGLang drains, stops its scheduler and detokenizer, then exits."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def wait_stopped(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """Wait for the exit, SIGKILL after the grace. SGLang's scheduler and detokenizer set
        PR_SET_PDEATHSIG themselves (`kill_itself_when_parent_died`), so they go with it."""
        popen = self.process.popen
        assert popen is not None, "engines are always started by this process"
        try:
            popen.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(grace_seconds)

    def lost_a_port_race(self) -> bool:
        """It exited because another process took one of its free ports before it bound
        them (free ports are only free when chosen; the engine binds seconds later)."""
        return not self.alive() and PORT_TAKEN in tail(self.process.log_path, LOG_TAIL_LINES)

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        self.terminate()
        self.wait_stopped(grace_seconds)

    def wait_healthy(self, timeout_seconds: float = START_TIMEOUT_SECONDS) -> None:
        """Wait for `/health` 200; fail at once, with the log tail, if the engine exits."""

        def healthy() -> bool:
            if not self.alive():
                raise RuntimeError(
                    f"real SGLang engine {self.name} exited with {self.process.exit_code()} "
                    f"before /health answered; {self.log_tail()}"
                )
            return _health_ok(self.url)

        eventually(
            healthy,
            what=f"real SGLang engine {self.name} at {self.url}/health to answer 200",
            timeout_seconds=timeout_seconds,
            interval_seconds=0.5,
            context=self.log_tail,
        )


def _health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def spawn_engine(
    installed: RealSGLang,
    run_dir: Path,
    *,
    name: str = "engine",
    max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
    extra_args: Sequence[str] = (),
    enable_cache_report: bool = True,
) -> RealEngine:
    """Start one real engine (not yet serving; see `RealEngine.wait_healthy`).

    `extra_args` are appended to SGLang's command line (for example
    `["--max-running-requests", "4"]`); `enable_cache_report=False` leaves out
    `--enable-cache-report` (as SGLang's default); the log goes to `run_dir/NAME.log`.
    """
    port, kv_port, replay_port = free_ports(3)
    kv_endpoint = f"tcp://{LOOPBACK}:{kv_port}"
    replay_endpoint = f"tcp://{LOOPBACK}:{replay_port}"
    kv_events_config = {
        "publisher": "zmq",
        "endpoint": kv_endpoint,
        "bind": True,  # a concrete host would otherwise make the PUB socket connect
        "replay_endpoint": replay_endpoint,
        "topic": KV_TOPIC,
    }
    argv = [
        str(installed.python),
        *("-m", "sglang.launch_server"),
        *("--model-path", str(installed.model)),
        *("--served-model-name", SERVED_MODEL_NAME),
        *("--device", "cpu"),
        *("--host", LOOPBACK, "--port", str(port)),
        *("--attention-backend", "torch_native"),
        *("--sampling-backend", "pytorch"),
        *("--grammar-backend", "none"),
        *("--cuda-graph-backend-decode", "disabled"),
        *("--cuda-graph-backend-prefill", "disabled"),
        *("--mem-fraction-static", "0.1"),
        *("--max-total-tokens", str(max_total_tokens)),
        "--skip-server-warmup",
        *(["--enable-cache-report"] if enable_cache_report else []),
        "--enable-metrics",
        *("--page-size", str(PAGE_SIZE)),
        "--sleep-on-idle",
        *("--kv-events-config", json.dumps(kv_events_config)),
        *extra_args,
    ]
    spawned = time.monotonic()
    process = ManagedProcess.spawn(
        f"sglang-{name}", argv, run_dir / f"{name}.log", env=installed.environment()
    )
    return RealEngine(
        name=name,
        url=f"http://{LOOPBACK}:{port}",
        port=port,
        kv_events_endpoint=kv_endpoint,
        replay_endpoint=replay_endpoint,
        kv_topic=KV_TOPIC,
        page_size=PAGE_SIZE,
        model=SERVED_MODEL_NAME,
        model_path=installed.model,
        process=process,
        argv=argv,
        spawned_at=spawned,
    )


@dataclass(frozen=True)
class EngineOptions:
    """Launch options of a real engine: what makes two engines interchangeable."""

    max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS
    extra_args: tuple[str, ...] = ()
    enable_cache_report: bool = True


# The small-pool engine the differential and the router's eviction tests share: 1,024 tokens of
# KV pool (a few prompts evict the oldest) and SGLang's default of no cached tokens in usage.
SMALL_POOL = EngineOptions(max_total_tokens=1024, enable_cache_report=False)


class EngineFactory:
    """Starts real engines into one run directory and stops all of them at `close()`."""

    def __init__(self, installed: RealSGLang, run_dir: Path) -> None:
        self.installed = installed
        self.run_dir = run_dir
        self.engines: list[RealEngine] = []

    def start(
        self,
        *,
        name: str | None = None,
        max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
        extra_args: Sequence[str] = (),
        enable_cache_report: bool = True,
    ) -> RealEngine:
        """One engine, serving when this returns."""
        (engine,) = self.start_many(
            1,
            names=[name] if name else None,
            max_total_tokens=max_total_tokens,
            extra_args=extra_args,
            enable_cache_report=enable_cache_report,
        )
        return engine

    def start_many(
        self,
        count: int,
        *,
        names: Sequence[str] | None = None,
        max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
        extra_args: Sequence[str] = (),
        enable_cache_report: bool = True,
    ) -> list[RealEngine]:
        """`count` engines started side by side (faster than one after another), all serving
        when this returns. Names default to `engine-<n>`, numbered across the factory."""
        if names is not None and len(names) != count:
            raise ValueError(f"names: {len(names)} given for {count} engines")
        first = len(self.engines)
        chosen = list(names) if names else [f"engine-{first + i}" for i in range(count)]

        def spawn(name: str) -> RealEngine:
            engine = spawn_engine(
                self.installed,
                self.run_dir,
                name=name,
                max_total_tokens=max_total_tokens,
                extra_args=extra_args,
                enable_cache_report=enable_cache_report,
            )
            self.engines.append(engine)
            _running.append(engine)
            return engine

        started = [spawn(name) for name in chosen]
        for i, engine in enumerate(started):
            for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
                try:
                    engine.wait_healthy()
                    break
                except RuntimeError:
                    if attempt == PORT_RACE_ATTEMPTS or not engine.lost_a_port_race():
                        raise
                    self.forget(engine)
                    engine = started[i] = spawn(engine.name)
            engine.start_seconds = time.monotonic() - engine.spawned_at
        return started

    def forget(self, engine: RealEngine) -> None:
        """Stop `engine` (already dead, or to be replaced) and drop it from the factory."""
        engine.stop()
        self.engines.remove(engine)
        _running.remove(engine)

    def close(self) -> None:
        """Stop every engine: all get SIGTERM first, so their shutdowns overlap."""
        for engine in self.engines:
            engine.terminate()
        for engine in self.engines:
            engine.wait_stopped()
            _running.remove(engine)
        self.engines.clear()


class EnginePool:
    """One shared engine per `EngineOptions`, started on first use by `factory`, which stops
    them all at the end of the session.

    A module gets the engine with an empty cache (`RealEngine.flush_cache`); what else it did
    to the engine (counters, metric children created on first use) stays for the next one, so
    tests on a pooled engine assert on what their own requests did, never on totals. An engine
    found dead (a test that broke the rule) is started again.
    """

    def __init__(self, factory: EngineFactory) -> None:
        self.factory = factory
        self.engines: dict[EngineOptions, RealEngine] = {}
        self.starts = 0

    def engine(self, options: EngineOptions = EngineOptions(), *, name: str = "") -> RealEngine:
        """The shared engine of `options`, serving, its cache empty. `name` (for its log file)
        defaults to ``shared-<n>``."""
        engine = self.engines.get(options)
        if engine is None or not engine.alive():
            if engine is not None:
                self.factory.forget(engine)
            engine = self.factory.start(
                name=name or f"shared-{len(self.engines)}",
                max_total_tokens=options.max_total_tokens,
                extra_args=options.extra_args,
                enable_cache_report=options.enable_cache_report,
            )
            self.engines[options] = engine
            self.starts += 1
        else:
            engine.flush_cache()
        return engine


_running: list[RealEngine] = []


def log_report() -> str:
    """The log tails of every running real engine, for a failed test's report."""
    return "\n\n".join(f"== {e.name} ({e.url})\n{e.log_tail()}" for e in _running)


def installation() -> RealSGLang:
    """The installed real SGLang, or a skip (a failure under CI=true) saying how to install it."""
    try:
        return RealSGLang.discover()
    except RealSGLangMissing as err:
        reason = f"{err}; install it with scripts/install-real-sglang.sh (`make test` runs it)"
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: real-SGLang tests never skip)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session", name="real_sglang")
def real_sglang_installation() -> RealSGLang:
    return installation()


@pytest.fixture(scope="session")
def real_engine_pool(
    real_sglang: RealSGLang, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EnginePool]:
    factory = EngineFactory(real_sglang, tmp_path_factory.mktemp("real-sglang-pool"))
    try:
        yield EnginePool(factory)
    finally:
        factory.close()


@pytest.fixture(scope="module")
def real_engines(
    real_sglang: RealSGLang, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineFactory]:
    factory = EngineFactory(real_sglang, tmp_path_factory.mktemp("real-sglang"))
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def real_engine(real_engine_pool: EnginePool) -> RealEngine:
    return real_engine_pool.engine(name="shared-default")
