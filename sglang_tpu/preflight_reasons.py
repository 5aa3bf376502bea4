"""Why a pre-flight failed, as Kubernetes shows it: reasons, failures and the termination message.

The launcher's pre-flight (`sglang_tpu.preflight`) reports each problem as a `Failure` with a
stable `Reason`; a failed pre-flight writes them where the kubelet reads the container's
termination message (`termination_message`, `write_termination_message`), and the operator
reads them back from the pod's status (`parse_termination_message`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)

# What Kubernetes keeps of a termination message (the kubelet truncates at 4096 bytes).
TERMINATION_MESSAGE_BYTES = 4096


class Reason(StrEnum):
    """Why a pre-flight failed: stable, CamelCase, the reason of the TPUModelServer's
    Degraded condition and Event (`tpuserve_operator.conditions.Reason` has the same)."""

    TPU_STACK_MISSING = "TPUStackMissing"
    TPU_STACK_INCOMPATIBLE = "TPUStackIncompatible"
    TPU_PROBE_FAILED = "TPUProbeFailed"
    ACCELERATOR_MISMATCH = "AcceleratorMismatch"
    CHIP_COUNT_MISMATCH = "ChipCountMismatch"
    HBM_MISMATCH = "HBMMismatch"
    EXECUTION_MODE_UNSUPPORTED = "ExecutionModeUnsupported"
    COMPILE_CACHE_UNWRITABLE = "CompileCacheUnwritable"


REASON_MEANINGS: Mapping[Reason, str] = {
    Reason.TPU_STACK_MISSING: "the engine image lacks torch, torch-tpu or libtpu",
    Reason.TPU_STACK_INCOMPATIBLE: (
        "the engine image's torch, torch-tpu and libtpu do not work together (or torch_tpu's "
        "import raised)"
    ),
    Reason.TPU_PROBE_FAILED: "TorchTPU could not be asked about the chips (see message)",
    Reason.ACCELERATOR_MISMATCH: "the pod's chips are not of the spec's TPU generation",
    Reason.CHIP_COUNT_MISMATCH: "TorchTPU sees another number of devices than the slice has",
    Reason.HBM_MISMATCH: "a device's HBM differs from the catalog's for the generation",
    Reason.EXECUTION_MODE_UNSUPPORTED: "TorchTPU lacks the spec's engine execution mode",
    Reason.COMPILE_CACHE_UNWRITABLE: "the compile-cache volume cannot be written",
}


@dataclass(frozen=True, slots=True)
class Failure:
    """One problem: the reason, what was looked at, what was found and what is allowed."""

    reason: Reason
    field: str
    value: str
    allowed: str
    detail: str

    @property
    def message(self) -> str:
        return f"{self.field}: {self.value} is not allowed; allowed: {self.allowed}; {self.detail}"


def termination_message(failures: Sequence[Failure]) -> str:
    """One line per failure, `<Reason>: <message>`, within what Kubernetes keeps."""
    lines = [f"{f.reason}: {' '.join(f.message.split())}" for f in failures]
    text = "\n".join(lines)
    data = text.encode()
    if len(data) > TERMINATION_MESSAGE_BYTES:
        text = data[: TERMINATION_MESSAGE_BYTES - 3].decode(errors="ignore") + "..."
    return text


_LINE = re.compile(r"^([A-Z][A-Za-z0-9]*): (.+)$")


def parse_termination_message(text: str) -> tuple[Reason, str] | None:
    """(reason, message) of a pre-flight's termination message, else None. Later lines are
    summed up in the message ("and 1 more: CompileCacheUnwritable")."""
    parsed = []
    for line in text.strip().splitlines():
        match = _LINE.match(line.strip())
        if match is None or match.group(1) not in Reason.__members__.values():
            continue
        parsed.append((Reason(match.group(1)), match.group(2)))
    if not parsed:
        return None
    (reason, message), rest = parsed[0], parsed[1:]
    if rest:
        others = ", ".join(str(r) for r, _ in rest)
        message += f" (and {len(rest)} more: {others})"
    return reason, message


def write_termination_message(path: str | None, text: str) -> None:
    """Write `text` where the kubelet reads the container's termination message; a failure
    to write is logged, never raised (the exit status still tells)."""
    if path is None:
        return
    try:
        Path(path).write_text(text + "\n")
    except OSError as err:
        log.warning("cannot write the termination message to %s: %s", path, err)
