"""SGLang-JAX on the v5e, answering through ``tpuserve router``, all over unix sockets
(issue 67, item 4; the machine refuses TCP sockets, even on loopback).

    python bench/tpu_sglang_jax.py --out-dir DIR --models DIR [--phases tiny perf] [--budget-s S]

Each engine is SGLang-JAX's own server (`bench/sglang_jax_uds.py`: its uvicorn on a unix socket,
``--skip-server-warmup``), each router is ``tpuserve router --uds R --worker unix:E``; every
request goes to the router's socket. Rows go to ``DIR/lane.jsonl`` as they are measured (a call
cut short keeps them); each process's log to ``DIR/<name>.log``.

- ``tiny`` (`bench/sglang_jax_models.py`'s tiny Qwen3, float32, ``JAX_DEFAULT_MATMUL_PRECISION=
  highest``): the same server on the machine's CPU (``JAX_PLATFORMS=cpu``, same JAX) and on the
  chip, side by side; greedy tokens of text, ``input_ids``, chat and streamed requests compared;
  a long prompt and a chat sent twice, the second answer's cached tokens; the router's view.
- ``perf`` (Qwen3-0.6B's shape, ``--load-format dummy``: random bf16 weights, page 128): the
  server's start cold (empty ``JAX_COMPILATION_CACHE_DIR``), decode at batch 1, 8 and 32
  (streamed, ``ignore_eos``; per stream the seconds between its first and last token over the
  tokens between them, the median over streams), prefill of 1,024 and 4,096 tokens (one new
  token; the answer's latency, median of 3 distinct random prompts), then a second start with
  the cache warm. The performance model's predictions are put beside these rows afterwards
  (`bench/sglang_jax_vs_model.py`), on a machine with the project installed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STUBS = HERE / "sglang_jax_stubs"  # a stand-in for pathwaysutils, imported and never called
TEXT_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
)
INPUT_IDS = [11, 400, 23, 871, 5, 1290, 77, 640, 19, 1500, 3, 999]
CHAT = [{"role": "user", "content": "Say something about the sea."}]
NEW_TOKENS = 16
TINY_ARGS = [
    "--dtype",
    "float32",
    "--page-size",
    "128",
    "--context-length",
    "2048",
    "--max-running-requests",
    "8",
    "--chunked-prefill-size",
    "1024",
    "--precompile-token-paddings",
    "256",
    "1024",
    "--precompile-bs-paddings",
    "1",
    "8",
    "--max-total-tokens",
    "16384",
    "--served-model-name",
    "tiny",
]
PERF_ARGS = [
    "--dtype",
    "bfloat16",
    "--load-format",
    "dummy",
    "--page-size",
    "128",
    "--context-length",
    "5120",
    "--max-running-requests",
    "32",
    "--chunked-prefill-size",
    "4096",
    "--max-prefill-tokens",
    "4096",
    "--precompile-token-paddings",
    "1024",
    "4096",
    "--precompile-bs-paddings",
    "1",
    "8",
    "32",
    "--mem-fraction-static",
    "0.8",
    "--served-model-name",
    "qwen3-0.6b",
]
COMMON_ARGS = [
    "--skip-server-warmup",
    "--enable-cache-report",
    "--random-seed",
    "0",
    "--trust-remote-code",
    "--log-level",
    "info",
]
DECODE_BATCHES = (1, 8, 32)
DECODE_PROMPT_TOKENS = 128
DECODE_NEW_TOKENS = 64
PREFILL_TOKENS = (1024, 4096)
PREFILL_REPEATS = 3
START_TIMEOUT_S = 400.0
REQUEST_TIMEOUT_S = 120.0


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket (``host: localhost``)."""

    def __init__(self, path: str, timeout: float = REQUEST_TIMEOUT_S) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def call(
    sock: str, method: str, path: str, body: Any = None, timeout: float = REQUEST_TIMEOUT_S
) -> tuple[int, Any]:
    conn = UnixHTTPConnection(sock, timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, data, {"content-type": "application/json"})
        answer = conn.getresponse()
        raw = answer.read()
        try:
            return answer.status, json.loads(raw)
        except ValueError:
            return answer.status, raw.decode(errors="replace")
    finally:
        conn.close()


def stream(sock: str, path: str, body: dict[str, Any]) -> list[tuple[float, dict[str, Any]]]:
    """POST a streamed request; (arrival time, event) for each ``data:`` event."""
    conn = UnixHTTPConnection(sock)
    events: list[tuple[float, dict[str, Any]]] = []
    try:
        conn.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json"})
        answer = conn.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"{path}: {answer.status} {answer.read()[:300]!r}")
        while True:
            line = answer.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            events.append((time.perf_counter(), json.loads(line[5:])))
    finally:
        conn.close()
    return events


class Proc:
    """A child process in its own process group, its output in ``log``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self.started = time.monotonic()
        self.handle = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self.handle, stderr=subprocess.STDOUT, start_new_session=True
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = 15.0) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.handle.close()

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def answers_health(sock: str) -> Callable[[], bool]:
    return lambda: call(sock, "GET", "/health", timeout=5)[0] == 200


def wait_until(
    ok: Callable[[], bool], proc: Proc, timeout: float, by: float = float("inf")
) -> float:
    """Seconds from ``proc``'s start until ``ok()``; raises if it dies or times out (after
    ``timeout`` seconds, or at the monotonic time ``by``, the lane's deadline)."""
    deadline = min(time.monotonic() + timeout, by)
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.proc.returncode}):\n{proc.tail()}")
        try:
            if ok():
                return time.monotonic() - proc.started
        except OSError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{proc.name} not ready in {timeout:g} s:\n{proc.tail()}")


class Lane:
    def __init__(self, args: argparse.Namespace) -> None:
        self.out: Path = args.out_dir
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs: Path = args.log_dir or args.out_dir
        self.logs.mkdir(parents=True, exist_ok=True)
        self.models: Path = args.models
        self.run = Path(args.run_dir)
        self.run.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.budget_s
        self.procs: list[Proc] = []
        self.sgl_path = args.sgl_path
        self.device = args.device  # "cpu": a dry run of the whole lane on a machine without a chip
        self.perf_model = args.perf_model

    def left(self) -> float:
        return float(self.deadline - time.monotonic())

    def row(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"kind": kind, "at": time.strftime("%H:%M:%S", time.gmtime()), **fields}
        with open(self.out / "lane.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")
        print(json.dumps(record)[:600], flush=True)
        return record

    def env(self, *, cpu: bool, highest: bool, cache: Path | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (self.sgl_path, env.get("PYTHONPATH", ""), str(STUBS)) if p
        )
        env |= {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
        if cpu:
            env["JAX_PLATFORMS"] = "cpu"
        if highest:
            env["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
        if cache is not None:
            env |= {
                "JAX_COMPILATION_CACHE_DIR": str(cache),
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
            }
        return env

    def engine(
        self, name: str, model: Path, device: str, args: list[str], env: dict[str, str]
    ) -> tuple[Proc, str]:
        sock = str(self.run / f"{name}.sock")
        argv = [
            sys.executable,
            str(HERE / "sglang_jax_uds.py"),
            sock,
            "--model-path",
            str(model),
            "--device",
            device,
            *COMMON_ARGS,
            *args,
        ]
        proc = Proc(name, argv, env, self.logs / f"{name}.log")
        self.procs.append(proc)
        return proc, sock

    def router(self, name: str, worker_sock: str) -> tuple[Proc, str]:
        sock = str(self.run / f"{name}.sock")
        env = self.env(cpu=True, highest=False)
        env["PYTHONPATH"] = os.pathsep.join(
            [
                str(ROOT),
                str(ROOT / "router"),
                str(ROOT / "operator"),
                os.environ.get("PYTHONPATH", ""),
            ]
        )
        argv = [
            sys.executable,
            "-m",
            "tpuserve",
            "router",
            "--uds",
            sock,
            "--worker",
            f"unix:{worker_sock}",
            "--health-check-interval",
            "1",
            # a bucket the precompile left out compiles on the first request that needs it
            "--first-byte-timeout-floor",
            "300",
            "--request-timeout",
            "600",
        ]
        proc = Proc(name, argv, env, self.logs / f"{name}.log")
        self.procs.append(proc)
        return proc, sock

    def ready_router(self, proc: Proc, sock: str) -> float:
        def routable() -> bool:
            status, body = call(sock, "GET", "/readiness", timeout=5)
            return status == 200 and isinstance(body, dict) and body.get("healthy_workers") == 1

        return wait_until(routable, proc, 60)

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()

    # ------------------------------------------------------------------ tiny: tokens, cache

    def tiny(self) -> None:
        if self.left() < 150:
            self.row("skipped", what="tiny", left_s=round(self.left()))
            return
        model = self.models / "tiny"
        cpu, cpu_sock = self.engine(
            "tiny-cpu", model, "cpu", TINY_ARGS, self.env(cpu=True, highest=True)
        )
        tpu, tpu_sock = self.engine(
            "tiny-tpu",
            model,
            self.device,
            TINY_ARGS,
            self.env(cpu=self.device == "cpu", highest=True),
        )
        ready = {}
        for proc, sock in ((tpu, tpu_sock), (cpu, cpu_sock)):
            ready[proc.name] = wait_until(
                answers_health(sock), proc, START_TIMEOUT_S, self.deadline
            )
        r_cpu, r_cpu_sock = self.router("router-cpu", cpu_sock)
        r_tpu, r_tpu_sock = self.router("router-tpu", tpu_sock)
        ready["router-cpu"] = self.ready_router(r_cpu, r_cpu_sock)
        ready["router-tpu"] = self.ready_router(r_tpu, r_tpu_sock)
        self.row("tiny_ready", seconds=ready)
        answers: dict[str, dict[str, Any]] = {}
        for label, sock in (("cpu", r_cpu_sock), ("tpu", r_tpu_sock)):
            answers[label] = self.tiny_answers(sock)
        for key in answers["cpu"]:
            a, b = answers["cpu"][key], answers["tpu"][key]
            equal = sum(1 for x, y in zip(a, b, strict=False) if x == y)
            first_diff = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None
            )
            self.row(
                "tiny_tokens",
                request=key,
                cpu=a,
                tpu=b,
                equal=equal,
                compared=max(len(a), len(b)),
                first_difference=first_diff,
            )
        self.cached(r_tpu_sock, "tpu")
        self.cached(r_cpu_sock, "cpu")
        _status, metrics = call(r_tpu_sock, "GET", "/metrics")
        worker_lines = [
            line
            for line in str(metrics).splitlines()
            if "unix:" in line and not line.startswith("#")
        ][:12]
        _status_r, readiness = call(r_tpu_sock, "GET", "/readiness")
        self.row("tiny_router", readiness=readiness, metrics_with_unix_worker=worker_lines)
        self.stop_all()

    def tiny_answers(self, sock: str) -> dict[str, list[Any]]:
        """Greedy token ids per request (an error's text in their place), and the chat's text."""
        greedy = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS}
        out: dict[str, list[Any]] = {}
        for i, text in enumerate(TEXT_PROMPTS):
            status, body = call(
                sock, "POST", "/generate", {"text": text, "sampling_params": greedy}
            )
            out[f"text{i}"] = list(body["output_ids"]) if status == 200 else [f"{status}: {body}"]
        status, body = call(
            sock, "POST", "/generate", {"input_ids": INPUT_IDS, "sampling_params": greedy}
        )
        out["input_ids"] = list(body["output_ids"]) if status == 200 else [f"{status}: {body}"]
        events = stream(
            sock, "/generate", {"text": TEXT_PROMPTS[0], "sampling_params": greedy, "stream": True}
        )
        out["text0_streamed"] = list(events[-1][1]["output_ids"]) if events else []
        if events and len(events[-1][1]["output_ids"]) < NEW_TOKENS:  # deltas, not cumulative
            out["text0_streamed"] = [t for _, e in events for t in e["output_ids"]]
        status, body = call(
            sock,
            "POST",
            "/v1/chat/completions",
            {"model": "tiny", "messages": CHAT, "temperature": 0.0, "max_tokens": NEW_TOKENS},
        )
        text = body["choices"][0]["message"]["content"] if status == 200 else f"{status}: {body}"
        out["chat_text"] = [text]
        return out

    def cached(self, sock: str, label: str) -> None:
        rng = random.Random(7)
        words = " ".join(
            rng.choice(
                [
                    "alpha",
                    "beta",
                    "gamma",
                    "delta",
                    "sea",
                    "ship",
                    "wave",
                    "stone",
                    "river",
                    "cloud",
                ]
            )
            for _ in range(700)
        )
        greedy = {"temperature": 0.0, "max_new_tokens": 4}
        seen = []
        for _attempt in range(2):
            status, body = call(
                sock, "POST", "/generate", {"text": words, "sampling_params": greedy}
            )
            meta = body.get("meta_info", {}) if isinstance(body, dict) else {}
            seen.append(
                {
                    "status": status,
                    "prompt_tokens": meta.get("prompt_tokens"),
                    "cached_tokens": meta.get("cached_tokens"),
                    "cache_miss_count": meta.get("cache_miss_count"),
                }
            )
        chat = [{"role": "user", "content": words}]
        for _attempt in range(2):
            status, body = call(
                sock,
                "POST",
                "/v1/chat/completions",
                {"model": "tiny", "messages": chat, "temperature": 0.0, "max_tokens": 4},
            )
            usage = body.get("usage", {}) if isinstance(body, dict) else {}
            seen.append(
                {
                    "status": status,
                    "chat": True,
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens"
                    ),
                }
            )
        self.row("cached_tokens", engine=label, answers=seen)

    # ------------------------------------------------------------------ perf: 0.6B shape

    def perf(self) -> None:
        model = self.models / self.perf_model
        cache = self.run / "jax-cache"
        cache.mkdir(exist_ok=True)
        for start in ("cold", "warm"):
            if self.left() < (60 if start == "warm" else 200):
                self.row("skipped", what=f"perf start {start}", left_s=round(self.left()))
                return
            files_before = sum(1 for _ in cache.iterdir())
            proc, sock = self.engine(
                f"perf-{start}",
                model,
                self.device,
                PERF_ARGS,
                self.env(cpu=self.device == "cpu", highest=False, cache=cache),
            )
            seconds = wait_until(answers_health(sock), proc, START_TIMEOUT_S, self.deadline)
            logged = precompile_seconds(proc.log.read_text(errors="replace"))
            self.row(
                "perf_start",
                start=start,
                ready_s=round(seconds, 2),
                precompile_s=logged,
                cache_files_before=files_before,
                cache_files_after=sum(1 for _ in cache.iterdir()),
            )
            router, rsock = self.router(f"router-{start}", sock)
            self.ready_router(router, rsock)
            if start == "cold":
                self.measure(rsock)
            else:
                self.decode(rsock, 8, warm=False)  # one row: the warm start's server serves
            self.stop_all()

    def measure(self, sock: str) -> None:
        for batch in DECODE_BATCHES:
            if self.left() < 90:
                self.row("skipped", what=f"decode batch {batch}", left_s=round(self.left()))
                return
            self.decode(sock, batch, warm=True)
        for tokens in PREFILL_TOKENS:
            if self.left() < 90:
                self.row("skipped", what=f"prefill {tokens}", left_s=round(self.left()))
                return
            self.prefill(sock, tokens)

    def decode(self, sock: str, batch: int, *, warm: bool) -> None:
        rng = random.Random(batch)
        if warm:  # a first round compiles whatever the precompile left out
            self.streams(sock, batch, rng, 8)
        started = time.perf_counter()
        results = self.streams(sock, batch, rng, DECODE_NEW_TOKENS)
        wall = time.perf_counter() - started
        steps, ttfts, misses = [], [], []
        for events, t0 in results:
            if len(events) < 2:
                continue
            (ta, ea), (tb, eb) = events[0], events[-1]
            na, nb = ea["meta_info"]["completion_tokens"], eb["meta_info"]["completion_tokens"]
            if nb > na:
                steps.append((tb - ta) / (nb - na))
            ttfts.append(ta - t0)
            misses.append(eb["meta_info"].get("cache_miss_count"))
        step = statistics.median(steps) if steps else None
        self.row(
            "decode",
            batch=batch,
            prompt_tokens=DECODE_PROMPT_TOKENS,
            new_tokens=DECODE_NEW_TOKENS,
            streams=len(results),
            step_ms=None if step is None else round(step * 1e3, 3),
            step_ms_min=round(min(steps) * 1e3, 3) if steps else None,
            step_ms_max=round(max(steps) * 1e3, 3) if steps else None,
            tokens_per_s=None if step is None else round(batch / step, 1),
            wall_s=round(wall, 3),
            ttft_ms_median=round(statistics.median(ttfts) * 1e3, 1) if ttfts else None,
            cache_miss_count=misses[:4],
        )

    def streams(
        self, sock: str, batch: int, rng: random.Random, new_tokens: int
    ) -> list[tuple[list[tuple[float, dict[str, Any]]], float]]:
        results: list[Any] = [None] * batch
        barrier = threading.Barrier(batch)

        def one(i: int, ids: list[int]) -> None:
            body = {
                "input_ids": ids,
                "stream": True,
                "sampling_params": {
                    "temperature": 0.0,
                    "max_new_tokens": new_tokens,
                    "ignore_eos": True,
                },
            }
            barrier.wait()
            t0 = time.perf_counter()
            results[i] = (stream(sock, "/generate", body), t0)

        prompts = [
            [rng.randrange(100, 2000) for _ in range(DECODE_PROMPT_TOKENS)] for _ in range(batch)
        ]
        threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_S)
        return [r for r in results if r is not None]

    def prefill(self, sock: str, tokens: int) -> None:
        rng = random.Random(tokens)
        latencies, cached, misses = [], [], []
        for _ in range(PREFILL_REPEATS + 1):  # the first compiles what the precompile left out
            ids = [rng.randrange(100, 2000) for _ in range(tokens)]
            started = time.perf_counter()
            status, body = call(
                sock,
                "POST",
                "/generate",
                {
                    "input_ids": ids,
                    "sampling_params": {
                        "temperature": 0.0,
                        "max_new_tokens": 1,
                        "ignore_eos": True,
                    },
                },
            )
            latencies.append(time.perf_counter() - started)
            meta = body.get("meta_info", {}) if isinstance(body, dict) else {}
            cached.append(meta.get("cached_tokens"))
            misses.append(meta.get("cache_miss_count"))
            if status != 200:
                self.row("prefill_error", tokens=tokens, status=status, body=str(body)[:400])
                return
        measured = latencies[1:]
        self.row(
            "prefill",
            tokens=tokens,
            new_tokens=1,
            latency_ms=round(statistics.median(measured) * 1e3, 2),
            latencies_ms=[round(x * 1e3, 2) for x in latencies],
            cached_tokens=cached,
            cache_miss_count=misses,
        )


_PRECOMPILE = re.compile(r"\[(EXTEND|DECODE)\] Precompile finished in ([0-9.]+) secs")


def precompile_seconds(log: str) -> dict[str, float]:
    return {m.group(1).lower(): float(m.group(2)) for m in _PRECOMPILE.finditer(log)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--run-dir", default="/tmp/sgj-run", help="sockets and the JAX cache")
    parser.add_argument("--log-dir", type=Path, help="each process's log (default: --out-dir)")
    parser.add_argument("--sgl-path", default="", help="where sgl_jax is importable from")
    parser.add_argument("--phases", nargs="+", default=["tiny", "perf"], choices=["tiny", "perf"])
    parser.add_argument("--budget-s", type=float, default=540.0)
    parser.add_argument(
        "--device",
        default="tpu",
        choices=["tpu", "cpu"],
        help="cpu: run the whole lane on the CPU (a dry run of this script)",
    )
    parser.add_argument("--perf-model", default="qwen3-0.6b", help="the perf phase's model")
    args = parser.parse_args(argv)
    lane = Lane(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children on the way out
    lane.row("start", phases=args.phases, budget_s=args.budget_s, python=sys.version.split()[0])
    try:
        for phase in args.phases:
            try:
                getattr(lane, phase)()
            except Exception as err:  # one phase's failure leaves the next its chance
                lane.row("error", phase=phase, error=f"{type(err).__name__}: {err}"[:3000])
            finally:
                lane.stop_all()
    finally:
        lane.stop_all()
        lane.row("end", left_s=round(lane.left()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
