"""`tpuserve cluster up`: start a local control plane with fake GKE TPU node pools."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglang_tpu import cli_types
from tpuserve.cluster.cluster import Cluster, default_run_dir
from tpuserve.cluster.node_pools import DEFAULT_PROFILE, ProfileError, load_profile
from tpuserve.cluster.process import StartupError
from tpuserve.cluster.toolchain import ToolchainMissing

DESCRIPTION = """Start a local Kubernetes control plane with fake GKE TPU node pools.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok and (when built) the
LeaderWorkerSet controller run as local processes on 127.0.0.1 and keep running after this
command returns; stop them with `tpuserve cluster down`. Node pools come from a profile file.
Binaries: scripts/build-control-plane.sh. Guide: docs/development.md."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=default_run_dir(),
        help="Where kubeconfig, PKI, etcd data, logs and state go (default: %(default)s).",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=DEFAULT_PROFILE,
        help="Node-pool profile YAML (default: the built-in profile, %(default)s).",
    )
    lws = parser.add_mutually_exclusive_group()
    lws.add_argument(
        "--lws",
        dest="lws",
        action="store_true",
        default=None,
        help="Run the LeaderWorkerSet controller (default: when it was built).",
    )
    lws.add_argument(
        "--no-lws",
        dest="lws",
        action="store_false",
        help="Do not run the LeaderWorkerSet controller.",
    )
    parser.add_argument(
        "--no-pods",
        dest="run_pods",
        action="store_false",
        help="Do not run pods: kwok marks them Running and nothing runs (the e2e suite's mode). "
        "By default the pod runner runs every pod as local processes on loopback.",
    )
    parser.add_argument(
        "--no-prometheus",
        dest="prometheus",
        action="store_false",
        default=None,
        help="Do not run Prometheus (by default it runs when pods do, scraping what the "
        "cluster's PodMonitors and ServiceMonitors select).",
    )
    parser.add_argument(
        "--keda",
        action="store_true",
        help="Also run KEDA's operator and metrics apiserver (built by scripts/build-keda.sh, "
        "opt-in), which then serve the external metrics API; needs Prometheus.",
    )
    parser.add_argument(
        "--timeout",
        type=cli_types.duration_seconds,
        default=120.0,
        metavar="SECONDS",
        help="Readiness deadline of each component (default: %(default)s).",
    )


def run(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir.resolve()
    if (run_dir / "state.json").exists():
        existing = Cluster.attach(run_dir)
        alive = existing.alive_processes()
        if alive:
            print(
                f"a cluster is already running from {run_dir} ({', '.join(alive)}); "
                "stop it with `tpuserve cluster down` first",
                file=sys.stderr,
            )
            return 1
        existing.stop()  # stale state file of a dead cluster
    try:
        pools = load_profile(args.profile)
        cluster = Cluster(
            run_dir,
            pools=pools,
            lws=args.lws,
            run_pods=args.run_pods,
            prometheus=args.prometheus,
            keda=args.keda,
            detach=True,
            startup_timeout_seconds=args.timeout,
        )
        cluster.start()
    except (ProfileError, ToolchainMissing, StartupError) as err:
        print(f"tpuserve cluster up: {err}", file=sys.stderr)
        return 1
    nodes = sum(p.nodes for p in pools)
    print(f"control plane up in {cluster.started_seconds:.1f} s: {cluster.server}")
    print(
        f"  {nodes} fake nodes in {len(pools)} pools; LWS: {'on' if cluster.lws_enabled else 'off'}"
    )
    if cluster.run_pods:
        print(
            "  pods run as local processes on 127.244.0.0/16; a Service with ClusterIP "
            "10.96.A.B answers at 127.96.A.B (`tpuserve cluster services`)"
        )
    if cluster.prometheus_url:
        print(f"  Prometheus: {cluster.prometheus_url} (scrapes the cluster's PodMonitors)")
    print(f"  logs: {cluster.logs_dir}")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    print(
        "  stop with: tpuserve cluster down"
        + (f" --run-dir {run_dir}" if run_dir != default_run_dir().resolve() else "")
    )
    return 0
