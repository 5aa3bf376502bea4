"""SGLang 0.5.23's own engine in one process, with no TCP socket (issue 71, item 2).

SGLang's `Engine` runs its scheduler and its detokenizer in processes of their own and joins
the scheduler to `torch.distributed` (a `tcp://` store and gloo groups, even at width 1). The
project's TPU machine refuses every TCP socket, loopback included, and one process at a time
can hold its chip. `OneProcessEngine` is SGLang's `Engine` with two launch hooks changed:

- the scheduler (`Scheduler`, its radix cache, continuous batching, `TpModelWorker` and
  `ModelRunner`) runs in a thread of the calling process, the detokenizer in another; they
  talk to the tokenizer manager over SGLang's own ZMQ `ipc://` sockets, as they do between
  processes;
- `torch.distributed` is initialised at world size 1 with PyTorch's in-process ``fake``
  backend and store (`use_fake_process_groups`), so no store, no gloo and no TCP socket
  exists; every collective at width 1 is the identity.

Everything else is SGLang's: `Engine.generate` goes through its `TokenizerManager`. Where the
model runs is `sglang_tpu.sglang_device_bridge`'s job. SGLang is imported lazily.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

FAKE_BACKEND = "fake"
NO_TCP_ERRNO = 97  # EAFNOSUPPORT: what the TPU machine answers to an internet socket
FIXED_NCCL_PORT = 29500  # fixed, so SGLang does not probe for a free port over TCP


def use_fake_process_groups() -> None:
    """Make `torch.distributed` build every group with the in-process ``fake`` backend.

    SGLang asks for gloo (its CPU groups) and a ``tcp://`` init method; both open TCP
    sockets. At world size 1 a collective is the identity, which the fake process group
    gives, with a `FakeStore` instead of a TCP or file store. Idempotent."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if getattr(dist.init_process_group, "_tpuserve_fake", False):
        return
    init_group = dist.init_process_group
    new_group = dist.new_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        world = kwargs.get("world_size", 1)
        if world not in (1, -1):
            raise ValueError(
                f"world_size={world}: the one-process engine runs at world size 1 only"
            )
        kwargs.pop("init_method", None)
        kwargs.update(backend=FAKE_BACKEND, store=FakeStore(), world_size=1, rank=0)
        return init_group(**kwargs)

    def fake_new_group(*args: Any, **kwargs: Any) -> Any:
        kwargs["backend"] = FAKE_BACKEND
        kwargs.pop("pg_options", None)
        return new_group(*args, **kwargs)

    def monitored_barrier(
        group: Any = None, timeout: Any = None, wait_all_ranks: bool = False
    ) -> None:
        # gloo's alone; at world size 1 a barrier has no one to wait for.
        dist.barrier(group=group)

    init_process_group._tpuserve_fake = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.new_group = fake_new_group
    dist.monitored_barrier = monitored_barrier


@contextlib.contextmanager
def refuse_internet_sockets() -> Iterator[list[str]]:
    """Within the block, Python's internet sockets fail as on the TPU machine (errno 97).

    Yields the list of refused attempts (family, where from), so a CPU run proves the engine
    opened none. Unix sockets and ZMQ's ipc:// (native code) are untouched."""
    refused: list[str] = []
    original = socket.socket.__init__

    def guarded(self: socket.socket, family: Any = -1, *args: Any, **kwargs: Any) -> None:
        if family in (socket.AF_INET, socket.AF_INET6) or family == -1:
            import traceback

            where = traceback.extract_stack(limit=4)[0]
            refused.append(f"family {family} from {where.filename}:{where.lineno}")
            raise OSError(NO_TCP_ERRNO, "Address family not supported by protocol (guard)")
        original(self, family, *args, **kwargs)

    socket.socket.__init__ = guarded  # type: ignore[method-assign]
    try:
        yield refused
    finally:
        socket.socket.__init__ = original  # type: ignore[method-assign]


CPU_MONITOR_COMPONENT = "one-process"


def one_cpu_monitor() -> None:
    """Start SGLang's CPU-time monitor once per process (with `--enable-metrics`).

    The tokenizer manager and the detokenizer each start one, registering the same Prometheus
    counter: in one process the second registration raises `DuplicateTimeseries`. A process's
    CPU time is every component's here, so one counter, labelled `CPU_MONITOR_COMPONENT`,
    counts it. Idempotent."""
    from sglang.srt.managers import detokenizer_manager, tokenizer_manager
    from sglang.srt.observability import cpu_monitor

    start = cpu_monitor.start_cpu_monitor_thread
    if getattr(start, "_tpuserve_once", False):
        return
    started: list[threading.Thread] = []
    lock = threading.Lock()

    def start_once(component: str, interval: float = 5.0) -> threading.Thread:
        with lock:
            if not started:
                started.append(start(CPU_MONITOR_COMPONENT, interval))
            return started[0]

    start_once._tpuserve_once = True  # type: ignore[attr-defined]
    for module in (cpu_monitor, tokenizer_manager, detokenizer_manager):
        module.start_cpu_monitor_thread = start_once


def engine_class() -> type:
    """SGLang's `Engine` subclass whose scheduler and detokenizer run in threads."""
    from sglang.srt.entrypoints.engine import Engine, SchedulerInitResult

    one_cpu_monitor()

    class OneProcessEngine(Engine):  # type: ignore[misc]
        """SGLang's `Engine` with its scheduler and detokenizer in threads."""

        @classmethod
        def _launch_scheduler_processes(
            cls,
            server_args: Any,
            port_args: Any,
            run_scheduler_process_func: Any,
            **kwargs: Any,
        ) -> Any:
            # Built here, in the launching thread: SGLang publishes one runtime context per
            # process and checks its role (the model runner wants "scheduler", the
            # tokenizer manager, built next, "tokenizer"). Only the event loop is a thread.
            scheduler = _build_scheduler(server_args, port_args)
            threading.Thread(
                target=_run_event_loop,
                args=(scheduler,),
                name="sglang-scheduler",
                daemon=True,
            ).start()
            result = SchedulerInitResult(
                scheduler_infos=[scheduler.get_init_info()], all_child_pids=[]
            )
            return result, []

        @classmethod
        def _launch_detokenizer_subprocesses(
            cls, server_args: Any, port_args: Any, run_detokenizer_process_func: Any
        ) -> Any:
            threading.Thread(
                target=_run_detokenizer,
                args=(server_args, port_args),
                name="sglang-detokenizer",
                daemon=True,
            ).start()
            return [], []

    return OneProcessEngine


def _build_scheduler(server_args: Any, port_args: Any) -> Any:
    """What SGLang's `run_scheduler_process` does before its event loop, minus what only a
    child process may do (its parent-death signal, its process title); the runtime context's
    role is "tokenizer" again afterwards, for the tokenizer manager."""
    from sglang.srt import runtime_context
    from sglang.srt.managers import scheduler as scheduler_module

    # The scheduler's own context, as `run_scheduler_process` publishes it for rank 0.
    scheduler_module.publish(
        server_args,
        role="scheduler",
        ranks=scheduler_module.SpawnRanks(
            world_rank=scheduler_module.spawn_world_rank(server_args, tp_rank=0, pp_rank=0),
            dp_rank=scheduler_module.resolve_spawn_dp_rank(None),
            gpu_id=0,
        ),
    )
    scheduler = scheduler_module.Scheduler(server_args, port_args)
    runtime_context.get_context()._publish_role = "tokenizer"
    return scheduler


def _run_event_loop(scheduler: Any) -> None:
    import traceback

    try:
        scheduler.run_event_loop()
    except BaseException:
        logger.error("the scheduler thread ended: %s", traceback.format_exc())


def _run_detokenizer(server_args: Any, port_args: Any) -> None:
    import traceback

    from sglang.srt.managers.detokenizer_manager import DetokenizerManager

    try:
        DetokenizerManager(server_args, port_args).event_loop()
    except BaseException:
        logger.error("the detokenizer thread ended: %s", traceback.format_exc())


def start_engine(**server_args: Any) -> Any:
    """SGLang's `Engine` of these `ServerArgs` fields in this process; no TCP socket is
    opened (``nccl_port`` is fixed so SGLang does not probe for a free one)."""
    use_fake_process_groups()
    server_args.setdefault("nccl_port", FIXED_NCCL_PORT)
    started = time.monotonic()
    engine = engine_class()(**server_args)
    logger.info("one-process engine ready in %.1f s", time.monotonic() - started)
    return engine
