"""Where the control-plane binaries, the test tools and the Go module data files are.

`scripts/tool-paths.sh` is the one place that pins versions and names directories; this module
reads its exported variables from the environment (they are there when `scripts/test.sh` runs
pytest) or, failing that, by sourcing the script. Nothing here builds anything: a missing
binary raises `ToolchainMissing`, whose message says how to build it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOL_PATHS_SCRIPT = REPO_ROOT / "scripts" / "tool-paths.sh"
BUILD_HINT = (
    "build them with `scripts/build-control-plane.sh` (needs Go 1.26+ and the Go module proxy; "
    "`make test` runs it), or point TPUSERVE_K8S_BIN at a directory holding them"
)

CONTROL_PLANE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
)
LWS_BINARY = "lws-controller"
METRICS_ADAPTER_BINARY = "prometheus-adapter"
KEDA_BINARIES = ("keda-operator", "keda-adapter")
_ENV_KEYS = (
    "TPUSERVE_CACHE",
    "TPUSERVE_TOOLS_BIN",
    "TPUSERVE_K8S_BIN",
    "TPUSERVE_K8S_VERSION",
    "TPUSERVE_ETCD_VERSION",
    "TPUSERVE_KWOK_VERSION",
    "TPUSERVE_LWS_VERSION",
    "TPUSERVE_PROMETHEUS_OPERATOR_VERSION",
)


KEDA_VERSION = "v2.20.2"
"""KEDA's module, read for its CRDs only (`Toolchain.keda_crds`); TPUSERVE_KEDA_VERSION overrides
it. v2.21 needs go >= 1.27.4, newer than the toolchain's, and `go mod download` refuses it."""
KEDA_MODULE = "github.com/kedacore/keda/v2"


class ToolchainMissing(RuntimeError):
    """A binary or data file the local control plane needs is not there."""


@dataclass(frozen=True, slots=True)
class Toolchain:
    """Paths and pinned versions of everything the local control plane runs."""

    k8s_bin: Path
    tools_bin: Path
    k8s_version: str
    etcd_version: str
    kwok_version: str
    lws_version: str
    prometheus_operator_version: str

    @classmethod
    def discover(cls, environ: Mapping[str, str] | None = None) -> Toolchain:
        env = _tool_paths_env(os.environ if environ is None else environ)
        return cls(
            k8s_bin=Path(env["TPUSERVE_K8S_BIN"]),
            tools_bin=Path(env["TPUSERVE_TOOLS_BIN"]),
            k8s_version=env["TPUSERVE_K8S_VERSION"],
            etcd_version=env["TPUSERVE_ETCD_VERSION"],
            kwok_version=env["TPUSERVE_KWOK_VERSION"],
            lws_version=env["TPUSERVE_LWS_VERSION"],
            prometheus_operator_version=env["TPUSERVE_PROMETHEUS_OPERATOR_VERSION"],
        )

    def binary(self, name: str) -> Path:
        """A control-plane binary, or ToolchainMissing saying how to build it."""
        path = self.k8s_bin / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ToolchainMissing(f"{name} not found in {self.k8s_bin}; {BUILD_HINT}")
        return path

    def missing_binaries(self) -> list[str]:
        return [n for n in CONTROL_PLANE_BINARIES if not os.access(self.k8s_bin / n, os.X_OK)]

    @property
    def has_lws(self) -> bool:
        return os.access(self.k8s_bin / LWS_BINARY, os.X_OK)

    @property
    def has_keda(self) -> bool:
        """KEDA's operator and metrics apiserver were built (`scripts/build-keda.sh`)."""
        return all(os.access(self.k8s_bin / b, os.X_OK) for b in KEDA_BINARIES)

    @property
    def has_metrics_adapter(self) -> bool:
        return os.access(self.k8s_bin / METRICS_ADAPTER_BINARY, os.X_OK)

    def tool(self, name: str) -> Path:
        """helm, kubectl, prometheus or promtool from the tool cache (scripts/install-tools.sh)."""
        path = self.tools_bin / name
        if os.access(path, os.X_OK):
            return path
        raise ToolchainMissing(
            f"{name} not found in {self.tools_bin}; install it with `scripts/install-tools.sh`"
        )

    def kwok_module_dir(self) -> Path:
        return go_module_dir("sigs.k8s.io/kwok", self.kwok_version)

    def lws_module_dir(self) -> Path:
        return go_module_dir("sigs.k8s.io/lws", self.lws_version)

    def prometheus_operator_crds(self) -> list[Path]:
        """The PodMonitor, ServiceMonitor and PrometheusRule CRDs, from the operator's module."""
        module = go_module_dir(
            "github.com/prometheus-operator/prometheus-operator", self.prometheus_operator_version
        )
        crd_dir = module / "example" / "prometheus-operator-crd"
        kinds = ("podmonitors", "servicemonitors", "prometheusrules")
        return [crd_dir / f"monitoring.coreos.com_{kind}.yaml" for kind in kinds]

    @staticmethod
    def keda_crds() -> list[Path]:
        """KEDA's ScaledObject CRD (the one the operator renders), from KEDA's module."""
        version = os.environ.get("TPUSERVE_KEDA_VERSION") or KEDA_VERSION
        module = go_module_dir(KEDA_MODULE, version)
        return [module / "config" / "crd" / "bases" / "keda.sh_scaledobjects.yaml"]

    @staticmethod
    def keda_all_crds() -> list[Path]:
        """Every CRD KEDA's operator watches (config/crd/bases of KEDA's module)."""
        version = os.environ.get("TPUSERVE_KEDA_VERSION") or KEDA_VERSION
        module = go_module_dir(KEDA_MODULE, version)
        return sorted((module / "config" / "crd" / "bases").glob("*.yaml"))


def _tool_paths_env(environ: Mapping[str, str]) -> dict[str, str]:
    if all(environ.get(k) for k in _ENV_KEYS):
        return {k: environ[k] for k in _ENV_KEYS}
    if not TOOL_PATHS_SCRIPT.is_file():
        missing = [k for k in _ENV_KEYS if not environ.get(k)]
        raise ToolchainMissing(
            f"{', '.join(missing)} not set and {TOOL_PATHS_SCRIPT} not found; "
            "run from a tpuserve checkout or set them (see scripts/tool-paths.sh)"
        )
    script = f'source "{TOOL_PATHS_SCRIPT}" >/dev/null && env -0'
    out = subprocess.run(
        ["bash", "-c", script], env=dict(environ), capture_output=True, check=True
    ).stdout
    sourced = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return {k: sourced[k] for k in _ENV_KEYS}


def _escape_module_path(path: str) -> str:
    """The module cache's case encoding: `Azure` -> `!azure` (golang.org/x/mod/module)."""
    return "".join(f"!{c.lower()}" if c.isupper() else c for c in path)


def go_mod_cache() -> Path:
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    go = shutil.which("go")
    if go:
        out = subprocess.run(
            [go, "env", "GOMODCACHE"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if out:
            return Path(out)
    gopath = os.environ.get("GOPATH", str(Path.home() / "go")).split(os.pathsep)[0]
    return Path(gopath) / "pkg" / "mod"


def go_module_dir(module: str, version: str) -> Path:
    """The unpacked source of module@version in the Go module cache, downloaded if needed.

    Data files that ship inside kwok and LWS (stage YAMLs, CRDs, webhook manifests) are read
    from here at run time rather than copied into the repository.

    Go (1.16+) extracts a module in place: the directory exists before it is whole, and the
    download cache holds ``<version>.partial`` until it is (and ``<version>.ziphash`` once the
    zip was checked), as Go's own ``modfetch.DownloadDir`` reads them. A directory not yet
    whole is being extracted by another process (clusters started side by side on a fresh
    machine) and is not read: ``go mod download`` waits for that process's lock and answers
    once the module is whole.
    """
    cache = go_mod_cache()
    escaped, at = _escape_module_path(module), _escape_module_path(version)
    cached = cache / f"{escaped}@{at}"
    marks = cache / "cache" / "download" / escaped / "@v"
    whole = not (marks / f"{at}.partial").exists() and (marks / f"{at}.ziphash").exists()
    if cached.is_dir() and whole:
        return cached
    go = shutil.which("go")
    if go is None:
        raise ToolchainMissing(
            f"{module}@{version} is not in the Go module cache ({cached}) and Go is not on PATH; "
            f"{BUILD_HINT}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        # `go mod download module@version` needs a module context on some Go versions.
        subprocess.run([go, "mod", "init", "local.test/fetch"], cwd=tmp, capture_output=True)
        result = subprocess.run(
            [go, "mod", "download", "-json", f"{module}@{version}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
    info = json.loads(result.stdout) if result.stdout.strip() else {}
    if result.returncode != 0 or "Dir" not in info:
        detail = info.get("Error") or result.stderr.strip()
        raise ToolchainMissing(f"go mod download {module}@{version} failed: {detail}")
    return Path(info["Dir"])
