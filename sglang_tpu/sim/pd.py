"""The twin in SGLang's PD roles: a prefill engine with its bootstrap server, a decode engine
that waits for the bootstrap and the KV, and the transfer timed by bytes over the link.

What SGLang 0.5.23 does (`sglang_tpu.disaggregation` names the sources), and the twin too:

- **prefill** (``--disaggregation-mode prefill``): serves the bootstrap server on
  ``--disaggregation-bootstrap-port`` (``PUT``/``GET /route``, ``POST /register_dp_rank``,
  ``POST /query_dp_ranks``, ``GET /health``) and registers its ranks there. A request with a
  ``bootstrap_room`` is prefilled and makes one token; its KV is then sent once the decode
  engine holding the same room has bootstrapped, and the prefill answers after the send. A
  decode that does not come within ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` fails the
  request (``sglang:num_bootstrap_failed_reqs_total``; 500);
- **decode** (``--disaggregation-mode decode``): asks the prefill's bootstrap server for its
  ranks (``GET /route``), sends its metadata for the room's rank (``room % dp_size``), waits
  for the KV up to ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``, then decodes with the prompt's KV
  in its pool and the prefill's token first. A failed transfer counts in
  ``sglang:num_transfer_failed_reqs_total`` and the request ends with 500;
- either refuses a request without ``bootstrap_room`` (400, SGLang's message) unless the
  backend is ``fake`` (then a decode engine decodes at once, with no KV moved, as SGLang's
  fake receiver does).

Where the twin differs: SGLang moves the KV with the transfer backend (Mooncake/NIXL RDMA,
ZMQ side channels); the twin's decode sends its metadata as ``POST /twin/kv_transfer`` to the
rank address the prefill registered (its bootstrap server), and that call returns when the KV
has "arrived": after `sglang_tpu.disaggregation.kv_transfer_seconds` of the prompt's KV bytes
over ``--kv-link`` (DCN between slices) times ``--time-scale``. The prefill computes before
the decode bootstraps (SGLang's optimistic prefill); the transfer waits for both.

Faults on demand (``POST /debug/pd_fault``, with ``--enable-debug-endpoints``) on a prefill
twin, for the next ``count`` transfers: ``bootstrap_timeout`` (the decode's metadata is never
taken: both engines wait out their timeouts), ``transfer_failure`` (the transfer fails on
both sides) and ``die_mid_transfer`` (the process exits half-way through a transfer, as a
crashed prefill pod).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from sglang_tpu import disaggregation as pd
from sglang_tpu import metric_names as names

log = logging.getLogger(__name__)

FAULTS: Final = ("bootstrap_timeout", "transfer_failure", "die_mid_transfer")
MAX_FAULTS: Final = 1024
MAX_ROOMS: Final = 65536  # rooms the prefill keeps at once (each is one request in flight)
BOOTSTRAP_RETRY_SECONDS: Final = 0.05
TRANSFER_PATH: Final = "/twin/kv_transfer"
UNSPECIFIED_HOSTS: Final = ("", "0.0.0.0", "::")


class PdFailure(Exception):
    """A PD request failed (bootstrap or transfer); ``status`` and message are its answer."""

    def __init__(self, kind: str, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.kind = kind  # "bootstrap" | "transfer" | "no_room"
        self.status = status


@dataclass(frozen=True, slots=True)
class Bootstrap:
    """The three PD fields of a request (scalars: the twin serves one prompt a request)."""

    host: str | None
    port: int | None
    room: int


@dataclass(frozen=True, slots=True)
class PdSettings:
    mode: str = "null"
    bootstrap_port: int = pd.DEFAULT_BOOTSTRAP_PORT
    transfer_backend: str = pd.DEFAULT_TRANSFER_BACKEND
    kv_link: str = pd.DEFAULT_KV_LINK
    dp_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.mode != "null"


PD_COLOCATED: Final = PdSettings()


@dataclass(slots=True)
class _Room:
    """One room on the prefill: its KV (once computed) meets the decode's metadata."""

    decode_ready: asyncio.Event = field(default_factory=asyncio.Event)
    kv_ready: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Future[float] | None = None  # the transfer's seconds, or PdFailure
    prompt_tokens: int = 0


class PdRole:
    """The PD side of one running twin: rooms, bootstrap server, transfers, PD metrics."""

    def __init__(
        self,
        settings: PdSettings,
        *,
        host: str,
        kv_bytes_per_token: float,
        hosts: int,
        time_scale: float,
        registry: Any,
        scheduler_labels: Mapping[str, str],
    ) -> None:
        self.settings = settings
        self.host = host
        self.kv_bytes_per_token = kv_bytes_per_token
        self.hosts = hosts
        self.time_scale = time_scale
        self.bootstrap_timeout = pd.timeout_seconds(
            pd.BOOTSTRAP_TIMEOUT_ENV, pd.DEFAULT_BOOTSTRAP_TIMEOUT_SECONDS
        )
        self.waiting_timeout = pd.timeout_seconds(
            pd.WAITING_TIMEOUT_ENV, pd.DEFAULT_WAITING_TIMEOUT_SECONDS
        )
        self.rooms: dict[int, _Room] = {}
        self.faults: list[str] = []
        self.route_table: dict[int, dict[str, Any]] = {}  # dp rank -> rank info
        self.room_ranks: dict[int, int] = {}
        self.session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.bound_port: int | None = None
        self._depths: dict[int, int] = {}
        made = {spec.name: _make(spec, registry, scheduler_labels) for spec in names.PD_METRICS}
        self.bootstrap_queue: Gauge = made[names.NUM_PREFILL_BOOTSTRAP_QUEUE_REQS.name]
        self.inflight_queue: Gauge = made[names.NUM_PREFILL_INFLIGHT_QUEUE_REQS.name]
        self.prealloc_queue: Gauge = made[names.NUM_DECODE_PREALLOC_QUEUE_REQS.name]
        self.transfer_queue: Gauge = made[names.NUM_DECODE_TRANSFER_QUEUE_REQS.name]
        self.speed: Histogram = made[names.KV_TRANSFER_SPEED_GB_S.name]
        self.latency: Histogram = made[names.KV_TRANSFER_LATENCY_MS.name]
        self.total_mb: Histogram = made[names.KV_TRANSFER_TOTAL_MB.name]
        self.bootstrap_failed: Counter = made[names.NUM_BOOTSTRAP_FAILED_REQS.name]
        self.transfer_failed: Counter = made[names.NUM_TRANSFER_FAILED_REQS.name]

    def _move(self, gauge: Gauge, by: int) -> None:
        """A queue-depth gauge (SGLang's are ``mostrecent`` gauges: set, never incremented)."""
        depth = self._depths[id(gauge)] = self._depths.get(id(gauge), 0) + by
        gauge.set(depth)

    def queued_for_room(self, by: int) -> None:
        """A decode request waits for KV room (or stops waiting): SGLang's prealloc queue."""
        self._move(self.prealloc_queue, by)

    @property
    def fake(self) -> bool:
        return self.settings.transfer_backend == "fake"

    # --- lifetime -------------------------------------------------------------------------

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, connect=5.0)
        self.session = aiohttp.ClientSession(timeout=timeout)
        if self.settings.mode != "prefill":
            return
        app = web.Application()
        app.router.add_route("*", "/route", self._route)
        app.router.add_post("/register_dp_rank", self._register_dp_rank)
        app.router.add_post("/query_dp_ranks", self._query_dp_ranks)
        app.router.add_get("/health", self._health)
        app.router.add_post(TRANSFER_PATH, self._transfer)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.settings.bootstrap_port)
        await site.start()
        addresses = [a for a in self._runner.addresses if isinstance(a, tuple)]
        self.bound_port = addresses[0][1] if addresses else self.settings.bootstrap_port
        for rank in range(self.settings.dp_size):  # each DP rank registers, as SGLang's do
            self.route_table[rank] = {"rank_ip": self.host, "rank_port": self.bound_port}
        log.info("bootstrap server on %s:%d", self.host, self.bound_port)

    async def stop(self) -> None:
        for room in self.rooms.values():
            if room.done is not None and not room.done.done():
                room.done.set_exception(PdFailure("transfer", "the prefill engine is stopping"))
                room.done.exception()  # retrieved: nobody may wait on it any more
        if self._runner is not None:
            await self._runner.cleanup()
        if self.session is not None:
            await self.session.close()

    # --- the bootstrap server (prefill) ---------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            data = await request.json()
            rank = int(data.get("attn_dp_rank", 0))
            self.route_table[rank] = {
                "rank_ip": data["rank_ip"], "rank_port": int(data["rank_port"]),
            }  # fmt: skip
            return web.Response(text="OK")
        if request.method != "GET":
            return web.Response(text="Method not allowed", status=405)
        q = request.query
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if not all(q.get(k) for k in keys):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        if all(int(q[k]) == -1 for k in keys):
            return _json(
                {
                    "attn_tp_size": 1, "attn_cp_size": 1, "dp_size": self.settings.dp_size,
                    "pp_size": 1, "page_size": None, "kv_cache_dtype": None,
                    "follow_bootstrap_room": True, "enable_dsa_cache_layer_split": False,
                    "enable_kv_cache_sharding": False, "prefill_http_port": None,
                    "decode_allocation_policy": "early",
                }
            )  # fmt: skip
        info = self.route_table.get(int(q["prefill_dp_rank"]))
        if info is None:
            return web.Response(
                text=f"Bootstrap info not found for dp_rank={q['prefill_dp_rank']}", status=404
            )
        return _json(info)

    async def _register_dp_rank(self, request: web.Request) -> web.Response:
        data = await request.json()
        if len(self.room_ranks) >= MAX_ROOMS:
            self.room_ranks.pop(next(iter(self.room_ranks)))
        self.room_ranks[int(data["bootstrap_room"])] = int(data["dp_rank"])
        return web.Response(text="OK")

    async def _query_dp_ranks(self, request: web.Request) -> web.Response:
        data = await request.json()
        rooms = [int(r) for r in data.get("bootstrap_rooms", [])]
        return _json({str(r): self.room_ranks[r] for r in rooms if r in self.room_ranks})

    def _room(self, room: int) -> _Room:
        state = self.rooms.get(room)
        if state is None:
            if len(self.rooms) >= MAX_ROOMS:
                raise PdFailure("bootstrap", f"the prefill holds {MAX_ROOMS} rooms", 503)
            state = self.rooms[room] = _Room()
            state.done = asyncio.get_running_loop().create_future()
        return state

    async def _transfer(self, request: web.Request) -> web.Response:
        """The decode's metadata for a room: answered once the KV has arrived (or failed)."""
        data = await request.json()
        room_id = int(data["bootstrap_room"])
        try:
            room = self._room(room_id)
        except PdFailure as err:
            return _json({"error": str(err)}, err.status)
        if self.faults and self.faults[0] == "bootstrap_timeout":
            self.faults.pop(0)
            room.decode_ready = asyncio.Event()  # never set: the metadata is lost
            await asyncio.sleep(self.waiting_timeout + 1)
            return _json({"error": "bootstrap lost"}, 500)
        room.decode_ready.set()
        assert room.done is not None
        try:  # bounded: a decode that left (or a prefill request that never came) ends it
            async with asyncio.timeout(self.waiting_timeout):
                seconds = await asyncio.shield(room.done)
        except PdFailure as err:
            return _json({"error": str(err)}, 500)
        except TimeoutError:
            if not room.kv_ready.is_set():  # no prefill request holds the room: forget it
                self._conclude(room_id, room, PdFailure("transfer", "no prefill request"))
            return _json({"error": f"room {room_id}: no KV within {self.waiting_timeout:g} s"}, 500)
        return _json({"seconds": seconds})

    # --- prefill: send the KV once the decode has bootstrapped -----------------------------

    async def send(self, boot: Bootstrap, prompt_tokens: int, waited: float) -> None:
        """After the prefill: wait for the decode of ``boot.room`` (the bootstrap timeout
        less ``waited``), then move the KV. PdFailure if either does not happen; an abort
        (cancellation) fails the room, so a decode waiting on it is told at once."""
        room = self._room(boot.room)
        try:
            await self._send(boot, room, prompt_tokens, waited)
        except asyncio.CancelledError:
            self._conclude(boot.room, room, PdFailure("transfer", "the request was aborted"))
            raise

    async def _send(self, boot: Bootstrap, room: _Room, prompt_tokens: int, waited: float) -> None:
        room.prompt_tokens = prompt_tokens
        room.kv_ready.set()
        assert room.done is not None
        self._move(self.bootstrap_queue, 1)
        try:
            async with asyncio.timeout(max(0.0, self.bootstrap_timeout - waited)):
                await room.decode_ready.wait()
        except TimeoutError:
            self.bootstrap_failed.inc()
            failure = PdFailure(
                "bootstrap",
                f"Request room {boot.room} timed out after {self.bootstrap_timeout:g} s in "
                "KVPoll.Bootstrapping",
            )
            self._conclude(boot.room, room, failure)
            raise failure from None
        finally:
            self._move(self.bootstrap_queue, -1)
        seconds = pd.kv_transfer_seconds(
            prompt_tokens, self.kv_bytes_per_token, self.settings.kv_link, self.hosts
        )
        fault = self.faults.pop(0) if self.faults else None
        self._move(self.inflight_queue, 1)
        try:
            if fault == "die_mid_transfer":
                await asyncio.sleep(seconds * self.time_scale / 2)
                log.error("fault die_mid_transfer: the prefill engine exits mid-transfer")
                os._exit(1)
            await asyncio.sleep(seconds * self.time_scale)
        finally:
            self._move(self.inflight_queue, -1)
        if fault == "transfer_failure":
            self.transfer_failed.inc()
            failure = PdFailure("transfer", f"KV transfer of room {boot.room} failed")
            self._conclude(boot.room, room, failure)
            raise failure
        kv_bytes = prompt_tokens * self.kv_bytes_per_token
        self.latency.observe(seconds * 1e3)
        self.total_mb.observe(kv_bytes / 1e6)
        if seconds > 0:
            self.speed.observe(kv_bytes / seconds / 1e9)
        self._conclude(boot.room, room, seconds)

    def _conclude(self, room_id: int, room: _Room, result: float | PdFailure) -> None:
        assert room.done is not None
        if not room.done.done():
            if isinstance(result, PdFailure):
                room.done.set_exception(result)
                room.done.exception()  # retrieved, whether or not a decode waits on it
            else:
                room.done.set_result(result)
        self.rooms.pop(room_id, None)

    # --- decode: bootstrap, then wait for the KV --------------------------------------------

    async def receive(self, boot: Bootstrap) -> None:
        """Bootstrap with the prefill named in ``boot`` and wait for its KV. PdFailure when
        the bootstrap or the transfer fails or times out."""
        assert self.session is not None
        if boot.host is None or boot.host == pd.FAKE_BOOTSTRAP_HOST or self.fake:
            return  # SGLang's fake receiver: done at once, nothing moved
        base = f"http://{_bracketed(boot.host)}:{boot.port or pd.DEFAULT_BOOTSTRAP_PORT}"
        self._move(self.prealloc_queue, 1)
        try:
            rank_info = await self._bootstrap(base, boot.room)
        finally:
            self._move(self.prealloc_queue, -1)
        rank_ip = str(rank_info.get("rank_ip") or "")
        if rank_ip in UNSPECIFIED_HOSTS:  # a prefill bound to every address: the one dialled
            rank_ip = boot.host
        url = f"http://{_bracketed(rank_ip)}:{rank_info['rank_port']}{TRANSFER_PATH}"
        self._move(self.transfer_queue, 1)
        try:
            async with asyncio.timeout(self.waiting_timeout):
                async with self.session.post(url, json={"bootstrap_room": boot.room}) as resp:
                    body = await resp.read()
            if resp.status != 200:
                message = orjson.loads(body).get("error", "") if body else ""
                raise PdFailure("transfer", f"KV transfer of room {boot.room} failed: {message}")
        except TimeoutError:
            raise self._transfer_failed(
                f"Request room {boot.room} timed out after {self.waiting_timeout:g} s in "
                "KVPoll.WaitingForInput"
            ) from None
        except (aiohttp.ClientError, orjson.JSONDecodeError) as err:
            raise self._transfer_failed(
                f"KV transfer of room {boot.room} failed: the prefill is gone ({err})"
            ) from None
        except PdFailure as err:
            raise self._transfer_failed(str(err)) from None
        finally:
            self._move(self.transfer_queue, -1)

    def _transfer_failed(self, message: str) -> PdFailure:
        self.transfer_failed.inc()
        return PdFailure("transfer", message)

    async def _bootstrap(self, base: str, room: int) -> dict[str, Any]:
        """The prefill rank's address for ``room``, as SGLang's receiver asks it."""
        assert self.session is not None
        try:
            async with asyncio.timeout(self.bootstrap_timeout):
                info = await self._get_route(base, -1)
                while info is None:  # 503: the prefill's ranks are not all registered yet
                    await asyncio.sleep(BOOTSTRAP_RETRY_SECONDS)
                    info = await self._get_route(base, -1)
                rank = pd.dp_rank_of(room, int(info.get("dp_size") or 1))
                rank_info = await self._get_route(base, rank)
                if rank_info is None:
                    raise PdFailure("bootstrap", f"no prefill rank {rank} at {base}")
                return rank_info
        except TimeoutError:
            failure = PdFailure(
                "bootstrap", f"bootstrap with {base} timed out after {self.bootstrap_timeout:g} s"
            )
        except (aiohttp.ClientError, orjson.JSONDecodeError, ValueError) as err:
            failure = PdFailure("bootstrap", f"bootstrap with {base} failed: {err}")
        except PdFailure as err:
            failure = err
        self.bootstrap_failed.inc()
        raise failure

    async def _get_route(self, base: str, rank: int) -> dict[str, Any] | None:
        assert self.session is not None
        other = "0" if rank >= 0 else "-1"  # -1 everywhere asks for the server's info
        params = {
            "prefill_dp_rank": str(rank), "prefill_cp_rank": other, "target_tp_rank": other,
            "target_pp_rank": other,
        }  # fmt: skip
        async with self.session.get(base + "/route", params=params) as resp:
            if resp.status == 503:
                return None
            if resp.status != 200:
                raise ValueError(f"GET /route answered {resp.status}: {await resp.text()}")
            data = orjson.loads(await resp.read())
            if not isinstance(data, dict):
                raise ValueError("GET /route did not answer an object")
            return data


def _make(spec: names.MetricSpec, registry: Any, labels: Mapping[str, str]) -> Any:
    if spec.kind == "counter":
        metric: Any = Counter(spec.name, spec.documentation, spec.labels, registry=registry)
    elif spec.kind == "gauge":
        metric = Gauge(
            spec.name, spec.documentation, spec.labels, registry=registry,
            multiprocess_mode="mostrecent",
        )  # fmt: skip
    else:
        metric = Histogram(
            spec.name, spec.documentation, spec.labels, buckets=spec.buckets, registry=registry
        )
    return metric.labels(**labels)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_bootstrap(data: Mapping[str, Any]) -> Bootstrap | None:
    """The request's PD fields (a one-element list as its scalar); None without a room.
    ValueError naming the field when one has the wrong type."""
    values: dict[str, Any] = {}
    for name in pd.BOOTSTRAP_FIELDS:
        value = data.get(name)
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError(f"{name}: a list of {len(value)} is not allowed; allowed: one")
            value = value[0]
        values[name] = value
    host, port, room = values["bootstrap_host"], values["bootstrap_port"], values["bootstrap_room"]
    if room is None:
        return None
    if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room <= pd.MAX_ROOM:
        raise ValueError(f"bootstrap_room: {room!r} is not allowed; allowed: 0..2^63-1")
    if host is not None and not isinstance(host, str):
        raise ValueError(f"bootstrap_host: {host!r} is not allowed; allowed: a host name")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise ValueError(f"bootstrap_port: {port!r} is not allowed; allowed: a port or null")
    return Bootstrap(host, port, room)
