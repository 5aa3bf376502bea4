"""The README's first command on a fresh clone: `make up`, the `openai` client, then Ctrl-C.

A new user's steps, in order: a clean copy of the checkout in a temporary directory,
``make up`` there, the official ``openai`` client against the base URL it prints, a plain and
a streamed chat completion, then Ctrl-C (SIGINT to make's whole process group, as a terminal
sends it). ``ARGS="--port 0 --json"`` is the one addition: the router takes a free port, and
``tpuserve up`` also reports on stdout how it stopped. Make itself mostly dies of the SIGINT
(GNU make re-raises it once its child is done and says "Interrupt"), but exits 0 when its
child had already exited 0 as make handled the signal, so the clean exit is read from
``tpuserve up``'s own ``stopped`` line (exit code 0, no child exited early), with no
traceback, nothing the fleet started left running, and
nothing from the dev extra in the copy's virtual environment.

What is copied is what git would check out from a commit of the working tree: the tracked
files and the untracked ones git does not ignore, as they are on disk now. A developer's
uncommitted edits are tested too; in CI the two are the same. Nothing ignored comes along
(``.venv``, ``router/native/target``, ``_native.abi3.so``), so ``make up`` creates the
virtual environment, installs the runtime dependencies and compiles ``router/native`` with
cargo in the copy, as a new user's first run does. uv (which `scripts/venv.sh` installs once per
machine), its cache and cargo's downloaded crates are shared, as they are for anyone who ran the
project or cargo before, and so is the test run's Rust build directory when scripts/test.sh
set one (``CARGO_TARGET_DIR``): the crate is compiled in the copy, its dependencies are not
compiled again (a fresh machine's CI run compiles them once, from the same lock file).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.waiting import eventually

pytestmark = [pytest.mark.component, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
BASE_URL = re.compile(r"OpenAI base URL: (http://127\.0\.0\.1:\d+/v1)")
READY_TIMEOUT_SECONDS = 1200.0
"""`make up` on a fresh clone: a virtual environment, the runtime dependencies (from uv's
cache when it has them), the Rust build, then the fleet's start."""
STOP_TIMEOUT_SECONDS = 60.0
DEV_ONLY = ("mypy", "pytest", "ruff", "openai")
"""Modules only the dev extra installs: ``make up`` must need none of them."""


def clean_copy(destination: Path) -> None:
    """The files a clone of the working tree would hold, copied with their modes."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, timeout=60,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree, not yet in a commit
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(source.stat().st_mode & 0o777)


def new_users_environment() -> dict[str, str]:
    """This environment without the test run's virtual environment in it."""
    env = {
        k: v
        for k, v in os.environ.items()
        # CARGO_TARGET_DIR stays: scripts/test.sh shares Rust's build between clones, so the
        # copy's `make up` compiles router/native itself (its path is new to cargo) and not its
        # dependencies again, ~2 min of two cores' CPU that a fresh machine's CI run spends once
        # in scripts/venv.sh with the same lock file
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    ours = Path(sys.prefix).resolve()
    path = env.get("PATH", "").split(os.pathsep)
    env["PATH"] = os.pathsep.join(p for p in path if p and ours not in Path(p).resolve().parents)
    return env


def running_from(tree: Path) -> list[str]:
    """Processes whose command line names ``tree`` (the copy's python and what it started)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if str(tree) in args:
            found.append(f"{proc.name}: {args.strip()}")
    return found


def test_make_up_on_a_fresh_clone_serves_the_openai_client_until_ctrl_c(tmp_path: Path) -> None:
    clone = tmp_path / "tpuserve"
    clean_copy(clone)
    log, status = tmp_path / "make-up.log", tmp_path / "status.jsonl"

    def tail() -> str:
        return f"make up's output (last 4000 characters):\n{log.read_text()[-4000:]}"

    with log.open("w") as err, status.open("w") as out:
        make = subprocess.Popen(
            ["make", "up", "ARGS=--port 0 --json"],
            cwd=clone, env=new_users_environment(), stdout=out, stderr=err,
            stdin=subprocess.DEVNULL, start_new_session=True,  # a terminal's process group
        )  # fmt: skip
    try:

        def printed_url() -> str | None:
            if found := BASE_URL.search(log.read_text()):
                return found[1]
            assert make.poll() is None, f"make up exited with {make.returncode}\n{tail()}"
            return None

        base_url = eventually(
            printed_url, what="make up's base URL", timeout_seconds=READY_TIMEOUT_SECONDS,
            interval_seconds=0.5, context=tail,
        )  # fmt: skip
        client = openai.OpenAI(base_url=base_url, api_key="unused", timeout=30, max_retries=0)
        model = client.models.list().data[0].id
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]

        answer = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
        assert answer.choices[0].message.content
        assert answer.choices[0].finish_reason in ("length", "stop")
        assert answer.usage is not None
        assert answer.usage.completion_tokens == 8 or answer.choices[0].finish_reason == "stop"

        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=8, stream=True
        )
        chunks = [chunk for chunk in stream if chunk.choices]
        assert "".join(c.choices[0].delta.content or "" for c in chunks)
        assert chunks[-1].choices[0].finish_reason in ("length", "stop")

        os.killpg(make.pid, signal.SIGINT)  # Ctrl-C
        # GNU make dies of the SIGINT it got too (-2) unless its child had already exited 0
        # when make handled it (seen: 0); either is a user's Ctrl-C. Whether the fleet stopped
        # cleanly is what `tpuserve up` itself says last (below).
        assert make.wait(timeout=STOP_TIMEOUT_SECONDS) in (0, -signal.SIGINT), tail()
        lines = status.read_text().splitlines()
        events = [json.loads(line) for line in lines if line.startswith("{")]
        assert events[0]["event"] == "ready"
        assert events[0]["base_url"] == base_url
        assert events[-1] == {"event": "stopped", "exit_code": 0, "exited": []}, tail()
        assert "Traceback" not in log.read_text(), tail()
        assert running_from(clone) == [], tail()
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait(timeout=STOP_TIMEOUT_SECONDS)
        for leftover in running_from(clone):  # the fleet's children run in sessions of their own
            os.kill(int(leftover.split(":", 1)[0]), signal.SIGKILL)

    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    python = clone / ".venv" / "bin" / "python"
    installed = subprocess.run(
        [python, "-c", probe, *DEV_ONLY], capture_output=True, text=True, check=True, timeout=60
    )
    assert installed.stdout.strip() == "[]"
