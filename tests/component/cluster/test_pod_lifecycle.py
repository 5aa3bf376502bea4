"""A pod run by the pod runner gets the kubelet's lifecycle, with real processes on loopback:
init containers first, probes that decide readiness and restart on liveness failures, exits
that are restarts with CrashLoopBackOff, and deletion as preStop, SIGTERM and SIGKILL after
the grace period. The API server is `tests.fakes.FakePodHost`, which records every status."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakePodHost, pod_manifest
from tests.waiting import eventually_async
from tpuserve.cluster.pods.pod import PodSupervisor

pytestmark = pytest.mark.component

IMAGE = "ghcr.io/tpuserve/tpuserve:test"
TIMEOUT_SECONDS = 120.0  # an upper bound: a loaded CI machine took over 30 s for a restart


def python(code: str, **extra: Any) -> dict[str, Any]:
    """A container running `python -c code` (the image's PATH has this environment's python)."""
    return {
        "name": extra.pop("name", "main"),
        "image": IMAGE,
        "command": ["python", "-c", code],
        **extra,
    }


@pytest.fixture
def host(tmp_path: Path) -> FakePodHost:
    return FakePodHost(tmp_path)


@contextlib.asynccontextmanager
async def running(host: FakePodHost, pod: dict[str, Any]) -> Any:
    supervisor = PodSupervisor(host, pod)
    task = asyncio.create_task(supervisor.run())
    try:
        yield supervisor
    finally:
        supervisor.gone()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, TIMEOUT_SECONDS)


async def until(what: str, check: Callable[[], bool]) -> None:
    async def probe() -> bool:
        return check()

    await eventually_async(
        probe,
        what=what,
        timeout_seconds=TIMEOUT_SECONDS,
        interval_seconds=0.05,
        ignore=(LookupError,),  # no status written yet
    )


async def test_a_crashing_container_restarts_with_back_off_and_says_so(host: FakePodHost) -> None:
    pod = pod_manifest("crash", [python("import sys; sys.exit(3)")])
    seen_back_off: list[str] = []

    def restarted_twice() -> bool:
        state = host.container("main")["state"] if host.statuses else {}
        if state.get("waiting", {}).get("reason") == "CrashLoopBackOff":
            seen_back_off.append(state["waiting"]["message"])
        return bool(host.statuses) and host.container("main")["restartCount"] >= 2

    async with running(host, pod):
        await until("two restarts", restarted_twice)
    main = host.container("main")
    assert main["lastState"]["terminated"]["exitCode"] == 3
    assert main["lastState"]["terminated"]["reason"] == "Error"
    assert host.status["phase"] == "Running"
    assert any("back-off" in m and "restarting failed container=main" in m for m in seen_back_off)
    assert ("Warning", "BackOff", "Back-off restarting failed container main") in host.events


async def test_probes_decide_readiness_and_a_failed_liveness_probe_restarts(
    host: FakePodHost,
) -> None:
    server = {
        "name": "main",
        "image": IMAGE,
        "command": ["python", "-m", "http.server", "--bind", "0.0.0.0", "--directory", "/srv"],
        "args": ["8080"],
        "ports": [{"name": "http", "containerPort": 8080}],
        "volumeMounts": [{"name": "www", "mountPath": "/srv"}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1},
        "livenessProbe": {
            "httpGet": {"path": "/alive", "port": 8080},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    }
    pod = pod_manifest("web", [server], volumes=[{"name": "www", "emptyDir": {}}], grace_seconds=1)
    async with running(host, pod) as supervisor:
        www = supervisor.work_dir / "volumes" / "www"
        await until("the volume", www.is_dir)
        (www / "alive").write_text("ok")
        await until("the server running", lambda: "running" in host.container("main")["state"])
        assert not host.container("main")["ready"]  # /ready is missing: 404
        (www / "ready").write_text("ok")
        await until("ready", lambda: host.container("main")["ready"])
        ready = {c["type"]: c["status"] for c in host.status["conditions"]}
        assert ready["Ready"] == ready["ContainersReady"] == "True"
        assert ready["PodScheduled"] == "True"  # the scheduler's condition is kept
        assert host.status["podIP"].startswith("127.250.7.")
        (www / "alive").unlink()
        await until("a liveness restart", lambda: host.container("main")["restartCount"] == 1)
    assert any(e[1] == "Unhealthy" and "Liveness probe failed" in e[2] for e in host.events)


async def test_deletion_is_pre_stop_then_sigterm_then_sigkill_after_the_grace(
    host: FakePodHost, tmp_path: Path
) -> None:
    stubborn = python(
        "import pathlib, signal, sys, time\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "signal.signal(signal.SIGTERM, lambda *_: (out / 'term').write_text('got it'))\n"
        "(out / 'up').write_text('1')\n"
        "while True: time.sleep(0.1)\n",
        args=["/data"],
        volumeMounts=[{"name": "data", "mountPath": "/data"}],
        lifecycle={"preStop": {"exec": {"command": ["sh", "-c", "echo bye > $(DATA)/pre-stop"]}}},
        env=[{"name": "DATA", "value": "/data"}],
    )
    pod = pod_manifest(
        "stubborn", [stubborn], volumes=[{"name": "data", "emptyDir": {}}], grace_seconds=1
    )
    supervisor = PodSupervisor(host, pod)
    data = supervisor.work_dir / "volumes" / "data"
    task = asyncio.create_task(supervisor.run())
    await until("the container up", (data / "up").exists)
    pre_stop, term = data / "pre-stop", data / "term"
    order: list[str] = []
    watcher = asyncio.create_task(_record_order(order, pre_stop, term))
    supervisor.terminate(grace_seconds=1.0)
    await asyncio.wait_for(task, TIMEOUT_SECONDS)  # SIGKILL ended it: it ignored SIGTERM
    watcher.cancel()
    assert order == ["pre-stop", "term"]
    terminated = host.container("main")["state"]["terminated"]
    assert terminated["exitCode"] == 137  # 128 + SIGKILL, as a container runtime reports it
    assert host.deleted == ["stubborn"]  # the runner removes the object, as the kubelet does
    assert not supervisor.work_dir.exists()  # emptyDir volumes go with the pod


async def _record_order(order: list[str], *paths: Path) -> None:
    while True:
        for path in paths:
            if path.exists() and path.name not in order:
                order.append(path.name)
        await asyncio.sleep(0.01)


async def test_init_containers_run_first_and_a_finished_pod_succeeds(host: FakePodHost) -> None:
    host.objects[("ConfigMap", "ns", "settings")] = {"GREETING": "hello"}
    init = python(
        "import os, pathlib; pathlib.Path(os.environ['WORK'], 'greeting')"
        ".write_text(os.environ['GREETING'])",
        name="prepare",
        env=[
            {"name": "WORK", "value": "/work"},
            {
                "name": "GREETING",
                "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "GREETING"}},
            },
        ],
        volumeMounts=[{"name": "work", "mountPath": "/work"}],
    )
    main = python(
        "import os, pathlib, sys; "
        "ok = pathlib.Path(sys.argv[1], 'greeting').read_text() == 'hello' "
        "and os.environ['POD_NAME'] == 'job' and os.environ['KUBECONFIG']; "
        "sys.exit(0 if ok else 1)",
        args=["/work"],
        env=[{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        volumeMounts=[{"name": "work", "mountPath": "/work"}],
    )
    pod = pod_manifest(
        "job",
        [main],
        restart_policy="Never",
        initContainers=[init],
        volumes=[{"name": "work", "emptyDir": {}}],
    )
    async with running(host, pod):
        await until("Succeeded", lambda: host.status.get("phase") == "Succeeded")
    assert host.status["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert host.container("main")["state"]["terminated"]["exitCode"] == 0


@pytest.fixture(autouse=True)
def _no_leftover_children() -> Iterator[None]:
    """No process the test started is left. Children of pytest that were there before it are
    not its own: a session's shared fixtures (the real-SGLang engine pool) outlive tests, and a
    pytest-xdist worker runs other modules' tests before and after this one."""
    before = set(_children())
    yield
    left = set(_children()) - before
    assert sys.platform != "linux" or not left, f"a container process outlived its test: {left}"


async def test_a_container_ends_with_everything_its_command_started(host: FakePodHost) -> None:
    """A command that leaves a process behind in its own session (as the launcher's server
    is): when the command exits, the leftover goes too, as with a container's PID 1."""
    leaver = python(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
        " start_new_session=True)\n"
        "print('leftover', child.pid, flush=True)\n"
        "time.sleep(0.5)\n"
        "sys.exit(4)\n",
    )
    pod = pod_manifest("leaver", [leaver], restart_policy="Never")
    async with running(host, pod) as supervisor:
        await until("the command done", lambda: host.status.get("phase") == "Failed")
        log = (supervisor.pod_dir / "main.log").read_text()
    leftover = int(log.split("leftover ", 1)[1].split()[0])
    assert _gone(leftover)
    assert host.container("main")["state"]["terminated"]["exitCode"] == 4


def _gone(pid: int) -> bool:
    """No such process, or only its zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _children() -> list[str]:
    import os

    me = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[1] == me and fields[0] != "Z":
                found.append(stat.parent.name)
    return found
