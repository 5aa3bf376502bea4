"""One container of a running pod: its process, its probes, its restarts.

The lifecycle the kubelet gives a container:

- start: the process (own session, stdout and stderr appended to the container's log, killed
  if the runner dies) runs the container's command; `postStart` runs beside it;
- probes: the startup probe first; then readiness (the container is ready after
  `successThreshold` passes, unready after `failureThreshold` failures; with no readiness
  probe it is ready once started) and liveness (`failureThreshold` failures restart it);
- exit: `restartPolicy` Always, or OnFailure after a non-zero code, restarts it after a
  back-off of 10 s doubling to 5 min (reset after 10 min of running), shown as waiting
  CrashLoopBackOff; `restartCount` and `lastState` record every exit, with the termination
  message: what the command wrote to `terminationMessagePath` (default
  /dev/termination-log, emptied at each start; its first 4096 bytes), or with
  `terminationMessagePolicy: FallbackToLogsOnError` and a failed exit that wrote nothing, the
  end of this run's log (at most 80 lines and 2048 bytes);
- stop (pod deleted, liveness failure): `preStop`, then SIGTERM to the process, then
  SIGKILL to it and everything it started when the grace period is over.

Each container's first process is `container_init.py`, which runs the command and, like a
container's PID 1 and cgroup, takes everything the command leaves behind down with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from tpuserve.cluster.pods import probes
from tpuserve.cluster.pods.container_spec import ProcessSpec
from tpuserve.cluster.pods.status import ContainerState, now

log = logging.getLogger(__name__)

TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # the kubelet's default
TERMINATION_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
MAX_BACKOFF_SECONDS = 300.0
BACKOFF_RESET_SECONDS = 600.0
INIT = Path(__file__).with_name("container_init.py")
# container_init.py's "kill the container": SIGKILL the command and everything under it.
KILL_CONTAINER = signal.SIGUSR1


def backoff_seconds(restarts: int, base_seconds: float) -> float:
    """The wait before restart number `restarts` (1, 2, ...): base, doubling, capped."""
    return float(min(base_seconds * 2 ** max(restarts - 1, 0), MAX_BACKOFF_SECONDS))


class Container:
    """Runs one container until `stop()`; reports every change through `changed()`."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        restart_policy: str,
        pod_ip: str,
        log_path: Path,
        build: Callable[[], Awaitable[ProcessSpec]],
        changed: Callable[[], None],
        event: Callable[[str, str, str], None],
        backoff_base_seconds: float,
        grace_seconds: float,
        init: bool = False,
        termination_file: Path | None = None,
    ) -> None:
        self.spec = spec
        self.name = str(spec["name"])
        self.restart_policy = restart_policy
        self.pod_ip = pod_ip
        self.log_path = log_path
        self.build = build
        self.changed = changed
        self.event = event
        self.backoff_base_seconds = backoff_base_seconds
        self.grace_seconds = grace_seconds
        self.init = init
        self.termination_file = termination_file
        self.state = ContainerState(self.name, str(spec.get("image", "")))
        self.process: asyncio.subprocess.Process | None = None
        self.process_spec: ProcessSpec | None = None
        self._stopping = False
        self._restart_now = asyncio.Event()

    # ---- running -------------------------------------------------------------------------

    async def run(self) -> int | None:
        """Run (and restart) until stopped, or until it exits for good; the last exit code."""
        code: int | None = None
        while not self.stopping():
            try:
                self.process_spec = await self.build()
            except Exception as err:  # a missing ConfigMap key, an unknown image, ...
                reason = getattr(err, "reason", "CreateContainerConfigError")
                self.state.waiting(reason, str(err))
                self.changed()
                self.event("Warning", "Failed", f"Error: {err}")
                await self._sleep(10.0)
                continue
            started = time.monotonic()
            code = await self._run_once(self.process_spec)
            if self.stopping():
                break
            restart = self.restart_policy == "Always" or (
                self.restart_policy == "OnFailure" and code != 0
            )
            if self.init and code == 0:
                restart = False
            if not restart:
                self.state.will_restart = False
                self.changed()
                break
            if time.monotonic() - started > BACKOFF_RESET_SECONDS:
                self.state.restart_count = 0  # the kubelet forgets old crashes too
            self.state.restart_count += 1
            delay = backoff_seconds(self.state.restart_count, self.backoff_base_seconds)
            message = (
                f"back-off {delay:g}s restarting failed container={self.name} "
                f"pod={self._pod_name()}"
            )
            self.state.waiting("CrashLoopBackOff", message)
            self.changed()
            self.event("Warning", "BackOff", f"Back-off restarting failed container {self.name}")
            await self._sleep(delay)
        return code

    def stopping(self) -> bool:
        return self._stopping

    def _pod_name(self) -> str:
        return self.log_path.parent.name

    async def _sleep(self, seconds: float) -> None:
        self._restart_now.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._restart_now.wait(), seconds)

    async def _run_once(self, spec: ProcessSpec) -> int:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.termination_file is not None:
            self.termination_file.parent.mkdir(parents=True, exist_ok=True)
            self.termination_file.write_bytes(b"")
        with self.log_path.open("ab") as log_file:
            log_start = log_file.tell()
            log_file.write(f"==== {time.strftime('%H:%M:%S')} starting: {spec.argv}\n".encode())
            log_file.flush()
            hosts = ["--hosts", str(spec.hosts_file)] if spec.hosts_file is not None else []
            try:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-I",
                    str(INIT),
                    *hosts,
                    *spec.argv,
                    env=spec.env,
                    cwd=spec.cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as err:
                self.state.last_state = {}
                self.state.state = {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": str(err),
                        "startedAt": now(),
                        "finishedAt": now(),
                    }
                }
                self.changed()
                return 128
        self.process = process
        started_at = now()
        self.state.container_id = f"tpuserve://{process.pid}"
        self.state.state = {"running": {"startedAt": started_at}}
        self.state.ready = False
        self.state.started = "startupProbe" not in self.spec
        self.changed()
        self.event("Normal", "Started", f"Started container {self.name} (pid {process.pid})")
        watchers = [asyncio.create_task(self._probe_loop())]
        post_start = (self.spec.get("lifecycle") or {}).get("postStart")
        if post_start:
            watchers.append(asyncio.create_task(self._hook("PostStart", post_start, 30.0)))
        try:
            code = await process.wait()
        finally:
            for task in watchers:
                task.cancel()
            for task in watchers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        finished_at = now()
        terminated: dict[str, Any] = {
            # container_init.py exits 128 + N when signal N ended the command, as runtimes report
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started_at,
            "finishedAt": finished_at,
            "containerID": self.state.container_id,
        }
        message = self._termination_message(int(terminated["exitCode"]), log_start)
        if message:
            terminated["message"] = message
        self.state.state = {"terminated": terminated}
        self.state.last_state = {"terminated": terminated}
        self.state.ready = False
        self.state.started = False
        self.process = None
        self.changed()
        return int(terminated["exitCode"])

    def _termination_message(self, exit_code: int, log_start: int) -> str:
        """What the kubelet reports as the exit's message (see the module docstring)."""
        text = ""
        if self.termination_file is not None:
            with contextlib.suppress(OSError), self.termination_file.open("rb") as file:
                text = file.read(TERMINATION_MESSAGE_BYTES).decode(errors="replace")
        fallback = self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        if not text.strip() and fallback and exit_code != 0:
            with contextlib.suppress(OSError), self.log_path.open("rb") as log_file:
                log_file.seek(max(log_start, log_file.seek(0, os.SEEK_END) - FALLBACK_LOG_BYTES))
                lines = log_file.read().decode(errors="replace").splitlines()
                text = "\n".join(lines[-FALLBACK_LOG_LINES:])
        return text.strip()

    # ---- probes --------------------------------------------------------------------------

    async def _probe_loop(self) -> None:
        spec = self.spec
        assert self.process_spec is not None
        if "startupProbe" in spec and not await self._until_started(spec["startupProbe"]):
            return
        tasks = []
        if "readinessProbe" in spec:
            tasks.append(asyncio.create_task(self._readiness(spec["readinessProbe"])))
        else:
            self.state.ready = True
            self.changed()
        if "livenessProbe" in spec:
            tasks.append(asyncio.create_task(self._liveness(spec["livenessProbe"])))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _check(self, probe: Mapping[str, Any], timing: probes.ProbeTiming) -> str | None:
        assert self.process_spec is not None
        return await probes.run_handler(
            probe, self.spec, self.pod_ip, self.process_spec, timing.timeout_seconds
        )

    async def _until_started(self, probe: Mapping[str, Any]) -> bool:
        timing = probes.ProbeTiming.of(probe)
        await asyncio.sleep(timing.initial_delay_seconds)
        failures = 0
        while True:
            problem = await self._check(probe, timing)
            if problem is None:
                self.state.started = True
                self.changed()
                return True
            failures += 1
            if failures >= timing.failure_threshold:
                self.event("Warning", "Unhealthy", f"Startup probe failed: {problem}")
                await self._restart_for(f"failed startup probe: {problem}")
                return False
            await asyncio.sleep(timing.period_seconds)

    async def _readiness(self, probe: Mapping[str, Any]) -> None:
        timing = probes.ProbeTiming.of(probe)
        await asyncio.sleep(timing.initial_delay_seconds)
        successes = failures = 0
        while True:
            problem = await self._check(probe, timing)
            if problem is None:
                successes, failures = successes + 1, 0
                if not self.state.ready and successes >= timing.success_threshold:
                    self.state.ready = True
                    self.changed()
            else:
                successes, failures = 0, failures + 1
                if self.state.ready and failures >= timing.failure_threshold:
                    self.state.ready = False
                    self.changed()
                    self.event("Warning", "Unhealthy", f"Readiness probe failed: {problem}")
            await asyncio.sleep(timing.period_seconds)

    async def _liveness(self, probe: Mapping[str, Any]) -> None:
        timing = probes.ProbeTiming.of(probe)
        await asyncio.sleep(timing.initial_delay_seconds)
        failures = 0
        while True:
            problem = await self._check(probe, timing)
            failures = 0 if problem is None else failures + 1
            if problem is not None and failures >= timing.failure_threshold:
                self.event("Warning", "Unhealthy", f"Liveness probe failed: {problem}")
                await self._restart_for(f"failed liveness probe: {problem}")
                return
            await asyncio.sleep(timing.period_seconds)

    async def _restart_for(self, why: str) -> None:
        """Kill the process the way a deletion would; `run` then restarts it per policy."""
        self.event("Normal", "Killing", f"Container {self.name} {why}, will be restarted")
        process = self.process
        if process is not None:
            await self._terminate(process, self.grace_seconds)

    # ---- stopping ------------------------------------------------------------------------

    async def _hook(self, name: str, handler: Mapping[str, Any], timeout_seconds: float) -> None:
        assert self.process_spec is not None
        problem = await probes.run_handler(
            handler, self.spec, self.pod_ip, self.process_spec, timeout_seconds
        )
        if problem is not None:
            self.event("Warning", f"Failed{name}Hook", f"{name} hook failed: {problem}")

    async def _terminate(self, process: asyncio.subprocess.Process, grace_seconds: float) -> None:
        deadline = time.monotonic() + grace_seconds
        pre_stop = (self.spec.get("lifecycle") or {}).get("preStop")
        if pre_stop and process.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._hook("PreStop", pre_stop, grace_seconds), grace_seconds
                )
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        remaining = max(deadline - time.monotonic(), 0.0)
        try:
            await asyncio.wait_for(process.wait(), remaining)
        except TimeoutError:
            self._kill_container(process.pid)
            await process.wait()

    @staticmethod
    def _kill_container(pid: int) -> None:
        """SIGKILL the command and everything under it (container_init.py does it)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, KILL_CONTAINER)

    async def stop(self, grace_seconds: float) -> None:
        """preStop, SIGTERM, then SIGKILL after `grace_seconds`; no restart afterwards."""
        self._stopping = True
        self._restart_now.set()
        process = self.process
        if process is not None:
            self.state.ready = False
            self.changed()
            await self._terminate(process, grace_seconds)

    def kill(self) -> None:
        """SIGKILL at once (the pod object is gone, or the runner is exiting)."""
        self._stopping = True
        self._restart_now.set()
        if self.process is not None:
            self._kill_container(self.process.pid)
