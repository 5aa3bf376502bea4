"""kubectl and helm, run against one control plane's kubeconfig, with their errors carried.

helm keeps its config, cache and data under the run directory, so it never reads or writes
the user's own helm setup.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tpuserve.cluster.toolchain import Toolchain

KUBECTL_TIMEOUT_SECONDS = 120.0
HELM_TIMEOUT_SECONDS = 300.0


class CommandError(subprocess.CalledProcessError):
    """kubectl or helm failed; the message carries their stderr."""

    def __str__(self) -> str:
        return (
            f"{' '.join(map(str, self.cmd))} exited {self.returncode}: {self.stderr or self.stdout}"
        )


@dataclass(frozen=True, slots=True)
class Tools:
    """kubectl and helm bound to a kubeconfig; `helm_home` holds helm's own files."""

    toolchain: Toolchain
    kubeconfig: Path
    helm_home: Path

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout_seconds: float = KUBECTL_TIMEOUT_SECONDS,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl; CommandError (with stderr) when `check` and it fails."""
        return self.run(
            [str(self.toolchain.tool("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            check=check,
            input=input,
            timeout_seconds=timeout_seconds,
        )

    def helm(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        timeout_seconds: float = HELM_TIMEOUT_SECONDS,
    ) -> subprocess.CompletedProcess[str]:
        """Run helm, with its config/cache/data kept inside `helm_home`."""
        env = {
            "HELM_CONFIG_HOME": str(self.helm_home / "config"),
            "HELM_CACHE_HOME": str(self.helm_home / "cache"),
            "HELM_DATA_HOME": str(self.helm_home / "data"),
        }
        return self.run(
            [str(self.toolchain.tool("helm")), f"--kubeconfig={self.kubeconfig}", *args],
            check=check,
            input=input,
            timeout_seconds=timeout_seconds,
            env=env,
        )

    def run(
        self,
        argv: list[str],
        *,
        check: bool,
        input: str | None,
        timeout_seconds: float,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **(env or {})}
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout_seconds,
            check=False,
        )
        if check and result.returncode != 0:
            raise CommandError(result.returncode, argv, result.stdout, result.stderr)
        return result
