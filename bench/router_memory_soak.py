"""Router memory under steady load with an engine killed and restarted, and where it grows.

Issue 68 saw a router grow 50 -> 83 MB at a steady 3.3 MB/min over a 10-minute soak at 20
requests/s with an engine killed (``kill -9``) and restarted. This runs the router in this
process (the default policy, ``precise`` with KV events) with ``tracemalloc`` on, in front of
``--engines`` engine twins (processes, real clock), while a load process sends ``--rate``
streamed completions a second (prompts sharing 8 prefixes, as a chat fleet's do). At
``--kill-at`` seconds engine 0 is killed with SIGKILL, at ``--restart-at`` started again on
its ports. Every ``--sample-every`` seconds it prints the process's RSS and the Python heap
tracemalloc sees; at the end, the allocation sites that grew most between the first sample
after the restart and the last (the leak, if any: what a plateau does not show). Each
sample also reads glibc's ``mallinfo2`` (summed over every arena): the bytes in use and the
bytes free but still held; at the end ``malloc_trim(0)`` returns what it can, and the RSS
before and after it says how much of the RSS was free heap the allocator kept (fragmentation,
or arenas not returning memory) rather than memory in use.

    python bench/router_memory_soak.py [--seconds 240] [--rate 20] [--kill-at 60]
                                       [--restart-at 90] [--sample-every 15] [--top 12]
                                       [--engine-arg=--cache-tokens=16384]
                                       [--question-chars 0] [--token-cache-bytes 67108864]
                                       [--trim-every-sample] [--kill-every 0]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prometheus_client import CollectorRegistry

from tests.component.router.router_fleet import EngineTwin, wait_ready
from tpuserve_router.app import create_router_app
from tpuserve_router.config import RouterConfig

LOAD = r"""
import asyncio, random, sys, aiohttp, orjson
url, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
chars = int(sys.argv[4])
PREFIXES = [("system prompt %d " % i) * 60 for i in range(8)]
def question(i):
    rng = random.Random(i)
    words, size = ["question %d" % i], 0
    while size < chars:
        words.append("word%d" % rng.randrange(100000))
        size += len(words[-1]) + 1
    return " ".join(words)
async def one(session, i, stats):
    body = {"model": "m", "prompt": PREFIXES[i % 8] + question(i), "max_tokens": 16,
            "stream": True}
    try:
        async with session.post(url, json=body) as r:
            async for _ in r.content.iter_any():
                pass
            stats[0 if r.status == 200 else 1] += 1
    except Exception:
        stats[1] += 1
async def main():
    stats = [0, 0]
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks, loop = [], asyncio.get_running_loop()
        start = loop.time()
        i = 0
        while loop.time() - start < seconds:
            tasks.append(asyncio.ensure_future(one(session, i, stats)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
        await asyncio.gather(*tasks)
    print(orjson.dumps({"ok": stats[0], "failed": stats[1]}).decode(), flush=True)
asyncio.run(main())
"""


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = MallInfo2


def malloc_mib() -> tuple[float, float]:
    """glibc's heap: MiB in use (small blocks, ordinary blocks and mmapped ones) and MiB free
    but held, over every arena."""
    info = LIBC.mallinfo2()
    used = info.uordblks + info.hblkhd
    return used / 2**20, info.fordblks / 2**20


def malloc_trim() -> None:
    LIBC.malloc_trim(0)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def soak(args: argparse.Namespace) -> None:
    flags = ["--time-scale", "1", "--startup-time-scale", "0", "--served-model-name", "m"]
    engines = [EngineTwin([*flags, *args.engine_arg]) for _ in range(args.engines)]
    for engine in engines:
        engine.start()
    tracemalloc.start(args.frames)
    config = RouterConfig(
        host="127.0.0.1", port=0, workers=tuple(e.url for e in engines),
        health_check_interval_seconds=1.0, token_cache_bytes=args.token_cache_bytes,
    )  # fmt: skip
    app = create_router_app(config, registry=CollectorRegistry())
    await app.start()
    try:
        await wait_ready(app, args.engines)
    except BaseException:
        await app.stop()
        for engine in engines:
            engine.stop()
        raise
    load = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LOAD, app.base_url + "/v1/completions", str(args.rate),
        str(args.seconds), str(args.question_chars), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    start = time.monotonic()
    killed = restarted = False
    baseline: tracemalloc.Snapshot | None = None
    last: tracemalloc.Snapshot | None = None
    try:
        while load.returncode is None:
            await asyncio.sleep(args.sample_every)
            now = time.monotonic() - start
            if not killed and now >= args.kill_at:
                assert engines[0].proc is not None
                engines[0].proc.kill()  # SIGKILL
                engines[0].proc.wait()
                killed = True
                print(f"{now:6.0f} s  engine 0 killed", flush=True)
            if killed and not restarted and now >= args.restart_at:
                try:
                    await asyncio.to_thread(engines[0].start)
                except RuntimeError as err:  # not ready in time (a loaded machine): again
                    engines[0].stop()
                    print(f"{now:6.0f} s  engine 0 restart failed ({err}); retrying", flush=True)
                    continue
                restarted = True
                print(f"{now:6.0f} s  engine 0 restarted", flush=True)
                if args.kill_every:  # the next cycle
                    args.kill_at += args.kill_every
                    args.restart_at += args.kill_every
                    killed = restarted = False
            current, _peak = tracemalloc.get_traced_memory()
            used, free = malloc_mib()
            trimmed = ""
            if args.trim_every_sample:
                before = rss_mib()
                malloc_trim()
                trimmed = f" (trimmed {before - rss_mib():4.1f})"
            routed = {w.name[-5:]: w.in_flight for w in app.registry.workers}
            tokens = app.tokenizer.cached_bytes if app.tokenizer is not None else 0
            print(
                f"{now:6.0f} s  RSS {rss_mib():6.1f} MiB{trimmed}  malloc used {used:6.1f} free "
                f"{free:5.1f} MiB  traced heap {current / 2**20:6.1f} MiB"
                f"  token cache {tokens / 2**20:5.1f} MiB  index {app.policy.index_sizes()}"
                f"  in flight {routed}",
                flush=True,
            )
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            if args.kill_every and baseline is None and now >= args.kill_every:
                baseline = snapshot  # the first cycle's
            if restarted and baseline is None:
                baseline = snapshot
            last = snapshot
    finally:
        out, _ = await asyncio.wait_for(load.communicate(), 180)
        print("load:", out.decode().strip(), flush=True)
        before = rss_mib()
        used, free = malloc_mib()
        malloc_trim()
        print(f"at the end: RSS {before:.1f} MiB (malloc used {used:.1f}, free {free:.1f}); "
              f"after malloc_trim(0) {rss_mib():.1f} MiB", flush=True)  # fmt: skip
        await app.stop()
        for engine in engines:
            engine.stop()
    if baseline is not None and last is not None:
        print(f"top growth after the restart (by {args.frames}-frame traceback):")
        for stat in last.compare_to(baseline, "traceback")[: args.top]:
            print(f"  {stat.size_diff / 1024:+9.1f} KiB  {stat.count_diff:+7d} blocks")
            for line in stat.traceback.format()[-6:]:
                print("     ", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--rate", type=float, default=20)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--kill-at", type=float, default=60)
    parser.add_argument("--restart-at", type=float, default=90)
    parser.add_argument("--kill-every", type=float, default=0,
                        help="repeat the kill and the restart every this many seconds")  # fmt: skip
    parser.add_argument("--sample-every", type=float, default=15)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument(
        "--question-chars",
        type=int,
        default=0,
        help="each prompt's own tail, after its shared prefix (distinct text)",
    )
    parser.add_argument("--token-cache-bytes", type=int, default=64 << 20)
    parser.add_argument(
        "--trim-every-sample",
        action="store_true",
        help="call malloc_trim(0) after each sample (the RSS it returned)",
    )
    parser.add_argument(
        "--engine-arg", action="append", default=[],
        help="a flag for every engine twin, e.g. --engine-arg=--cache-tokens=16384",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(soak(args))


if __name__ == "__main__":
    main()
