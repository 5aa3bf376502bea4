"""Engines killed and restarted, a router replica restarted, under steady conversation load.

Live, on loopback: ``--engines`` engine twins (real clock, one seed, so every engine gives a
prompt the same greedy text; each with ``--system-fingerprint eN`` so an answer says which
engine wrote it) behind ``--replicas`` peering router replicas (`tpuserve router` processes,
the default policy, installed together). A load of multi-turn greedy conversations arrives at
``--rate`` requests a second: each conversation starts from one of 8 shared system prompts,
then each turn adds a question of its own (``--question-chars`` long) and the previous answer,
sent to a replica chosen at random (streamed completions, and a ``--non-stream-share`` of
plain ones). At each ``--kill`` second an engine is killed with SIGKILL and started again
``--restart-after`` seconds later on its ports; at ``--router-restart`` one replica is taken
out of the load (as a Service does on its readiness), stopped with SIGTERM and started again,
and put back once ready. It reports:

- requests failed (a status other than 200, an error event, a stream without its end);
- streams that were answering on an engine when it was killed, and whether each completed
  with the text a direct run (the same prompt to a live engine, not streamed) gives;
- routing consistency after failover: of the conversations the killed engine held (their
  last turn before the kill answered there), the share of their later turns, on whichever
  replica, answered by the engine that answered their first turn after the kill;
- the restarted engine's share of the first turns of new conversations in the
  ``--share-window`` seconds after its restart (a fair share is 1 / engines);
- each replica's RSS over time, and its slope and range over the last half, against
  ``--flat-slope`` (MiB/min: "flat" is a last-half least-squares slope at most this), with
  the sizes of its bounded state (`tpuserve_router_prefix_index_size{kind}`: the block
  index, the lost workers' keys, the shared-prefix ends, the token cache's bytes), its
  thread count and the machine's load average at each sample;
- the replicas' readiness at install: seconds from their (simultaneous) start to
  ``/readiness`` 200, and the restarted replica's.

    python bench/router_failover_soak.py [--seconds 600] [--rate 20] [--engines 4]
        [--replicas 3] [--kill 120 --kill 300] [--restart-after 20] [--router-restart 420]
        [--sample-every 30] [--replica-env 2:MALLOC_ARENA_MAX=2] [--flat-slope 0.1]
        [--json out.json]

With no ``--kill`` and no ``--router-restart`` it is a plain memory soak (item 4 of issue 68:
``--seconds 3600 --rate 4 --sample-every 60``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.component.router.router_fleet import ENTRY, EngineTwin, stop_process
from tpuserve.cluster.ports import free_port, free_port_pair

MODEL = "m"
SYSTEMS = [f"System prompt {k}: you are assistant number {k} of a large company. " * 12
           for k in range(8)]  # fmt: skip
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray"]  # fmt: skip
READY_POLL_SECONDS = 0.05


def question(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS) + str(rng.randrange(1000))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def proc_status(pid: int, field: str) -> int | None:
    """A number of ``/proc/PID/status`` (``VmRSS`` in KiB, ``Threads``), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


ARENA_ALIGN = 64 << 20  # glibc's thread arenas are heaps of 64 MiB, aligned to their size


def memory_map(pid: int) -> dict[str, float]:
    """Where a process's resident memory is (MiB, from ``/proc/PID/smaps``): glibc's main
    heap (``[heap]``), its thread arenas (anonymous read-write mappings that start on a 64 MiB
    boundary) and how many, the other anonymous mappings (pymalloc's arenas, large blocks
    malloc maps on their own) and files (code, shared libraries)."""
    out = {"heap": 0.0, "thread_arenas": 0.0, "thread_arena_count": 0.0, "other_anon": 0.0,
           "files": 0.0}  # fmt: skip
    kind = ""
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        head = line.split(None, 5)
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            start = int(head[0].split("-", 1)[0], 16)
            name = head[5].strip() if len(head) > 5 else ""
            if name == "[heap]":
                kind = "heap"
            elif name.startswith("/"):
                kind = "files"
            elif not name and head[1].startswith("rw") and start % ARENA_ALIGN == 0:
                kind = "thread_arenas"
                out["thread_arena_count"] += 1
            elif not name:
                kind = "other_anon"
            else:
                kind = ""  # [stack], [vdso] and the like
        elif line.startswith("Rss:") and kind:
            out[kind] += int(line.split()[1]) / 1024
    return {k: round(v, 1) for k, v in out.items()}


def rss_mib(pid: int) -> float | None:
    kib = proc_status(pid, "VmRSS")
    return None if kib is None else kib / 1024


@dataclass
class Replica:
    index: int
    workers: list[str]
    peer_port: int
    peers: list[int]
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[str] | None = None
    log: Any = None
    started_at: float = 0.0
    ready_at: float | None = None
    in_service: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> None:
        cmd = [sys.executable, "-c", ENTRY, "router", "--port", str(self.port),
               "--log-level", "info", "--health-check-interval", "1",
               "--peer-port", str(self.peer_port), *self.args]  # fmt: skip
        for port in self.peers:
            cmd += ["--peer", f"tcp://127.0.0.1:{port}"]
        for url in self.workers:
            cmd += ["--worker", url]
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"soak-router{self.index}-")  # noqa: SIM115
        self.started_at = time.monotonic()
        self.ready_at = None
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=self.log, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )  # fmt: skip

    async def wait_ready(self, session: aiohttp.ClientSession, workers: int, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"router {self.index} exited: {self.read_log()[-2000:]}")
            try:
                async with session.get(self.url + "/readiness") as resp:
                    body = await resp.json(content_type=None)
                    if resp.status == 200 and body.get("healthy_workers", 0) >= workers:
                        self.ready_at = time.monotonic()
                        return
            except (aiohttp.ClientError, ValueError):
                pass
            await asyncio.sleep(READY_POLL_SECONDS)
        raise RuntimeError(f"router {self.index} not ready within {within} s")

    def read_log(self) -> str:
        if self.log is None:
            return ""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        if self.log is not None:
            self.log.close()
            self.log = None


@dataclass
class Turn:
    conversation: int
    turn: int
    replica: int
    stream: bool
    prompt: str
    max_tokens: int
    start: float
    end: float = 0.0
    ok: bool = False
    error: str = ""
    text: str = ""
    engines: list[str] = field(default_factory=list)  # fingerprints in answer order


async def send(session: aiohttp.ClientSession, url: str, t: Turn, t0: float) -> None:
    body = {"model": MODEL, "prompt": t.prompt, "max_tokens": t.max_tokens,
            "temperature": 0, "stream": t.stream}  # fmt: skip
    try:
        async with session.post(url + "/v1/completions", data=orjson.dumps(body),
                                headers={"content-type": "application/json"}) as resp:  # fmt: skip
            if resp.status != 200:
                t.error = f"http_{resp.status}: {(await resp.text())[:200]}"
                return
            if not t.stream:
                answer = await resp.json()
                t.text = answer["choices"][0]["text"]
                t.engines.append(str(answer.get("system_fingerprint")))
                t.ok = True
                return
            done = False
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                chunk = orjson.loads(data)
                if chunk.get("error"):
                    t.error = f"stream_error: {str(chunk['error'])[:200]}"
                    return
                fp = chunk.get("system_fingerprint")
                if fp is not None and (not t.engines or t.engines[-1] != fp):
                    t.engines.append(fp)
                for choice in chunk.get("choices") or ():
                    t.text += choice.get("text") or ""
            t.ok = done
            if not done:
                t.error = "no_done"
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as err:
        t.error = f"{type(err).__name__}: {err}"[:200]
    finally:
        t.end = time.monotonic() - t0


class Load:
    def __init__(self, args: argparse.Namespace, replicas: list[Replica], t0: float) -> None:
        self.args = args
        self.replicas = replicas
        self.t0 = t0
        self.turns: list[Turn] = []
        self.rng = random.Random(args.seed)
        self.next_conversation = 0

    def pick_replica(self) -> Replica:
        live = [r for r in self.replicas if r.in_service]
        return self.rng.choice(live)

    async def conversation(self, session: aiohttp.ClientSession, c: int) -> None:
        rng = random.Random(self.args.seed * 1_000_003 + c)
        history = SYSTEMS[c % len(SYSTEMS)]
        for turn in range(self.args.turns):
            history += f"\nUser: {question(rng, self.args.question_chars)}\nAssistant:"
            replica = self.pick_replica()
            t = Turn(c, turn, replica.index, rng.random() >= self.args.non_stream_share,
                     history, self.args.max_tokens, time.monotonic() - self.t0)  # fmt: skip
            self.turns.append(t)
            await send(session, replica.url, t, self.t0)
            if not t.ok:
                return  # a failed turn ends its conversation (counted as failed)
            history += t.text
            if turn + 1 < self.args.turns:
                await asyncio.sleep(rng.uniform(0.5, 1.5) * self.args.think_seconds)

    async def run(self, session: aiohttp.ClientSession, seconds: float) -> None:
        per_second = self.args.rate / self.args.turns  # new conversations a second
        tasks: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()
        start = loop.time()
        i = 0
        while loop.time() - start < seconds:
            task = asyncio.ensure_future(self.conversation(session, i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            await asyncio.sleep(max(0.0, start + i / per_second - loop.time()))
        if tasks:
            await asyncio.gather(*tasks)


def slope_and_range(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope (MiB/min) and max - min (MiB) of (seconds, MiB) points."""
    if len(points) < 2:
        return 0.0, 0.0
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in points)
    values = [p[1] for p in points]
    return (sxy / sxx * 60 if sxx else 0.0), max(values) - min(values)


async def index_sizes(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    """The replica's state sizes (``tpuserve_router_prefix_index_size{kind}``), by kind."""
    try:
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return {}
    sizes = {}
    for line in text.splitlines():
        if line.startswith("tpuserve_router_prefix_index_size{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            sizes[kind] = int(float(line.rsplit(" ", 1)[1]))
    return sizes


def compact(sizes: dict[str, int]) -> str:
    shown = (f"{kind.split('_')[0]}={n}" for kind, n in sizes.items() if kind != "tree_chars")
    return ",".join(shown)


async def direct_text(session: aiohttp.ClientSession, url: str, t: Turn) -> str:
    body = {"model": MODEL, "prompt": t.prompt, "max_tokens": t.max_tokens, "temperature": 0}
    async with session.post(url + "/v1/completions", json=body) as resp:
        answer = await resp.json()
        return str(answer["choices"][0]["text"])


def report(
    args: argparse.Namespace,
    turns: list[Turn],
    kills: list[tuple[float, float, str]],
    memory: dict[int, list[tuple[float, float]]],
    ready: dict[str, Any],
    migrated_checks: list[dict[str, Any]],
    samples: list[dict[str, Any]],
) -> dict[str, Any]:
    failed = [t for t in turns if not t.ok]
    by_conv: dict[int, list[Turn]] = {}
    for t in sorted(turns, key=lambda t: (t.conversation, t.turn)):
        by_conv.setdefault(t.conversation, []).append(t)
    failover = []
    for killed_at, restarted_at, engine in kills:
        moved = consistent = conversations = other_replica = other_replica_consistent = 0
        strays: list[list[tuple[int, float, int, list[str]]]] = []
        for conv in by_conv.values():
            before = [t for t in conv if t.ok and t.end <= killed_at]
            after = [t for t in conv if t.ok and t.start >= killed_at]
            if not before or not after or before[-1].engines[-1] != engine:
                continue
            conversations += 1
            successor = after[0].engines[0]
            for t in after[1:]:
                moved += 1
                consistent += t.engines[0] == successor
                if t.engines[0] != successor and len(strays) < 20:
                    strays.append([(u.turn, round(u.start, 1), u.replica, u.engines)
                                   for u in conv])  # fmt: skip
                if t.replica != after[0].replica:  # decided by another replica than the first
                    other_replica += 1
                    other_replica_consistent += t.engines[0] == successor
        low, high = restarted_at + 5, restarted_at + args.share_window
        window = [c[0] for c in by_conv.values() if c[0].ok and low <= c[0].start < high]
        share = sum(1 for t in window if t.engines[0] == engine) / len(window) if window else 0.0
        failover.append({
            "engine": engine, "killed_at": round(killed_at, 1),
            "restarted_at": round(restarted_at, 1), "conversations_held": conversations,
            "later_turns": moved, "on_successor": consistent,
            "consistency": round(consistent / moved, 4) if moved else None,
            "later_turns_via_another_replica": other_replica,
            "via_another_replica_on_successor": other_replica_consistent,
            "first_turns_after_restart": len(window),
            "restarted_engine_share": round(share, 3),
            "strays": strays,  # (turn, start s, replica, engines) of each turn
        })  # fmt: skip
    same = total = 0
    for conv in by_conv.values():
        ok = [t for t in conv if t.ok]
        for prev, t in itertools.pairwise(ok):
            total += 1
            same += t.engines[0] == prev.engines[-1]
    mem: dict[str, Any] = {}
    for index, points in memory.items():
        half = [p for p in points if p[0] >= args.seconds / 2]
        slope, spread = slope_and_range(half)
        mem[f"router{index}"] = {
            "env": args.replica_env.get(index, {}),
            "flat": abs(slope) <= args.flat_slope,
            "first_mib": round(points[0][1], 1) if points else None,
            "last_mib": round(points[-1][1], 1) if points else None,
            "max_mib": round(max(p[1] for p in points), 1) if points else None,
            "last_half_slope_mib_per_min": round(slope, 3),
            "last_half_range_mib": round(spread, 1),
            "series": [(round(t), round(m, 1)) for t, m in points],
        }  # fmt: skip
    consistency = [f["consistency"] for f in failover]
    criteria = {
        "no_request_failed": not failed,
        "migrated_streams_same_text": bool(migrated_checks)
        and all(m["same"] for m in migrated_checks),
        "consistency_at_least_0.99": bool(consistency)
        and all(isinstance(c, (int, float)) and c >= 0.99 for c in consistency),
        f"memory_flat_last_half_slope_at_most_{args.flat_slope}_mib_per_min": bool(mem)
        and all(m["flat"] for m in mem.values()),
    }  # fmt: skip
    loads = [s["load1"] for s in samples]
    return {
        "criteria": criteria, "all_met": all(criteria.values()),
        "load_average_1min": {"min": min(loads, default=None), "max": max(loads, default=None),
                              "mean": round(sum(loads) / len(loads), 2) if loads else None},
        "requests": len(turns), "failed": len(failed),
        "failures": [f"{t.conversation}/{t.turn}: {t.error}" for t in failed[:20]],
        "streams_on_killed_engines": len(migrated_checks),
        "streams_same_text_as_direct": sum(1 for m in migrated_checks if m["same"]),
        "migrated": migrated_checks[:20],
        "failover": failover,
        "next_turn_same_engine": round(same / total, 4) if total else None,
        "memory": mem, "ready": ready, "samples": samples,
    }  # fmt: skip


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    flags = ["--time-scale", "1", "--startup-time-scale", "0", "--served-model-name", MODEL,
             "--seed", "7", *args.engine_arg]  # fmt: skip
    engines = [EngineTwin([*flags, "--system-fingerprint", f"e{i}"]) for i in range(args.engines)]
    replicas: list[Replica] = []
    memory: dict[int, list[tuple[float, float]]] = {}
    kills: list[tuple[float, float, str]] = []
    ready: dict[str, Any] = {}
    samples: list[dict[str, Any]] = []
    try:
        for engine in engines:
            engine.start()
        urls = [e.url for e in engines]
        ports = [free_port_pair() for _ in range(args.replicas)]
        for i in range(args.replicas):
            peers = [p for j, p in enumerate(ports) if j != i]
            replicas.append(Replica(i, urls, ports[i], peers, args.router_arg,
                                    args.replica_env.get(i, {})))  # fmt: skip
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for r in replicas:  # installed together
                r.launch()
            await asyncio.gather(*(r.wait_ready(session, len(urls), 60) for r in replicas))
            secs = [round(r.ready_at - r.started_at, 2) for r in replicas if r.ready_at]
            spread = max(r.ready_at for r in replicas if r.ready_at) - min(
                r.started_at for r in replicas)  # fmt: skip
            ready["installed_together_seconds"] = secs
            ready["installed_together_spread_seconds"] = round(spread, 2)
            ready_times = [r.ready_at for r in replicas if r.ready_at]
            ready["ready_within_seconds_of_each_other"] = round(
                max(ready_times) - min(ready_times), 2
            )
            print(
                f"replicas ready after {secs} s of their start, within "
                f"{ready['ready_within_seconds_of_each_other']} s of each other",
                flush=True,
            )
            for r in replicas:
                r.in_service = True
            t0 = time.monotonic()
            load = Load(args, replicas, t0)
            runner = asyncio.ensure_future(load.run(session, args.seconds))
            events = sorted([(k, "kill", i % args.engines) for i, k in enumerate(args.kill)]
                            + [(s, "router", 0) for s in args.router_restart])  # fmt: skip
            pending_restarts: list[tuple[float, int]] = []
            next_sample = 0.0
            while not runner.done():
                now = time.monotonic() - t0
                if now >= next_sample:
                    load1 = os.getloadavg()[0]
                    sample: dict[str, Any] = {"t": round(now), "load1": round(load1, 2)}
                    line = [f"{now:6.0f} s  load {load1:5.2f}"]
                    for r in replicas:
                        mib = rss_mib(r.proc.pid) if r.proc is not None else None
                        if mib is not None:
                            memory.setdefault(r.index, []).append((now, mib))
                            line.append(f"router{r.index} {mib:6.1f} MiB")
                    for r in replicas:
                        if r.in_service and r.proc is not None:
                            sizes = await index_sizes(session, r.url)
                            threads = proc_status(r.proc.pid, "Threads")
                            sample[f"router{r.index}"] = {**sizes, "threads": threads,
                                                          **memory_map(r.proc.pid)}  # fmt: skip
                            line.append(f"r{r.index} {compact(sizes)},thr={threads}")
                    samples.append(sample)
                    done = [t for t in load.turns if t.end]
                    line.append(f"requests {len(done)} failed {sum(1 for t in done if not t.ok)}")
                    print("  ".join(line), flush=True)
                    next_sample += args.sample_every
                while events and now >= events[0][0]:
                    _, what, which = events.pop(0)
                    if what == "kill":
                        engines[which].kill()
                        print(f"{now:6.0f} s  engine e{which} killed (SIGKILL)", flush=True)
                        pending_restarts.append((now + args.restart_after, which))
                        kills.append((now, 0.0, f"e{which}"))
                    else:
                        r = replicas[which]
                        r.in_service = False
                        await asyncio.sleep(1.0)  # a Service stops sending first
                        await asyncio.to_thread(r.stop)
                        r.launch()
                        await r.wait_ready(session, len(urls), 60)
                        assert r.ready_at is not None
                        ready["restarted_replica_seconds"] = round(r.ready_at - r.started_at, 2)
                        r.in_service = True
                        print(f"{now:6.0f} s  router{which} restarted, ready after "
                              f"{ready['restarted_replica_seconds']} s", flush=True)  # fmt: skip
                for due, which in list(pending_restarts):
                    if now >= due:
                        pending_restarts.remove((due, which))
                        await asyncio.to_thread(engines[which].start)
                        at = time.monotonic() - t0
                        kills = [(k, at if e == f"e{which}" and not r_ else r_, e)
                                 for k, r_, e in kills]  # fmt: skip
                        print(f"{at:6.0f} s  engine e{which} restarted", flush=True)
                await asyncio.sleep(0.2)
            await runner
            checks: list[dict[str, Any]] = []
            live = next(e for e in engines if e.proc is not None and e.proc.poll() is None)
            for killed_at, _, fingerprint in kills:
                for t in load.turns:
                    answering = t.start < killed_at < t.end
                    if t.stream and t.engines and t.engines[0] == fingerprint and answering:
                        expected = await direct_text(session, live.url, t)
                        checks.append({"conversation": t.conversation, "turn": t.turn,
                                       "engines": t.engines, "ok": t.ok,
                                       "same": t.ok and t.text == expected})  # fmt: skip
        return report(args, load.turns, kills, memory, ready, checks, samples)
    finally:
        for r in replicas:
            r.stop()
        for engine in engines:
            engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--rate", type=float, default=20, help="requests a second")
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation")
    parser.add_argument("--think-seconds", type=float, default=1.0)
    parser.add_argument("--question-chars", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--non-stream-share", type=float, default=0.2)
    parser.add_argument("--kill", type=float, action="append", default=[],
                        help="second at which the next engine is killed (repeat)")  # fmt: skip
    parser.add_argument("--restart-after", type=float, default=20)
    parser.add_argument("--router-restart", type=float, action="append", default=[])
    parser.add_argument("--share-window", type=float, default=60)
    parser.add_argument("--sample-every", type=float, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        help="a flag for every engine, e.g. --engine-arg=--cache-tokens=65536",
    )
    parser.add_argument("--router-arg", action="append", default=[],
                        help="a flag for every router replica")  # fmt: skip
    parser.add_argument("--replica-env", action="append", default=[], metavar="I:KEY=VALUE",
                        help="an environment variable for replica I only, e.g. "
                        "2:MALLOC_ARENA_MAX=2 (an A/B within one run)")  # fmt: skip
    parser.add_argument("--flat-slope", type=float, default=0.1,
                        help="MiB/min: memory is flat when each replica's last-half "
                        "least-squares RSS slope is at most this")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    envs: dict[int, dict[str, str]] = {}
    for item in args.replica_env:
        index, sep, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        if not (sep and eq and key and index.isdigit() and int(index) < args.replicas):
            parser.error(f"--replica-env {item!r}: expected I:KEY=VALUE, I below --replicas "
                         f"({args.replicas})")  # fmt: skip
        envs.setdefault(int(index), {})[key] = value
    args.replica_env = envs
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop cleanly: finally runs
    result = asyncio.run(soak(args))
    print(json.dumps(result, indent=2), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["all_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
