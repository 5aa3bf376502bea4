"""The launcher's pre-flight against real launch contracts, with fakes of what the probe sees.

A stack and chips that match the contract pass for every slice shape in the catalog; each way
a pod can be wrong fails with its own stable reason and a message naming what was found and
what is allowed; the device is never asked once the stack is known to be broken; a failure
is written as the termination message the operator parses back; and `tpuserve engine launch`
stops with exit 3 before it fetches anything.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sglang_tpu import launch, preflight_cli
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.preflight import (
    EXIT_PREFLIGHT_FAILED,
    TERMINATION_MESSAGE_BYTES,
    DeviceFacts,
    Expectation,
    Failure,
    Reason,
    Report,
    parse_termination_message,
    run_preflight,
    termination_message,
)
from sglang_tpu.topology import GIB, SLICE_SHAPES, SliceShape
from sglang_tpu.tpu_stack import (
    KV_WRITES_ENV,
    STACK_RULES,
    WRONG_TOKEN_RULES,
    StackVersions,
    check_stack,
    release,
)
from tests.contract_env import contract_env
from tests.fakes import FakeTPUProbe

pytestmark = pytest.mark.unit

V5E = contract_env("v5e", "1x1", 1, 1, 0)


def expect(env: dict[str, str], **environ: str) -> Expectation:
    # The engine image of these tests keeps SGLang's KV pool writes eager (it declares so);
    # the compiled-tokens tests below say otherwise.
    environ.setdefault(KV_WRITES_ENV, "eager")
    environ = {k: v for k, v in environ.items() if v != "<unset>"}
    return Expectation.from_contract(LaunchContract.from_env(env), environ)


def run(env: dict[str, str], probe: FakeTPUProbe, **environ: str) -> Report:
    return run_preflight(expect(env, **environ), probe)


def only_failure(report: Report) -> Failure:
    (failure,) = report.failures
    return failure


@pytest.mark.parametrize("shape", SLICE_SHAPES, ids=lambda s: s.key)
def test_a_host_with_the_contracts_chips_and_the_image_stack_passes(shape: SliceShape) -> None:
    names = [f"h{i}.svc" for i in range(shape.hosts)]
    env = contract_env(
        shape.generation.name,
        shape.topology,
        shape.hosts,
        shape.chips_per_host,
        0,
        worker_hostnames=names if shape.multi_host else (),
    )
    probe = FakeTPUProbe.matching(shape.generation.name, shape.topology)
    report = run(env, probe)
    assert report.ok, report.failures
    assert report.reason is None
    assert probe.asked == ["versions", "device"]
    assert {c.name: c.status for c in report.checks} == {
        "stack": "passed",
        "accelerator": "passed",
        "chips": "passed",
        "hbm": "passed",
        "execution mode": "passed",
        "compiled tokens": "passed",
        "compile cache": "skipped",  # no TPUSERVE_COMPILE_CACHE_DIR
    }


def test_libtpu_0_0_42_1_is_refused_by_name_with_the_fix_and_the_chips_are_not_touched() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1", torch="2.13.0+cpu", libtpu="0.0.42.1")
    report = run(V5E, probe)
    failure = only_failure(report)
    assert failure.reason == Reason.TPU_STACK_INCOMPATIBLE
    message = failure.message
    for text in ("libtpu 0.0.42.1", "torch-tpu 0.2.0", "torch 2.13.0+cpu", "'0.0.42.1'"):
        assert text in message
    assert "libtpu>=0.0.50" in message  # the fix
    assert "three parts" in message  # what torch_tpu's set_libtpu_version() accepts
    assert "Traceback" not in message
    assert probe.asked == ["versions"]


@pytest.mark.parametrize(
    ("torch", "libtpu", "wrong"),
    [
        ("2.10.0", "0.0.50", "torch"),
        ("2.16.0", "0.0.50", "torch"),
        ("2.14.1+cpu", "0.0.42", "libtpu"),
        ("2.14.1+cpu", "0.0.49.dev20250101", "libtpu"),
        ("2.14.1+cpu", "0.0.50.1", "libtpu"),
    ],
)
def test_versions_outside_the_table_are_incompatible(torch: str, libtpu: str, wrong: str) -> None:
    report = run(V5E, FakeTPUProbe.matching("v5e", "1x1", torch=torch, libtpu=libtpu))
    failure = only_failure(report)
    assert failure.reason == Reason.TPU_STACK_INCOMPATIBLE
    assert f"{wrong} {torch if wrong == 'torch' else libtpu}" in failure.value


@pytest.mark.parametrize(
    ("torch", "libtpu"),
    [("2.11.0", "0.0.50"), ("2.15.9+cpu", "0.0.51"), ("2.13.0", "0.0.50rc1"), ("2.13", "1.0")],
)
def test_versions_inside_the_table_pass(torch: str, libtpu: str) -> None:
    assert run(V5E, FakeTPUProbe.matching("v5e", "1x1", torch=torch, libtpu=libtpu)).ok


def test_the_table_bounds_are_what_torch_tpu_0_2_declares() -> None:
    (rule,) = STACK_RULES
    assert rule.torch_text == "2.11 to 2.15"
    assert release("2.13.0+cpu") == (2, 13, 0)
    stack = StackVersions("python3", "2.13.0+cpu", "0.2.0", "0.0.42.1")
    assert {p.package for p in check_stack(stack)} == {"libtpu"}


def test_a_missing_torch_tpu_is_its_own_reason() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1", torch_tpu=None)
    failure = only_failure(run(V5E, probe))
    assert failure.reason == Reason.TPU_STACK_MISSING
    assert "torch-tpu not installed" in failure.value
    assert probe.asked == ["versions"]


def test_a_torch_tpu_the_table_does_not_know_goes_on_to_the_chips() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1", torch_tpu="0.3.0", torch="2.17.0")
    report = run(V5E, probe)
    assert report.ok
    assert "not in the compatibility table" in report.checks[0].note


def test_an_import_that_raises_despite_the_table_is_incompatible_with_its_error() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1")
    probe.facts = DeviceFacts(stage="import", error="RuntimeError: set_libtpu_version(): boom")
    failure = only_failure(run(V5E, probe))
    assert failure.reason == Reason.TPU_STACK_INCOMPATIBLE
    assert "set_libtpu_version(): boom" in failure.message


def test_chips_of_another_generation_are_an_accelerator_mismatch() -> None:
    v6e = contract_env("v6e", "1x1", 1, 1, 0)
    failure = only_failure(run(v6e, FakeTPUProbe.matching("v5e", "1x1")))
    assert failure.reason == Reason.ACCELERATOR_MISMATCH
    assert failure.value == "v6e"
    assert "v5e" in failure.allowed
    assert "'TPU v5e'" in failure.allowed


def test_when_torch_tpu_cannot_open_the_chips_the_nodes_accelerator_type_decides() -> None:
    v6e = contract_env("v6e", "1x1", 1, 1, 0)
    probe = FakeTPUProbe.matching("v5e", "1x1")
    probe.device_error = "RuntimeError: Internal error when accessing libtpu multi-process lockfile"
    probe.facts = DeviceFacts()
    hinted = run(v6e, probe, TPU_ACCELERATOR_TYPE="v5litepod-4")
    assert only_failure(hinted).reason == Reason.ACCELERATOR_MISMATCH
    assert "TPU_ACCELERATOR_TYPE=v5litepod-4" in only_failure(hinted).allowed
    unknown = only_failure(run(V5E, probe, TPU_ACCELERATOR_TYPE="v5litepod-4"))
    assert unknown.reason == Reason.TPU_PROBE_FAILED
    assert "lockfile" in unknown.message


def test_the_pci_bus_names_the_generation_when_torch_tpu_names_none() -> None:
    v6e = contract_env("v6e", "1x1", 1, 1, 0)
    probe = FakeTPUProbe.matching("v5e", "1x1")
    probe.facts = DeviceFacts(pci=("0x0063",), stage="device count", error="RuntimeError: x")
    failure = only_failure(run(v6e, probe))
    assert failure.reason == Reason.ACCELERATOR_MISMATCH
    assert "0x0063" in failure.allowed


def test_torch_without_a_tpu_accelerator_is_a_mismatch() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1")
    probe.facts = DeviceFacts(accelerator="cpu", device_count=0)
    assert Reason.ACCELERATOR_MISMATCH in [f.reason for f in run(V5E, probe).failures]


def test_too_few_devices_for_the_topology_is_a_chip_count_mismatch() -> None:
    two_by_two = contract_env("v5e", "2x2", 1, 4, 0)
    failure = only_failure(run(two_by_two, FakeTPUProbe.matching("v5e", "1x1")))
    assert failure.reason == Reason.CHIP_COUNT_MISMATCH
    assert (failure.value, failure.allowed) == ("1", "4")
    assert "v5e 2x2" in failure.message


def test_hbm_unlike_the_catalogs_is_an_hbm_mismatch() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1")
    probe.facts = dataclasses.replace(probe.facts, total_memory_bytes=(8 * GIB,))
    failure = only_failure(run(V5E, probe))
    assert failure.reason == Reason.HBM_MISMATCH
    assert "8.00 GiB" in failure.value
    assert "16 GiB" in failure.allowed


def test_hbm_as_a_v5e_reports_it_passes() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1")
    assert probe.facts.total_memory_bytes == (17179869184,)  # seen on the chip
    assert run(V5E, probe).ok


@pytest.mark.parametrize(
    ("mode", "modes", "backend"),
    [
        ("compiled", ("DEFER_NEVER",), False),
        ("eager-defer-and-fuse", ("DEFER_NEVER",), True),
        ("eager-debug", ("DEFER_NEVER", "DEFER_AND_FUSE"), True),
    ],
)
def test_an_execution_mode_torch_tpu_lacks_is_unsupported(
    mode: str, modes: tuple[str, ...], backend: bool
) -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1")
    probe.facts = dataclasses.replace(probe.facts, eager_modes=modes, compile_backend_tpu=backend)
    failure = only_failure(run({**V5E, "TPUSERVE_EXECUTION_MODE": mode}, probe))
    assert failure.reason == Reason.EXECUTION_MODE_UNSUPPORTED
    assert failure.value == mode
    assert "eager" in failure.allowed


@pytest.mark.parametrize("declared", ["<unset>", "graph"])
def test_a_compiled_step_known_to_give_wrong_tokens_is_refused_with_what_is_allowed(
    declared: str,
) -> None:
    """torch-tpu 0.2.x compiles SGLang's step to token 0 everywhere with the KV pool's writes
    in the graph (device calls 6-8): the default compiled mode from an image that does not
    declare the writes eager is refused, naming the version, the mode and the way out."""
    probe = FakeTPUProbe.matching("v5e", "1x1")
    report = run(V5E, probe, **{KV_WRITES_ENV: declared})
    failure = only_failure(report)
    assert failure.reason == Reason.EXECUTION_MODE_UNSUPPORTED
    assert "torch-tpu 0.2.0" in failure.field
    assert failure.value.startswith("compiled")
    assert "eager-defer-and-fuse" in failure.allowed
    assert f"{KV_WRITES_ENV}=eager" in failure.allowed
    assert WRONG_TOKEN_RULES[0].seen in failure.detail
    assert {c.name: c.status for c in report.checks}["compiled tokens"] == "failed"
    assert termination_message(report.failures).startswith("ExecutionModeUnsupported: ")


def test_eager_modes_and_an_image_keeping_the_writes_eager_pass_the_compiled_tokens_check() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1")
    eager = run({**V5E, "TPUSERVE_EXECUTION_MODE": "eager"}, probe, **{KV_WRITES_ENV: "<unset>"})
    assert eager.ok, eager.failures
    assert {c.name: c.status for c in eager.checks}["compiled tokens"] == "skipped"
    declared = run(V5E, probe, **{KV_WRITES_ENV: "eager"})
    assert declared.ok, declared.failures
    # A torch-tpu no rule knows: nothing is known to be wrong.
    newer = FakeTPUProbe.matching("v5e", "1x1", torch_tpu="0.3.0", torch="2.17.0")
    assert run(V5E, newer, **{KV_WRITES_ENV: "<unset>"}).ok


def test_an_unknown_kv_writes_declaration_is_refused_by_name() -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1")
    failure = only_failure(run(V5E, probe, **{KV_WRITES_ENV: "sometimes"}))
    assert failure.reason == Reason.EXECUTION_MODE_UNSUPPORTED
    assert (failure.field, failure.value) == (KV_WRITES_ENV, "sometimes")
    assert "eager or graph" in failure.allowed


def test_an_unwritable_compile_cache_is_named_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "volume").write_text("a file where the volume's directory should be")
    env = {**V5E, "TPUSERVE_COMPILE_CACHE_DIR": str(tmp_path / "volume")}
    report = run(env, FakeTPUProbe.matching("v5e", "1x1"))
    reasons = {f.reason for f in report.failures}
    assert reasons == {Reason.COMPILE_CACHE_UNWRITABLE}
    failure = report.failures[0]
    assert failure.value.startswith(str(tmp_path / "volume" / "v5e-1x1"))
    assert "TPUSERVE_COMPILE_CACHE_DIR" in failure.field


def test_a_writable_compile_cache_passes_and_holds_every_directory(tmp_path: Path) -> None:
    env = {**V5E, "TPUSERVE_COMPILE_CACHE_DIR": str(tmp_path / "cc")}
    report = run(env, FakeTPUProbe.matching("v5e", "1x1"))
    assert report.ok
    made = sorted(p.name for p in (tmp_path / "cc").rglob("*") if p.is_dir())
    assert "torch_tpu" in made
    assert "inductor" in made
    assert not [p for p in (tmp_path / "cc").rglob("*") if p.is_file()]  # probe files gone


def test_the_engine_twin_gets_only_the_compile_cache_check(tmp_path: Path) -> None:
    (tmp_path / "volume").write_text("")
    env = {
        **V5E,
        "TPUSERVE_ENGINE": "simulated",
        "TPUSERVE_COMPILE_CACHE_DIR": str(tmp_path / "volume"),
    }
    probe = FakeTPUProbe.matching("v5e", "1x1")
    report = run(env, probe)
    assert probe.asked == []
    assert [f.reason for f in report.failures] == [Reason.COMPILE_CACHE_UNWRITABLE]


def test_the_first_reason_is_the_most_fundamental(tmp_path: Path) -> None:
    (tmp_path / "volume").write_text("")
    env = {**V5E, "TPUSERVE_COMPILE_CACHE_DIR": str(tmp_path / "volume")}
    report = run(env, FakeTPUProbe.matching("v5e", "1x1", libtpu="0.0.42.1"))
    assert [f.reason for f in report.failures] == [
        Reason.TPU_STACK_INCOMPATIBLE,
        Reason.COMPILE_CACHE_UNWRITABLE,
    ]


def test_the_termination_message_parses_back_to_the_first_reason() -> None:
    report = run(V5E, FakeTPUProbe.matching("v5e", "2x2"))
    text = report.termination_message()
    assert text.startswith("ChipCountMismatch: TorchTPU devices on this host: 4 is not allowed")
    parsed = parse_termination_message(text)
    assert parsed is not None
    assert parsed[0] == Reason.CHIP_COUNT_MISMATCH
    assert parsed[1] == report.failures[0].message


def test_more_failures_are_summed_up_and_the_message_stays_within_kubernetes_limit() -> None:
    failures = [
        Failure(Reason.HBM_MISMATCH, "f", "v" * 3000, "a", "d"),
        Failure(Reason.COMPILE_CACHE_UNWRITABLE, "g", "w", "b", "e"),
    ]
    parsed = parse_termination_message(termination_message(failures))
    assert parsed is not None
    assert parsed[0] == Reason.HBM_MISMATCH
    assert parsed[1].endswith("(and 1 more: CompileCacheUnwritable)")
    long = termination_message([Failure(Reason.HBM_MISMATCH, "f", "v" * 9000, "a", "d")])
    assert len(long.encode()) <= TERMINATION_MESSAGE_BYTES


@pytest.mark.parametrize("text", ["", "Error: something else", "Traceback (most recent call)"])
def test_other_termination_messages_are_not_a_preflights(text: str) -> None:
    assert parse_termination_message(text) is None


def test_launch_stops_with_exit_3_and_the_termination_message_before_any_fetch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "termination-log"
    env = {
        **V5E,
        "TPUSERVE_MODEL": f"{tmp_path}/no-such-model",  # a fetch would exit 1
        "TPUSERVE_TERMINATION_MESSAGE_PATH": str(log),
    }
    probe = FakeTPUProbe.matching("v5e", "1x1", libtpu="0.0.42.1")
    assert launch.launch(env, dry_run=False, probe=probe) == EXIT_PREFLIGHT_FAILED
    assert log.read_text().startswith("TPUStackIncompatible: ")
    assert "TPUStackIncompatible" in capsys.readouterr().err


def test_launch_dry_run_and_a_passing_preflight_go_on(tmp_path: Path) -> None:
    env = {**V5E, "TPUSERVE_MODEL": f"{tmp_path}/no-such-model", KV_WRITES_ENV: "eager"}
    probe = FakeTPUProbe.matching("v5e", "1x1")
    assert launch.launch(env, dry_run=True, probe=probe) == 0
    assert probe.asked == []  # a dry run checks nothing
    assert launch.launch(env, dry_run=False, probe=probe) == launch.EXIT_FETCH_FAILED
    assert launch.launch(env, dry_run=False, check=False) == launch.EXIT_FETCH_FAILED


def test_preflight_command_prints_one_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    probe = FakeTPUProbe.matching("v5e", "1x1")
    v6e = contract_env("v6e", "1x1", 1, 1, 0)
    assert preflight_cli.check(v6e, as_json=True, probe=probe) == EXIT_PREFLIGHT_FAILED
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert report["reason"] == "AcceleratorMismatch"
    assert report["versions"]["libtpu"] == "0.0.50"
    assert preflight_cli.check({**V5E, KV_WRITES_ENV: "eager"}, as_json=False, probe=probe) == 0
    assert "chips: passed (1 devices)" in capsys.readouterr().out
    assert preflight_cli.check({}, as_json=True, probe=probe) == launch.EXIT_INVALID_CONTRACT
