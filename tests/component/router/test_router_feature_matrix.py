"""Where features meet (issue 56): the router's modes crossed with its features, against engine
twins on loopback through the official ``openai`` client.

The breaks a review found where two features meet are `test_router_feature_breaks`; here the
matrix: modes (HTTP colocated, HTTP PD, the endpoint picker behind an emulated gateway, the
picker in PD mode) × features (API keys, request and token limits, priority, multi-model, LoRA
affinity); each cell works, shown through the client with the feature's effect asserted, or is
refused at router start naming the flags (or, for the picker and keys, left to the gateway).
The table in docs/router.md is generated from `CELLS` (`matrix_table`), and a test fails when
it is stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import aiohttp
import openai
import orjson
import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tests.component.router.feature_fleet import (
    ADAPTER,
    KEY,
    LATE,
    PROMPT,
    QWEN,
    Fleet,
    Target,
    client,
    complete,
    running_fleet,
    series,
    serve,
    settled,
)
from tests.component.router.gateway_emulator import GatewayFront, PickerClient
from tests.component.router.router_fleet import (
    MODEL,
    EngineTwin,
    start_router,
    wait_caught_up,
)
from tests.fakes import StubWorker
from tests.waiting import eventually_async
from tpuserve.cluster.ports import free_port
from tpuserve_router.app import RouterApp
from tpuserve_router.config import ConfigError
from tpuserve_router.engines.workers import Worker
from tpuserve_router.tenancy.auth import digest_of, key_id

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with running_fleet() as started:
        yield started


@pytest.fixture
async def routers() -> AsyncIterator[list[RouterApp]]:
    """The routers a test starts (`serve`), stopped after it."""
    started: list[RouterApp] = []
    yield started
    for app in started:
        await app.stop()


# ---------------------------------------------------------------- the matrix

SERVED: Final = "works"
REFUSED: Final = "refused at start"
FEATURES: Final = {
    "API keys": "a request without a valid key is 401; with one, served and counted for its tenant",
    "request limits": "a key's `requests_per_minute` answers 429 past it",
    "token limits": "a key's `tokens_per_minute`: a request that may take more is 429 naming "
    "`max_tokens`; one that fits is served and charged",
    "priority": "at `--max-in-flight` 3, a `low` key's request is shed (503) where a "
    "`critical` one is served",
    "multi-model": "each served model answers under its name; an unknown one is 404 listing them",
    "LoRA affinity": "`MODEL:ADAPTER` is served, and the adapter is warm on the worker(s) "
    "that served it",
    "holds": "a request for a model no engine serves yet waits in the hold queue "
    "(`--hold-models`) and is served when its engines come up",
    "retries and ejection": "colocated, a worker answering 500 costs no request: it is "
    "retried on another and ejected (`--outlier-consecutive-failures 1`); a pair whose KV "
    "transfer fails is retried on a new pair (a new room)",
    "peering": "a second replica (`--peer-port`, `--peer`) counts a request the first holds "
    "open on the engine it chose (a pair's prefill), until it ends",
    "precise routing": "`--policy precise`: the engines' KV events put a prompt in the "
    "router's index on the engine that prefilled it (a pair's prefill; its decode holds it "
    "too); colocated, the next request with that prefix is a prefix hit",
}
NOT_ENFORCED: Final = "left to the gateway"
NOT_HELD: Final = "answered at once"
EJECTS_ONLY: Final = (
    "ejects (the statuses of a gateway with `--picker-token-file`); the gateway retries"
)
GATEWAY_TOKEN: Final = "gateway-token-0123456789abcdef"
MATRIX_MODES: Final = {
    "colocated": "HTTP, colocated workers (`--worker`)",
    "pd": "HTTP, prefill/decode pairs (`--prefill`/`--decode`, `--pd-policy always`)",
    "picker": "endpoint picker (`--picker-port`) over colocated workers, a gateway relaying",
    "picker+pd": "endpoint picker (`--picker-port`) in PD mode",
}


def verdict(mode: str, feature: str) -> str:
    """What a cell does: works (the feature's effect shown), refused at router start, or, for
    the picker and API keys, left to the gateway (docs/gateway.md: the gateway
    authenticates; the picker reads no key, so a request is served whatever key it carries),
    and for the picker and holds, answered at once (docs/gateway.md: the gateway retries)."""
    if mode == "picker+pd":
        return REFUSED
    if mode == "picker" and feature in KEYED:
        return NOT_ENFORCED
    if mode == "picker" and feature == "holds":
        return NOT_HELD
    if mode == "picker" and feature == "retries and ejection":
        return EJECTS_ONLY
    return SERVED


CELLS: Final = [(mode, feature) for mode in MATRIX_MODES for feature in FEATURES]

WRONG_KEY = "sk-wrong-0123456789abcdef"
LIMITED = "sk-limited-0123456789abcdef"  # 2 requests, 300 tokens a minute
LOW = "sk-low-0123456789abcdef"
CRITICAL = "sk-critical-0123456789abcdef"


def feature_keys(tmp_path: Path) -> str:
    path = tmp_path / "keys.json"
    keys = [
        {"key": KEY, "tenant": "matrix"},
        {"key": LIMITED, "tenant": "limited", "requests_per_minute": 2, "tokens_per_minute": 300},
        {"key": LOW, "tenant": "low", "priority": "low"},
        {"key": CRITICAL, "tenant": "critical", "priority": "critical"},
    ]
    path.write_bytes(orjson.dumps({"keys": keys}))
    return str(path)


async def check_api_keys(t: Target) -> None:
    async with client(t, WRONG_KEY) as oa:
        with pytest.raises(openai.AuthenticationError):
            await complete(oa)
    async with client(t) as oa:
        await complete(oa)
    tenant = series(
        t.app,
        "tpuserve_router_tenant_requests_total",
        key=key_id(digest_of(KEY.encode())),
        status="200",
    )
    assert tenant == 1


async def check_request_limits(t: Target) -> None:
    async with client(t, LIMITED) as oa:
        await complete(oa)
        await complete(oa)
        with pytest.raises(openai.RateLimitError, match="requests per minute"):
            await complete(oa)


async def check_token_limits(t: Target) -> None:
    async with client(t, LIMITED) as oa:
        with pytest.raises(openai.RateLimitError, match="lower max_tokens"):
            await complete(oa, max_tokens=400)
        await complete(oa, max_tokens=4)
    charged = series(
        t.app, "tpuserve_router_tenant_tokens_total", key=key_id(digest_of(LIMITED.encode()))
    )
    assert 4 < charged <= 300


async def check_priority(t: Target) -> None:
    """Two critical streams held open fill a low key's share of 3 (70 %: 2)."""
    async with client(t, CRITICAL) as critical, client(t, LOW) as low:
        streams = []
        for _ in range(2):
            stream = await critical.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=2000, stream=True
            )
            await stream.__anext__()  # in flight until closed
            streams.append(stream)
        with pytest.raises(openai.InternalServerError, match="for low requests"):
            await complete(low)
        await complete(critical)
        for stream in streams:
            await stream.close()
    assert series(t.app, "tpuserve_router_shed_total", priority="low") == 1


async def check_multi_model(t: Target) -> None:
    async with client(t) as oa:
        assert await complete(oa, MODEL) == MODEL
        assert await complete(oa, QWEN) == QWEN
        with pytest.raises(openai.NotFoundError, match=QWEN):
            await complete(oa, "no-such-model")


async def check_lora_affinity(t: Target) -> None:
    async with client(t) as oa:
        await complete(oa, f"{MODEL}:{ADAPTER}")
    affinity = t.app.pipeline.affinity
    workers = t.app.registry.workers
    other = next(w for w in workers if QWEN in w.models)  # never sent the adapter
    warm = [w for w in workers if affinity.candidates(ADAPTER, [w, other]) == [w]]
    roles = {"prefill", "decode"} if t.mode.endswith("pd") else {None}
    assert {w.role for w in warm} == roles
    assert all(MODEL in w.models for w in warm)


async def check_not_enforced(t: Target) -> None:
    """Through the picker no key is read (the gateway authenticates): a wrong one is served."""
    async with client(t, WRONG_KEY) as oa:
        await complete(oa)


async def check_precise_routing(t: Target) -> None:
    app, index = t.app, t.app.block_index
    assert index is not None
    await wait_caught_up(app, [w.name for w in app.registry.workers])
    prompt = f"precise routing in mode {t.mode}: {PROMPT}"
    tokens = load_tokenizer().encode(prompt)
    async with client(t) as oa:
        await complete(oa, prompt=prompt)
        workers = app.registry.workers

        def holders() -> set[Worker]:
            depths = index.match(index.keys(tokens), [w.name for w in workers])
            return {w for w, depth in zip(workers, depths, strict=True) if depth}

        await eventually_async(holders, what="BlockStored events of the prompt")
        role = "prefill" if t.mode.endswith("pd") else None
        held = {(w.role, MODEL in w.models) for w in holders()}  # a pair's decode holds it too
        assert (role, True) in held, held
        assert all(has_model for _, has_model in held), held
        if role is None:
            hits = series(app, "tpuserve_router_routing_decisions_total", outcome="prefix_hit")
            await complete(oa, prompt=prompt + " and more")
            after = series(app, "tpuserve_router_routing_decisions_total", outcome="prefix_hit")
            assert after == hits + 1


async def check_holds(t: Target) -> None:
    holds = t.app.pipeline.holds
    async with client(t) as oa:
        answer = asyncio.ensure_future(complete(oa, LATE))
        await eventually_async(lambda: holds.total == 1 or answer.done(), what="a held request")
        assert not answer.done()
        for twin in t.late:  # started off the event loop: the router keeps serving meanwhile
            await asyncio.to_thread(twin.start)
        assert await answer == LATE
    assert series(t.app, "tpuserve_router_hold_outcomes_total", outcome="dispatched") == 1


async def check_not_held(t: Target) -> None:
    """The picker holds nothing: a model with no engine up is answered 503 at once."""
    async with client(t) as oa:
        with pytest.raises(openai.InternalServerError, match="no healthy worker"):
            await complete(oa, LATE)
    assert t.app.pipeline.holds.total == 0


async def check_retries(t: Target) -> None:
    app = t.app
    async with client(t) as oa:
        if t.mode == "pd":
            assert t.fleet is not None
            prefill = t.fleet.by_model[MODEL]["prefill"].url
            async with aiohttp.ClientSession() as session:
                fault = {"kind": "transfer_failure", "count": 1}
                async with session.post(prefill + "/debug/pd_fault", json=fault) as r:
                    assert r.status == 200
            await complete(oa)
            assert series(app, "tpuserve_router_pd_failures_total", kind="transfer") == 1
        else:
            assert t.failing is not None
            await complete(oa)  # least loaded and listed first: the failing worker's first
            assert t.failing.generation_requests == 1
            await complete(oa)
            assert t.failing.generation_requests == 1  # ejected: not asked again
            assert series(app, "tpuserve_router_worker_ejections_total") == 1
    assert series(app, "tpuserve_router_retries_total") == 1


async def check_ejects_only(t: Target) -> None:
    """Through the picker the failing worker's 500 reaches the client (an emulated gateway
    does not retry down the picker's fallbacks, as a real one does), the worker is ejected
    (the status came from the gateway that holds the picker's token: its observation), and
    the next request is served elsewhere."""
    assert t.failing is not None
    async with client(t) as oa:
        with pytest.raises(openai.InternalServerError):
            await complete(oa)
        await complete(oa)
    assert t.failing.generation_requests == 1
    assert series(t.app, "tpuserve_router_worker_ejections_total") == 1


async def check_peering(t: Target) -> None:
    peer = t.peer
    assert peer is not None
    await eventually_async(
        lambda: (
            series(peer, "tpuserve_router_peers") >= 1
            and series(t.app, "tpuserve_router_peers") >= 1
        ),
        what="the replicas connected",
    )
    role = "prefill" if t.mode.endswith("pd") else None
    chosen = {w.name for w in t.app.registry.workers if w.role == role and MODEL in w.models}

    def announced() -> dict[str, int]:
        return {
            w.name: w.announced_in_flight for w in peer.registry.workers if w.announced_in_flight
        }

    async with client(t) as oa:
        stream = await oa.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=200, stream=True
        )
        await stream.__anext__()  # in flight until its last event
        await eventually_async(lambda: announced().keys() == chosen, what="the peer counting it")
        assert sum(announced().values()) == 1
        async for _ in stream:  # read to its end (the emulated gateway ends the picker's
            pass  # exchange then, not when its client leaves)
    await eventually_async(lambda: not announced(), what="the peer forgetting it")


CHECKS: Final = {
    "API keys": check_api_keys,
    "request limits": check_request_limits,
    "token limits": check_token_limits,
    "priority": check_priority,
    "multi-model": check_multi_model,
    "LoRA affinity": check_lora_affinity,
    "holds": check_holds,
    "peering": check_peering,
    "retries and ejection": check_retries,
    "precise routing": check_precise_routing,
}
OTHER_CHECKS: Final = {
    NOT_ENFORCED: check_not_enforced,
    NOT_HELD: check_not_held,
    EJECTS_ONLY: check_ejects_only,
}
KEYED: Final = ("API keys", "request limits", "token limits", "priority")
"""The features of API keys, which the picker does not read."""


def feature_config(feature: str, mode: str, tmp_path: Path) -> dict[str, object]:
    """The router settings a feature needs."""
    if feature == "priority":
        return {"api_keys_file": feature_keys(tmp_path), "max_in_flight": 3}
    if feature in KEYED:
        return {"api_keys_file": feature_keys(tmp_path)}
    if feature == "precise routing":
        return {"policy": "precise"}
    if feature == "holds":
        return {"hold_max_requests": 2, "hold_models": (LATE,)}
    if feature == "retries and ejection":  # a pair: the one prefill of MODEL is not ejected
        ejection = {} if mode.endswith("pd") else {"outlier_consecutive_failures": 1}
        return {"policy": "least_load", **ejection}
    return {}


def peer_port() -> int:
    """A free port whose next one is free too (a replica's peer and snapshot ports)."""
    while True:
        port = free_port()
        with contextlib.suppress(OSError), socket.socket() as probe:
            probe.bind(("127.0.0.1", port + 1))
            return port


def late_engines(mode: str) -> tuple[list[EngineTwin], dict[str, tuple[str, ...]]]:
    """Engines of model `LATE`, not started, and the router settings that name them."""
    args = ["--time-scale", "0.5", "--served-model-name", LATE]
    if not mode.endswith("pd"):
        twin = EngineTwin(args)
        return [twin], {"workers": (twin.url,)}
    port = free_port()
    prefill = EngineTwin(
        [*args, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(port)]
    )
    decode = EngineTwin([*args, "--disaggregation-mode", "decode"])
    return [prefill, decode], {"prefill": (f"{prefill.url} {port}",), "decode": (decode.url,)}


@pytest.fixture
async def fronts() -> AsyncIterator[list[tuple[PickerClient, GatewayFront]]]:
    """The gateways a test starts in front of a picker, stopped after it."""
    started: list[tuple[PickerClient, GatewayFront]] = []
    yield started
    for picker, front in started:
        await front.stop()
        await picker.close()


@pytest.mark.parametrize(("mode", "feature"), CELLS)
async def test_a_feature_in_a_mode_works_or_is_refused_at_start(
    fleet: Fleet,
    routers: list[RouterApp],
    fronts: list[tuple[PickerClient, GatewayFront]],
    tmp_path: Path,
    mode: str,
    feature: str,
) -> None:
    changes = feature_config(feature, mode, tmp_path)
    expected = verdict(mode, feature)
    late: list[EngineTwin] = []
    failing: StubWorker | None = None
    if mode.startswith("picker"):  # as deployed: the gateway holds the picker's token
        token = tmp_path / "picker-token"
        token.write_text(GATEWAY_TOKEN)
        changes["picker_token_file"] = str(token)
    if feature == "retries and ejection" and not mode.endswith("pd"):
        failing = await StubWorker("error_500").start()
        changes["workers"] = (f"{MODEL}={failing.url}", *fleet.config(mode).workers)
    if feature == "holds":
        late, named = late_engines(mode)
        base = fleet.config(mode)
        for name, urls in named.items():
            changes[name] = (*getattr(base, name), *urls)
    if expected == REFUSED:
        with pytest.raises(ConfigError) as refused:
            await start_router(fleet.config(mode, **changes))
        assert "picker_port=0 (--picker-port)" in str(refused.value)
        assert "--prefill/--decode" in str(refused.value)
        return
    peer: RouterApp | None = None
    if feature == "peering":
        first, second = peer_port(), peer_port()
        peer = await serve(
            fleet, routers, mode, peer_port=second, peers=(f"tcp://127.0.0.1:{first}",)
        )
        changes.update(peer_port=first, peers=(f"tcp://127.0.0.1:{second}",))
    app = await serve(fleet, routers, mode, **changes)
    url = app.base_url
    if mode == "picker":  # the openai client talks to a gateway that asks the picker
        assert app.picker is not None
        picker = PickerClient(f"127.0.0.1:{app.picker.port}", token=GATEWAY_TOKEN)
        front = GatewayFront(picker)
        fronts.append((picker, front))
        url = await front.start()
    target = Target(app, url, mode, tuple(late), failing, fleet, peer)
    try:
        await (OTHER_CHECKS[expected] if expected in OTHER_CHECKS else CHECKS[feature])(target)
        await settled(app, fleet, mode)
    finally:
        for twin in late:
            twin.stop()
        if failing is not None:
            await failing.stop()
    if mode == "pd":  # every request was a pair
        assert series(app, "tpuserve_router_pd_requests_total", how="colocated") == 0


MARK: Final = (
    "<!-- feature matrix: generated from tests/component/router/test_router_feature_matrix.py -->"
)


def matrix_table() -> str:
    """The docs' table of the matrix (docs/router.md, "Features by mode")."""
    modes = list(MATRIX_MODES)
    lines = [
        MARK,
        "| feature | " + " | ".join(f"`{m}`" for m in modes) + " | shown by |",
        "|---" * (len(modes) + 2) + "|",
    ]
    for feature, effect in FEATURES.items():
        cells = " | ".join(verdict(m, feature) for m in modes)
        lines.append(f"| {feature} | {cells} | {effect} |")
    lines.append("")
    lines += [f"- `{m}`: {what}" for m, what in MATRIX_MODES.items()]
    lines.append(
        f"- {NOT_ENFORCED}: shown by a request with a wrong key served through the picker "
        "(the gateway authenticates, [gateway.md](gateway.md))"
    )
    lines.append(
        f"- {EJECTS_ONLY}: shown by a worker answering 500 through the picker: the client gets "
        "the 500 from a gateway that does not retry, the worker is ejected, the next request is "
        "served elsewhere (a gateway retries down the picker's fallbacks, "
        "[gateway.md](gateway.md))"
    )
    lines.append(
        f"- {NOT_HELD}: shown by a request for a model with no engine up answered 503 at once "
        "through the picker (the gateway retries, [gateway.md](gateway.md))"
    )
    return "\n".join([*lines, MARK])


DOCS: Final = Path(__file__).resolve().parents[3] / "docs/router.md"


def test_the_docs_table_is_the_matrix() -> None:
    """docs/router.md holds `matrix_table()` (rewrite it: ``python -m
    tests.component.router.test_router_feature_matrix``)."""
    text = DOCS.read_text()
    start, end = text.find(MARK), text.rfind(MARK)
    assert 0 <= start < end, f"{DOCS} has no feature-matrix table between {MARK!r} lines"
    assert text[start : end + len(MARK)] == matrix_table(), "stale: regenerate it"


if __name__ == "__main__":
    text = DOCS.read_text()
    start, end = text.find(MARK), text.rfind(MARK)
    assert 0 <= start < end, "place two marker lines in docs/router.md first"
    DOCS.write_text(text[:start] + matrix_table() + text[end + len(MARK) :])
