"""`tpuserve cluster down`: stop the control plane `tpuserve cluster up` started."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tpuserve.cluster.cluster import STATE_FILE, Cluster, default_run_dir

DESCRIPTION = """Stop the local control plane started by `tpuserve cluster up`.

Every process recorded in the run directory's state file gets SIGTERM, then SIGKILL after
10 s; then the run directory (etcd data, PKI, logs) is deleted unless --keep is given."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=default_run_dir(),
        help="The run directory given to `cluster up` (default: %(default)s).",
    )
    parser.add_argument(
        "--keep", action="store_true", help="Keep the run directory (logs, etcd data)."
    )


def run(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir.resolve()
    if not (run_dir / STATE_FILE).exists():
        print(f"no cluster running from {run_dir}")
        return 0
    cluster = Cluster.attach(run_dir)
    try:
        cluster.stop()
    except RuntimeError as err:
        print(f"tpuserve cluster down: {err}", file=sys.stderr)
        return 1
    if args.keep:
        print(f"cluster stopped; run directory kept: {run_dir}")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"cluster stopped; removed {run_dir}")
    return 0
