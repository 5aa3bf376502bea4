"""Helpers for the chart and metrics tests: the real helm binary, rendering to parsed objects."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuserve.cluster.toolchain import Toolchain, ToolchainMissing

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "tpuserve"
VALUES_DIR = Path(__file__).parent / "values"
# The API groups a cluster with kube-prometheus-stack and GMP serves, for .Capabilities checks.
MONITORING_APIS = ("monitoring.coreos.com/v1", "monitoring.googleapis.com/v1")
# Served by Kubernetes 1.30+; helm template only knows it when told (kind-level capability).
ADMISSION_POLICY_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"

Render = Callable[..., list[dict[str, Any]]]


def find_tool(name: str) -> Path:
    """A tool from the tool cache; skips locally (fails under CI) when it is not installed."""
    try:
        return Toolchain.discover().tool(name)
    except ToolchainMissing as err:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"{err} (make test installs it)")


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def make_renderer(helm: Path) -> Render:
    def _render(
        values: Sequence[Path] = (),
        sets: Sequence[str] = (),
        api_versions: Sequence[str] = (*MONITORING_APIS, ADMISSION_POLICY_API),
        include_crds: bool = False,
        namespace: str = "tpuserve-system",
    ) -> list[dict[str, Any]]:
        args = ["template", "tpuserve", str(CHART), "--namespace", namespace]
        for path in values:
            args += ["--values", str(path)]
        for item in sets:
            args += ["--set", item]
        for api in api_versions:
            args += ["--api-versions", api]
        if include_crds:
            args.append("--include-crds")
        done = run_helm(helm, *args)
        assert done.returncode == 0, done.stderr
        return [d for d in yaml.safe_load_all(done.stdout) if d]

    return _render
