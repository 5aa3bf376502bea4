"""The pre-flight's `jax-device` probe against real JAX, in its own process.

`preflight_probe.py jax-device` runs with the interpreter SGLang-JAX will run under and asks
JAX what it sees; here that is the opt-in SGLang-JAX build's interpreter on this machine's
CPU (`JAX_PLATFORMS=cpu`), so JAX answers with the `cpu` platform and the pre-flight of a
v5e contract refuses it as an accelerator mismatch, naming what JAX saw. The same probe on
the v5e is the TPU lane's.
"""

from __future__ import annotations

import pytest

from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.preflight import (
    Expectation,
    Reason,
    SubprocessProbe,
    check_device,
    run_preflight,
)
from tests.contract_env import contract_env
from tests.real_sglang_jax import sgl_jax_python

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def jax_python() -> str:
    python = sgl_jax_python()  # or a skip naming scripts/build-sglang-jax.sh
    return python


def test_the_jax_probe_reports_what_real_jax_sees(jax_python: str) -> None:
    probe = SubprocessProbe(jax_python, {"JAX_PLATFORMS": "cpu"}, "jax-device")
    versions = probe.versions()
    assert versions.jax is not None
    facts = probe.device()
    assert facts.error is None, facts.error
    assert facts.accelerator == "cpu"
    assert facts.device_count is not None
    assert facts.device_count >= 1
    assert len(facts.device_names) == facts.device_count


def test_a_v5e_contract_refuses_jax_on_the_cpu_platform(jax_python: str) -> None:
    env = contract_env("v5e", "2x2", 1, 4, 0) | {"TPUSERVE_ENGINE": "sglang-jax"}
    expect = Expectation.from_contract(LaunchContract.from_env(env), {})
    probe = SubprocessProbe(jax_python, {"JAX_PLATFORMS": "cpu"}, "jax-device")
    checks = {c.name: c for c in check_device(expect, probe.device())}
    assert checks["accelerator"].status == "failed"
    (failure,) = checks["accelerator"].failures
    assert failure.reason == Reason.ACCELERATOR_MISMATCH
    assert failure.message.startswith("jax.local_devices() platform: 'cpu' is not allowed")
    assert checks["execution mode"].status == "skipped"


def test_the_stack_check_reads_the_real_interpreters_jax_and_libtpu(jax_python: str) -> None:
    env = contract_env("v5e", "2x2", 1, 4, 0) | {"TPUSERVE_ENGINE": "sglang-jax"}
    expect = Expectation.from_contract(LaunchContract.from_env(env), {})
    probe = SubprocessProbe(jax_python, {"JAX_PLATFORMS": "cpu"}, "jax-device")
    report = run_preflight(expect, probe)
    stack = next(c for c in report.checks if c.name == "stack")
    if probe.versions().libtpu is None:  # a CPU build: jax[cpu] brings no libtpu
        assert report.reason == Reason.TPU_STACK_MISSING
        assert "libtpu not installed" in stack.failures[0].message
    else:
        assert stack.status == "passed"
        assert report.reason == Reason.ACCELERATOR_MISMATCH
