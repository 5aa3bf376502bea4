"""Shared test fakes: stand-ins for the parts a test does not exercise (one section per area;
the Kubernetes side's are in `tests/fake_kube.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import os
import stat
import sys
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from sglang_tpu.preflight import DeviceFacts, ProbeError
from sglang_tpu.topology import lookup
from sglang_tpu.tpu_stack import StackVersions
from tests.waiting import eventually_async
from tpuserve.cluster.pods.volumes import TokenRequest
from tpuserve_router.app import RouterApp, create_router_app
from tpuserve_router.config import RouterConfig
from tpuserve_router.front.http_request import HttpRequest, status_line
from tpuserve_router.front.server import front_limits, serve
from tpuserve_router.policies import RouteRequest

# --- router ------------------------------------------------------------------------------------
#
# `FakeWorker` is a worker as routing policies see it (`policies.base.WorkerView`);
# `fake_request` a routing request whose prompt's characters stand in for its tokens;
# `VirtualClock` a clock a test moves by hand (policies and the block index take a clock).


@dataclasses.dataclass
class FakeWorker:
    """A worker as routing policies see it."""

    name: str
    in_flight: int = 0
    healthy: bool = True
    peer_in_flight: int = 0
    peer_prefill_tokens: int = 0
    announced_in_flight: int = 0


def fake_worker(name: str, in_flight: int = 0, healthy: bool = True) -> FakeWorker:
    return FakeWorker(name, in_flight, healthy)


def fake_request(
    prompt: str = "", token_ids: list[int] | None = None, model: str = ""
) -> RouteRequest:
    """A routing request; without ``token_ids`` a prompt's characters stand in for tokens."""
    if token_ids is None and prompt:
        token_ids = [ord(c) for c in prompt]
    return RouteRequest(model=model, text=prompt, token_ids=token_ids)


class VirtualClock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# --- http --------------------------------------------------------------------------------------
#
# `LoopbackApp` serves an aiohttp application on a free loopback port: the base of every fake
# HTTP server here and in the suites. `FakeModelServer` adds what a router asks a model server
# before it routes there (`/health`, `/v1/models`) to the routes a fake serves.


class LoopbackApp:
    """An aiohttp application on 127.0.0.1 and a free port; ``start`` returns its base URL."""

    def __init__(self, app: web.Application) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        self._started = False
        self.url = ""

    async def start(self) -> str:
        await self._runner.setup()
        self._started = True
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = next(a[1] for a in self._runner.addresses if isinstance(a, tuple))
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._runner.cleanup()


class FakeModelServer(LoopbackApp):
    """A model server on loopback: healthy, lists ``model``, and serves ``routes``."""

    def __init__(self, model: str, routes: Iterable[web.RouteDef]) -> None:
        self.model = model
        app = web.Application()
        app.add_routes([web.get("/health", self._health), web.get("/v1/models", self._models)])
        app.add_routes(routes)
        super().__init__(app)

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )


# --- kv events ---------------------------------------------------------------------------------
#
# `FakeSGLangWorker` is an HTTP worker whose `/server_info` a test writes, to drive the router's
# discovery of KV-event publishers (it serves no generation).


class FakeSGLangWorker(FakeModelServer):
    """An HTTP worker on loopback that answers what a router asks before it routes there
    (``/health``, ``/v1/models``) and a given ``/server_info``; it generates nothing. Tests
    put a KV-event publisher description in the server info (``kv_events`` block or
    ``kv_events_config``) to drive the router's discovery."""

    def __init__(self, server_info: dict[str, Any], model: str = "fake-model") -> None:
        self.server_info = server_info
        super().__init__(model, [web.get("/server_info", self._server_info)])

    async def _server_info(self, _: web.Request) -> web.Response:
        return web.json_response(self.server_info)


# --- pod runner: the runner as a pod sees it, with no API server ------------------------------


class FakePodHost:
    """`tpuserve.cluster.pods.pod.PodHost` in memory: every status write, event and deletion
    is recorded; ConfigMaps and Secrets come from `objects` ((kind, namespace, name) -> data)."""

    def __init__(self, root: Any, network: str = "127.250.7.0/24") -> None:
        import ipaddress
        from pathlib import Path

        from tpuserve.cluster.pods.addresses import PodAddresses

        self.root = Path(root)
        self.pods_dir = self.root / "pods"
        self.claims_dir = self.root / "claims"
        self.base_env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        self.backoff_base_seconds = 0.2
        self.objects: dict[tuple[str, str, str], dict[str, str]] = {}
        self.statuses: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.deleted: list[str] = []
        self.addresses = PodAddresses(ipaddress.IPv4Network(network))
        ca_cert = self.root / "ca.crt"
        ca_cert.parent.mkdir(parents=True, exist_ok=True)
        ca_cert.write_text("not a certificate\n")
        self.reader = _FakeReader(self.objects, ca_cert)
        self.dns: Any = None  # a tpuserve.cluster.pods.dns.HostsFile, as the runner keeps one
        self.supervisors: dict[str, Any] = {}

    @property
    def hosts_file(self) -> Any:
        return None if self.dns is None else self.dns.path

    def lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        return self.objects.get((kind, namespace, name))

    def allocate_address(self) -> str:
        return self.addresses.allocate()

    def release_address(self, address: str) -> None:
        self.addresses.release(address)

    async def write_status(self, pod: Mapping[str, Any], status: dict[str, Any]) -> bool:
        self.statuses.append(copy.deepcopy(status))
        return True

    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))

    async def delete_pod(self, pod: Mapping[str, Any]) -> None:
        self.deleted.append(str(pod["metadata"]["name"]))

    def pod_changed(self, supervisor: Any) -> None:
        self.supervisors[supervisor.uid] = supervisor
        if self.dns is not None:
            self.dns.refresh((s.pod, s.pod_ip) for s in self.supervisors.values() if s.pod_ip)

    @property
    def status(self) -> dict[str, Any]:
        """The last status written."""
        return self.statuses[-1] if self.statuses else {}

    def container(self, name: str) -> dict[str, Any]:
        """The last status of container `name`; KeyError before there is one."""
        for found in self.status.get("containerStatuses") or []:
            if found["name"] == name:
                return dict(found)
        raise KeyError(name)


class _FakeReader:
    server = "https://127.0.0.1:6443"

    def __init__(self, objects: Mapping[tuple[str, str, str], dict[str, str]], ca_cert: Any):
        self.objects = objects
        self.ca_cert = ca_cert

    def data(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        return self.objects.get((kind, namespace, name))

    def token(self, request: TokenRequest) -> str:
        return f"token-for-{request.namespace}-{request.service_account}"


def pod_manifest(
    name: str,
    containers: list[dict[str, Any]],
    *,
    namespace: str = "ns",
    restart_policy: str = "Always",
    grace_seconds: int = 5,
    **spec: Any,
) -> dict[str, Any]:
    """A bound pod as the runner receives it from the API server."""
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": {"app": name},
        },
        "spec": {
            "nodeName": "gke-tpuserve-cpu-0",
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": grace_seconds,
            "containers": containers,
            **spec,
        },
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }


# --- router: stub workers ----------------------------------------------------------------------
#
# `StubWorker` is an SGLang-compatible worker on loopback that answers at once, or misbehaves
# as a test asks (`mode`): 500 to every generation request while /health passes, never
# answering, an answer larger than the router's cap, a stream that never ends, a stream that
# stalls after its first event, or ("stream") answers every request with a short whole stream,
# or ("twice") writes two whole answers to each request in one write.
# Set `frozen`, it reads every request and answers none (a stopped engine: probes too).
# It counts what it saw and records `/abort_request` calls, so tests assert on counts and
# state, never on time. It runs in the test's event loop.

STUB_MODEL = "stub-model"
STUB_COMPLETION = (
    b'{"id":"c","object":"text_completion","model":"stub-model","choices":[{"index":0,'
    b'"text":" ok","finish_reason":"length"}],"usage":{"prompt_tokens":3,'
    b'"completion_tokens":1,"total_tokens":4}}'
)
STUB_EVENT = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":" a"}]}\n\n'
STUB_SECOND = b'{"second":"an answer no request asked for"}'
STUB_MODES = ("ok", "error_500", "hang", "big", "flood", "stall", "stream", "twice")


class StubWorker:
    """A worker answering as ``mode`` says (one of `STUB_MODES`); see the section comment."""

    def __init__(
        self, mode: str = "ok", big_bytes: int = 1 << 20, adapters: tuple[str, ...] = ()
    ) -> None:
        self.mode = mode
        self.big_bytes = big_bytes
        self.adapters = adapters  # LoRA adapters its /v1/models lists, as SGLang's
        self.health_status = 200
        self.generation_requests = 0
        self.in_progress = 0
        self.aborted: list[str] = []  # rids of /abort_request calls
        self.bodies: list[bytes] = []
        self.headers: list[list[tuple[bytes, bytes]]] = []  # of each generation request
        self.release = asyncio.Event()  # lets "hang" requests answer
        self.frozen = False  # answers nothing at all (a stopped engine), whatever the mode
        self.server_info: dict[str, Any] | None = None  # its /server_info, when set
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the stub first"
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> StubWorker:
        self._server = await serve(self.handle, "127.0.0.1", 0, front_limits(RouterConfig()))
        return self

    async def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.close()
            self._server = None

    async def handle(self, request: HttpRequest) -> None:
        if self.frozen:  # read, never answered: probes, look-ups and generation alike
            await self.release.wait()
            return
        json = b"content-type: application/json\r\n"
        path = request.path
        if path == "/health":
            request.respond(self.health_status, json, b"{}")
        elif path == "/v1/models":
            cards = [{"id": STUB_MODEL, "object": "model", "parent": None}]
            cards += [{"id": a, "object": "model", "parent": STUB_MODEL} for a in self.adapters]
            request.respond(200, json, orjson.dumps({"object": "list", "data": cards}))
        elif path == "/server_info" and self.server_info is not None:
            request.respond(200, json, orjson.dumps(self.server_info))
        elif path == "/abort_request":
            self.aborted.append(str(orjson.loads(request.body or b"{}").get("rid")))
            request.respond(200, json, b"{}")
        elif path in ("/v1/completions", "/v1/chat/completions", "/generate"):
            self.generation_requests += 1
            self.bodies.append(request.body)
            self.headers.append(request.headers)
            self.in_progress += 1
            try:
                await self._generate(request, json)
            finally:
                self.in_progress -= 1
        else:
            request.respond(404, json, b"{}")

    async def _generate(self, request: HttpRequest, json: bytes) -> None:
        mode = self.mode
        if mode == "ok":
            request.respond(200, json, STUB_COMPLETION)
        elif mode == "error_500":
            request.respond(500, json, b'{"error":{"message":"engine failure","code":500}}')
        elif mode == "hang":
            await self.release.wait()
            request.respond(200, json, STUB_COMPLETION)
        elif mode == "big":
            request.respond(200, json, b'{"pad":"' + b"x" * self.big_bytes + b'"}')
        elif mode == "flood":
            request.start_chunked(200, b"content-type: text/event-stream\r\n")
            while True:  # until the router goes away (that cancels this task)
                request.write_chunk(STUB_EVENT * 64)
                await request.drain()
                await asyncio.sleep(0)
        elif mode == "stream":  # a whole stream: one event, then [DONE]
            request.start_chunked(200, b"content-type: text/event-stream\r\n")
            request.write_chunk(STUB_EVENT)
            request.write_chunk(b"data: [DONE]\n\n")
            request.end_chunked()
        elif mode == "twice":  # two whole answers in one write: the second to no request
            transport = request._conn.transport
            assert transport is not None
            request.head_sent = request.finished = True
            transport.write(_whole_answer(json, STUB_COMPLETION) + _whole_answer(json, STUB_SECOND))
        elif mode == "stall":
            request.start_chunked(200, b"content-type: text/event-stream\r\n")
            request.write_chunk(STUB_EVENT)
            await self.release.wait()
            request.end_chunked()
        else:
            raise ValueError(f"mode {mode!r}: allowed {', '.join(STUB_MODES)}")


def _whole_answer(headers: bytes, body: bytes) -> bytes:
    return status_line(200) + headers + b"content-length: %d\r\n\r\n" % len(body) + body


@contextlib.asynccontextmanager
async def stub_router(*workers: StubWorker, **settings: Any) -> AsyncIterator[RouterApp]:
    """A least_load router probing every 50 ms in front of the started stub ``workers``
    (``settings`` override `RouterConfig` fields), once every worker is routable; stops the
    router and the workers on exit. A worker that fails fast is always the least loaded, so
    least_load sends it every request it can."""
    for worker in workers:
        await worker.start()
    config = RouterConfig(
        host="127.0.0.1",
        port=0,
        workers=tuple(w.url for w in workers),
        policy="least_load",
        health_check_interval_seconds=0.05,
    ).replace(**settings)
    app = create_router_app(config, registry=CollectorRegistry())
    await app.start()
    try:
        await eventually_async(
            lambda: all(w.healthy and w.models for w in app.registry.workers),
            what="every worker routable",
        )
        yield app
    finally:
        await app.stop()
        for worker in workers:
            await worker.stop()


# --- the launcher's pre-flight ------------------------------------------------------------------
#
# `FakeTPUProbe` stands where `preflight.SubprocessProbe` runs the probe script with SGLang's
# interpreter: it answers with the versions and device facts it was given (or raises
# `ProbeError`), and counts the questions, so a test sees the device was never asked after a
# stack failure. `FakeTPUProbe.matching(generation, topology)` sees exactly the chips the
# catalog says one host of that slice has, with the image's stack.


@dataclasses.dataclass
class FakeTPUProbe:
    stack: StackVersions
    facts: DeviceFacts
    versions_error: str | None = None
    device_error: str | None = None
    asked: list[str] = dataclasses.field(default_factory=list)

    IMAGE_STACK = StackVersions("/opt/tpuserve/bin/python3", "2.14.1+cpu", "0.2.0", "0.0.50")

    @classmethod
    def matching(cls, generation: str, topology: str, **stack: Any) -> FakeTPUProbe:
        shape = lookup(generation, topology)
        gen = shape.generation
        facts = DeviceFacts(
            pci=(gen.pci_device_id,) * shape.chips_per_host,
            accelerator="tpu",
            device_count=shape.devices_per_host,
            device_names=(gen.device_names[0],) * shape.devices_per_host,
            total_memory_bytes=(gen.hbm_bytes_per_device,) * shape.devices_per_host,
            eager_modes=("DEFER_AND_FUSE", "DEFER_NEVER", "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
            compile_backend_tpu=True,
        )
        return cls(dataclasses.replace(cls.IMAGE_STACK, **stack), facts)

    def versions(self) -> StackVersions:
        self.asked.append("versions")
        if self.versions_error is not None:
            raise ProbeError(self.versions_error)
        return self.stack

    def device(self) -> DeviceFacts:
        self.asked.append("device")
        if self.device_error is not None:
            raise ProbeError(self.device_error)
        return self.facts


# A stand-in TPU stack for the probe script (`sglang_tpu/preflight_probe.py`): distribution
# metadata for torch, torch-tpu and libtpu, and `torch` / `torch_tpu` modules answering the APIs
# TorchTPU 0.2.0 answered on a v5e (accelerator `tpu`, one device "TPU v5e" of 17179869184
# bytes, its eager modes, the `tpu` compile backend), behind a wrapper interpreter.

FAKE_TORCH = """
import enum, types
class _Accelerator:
    type = "tpu"
class _Properties:
    total_memory = 17179869184
class EagerMode(enum.Enum):
    DEFER_NEVER = 0
    DEFER_AND_FUSE = 1
    DEFER_NEVER_AND_LAUNCH_BLOCKING = 2
tpu = types.SimpleNamespace(
    get_device_name=lambda i=0: "TPU v5e",
    get_device_properties=lambda i=0: _Properties(),
    EagerMode=EagerMode,
)
accelerator = types.SimpleNamespace(
    current_accelerator=lambda: _Accelerator(), device_count=lambda: 1
)
def get_device_module(name):
    return tpu
def _lookup_backend(name):
    if name != "tpu":
        raise KeyError(name)
    return lambda *a: None
_dynamo = types.SimpleNamespace(lookup_backend=_lookup_backend)
"""
IMPORT_RAISES = (
    'raise RuntimeError("set_libtpu_version(): expected version string to be of the format '
    "<major>[.<minor>[.<patch>]][.dev<build>][<suffix>], got '0.0.42.1'\")\n"
)


def stand_in_tpu_python(
    tmp_path: Path, libtpu: str, torch_tpu_module: str = "", with_stack: bool = True
) -> Path:
    """A wrapper script running this interpreter with a stand-in TPU stack first on its
    PYTHONPATH (in `tmp_path/site`): what `TPUSERVE_SGLANG_PYTHON` names in these tests."""
    site = tmp_path / "site"
    site.mkdir()
    if with_stack:
        for name, version in (("torch", "2.13.0"), ("torch_tpu", "0.2.0"), ("libtpu", libtpu)):
            info = site / f"{name}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
            )
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
        (site / "torch_tpu").mkdir()
        (site / "torch_tpu" / "__init__.py").write_text(torch_tpu_module)
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper
