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
from tpuserve_operator.validation import check_bounds

DESCRIPTION = """Print the children of TPUModelServer resources as YAML, with no cluster.

Reads every TPUModelServer document of FILE ('-' for stdin), validates it exactly as the
operator does (CRD rules, topology catalog, fit check) and prints the objects the operator
would apply. Invalid resources are reported on stderr, one line per problem, and the exit
code is 1; a FILE that cannot be read (too large, not UTF-8, not YAML, too deep, or
expanding through aliases beyond 100,000 values or 16 Mi characters) is one line and exit
code 2.
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
    Flag(
        "--inference-pool",
        "inference_pool",
        "Render InferencePools (spec.inferencePool), as when the Gateway API Inference "
        "Extension's CRDs are installed (default: a server asking for one is invalid).",
        switch=True,
    ),
    Flag(
        "--keda",
        "keda",
        "Render KEDA ScaledObjects (autoscaling.engine keda), as when KEDA's CRDs are "
        "installed (default: a server asking for one is invalid).",
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


MAX_INPUT_BYTES = 4 * 1024 * 1024


class UnreadableInput(ValueError):
    """FILE is not YAML the render can take; the message is one line."""


class DuplicateKey(yaml.YAMLError):
    """A mapping gives one key twice (YAML 1.2 forbids it; PyYAML keeps the last)."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives a key twice: the last one used to
    win silently (issue 57, item 9), so a reviewer reading the first saw another spec."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: PyYAML's own error says so
                continue
            if duplicate:
                raise DuplicateKey(
                    f"line {key_node.start_mark.line + 1}: key {key!r:.80} given twice in one "
                    "mapping; allowed: each key once"
                )
        return super().construct_mapping(node, deep=deep)


def _documents(filename: str) -> list[Any]:
    """The YAML documents of FILE, refused with one line when FILE is too large, not UTF-8,
    not YAML, gives a key twice in one mapping, nested too deep, or expands (through
    aliases) beyond what is looked at."""
    if filename == "-":
        raw = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    else:
        with Path(filename).open("rb") as handle:
            raw = handle.read(MAX_INPUT_BYTES + 1)
    if len(raw) > MAX_INPUT_BYTES:
        raise UnreadableInput(f"larger than {MAX_INPUT_BYTES} bytes; allowed: at most that")
    try:
        text = raw.decode("utf-8")
        documents = [d for d in yaml.load_all(text, Loader=_UniqueKeyLoader) if d is not None]
    except UnicodeDecodeError as err:
        raise UnreadableInput(f"not UTF-8: byte {err.start} ({raw[err.start]:#04x})") from None
    except yaml.YAMLError as err:
        raise UnreadableInput(" ".join(str(err).split())) from None
    except RecursionError:
        raise UnreadableInput("nested too deeply to parse") from None
    for index, document in enumerate(documents):
        for problem in check_bounds(document, f"document {index + 1}"):
            raise UnreadableInput(str(problem))
    return documents


def run(args: argparse.Namespace) -> int:
    config = apply_flags(RenderConfig(), OPTIONS, args)
    try:
        documents = _documents(args.filename)
    except (OSError, UnreadableInput) as err:
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
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(meta, dict) or not isinstance(name, str) or not name:
            print(
                f"{labels.KIND} without metadata.name (got {name!r}); allowed: a name",
                file=sys.stderr,
            )
            failed = True
            continue
        meta = dict(meta)
        meta.setdefault("namespace", args.namespace or "default")
        where = f"{meta['namespace']}/{name}"
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
