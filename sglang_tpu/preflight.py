"""The launcher's pre-flight: is this pod's TPU stack and silicon the one its contract says?

`tpuserve engine launch` runs it before it fetches weights or starts SGLang (and
`tpuserve engine preflight` runs it alone). Checks, in the order a failure is reported:

1. **stack**: torch, torch-tpu and libtpu, as the interpreter that will run SGLang has them
   installed, work together (`sglang_tpu.tpu_stack`, read from package metadata, never by
   importing torch_tpu, whose import is what raises on libtpu `0.0.42.1`);
2. **accelerator**: torch's accelerator is `tpu` and its devices are of the contract's
   generation (device names from TorchTPU; else the PCI ids on the bus, else the
   `TPU_ACCELERATOR_TYPE` the node set before the launcher's);
3. **chips**: TorchTPU sees the slice's devices per host (catalog: chips per host x devices
   per chip);
4. **HBM**: each device has the catalog's HBM per device (within `HBM_TOLERANCE`);
5. **execution mode**: TorchTPU offers what `TPUSERVE_EXECUTION_MODE` asks for (the `tpu`
   compile backend, or the eager mode);
6. **compiled tokens**: a compiled step is not asked of a torch-tpu known to compile SGLang's
   step to wrong tokens with the KV pool's writes in the graph, unless the engine image
   declares them eager (`tpu_stack.WRONG_TOKEN_RULES`, `tpu_stack.KV_WRITES_ENV`);
7. **compile cache**: every compile-cache directory can be created and written.

Checks 1-6 run for real SGLang on a TPU (`TPUSERVE_ENGINE=sglang`, `TPUSERVE_DEVICE=tpu`).
SGLang-JAX on a TPU (`sglang-jax`) gets them through JAX instead of torch: the stack is jax
and libtpu installed, the chips are `jax.local_devices()` (platform, kind, count, the HBM
of `memory_stats()`), and the execution mode is not checked (JAX compiles every step). The
twin and the cpu device get check 7 only. The TPU is looked at through a `Probe`:
`SubprocessProbe` runs `preflight_probe.py` (mode `device`, or `jax-device`) with the
interpreter and environment the engine will get, in a process of its own that exits before
the engine starts (one process at a time can hold a TPU); tests pass fakes (`tests/fakes.py`).

A failed pre-flight exits `EXIT_PREFLIGHT_FAILED` and writes its reason where Kubernetes
shows it: the container's termination message (`TPUSERVE_TERMINATION_MESSAGE_PATH`, the
pod's `terminationMessagePath`), one line per problem, `<Reason>: <message>`
(`termination_message`, `parse_termination_message`). The operator reads it from the pod's
status and reports it as the TPUModelServer's Degraded condition and an Event.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from sglang_tpu import compile_cache, tpu_stack
from sglang_tpu.contract.env_names import Var
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.preflight_probe import PROBE_MARKER
from sglang_tpu.preflight_reasons import REASON_MEANINGS as REASON_MEANINGS
from sglang_tpu.preflight_reasons import TERMINATION_MESSAGE_BYTES as TERMINATION_MESSAGE_BYTES
from sglang_tpu.preflight_reasons import Failure as Failure
from sglang_tpu.preflight_reasons import Reason as Reason
from sglang_tpu.preflight_reasons import parse_termination_message as parse_termination_message
from sglang_tpu.preflight_reasons import termination_message as termination_message
from sglang_tpu.preflight_reasons import write_termination_message as write_termination_message
from sglang_tpu.topology import (
    GIB,
    generation_of_accelerator_type,
    generation_of_device_name,
    generation_of_pci_device,
    get_generation,
)
from sglang_tpu.tpu_stack import StackVersions

log = logging.getLogger(__name__)

EXIT_PREFLIGHT_FAILED = 3
PROBE_SCRIPT = Path(__file__).with_name("preflight_probe.py")
VERSIONS_TIMEOUT_SECONDS = 60.0
DEVICE_TIMEOUT_SECONDS = 300.0  # importing TorchTPU and opening the chips: ~15 s on a v5e
HBM_TOLERANCE = 0.05  # of the catalog's HBM per device
PROBE_OUTPUT_BYTES = 64 * 1024
PROBE_STDERR_BYTES = 2048
ACCELERATOR_TYPE_ENV = "TPU_ACCELERATOR_TYPE"

# TorchTPU's eager modes (torch.tpu.EagerMode) each execution mode needs; compiled needs the
# `tpu` backend of torch.compile instead. The launcher's variables for them:
# sglang_tpu.launch.EAGER_MODE_ENV.
EAGER_MODE_MEMBER: Mapping[str, str] = {
    "eager": "DEFER_NEVER",
    "eager-defer-and-fuse": "DEFER_AND_FUSE",
    "eager-debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
}


CheckName = Literal[
    "stack", "accelerator", "chips", "hbm", "execution mode", "compiled tokens", "compile cache"
]
CHECK_ORDER: tuple[CheckName, ...] = (
    "stack",
    "accelerator",
    "chips",
    "hbm",
    "execution mode",
    "compiled tokens",
    "compile cache",
)


@dataclass(frozen=True, slots=True)
class Check:
    name: CheckName
    status: Literal["passed", "failed", "skipped"]
    note: str = ""
    failures: tuple[Failure, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What the device probe saw; `error` (with its `stage`) when it could not finish."""

    pci: tuple[str, ...] = ()
    accelerator: str | None = None
    device_count: int | None = None
    device_names: tuple[str | None, ...] = ()
    total_memory_bytes: tuple[int | None, ...] = ()
    eager_modes: tuple[str, ...] | None = None
    compile_backend_tpu: bool | None = None
    stage: str | None = None
    error: str | None = None
    errors: tuple[str, ...] = ()

    @classmethod
    def from_probe(cls, data: Mapping[str, Any]) -> DeviceFacts:
        devices = data.get("devices") or []
        modes = data.get("eager_modes")
        backend = data.get("compile_backend_tpu")
        return cls(
            pci=tuple(str(p) for p in data.get("pci") or ()),
            accelerator=data.get("accelerator"),
            device_count=data.get("device_count"),
            device_names=tuple(d.get("name") for d in devices),
            total_memory_bytes=tuple(d.get("total_memory") for d in devices),
            eager_modes=None if modes is None else tuple(str(m) for m in modes),
            compile_backend_tpu=None if backend is None else bool(backend),
            stage=data.get("stage"),
            error=data.get("error"),
            errors=tuple(str(e) for e in data.get("errors") or ()),
        )


class ProbeError(RuntimeError):
    """The probe process could not answer (not started, crashed, timed out)."""


class Probe(Protocol):
    """How the pre-flight looks at the TPU stack (a subprocess for real; fakes in tests)."""

    def versions(self) -> StackVersions: ...

    def device(self) -> DeviceFacts: ...


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the launch contract says the pod has (no pydantic: tests build it directly)."""

    generation: str
    topology: str
    devices_per_host: int
    hbm_bytes_per_device: int
    execution_mode: str
    tpu: bool  # a real engine on TPU: check the stack and the chips
    jax: bool = False  # SGLang-JAX: through JAX, not torch
    cache_dirs: tuple[str, ...] = ()
    accelerator_type_hint: str | None = None  # TPU_ACCELERATOR_TYPE as the node set it
    kv_writes: str | None = None  # tpu_stack.KV_WRITES_ENV as the engine image declares it

    @property
    def runtime(self) -> str:
        return "JAX" if self.jax else "TorchTPU"

    @classmethod
    def from_contract(cls, contract: LaunchContract, environ: Mapping[str, str]) -> Expectation:
        shape = contract.shape
        keyed = compile_cache.cache_dir(contract)
        dirs = [] if keyed is None else [keyed]
        on_tpu = contract.engine in ("sglang", "sglang-jax") and contract.device == "tpu"
        jax = contract.engine == "sglang-jax"
        if on_tpu:
            caches = compile_cache.jax_cache_env if jax else compile_cache.compile_cache_dirs
            dirs += caches(contract).values()
        return cls(
            generation=contract.generation,
            topology=contract.topology,
            devices_per_host=shape.devices_per_host,
            hbm_bytes_per_device=shape.generation.hbm_bytes_per_device,
            execution_mode=contract.execution_mode,
            tpu=on_tpu,
            jax=jax,
            cache_dirs=tuple(dict.fromkeys(dirs)),
            accelerator_type_hint=environ.get(ACCELERATOR_TYPE_ENV) or None,
            kv_writes=environ.get(tpu_stack.KV_WRITES_ENV) or None,
        )


@dataclass(frozen=True, slots=True)
class Report:
    checks: tuple[Check, ...]
    versions: StackVersions | None = None
    device: DeviceFacts | None = None

    @property
    def failures(self) -> list[Failure]:
        order = {name: i for i, name in enumerate(CHECK_ORDER)}
        ordered = sorted(self.checks, key=lambda c: order[c.name])
        return [f for c in ordered for f in c.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def reason(self) -> Reason | None:
        failures = self.failures
        return failures[0].reason if failures else None

    def termination_message(self) -> str:
        return termination_message(self.failures)

    def to_json(self) -> dict[str, Any]:
        failures = self.failures
        return {
            "ok": not failures,
            "reason": str(failures[0].reason) if failures else None,
            "message": failures[0].message if failures else None,
            "checks": [
                {
                    "name": c.name,
                    "status": c.status,
                    "note": c.note,
                    "failures": [
                        {
                            "reason": str(f.reason),
                            "field": f.field,
                            "value": f.value,
                            "allowed": f.allowed,
                            "message": f.message,
                        }
                        for f in c.failures
                    ],
                }
                for c in self.checks
            ],
            "versions": None if self.versions is None else asdict(self.versions),
            "device": None if self.device is None else asdict(self.device),
        }


# -- the real probe ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubprocessProbe:
    """`python preflight_probe.py MODE` with SGLang's interpreter and environment."""

    python: str
    env: Mapping[str, str]
    device_mode: Literal["device", "jax-device"] = "device"
    versions_timeout_seconds: float = VERSIONS_TIMEOUT_SECONDS
    device_timeout_seconds: float = DEVICE_TIMEOUT_SECONDS

    def versions(self) -> StackVersions:
        data = self._run("versions", self.versions_timeout_seconds)
        return StackVersions(
            python=str(data.get("python") or self.python),
            torch=data.get("torch"),
            torch_tpu=data.get("torch_tpu"),
            libtpu=data.get("libtpu"),
            jax=data.get("jax"),
        )

    def device(self) -> DeviceFacts:
        return DeviceFacts.from_probe(self._run(self.device_mode, self.device_timeout_seconds))

    def _run(self, mode: str, timeout_seconds: float) -> dict[str, Any]:
        argv = [self.python, str(PROBE_SCRIPT), mode]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                process = subprocess.Popen(
                    argv,
                    env=dict(self.env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # so a timeout kills whatever it started too
                )
            except OSError as error:
                raise ProbeError(f"cannot run {self.python}: {error}") from None
            try:
                code = process.wait(timeout_seconds)
            except subprocess.TimeoutExpired:
                _kill_group(process.pid)
                process.wait()
                raise ProbeError(
                    f"the {mode} probe ({self.python}) did not answer within "
                    f"{timeout_seconds:g} s; stderr ends: {_tail(err, PROBE_STDERR_BYTES)}"
                ) from None
            answer = _answer(_tail(out, PROBE_OUTPUT_BYTES))
            if answer is None:
                raise ProbeError(
                    f"the {mode} probe ({self.python}) exited with status {code} and no "
                    f"answer; stderr ends: {_tail(err, PROBE_STDERR_BYTES) or '(empty)'}"
                )
            return answer


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _tail(file: Any, limit: int) -> str:
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - limit))
    return str(file.read().decode(errors="replace")).strip()


def _answer(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(PROBE_MARKER + " "):
            try:
                data = json.loads(line[len(PROBE_MARKER) + 1 :])
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None


# -- the checks -------------------------------------------------------------------------------


def cache_dir_problem(directory: str) -> str | None:
    """None when `directory` can be created and a file written in it, else why not."""
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".tpuserve-preflight-") as probe:
            probe.write(b"ok")
            probe.flush()
    except OSError as err:
        return f"{type(err).__name__}: {err.strerror or err}"
    return None


def check_compile_cache(
    expect: Expectation, problem_of: Callable[[str], str | None] = cache_dir_problem
) -> Check:
    if not expect.cache_dirs:
        return Check("compile cache", "skipped", f"{Var.COMPILE_CACHE_DIR} is unset: no cache")
    failures: list[Failure] = []
    for directory in expect.cache_dirs:
        if any(directory.startswith(f.value.rstrip("/") + "/") for f in failures):
            continue  # below a directory that failed already
        problem = problem_of(directory)
        if problem is not None:
            failures.append(
                Failure(
                    Reason.COMPILE_CACHE_UNWRITABLE,
                    f"compile cache ({Var.COMPILE_CACHE_DIR})",
                    directory,
                    "a directory this container can create and write (a writable volume)",
                    f"{problem}; compiled programs could not persist, so every start "
                    "would compile from scratch",
                )
            )
    if failures:
        return Check("compile cache", "failed", failures=tuple(failures))
    return Check("compile cache", "passed", f"{len(expect.cache_dirs)} directories writable")


def check_jax_stack(versions: StackVersions) -> Check:
    """SGLang-JAX's stack: jax and libtpu installed (their pairing is jax[tpu]'s to pin)."""
    missing = [name for name in ("jax", "libtpu") if getattr(versions, name) is None]
    if not missing:
        return Check("stack", "passed", f"jax {versions.jax}, libtpu {versions.libtpu}")
    failure = Failure(
        Reason.TPU_STACK_MISSING,
        f"TPU stack of {versions.python}",
        ", ".join(f"{name} not installed" for name in missing),
        "jax and libtpu installed for the interpreter that runs SGLang-JAX",
        f"install {tpu_stack.JAX_IMAGE_PIN} (sglang_tpu/Dockerfile.sglang-jax)",
    )
    return Check("stack", "failed", failures=(failure,))


def check_stack(versions: StackVersions) -> Check:
    problems = tpu_stack.check_stack(versions)
    if not problems:
        rule = tpu_stack.rule_for(versions.torch_tpu or "")
        note = versions.describe()
        if rule is None:
            note += " (torch-tpu not in the compatibility table: only the libtpu format checked)"
        return Check("stack", "passed", note)
    fix = tpu_stack.fix_text(problems, versions)
    missing = [p for p in problems if p.missing]
    if missing:
        failure = Failure(
            Reason.TPU_STACK_MISSING,
            f"TPU stack of {versions.python}",
            ", ".join(f"{p.package} not installed" for p in missing),
            "torch, torch-tpu and libtpu installed for the interpreter that runs SGLang",
            f"found {versions.describe()}; {fix}",
        )
        return Check("stack", "failed", failures=(failure,))
    failure = Failure(
        Reason.TPU_STACK_INCOMPATIBLE,
        f"TPU stack of {versions.python}",
        ", ".join(dict.fromkeys(f"{p.package} {p.found}" for p in problems)),
        "; ".join(f"{p.package} {p.allowed}" for p in problems),
        f"{'; '.join(p.detail for p in problems)} (found {versions.describe()}); {fix}",
    )
    return Check("stack", "failed", failures=(failure,))


def _observed_generation(facts: DeviceFacts | None, expect: Expectation) -> tuple[str, str] | None:
    """(generation, how it was seen) of the chips, by the most direct evidence at hand."""
    if facts is not None:
        for name in facts.device_names:
            found = generation_of_device_name(name) if name else None
            if found is not None:
                return found, f"TorchTPU calls the device {name!r}"
        for pci in facts.pci:
            found = generation_of_pci_device(pci)
            if found is not None:
                return found, f"the PCI bus has Google device {pci}"
    if expect.accelerator_type_hint:
        found = generation_of_accelerator_type(expect.accelerator_type_hint)
        if found is not None:
            hint = expect.accelerator_type_hint
            return found, f"the node set {ACCELERATOR_TYPE_ENV}={hint}"
    return None


def _accelerator_mismatch(expect: Expectation, facts: DeviceFacts | None) -> Failure | None:
    seen = _observed_generation(facts, expect)
    if seen is None or seen[0] == expect.generation:
        return None
    generation, evidence = seen
    return Failure(
        Reason.ACCELERATOR_MISMATCH,
        f"TPU generation ({Var.TPU_GENERATION})",
        expect.generation,
        f"{generation}, the chips this pod has ({evidence})",
        f"the spec asks for {expect.generation} {expect.topology} but the pod runs on "
        f"{generation}; set spec.tpu.generation to {generation} or schedule the pod on "
        f"{expect.generation} nodes",
    )


def check_device(expect: Expectation, facts: DeviceFacts) -> list[Check]:
    """Checks 2-5 from what the device probe saw."""
    if facts.error is not None:
        mismatch = _accelerator_mismatch(expect, facts)
        if mismatch is not None:
            return [Check("accelerator", "failed", facts.error, (mismatch,))]
        reason = (
            Reason.TPU_STACK_INCOMPATIBLE if facts.stage == "import" else (Reason.TPU_PROBE_FAILED)
        )
        failure = Failure(
            reason,
            expect.runtime if facts.stage == "import" else f"{expect.runtime} ({facts.stage})",
            facts.error,
            f"import {'jax' if expect.jax else 'torch_tpu'} and open the chips without an error",
            "the versions passed the compatibility table, so this combination is new to it"
            if facts.stage == "import"
            else "another process may hold the chips, or the TPU environment is wrong",
        )
        return [Check("stack" if facts.stage == "import" else "accelerator", "failed",
                      failures=(failure,))]  # fmt: skip
    accelerator = _check_accelerator(expect, facts)
    if accelerator.status == "failed":  # counts and sizes of other chips say nothing more
        why = "the chips are not the contract's"
        return [accelerator, Check("chips", "skipped", why), Check("hbm", "skipped", why),
                _check_mode(expect, facts)]  # fmt: skip
    return [accelerator, _check_chips(expect, facts), _check_hbm(expect, facts),
            _check_mode(expect, facts)]  # fmt: skip


def _check_accelerator(expect: Expectation, facts: DeviceFacts) -> Check:
    if facts.accelerator != "tpu":
        failure = Failure(
            Reason.ACCELERATOR_MISMATCH,
            "jax.local_devices() platform"
            if expect.jax
            else "torch.accelerator.current_accelerator()",
            repr(facts.accelerator),
            "tpu",
            "JAX found no TPU (is JAX_PLATFORMS tpu and libtpu installed?)"
            if expect.jax
            else "torch-tpu did not register the TPU as torch's accelerator",
        )
        return Check("accelerator", "failed", failures=(failure,))
    mismatch = _accelerator_mismatch(expect, facts)
    if mismatch is not None:
        return Check("accelerator", "failed", failures=(mismatch,))
    names = ", ".join(sorted({str(n) for n in facts.device_names})) or "no names"
    seen = _observed_generation(facts, expect)
    note = f"{names}: {expect.generation}" if seen else f"{names}: generation not recognised"
    return Check("accelerator", "passed", note)


def _check_chips(expect: Expectation, facts: DeviceFacts) -> Check:
    if facts.device_count == expect.devices_per_host:
        return Check("chips", "passed", f"{facts.device_count} devices")
    generation = get_generation(expect.generation)
    failure = Failure(
        Reason.CHIP_COUNT_MISMATCH,
        f"{expect.runtime} devices on this host",
        str(facts.device_count),
        str(expect.devices_per_host),
        f"{expect.generation} {expect.topology} has {expect.devices_per_host} devices per "
        f"host ({expect.devices_per_host // generation.devices_per_chip} chips x "
        f"{generation.devices_per_chip} device per chip); the pod must request every chip "
        "of its host (google.com/tpu) and see them all (TPU_VISIBLE_CHIPS)",
    )
    return Check("chips", "failed", failures=(failure,))


def _check_hbm(expect: Expectation, facts: DeviceFacts) -> Check:
    want = expect.hbm_bytes_per_device
    sizes = [m for m in facts.total_memory_bytes if m is not None]
    if not sizes:
        return Check("hbm", "skipped", "TorchTPU reported no device memory")
    wrong = [m for m in sizes if abs(m - want) > HBM_TOLERANCE * want]
    if not wrong:
        return Check("hbm", "passed", f"{sizes[0] / GIB:g} GiB per device")
    failure = Failure(
        Reason.HBM_MISMATCH,
        "HBM per device",
        f"{wrong[0] / GIB:.2f} GiB ({wrong[0]} bytes)",
        f"{want / GIB:g} GiB within {HBM_TOLERANCE:.0%} (the catalog's {expect.generation})",
        "the chips are not what the topology catalog says this generation has, so the HBM "
        "fit check and the KV-cache size would be wrong",
    )
    return Check("hbm", "failed", failures=(failure,))


def _check_mode(expect: Expectation, facts: DeviceFacts) -> Check:
    if expect.jax:
        return Check("execution mode", "skipped", "SGLang-JAX: JAX compiles every step")
    mode = expect.execution_mode
    if mode == "compiled":
        have, what = facts.compile_backend_tpu, "the torch.compile backend 'tpu'"
    else:
        member = EAGER_MODE_MEMBER[mode]
        have = None if facts.eager_modes is None else member in facts.eager_modes
        what = f"torch.tpu.EagerMode.{member}"
    if have is None:
        return Check("execution mode", "skipped", f"could not tell whether {what} exists")
    if have:
        return Check("execution mode", "passed", f"{mode}: {what}")
    offered = ["compiled"] if facts.compile_backend_tpu else []
    offered += [m for m, member in EAGER_MODE_MEMBER.items() if member in (facts.eager_modes or ())]
    failure = Failure(
        Reason.EXECUTION_MODE_UNSUPPORTED,
        f"execution mode ({Var.EXECUTION_MODE})",
        mode,
        ", ".join(offered) or "none: TorchTPU offers neither",
        f"this TorchTPU has no {what}",
    )
    return Check("execution mode", "failed", failures=(failure,))


def check_compiled_tokens(expect: Expectation, versions: StackVersions) -> Check:
    """Refuse a compiled SGLang step on a torch-tpu known to compile it to wrong tokens with
    the KV pool's writes in the graph (`tpu_stack.WRONG_TOKEN_RULES`), unless the engine image
    declares them kept eager (`tpu_stack.KV_WRITES_ENV`)."""
    name: CheckName = "compiled tokens"
    field = tpu_stack.KV_WRITES_ENV
    if expect.kv_writes is not None and expect.kv_writes not in tpu_stack.KV_WRITES_VALUES:
        failure = Failure(
            Reason.EXECUTION_MODE_UNSUPPORTED,
            field,
            expect.kv_writes,
            " or ".join(tpu_stack.KV_WRITES_VALUES) + " (or unset: graph)",
            "the engine image's declaration of where SGLang's KV pool writes run",
        )
        return Check(name, "failed", failures=(failure,))
    if expect.execution_mode != "compiled":
        return Check(name, "skipped", f"{expect.execution_mode}: nothing is compiled")
    rule = tpu_stack.compiled_wrong_tokens(versions.torch_tpu, expect.kv_writes)
    writes = expect.kv_writes or "graph"
    if rule is None:
        return Check(name, "passed", f"torch-tpu {versions.torch_tpu}, KV pool writes: {writes}")
    failure = Failure(
        Reason.EXECUTION_MODE_UNSUPPORTED,
        f"execution mode ({Var.EXECUTION_MODE}) on torch-tpu {versions.torch_tpu}",
        f"compiled, with the KV pool's writes in the graph ({field} {expect.kv_writes or 'unset'})",
        f"eager, eager-defer-and-fuse or eager-debug; compiled only from an engine image that "
        f"keeps the writes eager and sets {field}=eager",
        f"known to compile wrong tokens: {rule.seen}",
    )
    return Check(name, "failed", failures=(failure,))


def run_preflight(
    expect: Expectation,
    probe: Probe,
    cache_problem: Callable[[str], str | None] = cache_dir_problem,
) -> Report:
    """Every check the contract calls for. The device is probed only when the stack and the
    compile cache passed: TorchTPU's import itself fails when its tier-3 cache root cannot be
    written (seen on a v5e: `RuntimeError: Failed to load the backend extension: torch_tpu`),
    which would hide the cache's reason behind the stack's."""
    checks: list[Check] = []
    versions: StackVersions | None = None
    facts: DeviceFacts | None = None
    cache = check_compile_cache(expect, cache_problem)
    if expect.tpu:
        try:
            versions = probe.versions()
        except ProbeError as err:
            failure = Failure(
                Reason.TPU_PROBE_FAILED,
                "TPU stack versions",
                str(err),
                "an interpreter that can report them",
                f"set {Var.SGLANG_PYTHON} to SGLang's interpreter",
            )
            checks.append(Check("stack", "failed", failures=(failure,)))
        else:
            checks.append(check_jax_stack(versions) if expect.jax else check_stack(versions))
        if checks[-1].status == "failed":
            checks.append(Check("accelerator", "skipped", "the TPU stack cannot be imported"))
        elif cache.status == "failed":
            checks.append(cache)
            checks.append(
                Check(
                    "accelerator",
                    "skipped",
                    f"{expect.runtime} cannot start without its compile cache",
                )
            )
        else:
            try:
                facts = probe.device()
            except ProbeError as err:
                facts = DeviceFacts(stage="probe", error=str(err))
            checks += check_device(expect, facts)
        if versions is not None and not expect.jax and checks[0].status == "passed":
            checks.append(check_compiled_tokens(expect, versions))
    if cache not in checks:
        checks.append(cache)
    return Report(tuple(checks), versions, facts)


def log_report(report: Report) -> None:
    for check in report.checks:
        if check.status == "failed":
            for failure in check.failures:
                log.error("pre-flight %s: %s: %s", check.name, failure.reason, failure.message)
        else:
            log.info("pre-flight %s: %s%s", check.name, check.status,
                     f" ({check.note})" if check.note else "")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    """A pre-flight's report and the exit status it calls for (0 when it passed)."""

    report: Report
    exit_status: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "exit_status", 0 if self.report.ok else EXIT_PREFLIGHT_FAILED)


def preflight(
    contract: LaunchContract,
    environ: Mapping[str, str],
    server_env: Mapping[str, str],
    python: str,
    probe: Probe | None = None,
    cache_problem: Callable[[str], str | None] = cache_dir_problem,
) -> Outcome:
    """Run the pre-flight for `contract`; on failure, write the termination message."""
    expect = Expectation.from_contract(contract, environ)
    mode: Literal["device", "jax-device"] = "jax-device" if expect.jax else "device"
    probe = probe or SubprocessProbe(python, server_env, mode)
    report = run_preflight(expect, probe, cache_problem)
    log_report(report)
    if not report.ok:
        write_termination_message(contract.termination_message_path, report.termination_message())
    return Outcome(report)
