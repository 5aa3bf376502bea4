"""The pre-flight of SGLang-JAX (`TPUSERVE_ENGINE=sglang-jax`): the same checks through JAX.

The stack is jax and libtpu installed (no torch), the chips are what `jax.local_devices()`
shows, the execution mode is not asked, and the compile cache checked is JAX's directory.
`FakeTPUProbe` answers as the `jax-device` probe would (tests/fakes.py); the probe script
itself runs against real JAX in tests/component/launch/test_preflight_jax_probe.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from sglang_tpu import preflight
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.preflight import DeviceFacts, Expectation, Reason, Report, run_preflight
from sglang_tpu.tpu_stack import StackVersions
from tests.contract_env import contract_env
from tests.fakes import FakeTPUProbe

pytestmark = pytest.mark.unit

JAX_STACK = StackVersions("/opt/sglang-jax/bin/python3", None, None, "0.0.40", jax="0.10.2")
V5E_2X2 = contract_env("v5e", "2x2", 1, 4, 0) | {"TPUSERVE_ENGINE": "sglang-jax"}


def matching(missing: str | None = None) -> FakeTPUProbe:
    probe = FakeTPUProbe.matching("v5e", "2x2")
    # JAX answers no eager modes or compile backend: they are TorchTPU's
    facts = dataclasses.replace(probe.facts, eager_modes=None, compile_backend_tpu=None)
    stack = {
        None: JAX_STACK,
        "jax": dataclasses.replace(JAX_STACK, jax=None),
        "libtpu": dataclasses.replace(JAX_STACK, libtpu=None),
    }[missing]
    return FakeTPUProbe(stack, facts)


def run(env: dict[str, str], probe: FakeTPUProbe) -> Report:
    return run_preflight(Expectation.from_contract(LaunchContract.from_env(env), {}), probe)


def test_jax_stack_and_the_contracts_chips_pass_without_asking_for_an_execution_mode() -> None:
    probe = matching()
    report = run(V5E_2X2, probe)
    assert report.ok, report.failures
    assert probe.asked == ["versions", "device"]
    statuses = {c.name: c.status for c in report.checks}
    assert statuses == {
        "stack": "passed",
        "accelerator": "passed",
        "chips": "passed",
        "hbm": "passed",
        "execution mode": "skipped",
        "compile cache": "skipped",
    }


@pytest.mark.parametrize("missing", ["jax", "libtpu"])
def test_a_missing_jax_or_libtpu_fails_the_stack_and_never_opens_the_chips(missing: str) -> None:
    probe = matching(missing)
    report = run(V5E_2X2, probe)
    assert report.reason == Reason.TPU_STACK_MISSING
    assert f"{missing} not installed" in report.failures[0].message
    assert "jax[tpu]==0.10.2" in report.failures[0].message
    assert probe.asked == ["versions"]


def test_jax_seeing_fewer_devices_is_a_chip_count_mismatch_named_for_jax() -> None:
    probe = matching()
    probe.facts = dataclasses.replace(
        probe.facts,
        device_count=1,
        device_names=probe.facts.device_names[:1],
        total_memory_bytes=probe.facts.total_memory_bytes[:1],
    )
    report = run(V5E_2X2, probe)
    assert report.reason == Reason.CHIP_COUNT_MISMATCH
    assert report.failures[0].message.startswith("JAX devices on this host: 1 is not allowed")


def test_jax_on_the_cpu_platform_is_an_accelerator_mismatch() -> None:
    probe = matching()
    probe.facts = DeviceFacts(accelerator="cpu", device_count=1, device_names=("cpu",))
    report = run(V5E_2X2, probe)
    assert report.reason == Reason.ACCELERATOR_MISMATCH
    assert report.failures[0].message.startswith("jax.local_devices() platform: 'cpu'")


def test_the_compile_cache_checked_is_jaxs_directory() -> None:
    env = V5E_2X2 | {"TPUSERVE_COMPILE_CACHE_DIR": "/cache"}
    expect = Expectation.from_contract(LaunchContract.from_env(env), {})
    assert expect.jax
    assert expect.cache_dirs[-1].endswith("/jax")
    assert not [d for d in expect.cache_dirs if d.endswith(("/torch_tpu", "/inductor"))]


def test_the_real_probe_runs_the_jax_device_mode_for_sgl_jax(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    modes: list[str] = []

    def record(self: preflight.SubprocessProbe, mode: str, timeout: float) -> dict[str, object]:
        modes.append(mode)
        return {"python": self.python, "jax": "0.10.2", "libtpu": "0.0.40"}

    monkeypatch.setattr(preflight.SubprocessProbe, "_run", record)
    contract = LaunchContract.from_env(V5E_2X2)
    preflight.preflight(contract, {}, {}, "python3")
    assert modes == ["versions", "jax-device"]
