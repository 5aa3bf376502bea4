"""The first process of every container the pod runner starts: what PID 1 and the container's
cgroup give a real container.

    python -I container_init.py [--hosts FILE] COMMAND [ARG...]

It runs COMMAND as its child and is a child subreaper, so processes COMMAND leaves behind
(a launcher's server in its own session, say) become its children rather than init's. It
passes SIGTERM and SIGINT on to COMMAND; SIGUSR1 (the runner's "kill the container", and what
it gets if the runner dies) is SIGKILL for COMMAND and every process under it. When COMMAND
exits, everything still running under it is killed too, as when a container's main process
ends, and this exits with COMMAND's status (128 + N when a signal N ended it).

With `--hosts FILE` it first enters a user and mount namespace of its own and bind-mounts FILE
over /etc/hosts, as the kubelet mounts a pod's /etc/hosts (`dns.py`: the pod runner's stand-in
for cluster DNS); where the kernel refuses, it says why on stderr and runs the command anyway.

Standard library only, run with `-I`: it starts in milliseconds and never imports the code
under test.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_BIND = 4096
HOSTS = "/etc/hosts"


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value)


def own_hosts(path: str) -> str | None:
    """Enter a user and mount namespace (same uid and gid inside) and bind `path` over
    /etc/hosts; None when done, else why not. Before any thread starts (unshare requires it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        return f"unshare(CLONE_NEWUSER|CLONE_NEWNS): {os.strerror(ctypes.get_errno())}"
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
            with open(f"/proc/self/{name}", "w", encoding="ascii") as handle:
                handle.write(text)
    except OSError as err:
        return f"user namespace maps: {err}"
    if libc.mount(path.encode(), HOSTS.encode(), None, _MS_BIND, None) != 0:
        return f"mount --bind {path} {HOSTS}: {os.strerror(ctypes.get_errno())}"
    return None


def descendants(root: int) -> list[int]:
    """Every process under `root` (by parent links in /proc), deepest first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found[::-1]


def signal_all(root: int) -> list[int]:
    """SIGKILL everything under `root` (no reaping); the processes signalled."""
    remaining = descendants(root)
    for pid in remaining:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return remaining


def kill_all(root: int) -> None:
    """SIGKILL everything under `root` and reap it, until nothing is left (after the command
    itself was reaped: this reaps any child)."""
    for _ in range(50):
        if not signal_all(root):
            return
        reap(block_seconds=0.1)


def reap(block_seconds: float = 0.0) -> None:
    deadline = time.monotonic() + block_seconds
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.01)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--hosts"] and len(argv) >= 2:
        problem = own_hosts(argv[1])
        if problem is not None:
            print(f"container_init: {HOSTS} stays the machine's: {problem}", file=sys.stderr)
        argv = argv[2:]
    if not argv:
        print("usage: container_init.py [--hosts FILE] COMMAND [ARG...]", file=sys.stderr)
        return 2
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1)
    me = os.getpid()
    child = os.fork()
    if child == 0:  # pragma: no cover - the container's command
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the container ends with its init
        try:
            os.execvp(argv[0], argv)
        except OSError as err:
            print(f"exec {argv[0]!r}: {err}", file=sys.stderr)
            os._exit(127)

    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)

    def kill_container(_sig: int, _frame: object) -> None:
        signal_all(me)  # the loop below reaps the command and then the rest

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGUSR1, kill_container)
    while True:
        try:
            pid, status = os.waitpid(child, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            status = 0
            break
        if pid == child:
            break
    kill_all(me)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
