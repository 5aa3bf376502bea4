"""Entry point of the `tpuserve` command.

Each subcommand lives in the package that owns it and is imported only when it runs, so
`tpuserve engine sim` never imports kopf and `tpuserve router` never imports the operator.
A subcommand module provides:

- ``DESCRIPTION: str`` (first line is the summary shown by ``tpuserve --help``),
- ``configure(parser: argparse.ArgumentParser) -> None`` to add its flags,
- ``run(args: argparse.Namespace) -> int`` returning the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from tpuserve import __version__

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]
    module: str
    summary: str


COMMANDS: tuple[Command, ...] = (
    Command(("engine", "sim"), "sglang_tpu.sim.cli", "Run the simulated SGLang engine (no TPU)."),
    Command(("engine", "launch"), "sglang_tpu.launch", "Start real SGLang on TorchTPU in a pod."),
    Command(
        ("engine", "preflight"),
        "sglang_tpu.preflight_cli",
        "Check the TPU stack and chips against the launch contract.",
    ),
    Command(("router",), "tpuserve_router.cli", "Run the prefix-aware router."),
    Command(("operator",), "tpuserve_operator.cli", "Run the TPUModelServer operator."),
    Command(("render",), "tpuserve_operator.render_cli", "Print a TPUModelServer's children."),
    Command(("up",), "tpuserve.up.command", "Run a local fleet: engine twins and the router."),
    Command(("bench",), "tpuserve.bench.cli", "Benchmark routing policies on a workload."),
    Command(("plan",), "tpuserve.plan.cli", "Plan TPU slices, replicas and cost for a workload."),
    Command(("cluster", "up"), "tpuserve.cluster.cli_up", "Start a local control plane."),
    Command(("cluster", "down"), "tpuserve.cluster.cli_down", "Stop the local control plane."),
    Command(
        ("cluster", "services"),
        "tpuserve.cluster.cli_services",
        "Where the local cluster's Services and TPUModelServers answer.",
    ),
    Command(
        ("cluster", "maintenance"),
        "tpuserve.cluster.cli_maintenance",
        "Announce and run GKE host maintenance on fake nodes.",
    ),
    Command(
        ("cluster", "preempt"),
        "tpuserve.cluster.cli_preempt",
        "Preempt a fake Spot node, with notice or without.",
    ),
)


class CommandNotFound(Exception):
    pass


def find_command(argv: Sequence[str]) -> tuple[Command, list[str]]:
    """Longest command whose words prefix argv; the remaining arguments are its own."""
    best: Command | None = None
    for command in COMMANDS:
        n = len(command.words)
        if tuple(argv[:n]) == command.words and (best is None or n > len(best.words)):
            best = command
    if best is None:
        raise CommandNotFound(" ".join(argv[:2]))
    return best, list(argv[len(best.words) :])


def top_level_help() -> str:
    width = max(len(" ".join(c.words)) for c in COMMANDS)
    lines = [
        "usage: tpuserve COMMAND [options]",
        "",
        "Serve LLMs on Cloud TPUs from Kubernetes.",
        "",
        "commands:",
    ]
    lines += [f"  {' '.join(c.words):<{width}}  {c.summary}" for c in COMMANDS]
    lines += ["", "Run `tpuserve COMMAND --help` for the options of a command."]
    return "\n".join(lines)


def build_parser(command: Command) -> tuple[ModuleType, argparse.ArgumentParser]:
    """Import the command's module and build its parser exactly as ``main`` runs it."""
    module = importlib.import_module(command.module)
    parser = argparse.ArgumentParser(
        prog="tpuserve " + " ".join(command.words),
        description=module.DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="Log verbosity (default: %(default)s).",
    )
    module.configure(parser)
    return module, parser


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] in ("-h", "--help", "help"):
        print(top_level_help())
        return 0
    if args_list[0] == "--version":
        print(f"tpuserve {__version__}")
        return 0
    try:
        command, rest = find_command(args_list)
    except CommandNotFound as err:
        print(f"tpuserve: unknown command {str(err)!r}\n\n{top_level_help()}", file=sys.stderr)
        return 2
    module, parser = build_parser(command)
    args = parser.parse_args(rest)
    configure_logging(args.log_level)
    result: int = module.run(args)
    return result
