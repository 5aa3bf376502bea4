"""Shared pieces of the end-to-end tests on a living fleet (pods that really run).

- reading the cluster (`get`, `pods`, `ready`) and waiting on it (`wait`);
- `local_base_url`: a server's address as `tpuserve cluster services` prints it;
- `install_chart`: the chart with the operator as a pod, scraped every 2 s;
- `Load`: steady closed-loop clients through the router with the official `openai` client,
  streaming or not, that record every request's outcome and times (none is lost unseen).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import openai
import yaml

from tests.e2e.tms_harness import NOT_YET, POLL_SECONDS, REPO, condition
from tests.waiting import eventually
from tpuserve.cluster import Cluster

CHART = REPO / "charts" / "tpuserve"
EXAMPLE = CHART / "examples" / "simulated.yaml"
OPERATOR_NAMESPACE = "tpuserve-system"
NAMESPACE = "default"
TIMEOUT_SECONDS = 180.0
T = TypeVar("T")


def wait(what: str, check: Callable[[], T], timeout_seconds: float = TIMEOUT_SECONDS) -> T:
    return eventually(
        check,
        what=what,
        timeout_seconds=timeout_seconds,
        interval_seconds=POLL_SECONDS * 2,
        ignore=NOT_YET,
    )


def get(cluster: Cluster, *args: str) -> Any:
    return yaml.safe_load(cluster.kubectl("get", *args, "-o", "yaml").stdout)


def ready(cluster: Cluster, name: str) -> bool:
    server = get(cluster, "tpumodelserver", name, "-n", NAMESPACE)
    return condition(server, "Ready").get("status") == "True"


def pods(cluster: Cluster, selector: str) -> list[dict[str, Any]]:
    listing = get(cluster, "pods", "-n", NAMESPACE, "-l", selector)
    return list(listing.get("items") or [])


def install_chart(cluster: Cluster, *sets: str, verb: str = "install") -> None:
    """`helm install` (or `upgrade --install`) the chart; `sets` are extra `key=value`s."""
    args = ["upgrade", "--install"] if verb == "upgrade" else ["install"]
    extra = [arg for value in sets for arg in ("--set", value)]
    cluster.helm(
        *args, "tpuserve", str(CHART), "--namespace", OPERATOR_NAMESPACE,
        "--create-namespace", "--wait", "--timeout", "180s",
        "--set", "monitoring.scrapeInterval=2s", "--set", "monitoring.scrapeTimeout=2s",
        *extra,
    )  # fmt: skip


def local_base_url(cluster: Cluster, name: str) -> str:
    """The server's local URL as `tpuserve cluster services` prints it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpuserve",
            "cluster",
            "services",
            "--run-dir",
            str(cluster.run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,  # a second on a quiet machine; minutes seen under the whole suite's load
        check=True,
        env={**os.environ},
    )
    rows = done.stdout.splitlines()
    line = next(row for row in rows if f"tpumodelserver {NAMESPACE}/{name}" in row)
    found = re.search(r"http://127\.\d+\.\d+\.\d+:\d+", line)  # 127.(96 + network).A.B
    assert found, line
    return found.group(0)


def read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?query={urllib.parse.quote(promql)}"
    result: list[dict[str, Any]] = json.loads(read(url))["data"]["result"]
    return result


def ask(client: openai.OpenAI, model: str, prompt: str) -> Any:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=8
    )


@dataclass(frozen=True)
class Outcome:
    """One request of a `Load`: when it started and ended (monotonic), and how it went."""

    started: float
    finished: float
    ok: bool
    reason: str  # "" when ok
    streamed: bool
    first_byte: float | None = None  # streams: when the first content chunk arrived


class Load:
    """Closed-loop clients through the router with the official client; records every outcome."""

    def __init__(self, base_url: str, model: str, timeout_seconds: float = 60.0) -> None:
        self.client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()

    @property
    def ok(self) -> int:
        with self.lock:
            return sum(1 for outcome in self.outcomes if outcome.ok)

    @property
    def failed(self) -> list[str]:
        with self.lock:
            return [outcome.reason for outcome in self.outcomes if not outcome.ok]

    def run(self, streams: int, prompt_words: int, max_tokens: int, stream: bool = False) -> None:
        """Start `streams` clients (stopping the ones before); `stream` asks for SSE answers."""
        self.halt()
        self.stop = threading.Event()
        for i in range(streams):
            prompt = " ".join(f"w{i}x{j}" for j in range(prompt_words))
            thread = threading.Thread(
                target=self._loop, args=(self.stop, prompt, max_tokens, stream), daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def _loop(self, stop: threading.Event, prompt: str, max_tokens: int, stream: bool) -> None:
        sent = 0
        while not stop.is_set():
            sent += 1
            # A new first word each time: no prefix to follow, so the router balances by load.
            unique = f"{threading.get_ident()}-{sent} {prompt}"
            self.record(self.once(unique, max_tokens, stream))

    def once(self, prompt: str, max_tokens: int, stream: bool) -> Outcome:
        """Send one request and say how it went (every exception is an outcome, not lost)."""
        started = time.monotonic()
        first_byte: float | None = None
        messages: Any = [{"role": "user", "content": prompt}]
        try:
            if stream:
                text = ""
                finished_reason = None
                chunks = self.client.chat.completions.create(
                    model=self.model,
                    messages=messages,
                    max_tokens=max_tokens,
                    timeout=self.timeout_seconds,
                    stream=True,
                )
                for chunk in chunks:
                    for choice in chunk.choices:
                        if choice.delta.content:
                            first_byte = first_byte or time.monotonic()
                            text += choice.delta.content
                        finished_reason = choice.finish_reason or finished_reason
                good = bool(text) and finished_reason is not None
                reason = "" if good else f"broken stream (text {len(text)} chars, no finish)"
            else:
                answer = self.client.chat.completions.create(
                    model=self.model,
                    messages=messages,
                    max_tokens=max_tokens,
                    timeout=self.timeout_seconds,
                )
                good = bool(answer.choices and answer.choices[0].message.content)
                reason = "" if good else "empty answer"
        except Exception as err:  # every failure is counted and shown
            good = False
            reason = f"{type(err).__name__}: {err}"
        return Outcome(started, time.monotonic(), good, reason, stream, first_byte)

    def record(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(self.timeout_seconds + 30)
        self.threads = []
