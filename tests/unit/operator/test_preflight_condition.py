"""A pod whose launcher's pre-flight refused to start degrades its group and the server with the
pre-flight's own reason and message, read from the container's termination message; the
engine container is rendered so that Kubernetes keeps that message."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from sglang_tpu import preflight
from sglang_tpu.contract.env_names import Var
from tests.unit.operator.conftest import RenderFn
from tpuserve_operator import conditions, launch_contract
from tpuserve_operator.conditions import DEGRADED, Reason
from tpuserve_operator.observed import pod_view
from tpuserve_operator.status import GroupObservation, decide, report_group

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 12, 6, 12, 0, 0, tzinfo=datetime.UTC)
MESSAGE = (
    "TPUStackIncompatible: TPU stack of python3: libtpu 0.0.42.1 is not allowed; allowed: "
    "libtpu >= 0.0.50; fix: install 'libtpu>=0.0.50'\n"
    "CompileCacheUnwritable: compile cache (TPUSERVE_COMPILE_CACHE_DIR): /x is not allowed"
)


def engine_pod(
    state: dict[str, Any], last: dict[str, Any] | None = None, restarts: int = 1
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "qwen-r0-0",
            "labels": {"serving.tpuserve.dev/replica": "0", "serving.tpuserve.dev/role": "leader"},
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "engine",
                    "restartCount": restarts,
                    "state": state,
                    "lastState": last or {},
                }
            ],
        },
    }


def terminated(code: int = preflight.EXIT_PREFLIGHT_FAILED, message: str = MESSAGE) -> Any:
    return {"terminated": {"exitCode": code, "reason": "Error", "message": message}}


BACK_OFF = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}}


def test_every_preflight_reason_is_an_operator_reason_documented_for_degraded() -> None:
    documented = {(r.type, r.status, r.reason) for r in conditions.REASONS}
    for reason in preflight.Reason:
        assert str(Reason(str(reason))) == str(reason)  # same spelling in both enums
        assert (DEGRADED, "True", Reason(str(reason))) in documented


def test_the_reason_comes_from_the_last_exit_while_the_container_backs_off() -> None:
    view = pod_view(engine_pod(BACK_OFF, terminated()))
    assert view.preflight_failure is not None
    reason, message = view.preflight_failure
    assert reason == "TPUStackIncompatible"
    assert message.startswith("engine: TPU stack of python3: libtpu 0.0.42.1")
    assert message.endswith("(and 1 more: CompileCacheUnwritable)")
    assert view.crash_loop is not None  # a crash loop too, but the pre-flight says why
    assert pod_view(engine_pod(terminated(), restarts=0)).preflight_failure is not None


@pytest.mark.parametrize(
    ("state", "last"),
    [
        ({"running": {}}, terminated()),  # restarted since, and its pre-flight passed
        (BACK_OFF, terminated(code=1)),  # another failure
        (BACK_OFF, terminated(message="Traceback (most recent call last):\n  ...")),
        (BACK_OFF, terminated(message="")),
    ],
)
def test_other_exits_are_not_a_preflight_failure(state: Any, last: Any) -> None:
    assert pod_view(engine_pod(state, last)).preflight_failure is None


def test_the_group_and_the_server_are_degraded_with_the_preflights_reason() -> None:
    view = pod_view(engine_pod(BACK_OFF, terminated()))
    obs = GroupObservation(0, "qwen-r0", True, False, "rev", (view,))
    group = report_group(obs, hosts=1, revision="rev", previous=None, now=NOW)
    assert (group.state, group.reason) == ("Degraded", Reason.TPU_STACK_INCOMPATIBLE)
    assert "pod qwen-r0-0: engine: TPU stack of python3" in group.message
    decided = decide(
        replicas=1,
        reports=[group],
        plan=None,
        invalid=None,
        router_enabled=True,
        router_ready_replicas=1,
    )
    (degraded,) = [c for c in decided if c.type == DEGRADED]
    assert (degraded.status, degraded.reason) == ("True", "TPUStackIncompatible")
    assert "libtpu 0.0.42.1" in degraded.message
    (transition,) = [t for t in conditions.transitions([], decided) if t.condition is degraded]
    assert transition.warning  # posted as a Warning Event with the same reason


def test_the_engine_container_keeps_the_termination_message(rendered: RenderFn) -> None:
    workloads = [c for c in rendered().children if c["kind"] == "StatefulSet"]
    assert workloads
    for workload in workloads:
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        check_container(container)


def check_container(container: dict[str, Any]) -> None:
    assert container["terminationMessagePath"] == launch_contract.TERMINATION_MESSAGE_PATH
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[Var.TERMINATION_MESSAGE_PATH] == launch_contract.TERMINATION_MESSAGE_PATH
