"""The front's unix-socket listener (``--uds PATH``): a sidecar's clients, or a machine that
allows no TCP socket, reach the router through a socket file instead of ``--host:--port``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Callable
from typing import Final

UDS_MODE: Final = 0o660
"""The socket file's mode: its owner and group (a sidecar shares the pod's group) may
connect, no one else."""


async def serve_unix(factory: Callable[[], asyncio.Protocol], path: str) -> asyncio.Server:
    """Listen on the unix socket ``path``; the caller closes the server and `remove_socket`s.
    A stale socket left there (a router that died) is replaced; anything else there is refused
    (`tpuserve_router.config_checks.uds_problems` says so at start-up; here `FileExistsError`)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FileExistsError(f"uds={path!r}: the path exists and is not a socket")
        os.unlink(path)
    server = await asyncio.get_running_loop().create_unix_server(factory, path, backlog=1024)
    os.chmod(path, UDS_MODE)
    return server


def remove_socket(path: str) -> None:
    """Remove the socket file ``path`` once its server is closed (not a file of another kind)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
