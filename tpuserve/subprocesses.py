"""Stopping asyncio child processes: SIGTERM, then SIGKILL for those still up after a grace."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence

STOP_GRACE_SECONDS = 10.0


async def stop_processes(
    processes: Sequence[asyncio.subprocess.Process], grace_seconds: float = STOP_GRACE_SECONDS
) -> None:
    """SIGTERM every running process at once, then wait for each in turn, killing one that
    has not exited `grace_seconds` after its wait began."""
    for process in processes:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            await asyncio.wait_for(process.wait(), grace_seconds)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
