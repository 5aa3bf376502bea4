"""The fleet the feature tests of the router run against (`Fleet`: a prefill, a decode and a
colocated engine twin for each of two models, one with a LoRA adapter), the routers they start
in each mode (`serve`, `Target`), and what they read back (`series`, `ledger`, `settled`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import orjson

from tests.component.engine.engine_process import running_requests
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    start_router,
    wait_ready,
)
from tests.fakes import StubWorker
from tests.waiting import eventually_async
from tpuserve.cluster.ports import free_port
from tpuserve_router.app import RouterApp
from tpuserve_router.config import RouterConfig

KEY = "sk-matrix-0123456789abcdef"
ADAPTER = "sql"
QWEN = "qwen"
LATE = "late"  # a model whose engines come up while a request waits for them
PROMPT = "Tell me everything about tensor processing units, their memory and their links. " * 3
MODES = ("colocated", "pd")
"""HTTP colocated (``--worker``) and HTTP PD (``--prefill``/``--decode``, every request a
pair: ``--pd-policy always``)."""


class Fleet:
    """For each of two models (`MODEL` with LoRA adapter `ADAPTER`, and `QWEN`), a prefill, a
    decode and a colocated twin, at half their modelled speed (a stream still runs when its
    client leaves)."""

    def __init__(self) -> None:
        slow = ["--time-scale", "0.5"]
        self.bootstrap: dict[str, int] = {}
        self.by_model: dict[str, dict[str, EngineTwin]] = {}
        for model, extra in (
            (MODEL, ["--lora-paths", f"{ADAPTER}=/lora/{ADAPTER}"]),
            (QWEN, ["--served-model-name", QWEN]),
        ):
            base = [*slow, *extra]
            port = free_port()
            prefill = EngineTwin(
                [*base, "--disaggregation-mode", "prefill", "--enable-debug-endpoints",
                 "--disaggregation-bootstrap-port", str(port)],
            )  # fmt: skip
            self.bootstrap[prefill.url] = port
            self.by_model[model] = {
                "prefill": prefill,
                "decode": EngineTwin([*base, "--disaggregation-mode", "decode"]),
                "colocated": EngineTwin(base),
            }

    @property
    def engines(self) -> list[EngineTwin]:
        return [twin for roles in self.by_model.values() for twin in roles.values()]

    def of(self, role: str) -> list[EngineTwin]:
        return [roles[role] for roles in self.by_model.values()]

    @property
    def prefill(self) -> EngineTwin:
        return self.by_model[MODEL]["prefill"]

    def config(self, mode: str, **changes: object) -> RouterConfig:
        if not mode.endswith("pd"):
            config = RouterConfig(workers=tuple(t.url for t in self.of("colocated")))
        else:
            config = RouterConfig(
                prefill=tuple(f"{t.url} {self.bootstrap[t.url]}" for t in self.of("prefill")),
                decode=tuple(t.url for t in self.of("decode")),
                pd_policy="always",
            )
        if mode.startswith("picker"):
            config = config.replace(picker_port=0)
        settings: dict[str, object] = {
            "policy": "cache_aware",
            "health_check_interval_seconds": 0.3,
        }
        return config.replace(**{**settings, **changes})

    def serving(self, mode: str) -> list[EngineTwin]:
        if mode.endswith("pd"):
            return [*self.of("prefill"), *self.of("decode")]
        return self.of("colocated")


async def serve(fleet: Fleet, routers: list[RouterApp], mode: str, **changes: object) -> RouterApp:
    app = await start_router(fleet.config(mode, **changes))
    routers.append(app)
    await wait_ready(app, len(fleet.serving(mode)))
    return app


def keys_file(tmp_path: Path, **limits: object) -> str:
    path = tmp_path / "keys.json"
    path.write_bytes(orjson.dumps({"keys": [{"key": KEY, "tenant": "matrix", **limits}]}))
    return str(path)


def client(app: RouterApp | Target, key: str = KEY) -> openai.AsyncOpenAI:
    url = app.url if isinstance(app, Target) else app.base_url
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


@dataclass(frozen=True)
class Target:
    """A router in one mode, and where its clients send (a gateway's front, for the picker)."""

    app: RouterApp
    url: str
    mode: str
    late: tuple[EngineTwin, ...] = ()
    """Engines of model `LATE` the router knows but that are not up yet (the holds cell)."""
    failing: StubWorker | None = None
    """A worker of `MODEL` answering 500 to every request, listed first (the retries cell)."""
    fleet: Fleet | None = None
    peer: RouterApp | None = None
    """A second replica peering with ``app`` (the peering cell)."""


async def settled(app: RouterApp, fleet: Fleet, mode: str) -> None:
    """Until nothing runs on the router or on the engines it sends to."""

    async def idle() -> bool:
        async with aiohttp.ClientSession() as session:
            for engine in fleet.serving(mode):
                if await running_requests(session, engine.url):
                    return False
        return app.pipeline.in_flight == 0

    await eventually_async(idle, what="the requests ended")


def series(app: RouterApp, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for family in app.metrics.registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def ledger(app: RouterApp) -> dict[str, float]:
    """What the router wrote down for the tenant: its tokens, its requests by status, and
    what its key's minute holds."""
    key = app.pipeline.keys.authenticate(KEY.encode()) if app.pipeline.keys else None
    assert key is not None
    window = app.pipeline.quotas.of(key, 0.0).tokens
    assert window is not None
    return {
        "prompt": series(app, "tpuserve_router_tenant_tokens_total", kind="prompt"),
        "completion": series(app, "tpuserve_router_tenant_tokens_total", kind="completion"),
        "requests 499": series(app, "tpuserve_router_requests_total", status="499"),
        "tenant requests 499": series(app, "tpuserve_router_tenant_requests_total", status="499"),
        "minute": float(window.used),
        # what outlier ejection heard (the window outlasts the test): nothing of a client leaving
        "outlier window": float(sum(w.window_requests for w in app.registry.workers)),
    }


async def complete(
    oa: openai.AsyncOpenAI, model: str = MODEL, max_tokens: int = 4, prompt: str = PROMPT
) -> str:
    answer = await oa.completions.create(model=model, prompt=prompt, max_tokens=max_tokens)
    assert answer.choices[0].text
    return answer.model


@contextlib.contextmanager
def running_fleet() -> Iterator[Fleet]:
    """A `Fleet` with every engine started, stopped on the way out."""
    fleet = Fleet()
    try:
        for engine in fleet.engines:
            engine.start()
        yield fleet
    finally:
        for engine in fleet.engines:
            engine.stop()
