"""`tpuserve engine preflight`: the launcher's pre-flight alone, on this host."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping

from sglang_tpu import cli_types, launch, preflight
from sglang_tpu.contract.launch_contract import LaunchContract
from sglang_tpu.contract.problems import ContractError

DESCRIPTION = """Check this host's TPU stack and chips against the pod's launch contract.

What `tpuserve engine launch` checks before it starts SGLang (docs/engine-launch.md,
"Pre-flight"): torch / torch-tpu / libtpu versions work together (read from package
metadata, without importing torch_tpu), the chips TorchTPU sees (generation, count, HBM per
device) match TPUSERVE_TPU_GENERATION / TPUSERVE_TPU_TOPOLOGY, TorchTPU offers
TPUSERVE_EXECUTION_MODE, and the compile cache can be written. TorchTPU is asked in a
process of its own with the interpreter and environment SGLang would get.

exit status: 0 when every check passed; 3 when one failed (each failure has a stable
reason, e.g. TPUStackIncompatible, AcceleratorMismatch, HBMMismatch, CompileCacheUnwritable,
written to TPUSERVE_TERMINATION_MESSAGE_PATH when set); 2 when the contract is invalid.

example (one v5e chip):
  TPUSERVE_MODEL=/models/m TPUSERVE_TPU_GENERATION=v5e TPUSERVE_TPU_TOPOLOGY=1x1 \\
  TPUSERVE_HOSTS=1 TPUSERVE_CHIPS_PER_HOST=1 TPUSERVE_HOST_INDEX=0 \\
  TPUSERVE_COMPILE_CACHE_DIR=/tmp/cc tpuserve engine preflight --json
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="Print the report as one JSON object (ok, reason, message, checks, versions, "
        "device) instead of lines.",
    )
    parser.add_argument(
        "--probe-timeout-seconds",
        type=cli_types.positive_float,
        default=preflight.DEVICE_TIMEOUT_SECONDS,
        help="How long TorchTPU may take to import and open the chips (default: %(default)g).",
    )


def run(args: argparse.Namespace) -> int:
    return check(os.environ, as_json=args.json, timeout_seconds=args.probe_timeout_seconds)


def check(
    environ: Mapping[str, str],
    *,
    as_json: bool,
    timeout_seconds: float = preflight.DEVICE_TIMEOUT_SECONDS,
    probe: preflight.Probe | None = None,
) -> int:
    try:
        contract = LaunchContract.from_env(environ)
    except ContractError as err:
        print(f"tpuserve engine preflight: {err}", file=sys.stderr)
        return launch.EXIT_INVALID_CONTRACT
    env = launch.server_env(contract, launch.plan(contract), environ)
    python = launch.sglang_python(contract)
    if probe is None:
        probe = preflight.SubprocessProbe(python, env, device_timeout_seconds=timeout_seconds)
    outcome = preflight.preflight(contract, environ, env, python, probe)
    report = outcome.report
    if as_json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        for c in report.checks:
            print(f"{c.name}: {c.status}" + (f" ({c.note})" if c.note else ""))
            for failure in c.failures:
                print(f"  {failure.reason}: {failure.message}")
    return outcome.exit_status
