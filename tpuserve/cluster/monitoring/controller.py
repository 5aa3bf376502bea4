"""Runs the real Prometheus (Debian's) for the local cluster and keeps its configuration equal
to the cluster's PodMonitors, ServiceMonitors and PrometheusRules (`translate.py`).

Every `--sync-seconds` it lists those objects, the Services and the pods; when the
configuration or the rules change it rewrites them and sends Prometheus SIGHUP (Prometheus
reloads both); the pods go into each job's `file_sd` file, which Prometheus re-reads itself.
Prometheus listens on 127.0.0.1 only; the pods' addresses are loopback (the pod runner), so it
really scrapes them. If Prometheus exits it is started again; on SIGTERM it is stopped and
this process exits.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from tpuserve.cluster import kube, kubeconfig
from tpuserve.cluster.monitoring import translate
from tpuserve.observability.local_prometheus import find_prometheus, prometheus_argv

log = logging.getLogger(__name__)

GROUP, VERSION = "monitoring.coreos.com", "v1"
DEFAULT_INTERVAL = "5s"
DEFAULT_SYNC_SECONDS = 2.0
STOP_GRACE_SECONDS = 10.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Controller:
    def __init__(self, kubeconfig_path: Path, root: Path, port: int, interval: str) -> None:
        self.kubeconfig = kubeconfig_path
        self.root = root
        self.port = port
        self.interval = interval
        self.api = kubeconfig.api_client(kubeconfig_path)
        self.core = kube.client().CoreV1Api(self.api)
        self.custom = kube.client().CustomObjectsApi(self.api)
        self.process: subprocess.Popen[bytes] | None = None
        self.sd_files: dict[str, str] = {}
        self.stop = threading.Event()

    def _list(self, plural: str) -> list[dict[str, Any]]:
        try:
            found = self.custom.list_cluster_custom_object(GROUP, VERSION, plural)
        except kube.api_exception() as err:
            if getattr(err, "status", None) == 404:  # the CRD is not installed
                return []
            raise
        return list(found.get("items") or [])

    def render(self) -> tuple[str, dict[str, str]]:
        """prometheus.yml and the rule files (name -> text) for the cluster as it is now."""
        services = [
            self.api.sanitize_for_serialization(s)
            for s in self.core.list_service_for_all_namespaces().items
        ]
        config = translate.prometheus_config(
            self._list("podmonitors"),
            self._list("servicemonitors"),
            services,
            self.root / "sd",
            interval=self.interval,
            rules_glob=str(self.root / "rules" / "*.yaml"),
        )
        pods = [
            self.api.sanitize_for_serialization(p)
            for p in self.core.list_pod_for_all_namespaces().items
        ]
        targets = translate.pod_targets(pods)
        self.sd_files = {}
        for job in config["scrape_configs"]:
            namespaces = job.pop("_namespaces")
            chosen = [
                g
                for g in targets
                if namespaces is None or g["labels"]["__meta_kubernetes_namespace"] in namespaces
            ]
            self.sd_files[translate.sd_file(job["job_name"])] = json.dumps(chosen, indent=1)
        rule_files = {
            f"{r['metadata']['namespace']}-{r['metadata']['name']}.yaml": yaml.safe_dump(
                translate.rule_file(r), sort_keys=False
            )
            for r in self._list("prometheusrules")
        }
        return yaml.safe_dump(config, sort_keys=False), rule_files

    def write(self, config: str, rule_files: dict[str, str]) -> bool:
        """Write what changed; True when the configuration or a rule file did (the target
        files Prometheus watches itself)."""
        sd_dir = self.root / "sd"
        sd_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.sd_files.items():
            path = sd_dir / name
            if not path.exists() or path.read_text() != text:
                partial = path.with_suffix(".partial")
                partial.write_text(text)
                partial.replace(path)  # Prometheus never reads half a file
        rules_dir = self.root / "rules"
        rules_dir.mkdir(parents=True, exist_ok=True)
        changed = False
        config_path = self.root / "prometheus.yml"
        if not config_path.exists() or config_path.read_text() != config:
            config_path.write_text(config)
            changed = True
        for stale in set(p.name for p in rules_dir.glob("*.yaml")) - set(rule_files):
            (rules_dir / stale).unlink()
            changed = True
        for name, text in rule_files.items():
            path = rules_dir / name
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                changed = True
        return changed

    def start_prometheus(self) -> None:
        log_path = self.root / "prometheus.log"
        with log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                prometheus_argv(find_prometheus(), self.root, self.port),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        log.info("prometheus at http://127.0.0.1:%d (pid %d)", self.port, self.process.pid)

    def run(self, sync_seconds: float) -> None:
        self.write(*self.render())
        self.start_prometheus()
        while not self.stop.wait(sync_seconds):
            if self.process is not None and self.process.poll() is not None:
                log.warning("prometheus exited (%s); starting it again", self.process.returncode)
                self.start_prometheus()
            try:
                if self.write(*self.render()) and self.process is not None:
                    self.process.send_signal(signal.SIGHUP)
                    log.info("configuration changed; prometheus reloads")
            except Exception as err:  # the apiserver restarting: try again next round
                log.warning("monitors not read: %s", err)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuserve.cluster.monitoring")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--dir", type=Path, required=True, help="Configuration, rules, data.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--interval", default=DEFAULT_INTERVAL)
    parser.add_argument("--sync-seconds", type=float, default=DEFAULT_SYNC_SECONDS)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args.dir.mkdir(parents=True, exist_ok=True)
    controller = Controller(args.kubeconfig, args.dir.resolve(), args.port, args.interval)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: controller.stop.set())
    controller.run(args.sync_seconds)
    return 0
