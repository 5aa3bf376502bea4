"""The pre-flight's eyes on the TPU stack: a script run by the interpreter that will run SGLang.

`python3 preflight_probe.py versions` prints the versions of torch, torch-tpu and libtpu the
interpreter's installed distributions declare, without importing any of them (importing
torch_tpu is what raises on an incompatible libtpu). `python3 preflight_probe.py device`
imports torch and torch_tpu and prints what TorchTPU sees: the accelerator, the device count,
each device's name and memory, the eager modes, whether the `tpu` compile backend is
registered, and the Google PCI devices on the bus (read before torch is imported, so they are
there even when the import fails). `python3 preflight_probe.py jax-device` is the same for
SGLang-JAX through JAX instead of torch: `jax.local_devices()`' platform, count, device kind
and `memory_stats()["bytes_limit"]`. Each prints one line `PROBE_MARKER <json>` last.

It runs in a process of its own, by path, for three reasons: the interpreter may be another
one than the launcher's (SGLang's, with torch installed); a failing libtpu may abort the
process; and only one process at a time can hold a TPU, so the launcher must not keep it
open while SGLang starts. Standard library only; imports nothing from sglang_tpu.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROBE_MARKER = "TPUSERVE_PREFLIGHT_PROBE"
GOOGLE_PCI_VENDOR = "0x1ae0"
PCI_DEVICES = Path("/sys/bus/pci/devices")


def dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, Any]:
    return {
        "python": sys.executable,
        "torch": dist_version("torch"),
        "torch_tpu": dist_version("torch-tpu", "torch_tpu"),
        "libtpu": dist_version("libtpu", "libtpu-nightly"),
        "jax": dist_version("jax"),
    }


def pci_devices(root: Path = PCI_DEVICES) -> list[str]:
    """PCI device ids of Google's devices on the bus (TPU chips); [] when sysfs is hidden."""
    found = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            if (entry / "vendor").read_text().strip() == GOOGLE_PCI_VENDOR:
                found.append((entry / "device").read_text().strip())
        except OSError:
            continue
    return found


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip()


def _attempt(errors: list[str], what: str, *ways: Callable[[], Any]) -> Any:
    """The answer of the first of `ways` that gives one; when none does, their failures are
    noted under `what` (TorchTPU answers some questions only through one of torch's APIs)."""
    failures = []
    for way in ways:
        try:
            return way()
        except Exception as err:
            failures.append(_error(err))
    errors.append(f"{what}: {'; '.join(failures)}")
    return None


def device() -> dict[str, Any]:
    out: dict[str, Any] = {"pci": pci_devices(), "stage": None, "error": None, "errors": []}
    errors: list[str] = out["errors"]
    try:
        # The point of the probe: import here, never at the top (this may raise or abort).
        import torch
        import torch_tpu  # noqa: F401
    except BaseException as err:  # RuntimeError from set_libtpu_version, ImportError, ...
        out["stage"], out["error"] = "import", _error(err)
        return out
    try:
        accelerator = torch.accelerator.current_accelerator()
        out["accelerator"] = None if accelerator is None else accelerator.type
        out["device_count"] = int(torch.accelerator.device_count())
    except Exception as err:
        out["stage"], out["error"] = "device count", _error(err)
        return out
    module = _attempt(errors, "device module", lambda: torch.get_device_module("tpu"))
    devices = []
    for i in range(out["device_count"]):
        name = _attempt(
            errors,
            "device name",
            functools.partial(lambda n: module.get_device_name(n), i),
            functools.partial(lambda n: torch.accelerator.get_device_name(n), i),
        )
        properties = _attempt(
            errors,
            "device properties",
            functools.partial(lambda n: module.get_device_properties(n), i),
            functools.partial(lambda n: torch.accelerator.get_device_properties(n), i),
        )
        memory = getattr(properties, "total_memory", None)
        devices.append({"name": name, "total_memory": None if memory is None else int(memory)})
    out["devices"] = devices
    out["eager_modes"] = _attempt(
        errors, "eager modes", lambda: sorted(m.name for m in module.EagerMode)
    )
    out["compile_backend_tpu"] = _attempt(
        errors, "compile backend", lambda: callable(torch._dynamo.lookup_backend("tpu"))
    )
    return out


def jax_device() -> dict[str, Any]:
    out: dict[str, Any] = {"pci": pci_devices(), "stage": None, "error": None, "errors": []}
    errors: list[str] = out["errors"]
    try:
        import jax  # here, never at the top: this may raise or abort

        local = jax.local_devices()
    except BaseException as err:  # ImportError, RuntimeError from the TPU backend, ...
        out["stage"], out["error"] = "import", _error(err)
        return out
    out["accelerator"] = local[0].platform if local else None
    out["device_count"] = len(local)
    devices = []
    for dev in local:
        stats = _attempt(errors, "memory stats", functools.partial(lambda d: d.memory_stats(), dev))
        limit = stats.get("bytes_limit") if isinstance(stats, dict) else None
        devices.append({"name": getattr(dev, "device_kind", None),
                        "total_memory": None if limit is None else int(limit)})  # fmt: skip
    out["devices"] = devices
    return out


def main(argv: list[str]) -> int:
    modes: dict[str, Callable[[], dict[str, Any]]] = {
        "versions": versions,
        "device": device,
        "jax-device": jax_device,
    }
    if len(argv) != 1 or argv[0] not in modes:
        print(f"usage: preflight_probe.py {{{','.join(modes)}}}", file=sys.stderr)
        return 2
    result = modes[argv[0]]()
    sys.stdout.flush()
    print(f"{PROBE_MARKER} {json.dumps(result, sort_keys=True)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
