"""The pod runner keeps a container's termination message as the kubelet does, and a launcher
whose pre-flight refuses to start becomes the operator's Degraded condition through it.

The message is what the command wrote to `terminationMessagePath` (the file is emptied at each
start), or with `FallbackToLogsOnError` and a failed exit that wrote nothing, the end of the
run's log. The last test runs the real `tpuserve engine launch` in a pod the way the operator
renders it (the contract's `TPUSERVE_TERMINATION_MESSAGE_PATH` is the container's
`terminationMessagePath`) with SGLang's interpreter holding libtpu `0.0.42.1`, and feeds the
status the runner wrote to the operator's own status code. The API server is
`tests.fakes.FakePodHost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
from pathlib import Path
from typing import Any

import pytest

from sglang_tpu.preflight import EXIT_PREFLIGHT_FAILED
from tests.contract_env import contract_env
from tests.fakes import FakePodHost, pod_manifest, stand_in_tpu_python
from tests.waiting import eventually_async
from tpuserve.cluster.pods.pod import PodSupervisor
from tpuserve_operator.conditions import DEGRADED
from tpuserve_operator.observed import pod_view
from tpuserve_operator.status import GroupObservation, decide, report_group

pytestmark = pytest.mark.component

IMAGE = "ghcr.io/tpuserve/tpuserve:test"
TIMEOUT_SECONDS = 60.0
WRITE_MESSAGE = (
    "import os, sys\n"
    "open(os.environ['MESSAGE_FILE'], 'w').write('NotMine: written on the way out')\n"
    "sys.exit(4)\n"
)


@pytest.fixture
def host(tmp_path: Path) -> FakePodHost:
    return FakePodHost(tmp_path)


async def finished(host: FakePodHost, pod: dict[str, Any]) -> dict[str, Any]:
    """Run `pod` (restartPolicy Never) until its container exits; its terminated state."""
    supervisor = PodSupervisor(host, pod)
    task = asyncio.create_task(supervisor.run())

    def ended() -> bool:
        return bool(host.statuses) and "terminated" in host.container("main")["state"]

    async def check() -> bool:
        return ended()

    try:
        await eventually_async(
            check,
            what="the container's exit",
            timeout_seconds=TIMEOUT_SECONDS,
            interval_seconds=0.05,
            ignore=(LookupError,),
        )
    finally:
        supervisor.gone()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, TIMEOUT_SECONDS)
    terminated: dict[str, Any] = host.container("main")["state"]["terminated"]
    return terminated


def container(argv: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": "main", "image": IMAGE, "command": argv, **extra}


async def test_what_the_command_writes_to_the_path_is_the_message(host: FakePodHost) -> None:
    main = container(
        ["python", "-c", WRITE_MESSAGE],
        terminationMessagePath="/var/run/why",
        env=[{"name": "MESSAGE_FILE", "value": "/var/run/why"}],
    )
    ended = await finished(host, pod_manifest("writes", [main], restart_policy="Never"))
    assert ended["exitCode"] == 4
    assert ended["message"] == "NotMine: written on the way out"


async def test_a_failure_that_wrote_nothing_falls_back_to_the_end_of_its_log(
    host: FakePodHost, tmp_path: Path
) -> None:
    code = "import sys\nfor i in range(200): print('line', i)\nsys.exit(1)"
    main = container(["python", "-c", code], terminationMessagePolicy="FallbackToLogsOnError")
    ended = await finished(host, pod_manifest("logs", [main], restart_policy="Never"))
    lines = ended["message"].splitlines()
    assert lines[-1] == "line 199"
    assert len(lines) <= 80
    assert len(ended["message"].encode()) <= 2048
    plain = container(["python", "-c", code])
    ended = await finished(
        FakePodHost(tmp_path / "b"), pod_manifest("p", [plain], restart_policy="Never")
    )
    assert "message" not in ended  # the default policy (File) does not fall back


async def test_a_refusing_launcher_degrades_the_server_with_the_preflights_reason(
    host: FakePodHost, tmp_path: Path
) -> None:
    python = stand_in_tpu_python(tmp_path, "0.0.42.1")
    contract = contract_env("v5e", "1x1", 1, 1, 0, model=str(tmp_path / "model"))
    env = {
        **contract,
        "TPUSERVE_SGLANG_PYTHON": str(python),
        "TPUSERVE_TERMINATION_MESSAGE_PATH": "/dev/termination-log",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    main = container(
        ["tpuserve", "engine", "launch"],
        env=[{"name": k, "value": v} for k, v in env.items()],
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="FallbackToLogsOnError",
    )
    pod = pod_manifest("qwen-r0-0", [main], restart_policy="Never")
    ended = await finished(host, pod)
    assert ended["exitCode"] == EXIT_PREFLIGHT_FAILED
    assert ended["message"].startswith("TPUStackIncompatible: ")

    status = {**host.status, "containerStatuses": [host.container("main")]}
    view = pod_view({"metadata": {**pod["metadata"], "labels": {}}, "status": status})
    group = GroupObservation(0, "qwen-r0", True, False, "rev", (view,))
    now = datetime.datetime.now(datetime.UTC)
    report = report_group(group, hosts=1, revision="rev", previous=None, now=now)
    decided = decide(
        replicas=1,
        reports=[report],
        plan=None,
        invalid=None,
        router_enabled=False,
        router_ready_replicas=0,
    )
    degraded = next(c for c in decided if c.type == DEGRADED)
    assert (degraded.status, degraded.reason) == ("True", "TPUStackIncompatible")
    assert "libtpu 0.0.42.1" in degraded.message
    assert "libtpu>=0.0.50" in degraded.message
