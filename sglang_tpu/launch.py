"""`tpuserve engine launch`: turn a pod's launch contract into a running model server.

Steps: read and validate the contract from the environment (exit 2 listing every problem),
derive the TorchTPU environment and the server command (`plan`, pure), then either print
them (`--dry-run`) or check the TPU stack and chips against the contract (the pre-flight,
`sglang_tpu.preflight`: exit 3 with its reason in the termination message), fetch the
weights, create the cache directories and run the server as a child process (`supervise`):
SIGTERM and SIGINT are forwarded, the server gets `TPUSERVE_DRAIN_TIMEOUT_SECONDS` to drain
before its process group is killed, and the launcher exits with the server's status (128 + N
when it died of signal N).

With `TPUSERVE_ENGINE=simulated` the leader runs `tpuserve engine sim` with the same slice,
ports and model name, and the other hosts only hold their place in the group (`sleep
infinity`), as SGLang's non-leader ranks serve no HTTP API. Leaders (host index 0) are the
only routable pods in both modes.

With `TPUSERVE_ENGINE=sglang-jax` the server is SGLang-JAX (`sglang_tpu.sgl_jax_command`):
libtpu's and JAX's environment instead of TorchTPU's, JAX's compilation cache on the
managed compile cache, and a pre-flight through JAX instead of torch.

With `TPUSERVE_DEVICE=cpu` (a development target, one host) the launcher starts real SGLang
on this machine's CPU instead of TorchTPU: no TorchTPU environment, SGLang's CPU engine and
offline variables (`sglang_flags.CPU_ENV`), the CPU flags (`sglang_flags.CPU_FLAGS`), and a
pure-torch `sgl_kernel` stand-in first on PYTHONPATH (`TPUSERVE_CPU_KERNEL_SHIM_DIR`, by
default the `sglang_tpu.cpu_shim` package's directory when it is installed).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sglang_tpu import (
    compile_cache,
    lora,
    model_source,
    perf_model,
    preflight,
    sgl_jax_command,
    sglang_command,
    sglang_flags,
)
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.problems import ContractError
from sglang_tpu.contract.torch_tpu import torch_tpu_env

log = logging.getLogger(__name__)

DESCRIPTION = """Start SGLang on TorchTPU (or the simulated engine) from the pod's launch contract.

Reads the TPUSERVE_* variables the operator sets (docs/engine-launch.md lists them), checks
them against the topology catalog, derives the TorchTPU environment (TPU_WORKER_HOSTNAMES,
NODE_RANK, MASTER_ADDR, TORCH_TPU_*) and the SGLang command line, fetches the weights, and
runs the server until it exits; SIGTERM drains it within TPUSERVE_DRAIN_TIMEOUT_SECONDS.

Before it fetches anything, a pre-flight checks the TPU stack (torch, torch-tpu, libtpu
versions), the chips TorchTPU sees (generation, count, HBM), the execution mode and the
compile cache against the contract (`tpuserve engine preflight` runs it alone).

exit status: the server's (128 + N if it died of signal N); 2 when the contract is
invalid; 3 when the pre-flight fails (its reasons in TPUSERVE_TERMINATION_MESSAGE_PATH);
1 when the weights cannot be fetched; 127 when the server cannot be started.

example (one host of a two-host tpu7x 2x2x2 slice):
  TPUSERVE_MODEL=hf://Qwen/Qwen3-8B TPUSERVE_TPU_GENERATION=tpu7x \\
  TPUSERVE_TPU_TOPOLOGY=2x2x2 TPUSERVE_HOSTS=2 TPUSERVE_CHIPS_PER_HOST=4 \\
  TPUSERVE_HOST_INDEX=1 TPUSERVE_WORKER_HOSTNAMES=tpu-vm-0,tpu-vm-1 \\
  TPUSERVE_WEIGHTS_CACHE_DIR=/mnt/disks/weights tpuserve engine launch --dry-run

TPUSERVE_DEVICE=cpu starts real SGLang on this machine's CPU instead (a development target;
TPUSERVE_SGLANG_PYTHON names the interpreter with SGLang installed).

TPUSERVE_ENGINE=sglang-jax runs SGLang-JAX (`python -m sgl_jax.launch_server`) instead, with
JAX's TPU environment and compilation cache (docs/sglang-jax.md); TPUSERVE_SGLANG_PYTHON then
names the interpreter with sgl_jax installed.
"""

EXIT_INVALID_CONTRACT = 2
EXIT_PREFLIGHT_FAILED = preflight.EXIT_PREFLIGHT_FAILED
EXIT_FETCH_FAILED = 1
EXIT_CANNOT_START = 127  # as a shell reports a command it cannot run
PR_SET_PDEATHSIG = 1  # prctl option, <linux/prctl.h>

# TorchTPU 0.2.0 reads these at start-up as booleans ("1"/"0"/"true"/"false"; read from its
# wheel); unset, TorchTPU never defers.
EAGER_MODE_ENV: Mapping[str, Mapping[str, str]] = {
    "compiled": {},
    "eager": {"TORCH_TPU_DEFER_AND_FUSE": "0", "TORCH_TPU_LAUNCH_BLOCKING": "0"},
    "eager-defer-and-fuse": {"TORCH_TPU_DEFER_AND_FUSE": "1", "TORCH_TPU_LAUNCH_BLOCKING": "0"},
    "eager-debug": {"TORCH_TPU_DEFER_AND_FUSE": "0", "TORCH_TPU_LAUNCH_BLOCKING": "1"},
}

# The simulated engine models weight bytes, not formats: the 4-bit formats time like int4.
SIM_QUANTIZATION = {"none": "bf16", "fp8": "fp8", "mxfp4": "int4", "nvfp4": "int4"}
FOLLOWER_COMMAND = ("sleep", "infinity")
# Variables removed from the server's environment on a single-host slice: TorchTPU treats
# JOB_COMPLETION_INDEX (set on Indexed Job pods) as a sign of a multi-host job.
SINGLE_HOST_UNSET = ("JOB_COMPLETION_INDEX",)
CPU_SHIM_PACKAGE = "sglang_tpu.cpu_shim"  # a pure-torch sgl_kernel lives in its directory


@dataclass(frozen=True, slots=True)
class Fetch:
    """Weights to make available before the server starts."""

    source: model_source.ModelSource
    local_path: str


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything `run` does, decided up front; `env` holds no secrets."""

    env: dict[str, str]
    command: list[str]
    fetches: list[Fetch] = field(default_factory=list)
    directories: list[str] = field(default_factory=list)

    def dry_run_json(self) -> str:
        return json.dumps({"env": self.env, "command": self.command}, sort_keys=True)


def plan(contract: LaunchContract) -> LaunchPlan:
    """The environment and command of this host's server (no I/O)."""
    if contract.engine == "sglang-jax":
        env = sgl_jax_command.sgl_jax_env(contract)
        directories = [env[name] for name in compile_cache.jax_cache_env(contract)]
    elif contract.device == "cpu" and contract.engine == "sglang":
        env = dict(sglang_flags.CPU_ENV)
        shim = cpu_kernel_shim_dir(contract)
        if shim is not None:
            env["PYTHONPATH"] = shim  # server_env puts it before any inherited PYTHONPATH
        directories = []
    else:
        env = torch_tpu_env(contract)
        shim = cpu_kernel_shim_dir(contract) if contract.engine == "sglang" else None
        if shim is not None:
            # SGLang's host side imports `sgl_kernel`, which the TPU image does not install.
            env["PYTHONPATH"] = shim
        env |= compile_cache.compile_cache_env(contract)
        env |= compile_cache.tier2_cache_env()
        env |= EAGER_MODE_ENV[contract.execution_mode]
        directories = list(compile_cache.compile_cache_dirs(contract).values())
    if contract.weights_cache_dir is not None:
        # Hub and tokenizer caches must be writable with a read-only root filesystem.
        env["HF_HOME"] = f"{contract.weights_cache_dir.rstrip('/')}/hf-home"
        directories.append(env["HF_HOME"])
    if contract.engine == "simulated":
        return LaunchPlan(env, simulated_command(contract), directories=directories)
    fetches = [Fetch(contract.source, _local(contract, contract.source))]
    draft = contract.draft_source
    if draft is not None:
        fetches.append(Fetch(draft, _local(contract, draft)))
    adapters = [(name, Fetch(src, _local(contract, src))) for name, src in contract.adapter_sources]
    build = (
        sgl_jax_command.sgl_jax_command
        if contract.engine == "sglang-jax"
        else sglang_command.sglang_command
    )
    command = build(
        contract,
        fetches[0].local_path,
        fetches[1].local_path if draft else None,
        python=sglang_python(contract),
        adapter_paths=[(name, item.local_path) for name, item in adapters],
    )
    return LaunchPlan(env, command, fetches + [item for _, item in adapters], directories)


def sglang_python(contract: LaunchContract) -> str:
    """The interpreter that runs SGLang: the contract's, else the image's `python3` on tpu
    and this launcher's own interpreter on cpu (where SGLang sits in a development venv)."""
    if contract.sglang_python is not None:
        return contract.sglang_python
    return sys.executable if contract.device == "cpu" else sglang_flags.DEFAULT_PYTHON


def cpu_kernel_shim_dir(contract: LaunchContract) -> str | None:
    """Where the pure-torch `sgl_kernel` is: the contract's directory, else the directory of
    the `sglang_tpu.cpu_shim` package when it is installed, else None (SGLang's own)."""
    if contract.cpu_kernel_shim_dir is not None:
        return contract.cpu_kernel_shim_dir
    try:
        spec = importlib.util.find_spec(CPU_SHIM_PACKAGE)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(next(iter(spec.submodule_search_locations)))


def _local(contract: LaunchContract, source: model_source.ModelSource) -> str:
    return source.local_path(contract.weights_cache_dir, contract.gcs_fuse_root)


def _zmq_endpoint(contract: LaunchContract, port: int) -> str:
    host = "*" if contract.bind_host in ("0.0.0.0", "::") else contract.bind_host
    return f"tcp://{host}:{port}"


def sim_model_profile(contract: LaunchContract) -> str | None:
    """The engine twin's model profile: the explicit one, else the HF model's, else its default."""
    if contract.sim_model_profile is not None:
        return contract.sim_model_profile
    source = contract.source
    if source.scheme == "hf" and perf_model.lookup_hf_model(source.location) is not None:
        return source.location
    return None


def simulated_command(contract: LaunchContract) -> list[str]:
    """`tpuserve engine sim` for the leader; followers only hold their place in the group.

    The twin gets the compile cache key and its keyed directory, and the extra arguments as
    its own flags (e.g. ``--startup-time-scale``)."""
    if not contract.is_leader:
        return list(FOLLOWER_COMMAND)
    command = [
        "tpuserve",
        "engine",
        "sim",
        "--host",
        contract.bind_host,
        "--port",
        str(contract.http_port),
        "--drain-grace-seconds",
        f"{contract.drain_timeout_seconds * 0.8:g}",
        "--tpu",
        contract.generation,
        "--topology",
        contract.topology,
    ]
    profile = sim_model_profile(contract)
    if contract.model_architecture is not None:  # the model's config.json facts
        command += ["--model-architecture", contract.model_architecture]
    elif profile is not None:
        command += ["--model-profile", profile]
    command += ["--served-model-name", contract.served_name]
    if contract.execution_mode != "compiled":  # the twin's steps as TorchTPU's eager ones
        command += ["--execution-mode", contract.execution_mode]
    command += ["--quantization", SIM_QUANTIZATION[contract.quantization]]
    command += ["--kv-cache-dtype", contract.kv_cache_dtype]
    if contract.context_length is not None:
        command += ["--context-length", str(contract.context_length)]
    command += ["--enable-cache-report"]  # as the SGLang command
    command += sglang_command.host_kv_flags(contract)  # the twin has the tier too
    # the twin loads no weights: it serves and lists each adapter under its source
    command += lora.lora_args([(name, str(src)) for name, src in contract.adapter_sources])
    command += ["--kv-events-endpoint", _zmq_endpoint(contract, contract.kv_events_port)]
    if contract.kv_replay_port is not None:
        endpoint = _zmq_endpoint(contract, contract.kv_replay_port)
        command += ["--kv-events-replay-endpoint", endpoint]
    command += ["--compile-cache-key", compile_cache.cache_key(contract)]
    keyed = compile_cache.cache_dir(contract)
    if keyed is not None:
        command += ["--compile-cache-dir", keyed]
    # The twin's own flags (its cold-start model, time scales) from spec.engine.args.
    return command + list(contract.sglang_extra_args)


def server_env(
    contract: LaunchContract, launch_plan: LaunchPlan, inherited: Mapping[str, str]
) -> dict[str, str]:
    """The server's whole environment: inherited, overridden by the plan, plus secrets.

    The plan's PYTHONPATH goes before the inherited one instead of replacing it.
    """
    env = {**inherited, **launch_plan.env}
    if "PYTHONPATH" in launch_plan.env and inherited.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            [launch_plan.env["PYTHONPATH"], inherited["PYTHONPATH"]]
        )
    if not contract.shape.multi_host:
        for name in SINGLE_HOST_UNSET:
            env.pop(name, None)
    token = inherited.get(contract.hf_token_env)
    if token:
        env["HF_TOKEN"] = token  # what huggingface_hub and SGLang read
    return env


def log_compile_cache(contract: LaunchContract) -> None:
    """Say whether the engine will find compiled programs under this key (hit) or not (miss):
    TorchTPU's tier-3 directory, or JAX's cache directory for SGLang-JAX."""
    if contract.engine == "sglang-jax":
        found = compile_cache.jax_cache_env(contract).get(compile_cache.JAX_CACHE_ENV)
    else:
        found = compile_cache.compile_cache_env(contract).get(compile_cache.TIER3_ROOT_ENV)
    hit = found is not None and os.path.isdir(found) and any(os.scandir(found))
    log.info(
        "compile cache %s for key %s", "hit" if hit else "miss", compile_cache.cache_key(contract)
    )


# -- running the server ---------------------------------------------------------------------


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it (128 + N for death by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(
    command: Sequence[str],
    env: Mapping[str, str],
    drain_timeout_seconds: float,
    forwarded: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
) -> int:
    """Run `command` until it exits; forward signals, kill it after the drain timeout.

    The launcher blocks the forwarded signals and SIGCHLD and takes them synchronously
    (`sigwaitinfo`), so a SIGTERM that arrives while the server is still being started is
    not lost and no handler can interrupt the bookkeeping. The server runs in its own
    session with the signal mask the launcher had, so that when it overstays the drain
    timeout, or leaves processes behind, its whole process group can be killed. On Linux
    the server is also SIGKILLed when the launcher itself dies without forwarding anything
    (`_parent_death_signal`).
    """
    watched = {*forwarded, signal.SIGCHLD}
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    die_with_launcher = _parent_death_signal(signal.SIGKILL)

    def prepare_child() -> None:  # runs in the child, between fork and exec
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        die_with_launcher()

    log.info("starting: %s", " ".join(command))
    try:
        try:
            child = subprocess.Popen(
                list(command),
                env=dict(env),
                start_new_session=True,
                preexec_fn=prepare_child,
            )
        except OSError as err:
            log.error("cannot start %s: %s", command[0], err)
            return EXIT_CANNOT_START
        deadline: float | None = None
        while child.poll() is None:
            info: signal.struct_siginfo | None
            if deadline is None:
                info = signal.sigwaitinfo(watched)
            else:
                info = signal.sigtimedwait(watched, max(0.0, deadline - time.monotonic()))
            if info is None:
                log.warning("server did not exit within %gs; killing it", drain_timeout_seconds)
                _kill_group(child.pid)
                child.wait()
            elif info.si_signo != signal.SIGCHLD:
                if deadline is None:
                    deadline = time.monotonic() + drain_timeout_seconds
                    name = signal.Signals(info.si_signo).name
                    log.info("received %s: draining for up to %gs", name, drain_timeout_seconds)
                child.send_signal(info.si_signo)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
    _kill_group(child.pid)  # whatever the server left behind
    status = exit_status(child.returncode)
    log.info("server exited with status %d", status)
    return status


def _parent_death_signal(signum: signal.Signals) -> Callable[[], None]:
    """What a forked child calls so that `signum` kills it when the launcher dies.

    The server runs in its own session, so a launcher killed outright (SIGKILL, the OOM
    killer) would otherwise leave it running, re-parented to init, with nobody to drain or
    stop it. Linux's PR_SET_PDEATHSIG covers that; if the launcher died between fork and
    prctl, the child exits at once. Elsewhere this does nothing. libc is loaded here, in the
    launcher, so the child only makes the call.
    """
    if not sys.platform.startswith("linux"):
        return lambda: None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    launcher_pid = os.getpid()

    def arm() -> None:
        # The signal comes when the thread that forked exits: `supervise` runs on the main
        # thread, so that is when the launcher does.
        if prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            os.write(2, b"tpuserve engine launch: PR_SET_PDEATHSIG failed; the server may "
                        b"outlive a launcher killed outright\n")  # fmt: skip
        elif os.getppid() != launcher_pid:
            os._exit(128 + int(signum))

    return arm


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


# -- the subcommand ---------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help='Print one JSON object {"env": {...}, "command": [...]} and exit; fetch nothing.',
    )
    parser.add_argument(
        "--skip-preflight",
        action="store_true",
        help="Start without checking the TPU stack, chips and compile cache first (for a "
        "stack the pre-flight does not know yet; `tpuserve engine preflight` shows why).",
    )


def run(args: argparse.Namespace) -> int:
    return launch(os.environ, dry_run=args.dry_run, check=not args.skip_preflight)


def launch(
    environ: Mapping[str, str],
    *,
    dry_run: bool,
    check: bool = True,
    probe: preflight.Probe | None = None,
) -> int:
    """`tpuserve engine launch`; `check` runs the pre-flight (with `probe`, else the real
    one) before anything is fetched or started."""
    try:
        contract = LaunchContract.from_env(environ)
    except ContractError as err:
        print(f"tpuserve engine launch: {err}", file=sys.stderr)
        return EXIT_INVALID_CONTRACT
    launch_plan = plan(contract)
    if dry_run:
        print(launch_plan.dry_run_json())
        return 0
    role = "leader" if contract.is_leader else "follower (not routable)"
    log.info(
        "replica %d host %d/%d (%s) of %s %s, engine %s",
        contract.replica_index,
        contract.host_index,
        contract.shape.hosts,
        role,
        contract.generation,
        contract.topology,
        contract.engine,
    )
    env = server_env(contract, launch_plan, environ)
    if check:
        outcome = preflight.preflight(contract, environ, env, sglang_python(contract), probe)
        if outcome.exit_status:
            print(
                f"tpuserve engine launch: pre-flight failed:\n"
                f"{outcome.report.termination_message()}",
                file=sys.stderr,
            )
            return outcome.exit_status
    if contract.engine in ("sglang", "sglang-jax"):
        log_compile_cache(contract)
    began = time.monotonic()
    try:
        for directory in launch_plan.directories:
            os.makedirs(directory, exist_ok=True)
        for item in launch_plan.fetches:
            model_source.fetch(
                item.source,
                contract.weights_cache_dir,
                contract.gcs_fuse_root,
                environ,
                contract.hf_token_env,
            )
    except (model_source.FetchError, OSError) as err:
        print(f"tpuserve engine launch: {err}", file=sys.stderr)
        return EXIT_FETCH_FAILED
    if launch_plan.fetches:
        log.info("cold start: weights took %.2f s (fetch)", time.monotonic() - began)
    return supervise(launch_plan.command, env, contract.drain_timeout_seconds)
