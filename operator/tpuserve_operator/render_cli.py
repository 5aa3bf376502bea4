"""`tpuserve render -f FILE`: validate TPUModelServers and print every child as YAML.

No cluster is needed. The same code the operator runs validates and renders, so an invalid
resource exits non-zero with the messages its `Valid` condition would carry.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from tpuserve_operator import labels
from tpuserve_operator.errors import InvalidSpec
from tpuserve_operator.flags import RENDER_FLAGS, Flag, add_flags, apply_flags
from tpuserve_operator.render import RenderConfig, build_children

DESCRIPTION = """Print the children of TPUModelServer resources as YAML, with no cluster.

Reads every TPUModelServer document of FILE ('-' for stdin), validates it exactly as the
operator does (CRD rules, topology catalog, fit check) and prints the objects the operator
would apply. Invalid resources are reported on stderr, one line per problem, and the exit
code is 1.
"""


# The cluster capabilities the operator discovers, given here; then as `tpuserve operator`.
OPTIONS: tuple[Flag, ...] = (
    Flag(
        "--leaderworkerset",
        "leaderworkerset",
        "Render LeaderWorkerSets, as when the LWS CRD is installed (default: StatefulSets).",
        switch=True,
    ),
    Flag(
        "--prometheus-operator",
        "prometheus_operator",
        "Render PodMonitors/ServiceMonitors, as when their CRDs are installed.",
        switch=True,
    ),
    *RENDER_FLAGS,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True, help="YAML file, or - for stdin.")
    parser.add_argument(
        "--namespace", default=None, help="Namespace when a document has none (default: default)."
    )
    add_flags(parser, OPTIONS, RenderConfig())


def _documents(filename: str) -> list[Any]:
    text = sys.stdin.read() if filename == "-" else Path(filename).read_text(encoding="utf-8")
    return [d for d in yaml.safe_load_all(text) if d is not None]


def run(args: argparse.Namespace) -> int:
    config = apply_flags(RenderConfig(), OPTIONS, args)
    try:
        documents = _documents(args.filename)
    except (OSError, yaml.YAMLError) as err:
        print(f"tpuserve render: {args.filename}: {err}", file=sys.stderr)
        return 2
    servers = [d for d in documents if isinstance(d, dict) and d.get("kind") == labels.KIND]
    if not servers:
        print(
            f"tpuserve render: {args.filename}: no {labels.KIND} document "
            f"(apiVersion {labels.API_VERSION})",
            file=sys.stderr,
        )
        return 2
    failed = False
    out: list[dict[str, Any]] = []
    for doc in servers:
        meta = dict(doc.get("metadata") or {})
        meta.setdefault("namespace", args.namespace or "default")
        where = f"{meta['namespace']}/{meta.get('name', '?')}"
        if doc.get("apiVersion") != labels.API_VERSION:
            print(
                f"{where}: apiVersion: {doc.get('apiVersion')!r} is not allowed; "
                f"allowed: {labels.API_VERSION}",
                file=sys.stderr,
            )
            failed = True
            continue
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            print(f"{where}: spec: is required", file=sys.stderr)
            failed = True
            continue
        try:
            out += build_children(meta, spec, config)
        except InvalidSpec as err:
            failed = True
            for problem in err.problems:
                print(f"{where}: {problem} (reason {problem.reason})", file=sys.stderr)
    if failed:
        return 1
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False, width=100)
    return 0
