"""The router, with its default policy and KV events, in front of two real SGLang 0.5.23
engines, driven with the official openai client.

- the second request of a shared 1,000-token prefix lands on the engine that served the first
  and is served with >= 90 % of its prompt from cache, as the engine itself reports
  (`cached_tokens` in usage); prompts with different prefixes spread over both engines;
- the router's block index holds exactly the blocks the engines published (compared with a
  second subscriber decoding the engines' events with SGLang's own classes);
- a router started after an engine cached a prompt learns it by replay, and routes to it;
- `/flush_cache` through the router empties the index and the engines;
- streamed chat and completions pass through with usage in the last chunk;
- killing an engine (SIGKILL) under non-streaming load fails no request: the router retries
  on the other engine (the killing test runs last: it takes an engine away).

The engines: the session's shared default engine (`real_engine`, its cache empty) and one of
this module's own, the one the last test kills.

Measured numbers are printed (`pytest -s` shows them); docs/router.md ("Against real SGLang")
quotes them.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import AsyncIterator

import aiohttp
import openai
import orjson
import pytest

from sglang_tpu.tokenizer import Tokenizer, render_chatml
from tests.component.router.real_engine_traffic import (
    EngineEventFeed,
    engine_tokenizer,
    router_in_front_of,
    text_of_tokens,
)
from tests.component.router.router_fleet import requests_by_worker, sample
from tests.real_sglang import EngineFactory, RealEngine
from tests.waiting import eventually_async
from tpuserve_router._native import usage_counts
from tpuserve_router.app import RouterApp
from tpuserve_router.metrics import KV_EVENT_SKIP_REASONS
from tpuserve_router.pipeline.usage import usage_from_object

pytestmark = [pytest.mark.component, pytest.mark.real_sglang]

SHARED_PREFIX_TOKENS = 1000
MIN_CACHED_FRACTION = 0.9
CLIENT_TIMEOUT_SECONDS = 120.0
INDEX_SECONDS = 30.0
FLUSH_SECONDS = 60.0  # SGLang finishing what is still running on an engine
LOAD_CONCURRENCY = 8
REQUESTS_AFTER_KILL = 24


def measured(what: str, value: object) -> None:
    print(f"\nMEASURED {what}: {value}")


@pytest.fixture(scope="module")
def engines(real_engines: EngineFactory, real_engine: RealEngine) -> list[RealEngine]:
    """[the module's own engine (killed last), the shared one]."""
    return [real_engines.start(name="killed-last"), real_engine]


@pytest.fixture(scope="module")
def tokenizer(engines: list[RealEngine]) -> Tokenizer:
    return engine_tokenizer(engines[0])


@pytest.fixture
async def router(engines: list[RealEngine]) -> AsyncIterator[RouterApp]:
    """A router in front of both engines, whose caches start empty."""
    for engine in engines:
        engine.flush_cache()
    app = await router_in_front_of(engines)
    yield app
    await app.stop()


def client_of(base_url: str) -> openai.AsyncOpenAI:
    """The official client with its own retries off: every failure must show."""
    return openai.AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=CLIENT_TIMEOUT_SECONDS,
    )


@pytest.fixture
async def client(router: RouterApp) -> AsyncIterator[openai.AsyncOpenAI]:
    async with client_of(router.base_url) as api:
        yield api


def served_by(app: RouterApp, route: str) -> dict[str, int]:
    """Requests each worker answered on ``route`` (every test has its own router)."""
    return {w: int(n) for w, n in requests_by_worker(app, route).items() if n}


def cached_tokens(usage: openai.types.CompletionUsage | None) -> int:
    assert usage is not None
    details = usage.prompt_tokens_details
    assert details is not None, "the engines run with --enable-cache-report"
    assert details.cached_tokens is not None
    return details.cached_tokens


def prefix_pages(app: RouterApp, tokenizer: Tokenizer, text: str, worker: str) -> tuple[int, int]:
    """(pages of ``text`` the index says ``worker`` holds from the start, full pages of it)."""
    index = app.block_index
    assert index is not None
    keys = index.keys(tokenizer.encode(text))
    return index.match(keys, [worker])[0], len(keys)


# ---------------------------------------------------------------------------- prefix affinity


async def test_the_second_request_of_a_shared_prefix_is_served_from_cache(
    router: RouterApp, client: openai.AsyncOpenAI, tokenizer: Tokenizer, engines: list[RealEngine]
) -> None:
    prefix = text_of_tokens(tokenizer, random.Random(1), SHARED_PREFIX_TOKENS)
    usages = []
    for question in ("What comes first?", "And what comes second?"):
        completion = await client.completions.create(
            model=engines[0].model, prompt=prefix + question, max_tokens=4, temperature=0
        )
        usages.append(completion.usage)
    first, second = usages
    assert first is not None
    assert second is not None
    assert second.prompt_tokens >= SHARED_PREFIX_TOKENS
    assert second.prompt_tokens == len(tokenizer.encode(prefix + "And what comes second?"))
    served = served_by(router, "/v1/completions")
    assert list(served.values()) == [2], f"both requests on one engine, not {served}"
    fraction = cached_tokens(second) / second.prompt_tokens
    measured(
        "shared 1,000-token prefix, second request",
        f"{cached_tokens(second)} of {second.prompt_tokens} prompt tokens cached "
        f"({fraction:.1%}); first request {cached_tokens(first)} cached; served by {served}",
    )
    assert cached_tokens(first) == 0
    assert fraction >= MIN_CACHED_FRACTION
    decisions = {
        outcome: sample(
            router,
            "tpuserve_router_routing_decisions_total",
            {"policy": "precise", "outcome": outcome},
        )
        for outcome in ("miss", "prefix_hit")
    }
    assert decisions == {"miss": 1, "prefix_hit": 1}
    (worker,) = served
    assert sample(
        router,
        "tpuserve_router_cached_tokens_total",
        {"model": engines[0].model, "worker": worker},
    ) == cached_tokens(second)  # the router read the engine's usage too


async def test_prompts_with_different_prefixes_spread_over_both_engines(
    router: RouterApp, client: openai.AsyncOpenAI, tokenizer: Tokenizer, engines: list[RealEngine]
) -> None:
    rng = random.Random(2)
    prompts = [text_of_tokens(tokenizer, rng, 200) for _ in range(LOAD_CONCURRENCY)]
    await asyncio.gather(
        *(
            client.completions.create(model=engines[0].model, prompt=p, max_tokens=16)
            for p in prompts
        )
    )
    served = served_by(router, "/v1/completions")
    measured(f"{len(prompts)} concurrent prompts with different prefixes", f"served by {served}")
    assert sorted(served) == sorted(e.url for e in engines)
    assert sum(served.values()) == len(prompts)


async def test_generate_with_input_ids_keeps_a_shared_prefix_on_one_engine(
    router: RouterApp, tokenizer: Tokenizer, engines: list[RealEngine]
) -> None:
    """SGLang's native route, with token ids as clients of /generate send them."""
    prefix = tokenizer.encode(text_of_tokens(tokenizer, random.Random(9), SHARED_PREFIX_TOKENS))
    metas = []
    async with aiohttp.ClientSession() as session:
        for tail in ([20, 21, 22, 23], [30, 31, 32, 33, 34]):
            body = {"input_ids": prefix + tail, "sampling_params": {"max_new_tokens": 4}}
            async with session.post(f"{router.base_url}/generate", json=body) as response:
                assert response.status == 200, await response.text()
                metas.append((await response.json())["meta_info"])
    served = served_by(router, "/generate")
    assert list(served.values()) == [2], f"both requests on one engine, not {served}"
    second = metas[1]
    assert second["prompt_tokens"] == len(prefix) + 5
    fraction = second["cached_tokens"] / second["prompt_tokens"]
    measured("/generate, shared prefix of input ids", f"{fraction:.1%} cached")
    assert fraction >= MIN_CACHED_FRACTION


async def test_the_compiled_usage_reader_reads_real_sglang_answers_as_python_does(
    engines: list[RealEngine], tokenizer: Tokenizer
) -> None:
    """The router reads every answer's token counts with the compiled skimmer
    (`_native.usage_counts`), which leaves what it cannot read to Python: a real engine's
    answers on each route must be read by the skimmer itself, with Python's counts."""
    engine = engines[0]
    prompt = text_of_tokens(tokenizer, random.Random(11), 64) + ' \u00e9 "quoted"'
    routes = {
        "/v1/completions": {"model": engine.model, "prompt": prompt, "max_tokens": 4},
        "/v1/chat/completions": {
            "model": engine.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 4,
        },
        "/generate": {"text": prompt, "sampling_params": {"max_new_tokens": 4}},
    }
    async with aiohttp.ClientSession() as session:
        for route, body in routes.items():
            cached = []
            for _ in range(2):  # the second one has cached tokens to count
                async with session.post(f"{engine.url}{route}", json=body) as response:
                    assert response.status == 200, await response.text()
                    raw = await response.read()
                counts = usage_counts(raw)  # a ValueError here: Python would have read it
                assert counts is not None, raw
                cached.append(counts[2])
                assert counts == usage_from_object(orjson.loads(raw)), raw
            assert cached[1] > 0, f"{route}: the repeated prompt's cached tokens: {raw!r}"


# ---------------------------------------------------------------------------- the block index


async def test_the_index_holds_exactly_the_blocks_the_engines_published(
    router: RouterApp, client: openai.AsyncOpenAI, tokenizer: Tokenizer, engines: list[RealEngine]
) -> None:
    index = router.block_index
    assert index is not None
    rng = random.Random(3)
    shared = text_of_tokens(tokenizer, rng, 300)
    prompts = [shared + "One more line.", shared + "Another line."]
    prompts += [text_of_tokens(tokenizer, rng, 150) for _ in range(4)]
    async with EngineEventFeed(engines[0]) as feed0, EngineEventFeed(engines[1]) as feed1:
        feeds = {engines[0].url: feed0, engines[1].url: feed1}
        for feed in feeds.values():
            await feed.synchronise()
        for prompt in prompts[:2]:  # one after the other: the second finds the first's blocks
            await client.completions.create(model=engines[0].model, prompt=prompt, max_tokens=8)
        await asyncio.gather(
            *(
                client.completions.create(model=engines[0].model, prompt=p, max_tokens=8)
                for p in prompts[2:]
            )
        )

        def index_matches_the_events() -> bool:
            return all(
                feed.held() and index.engine_hashes(worker) == feed.held()
                for worker, feed in feeds.items()
            )

        await eventually_async(
            index_matches_the_events,
            what="the router's index to hold exactly the blocks each engine published",
            timeout_seconds=INDEX_SECONDS,
            context=lambda: str(
                {w: (len(index.engine_hashes(w)), len(f.held())) for w, f in feeds.items()}
            ),
        )
        skipped = {
            (worker, reason): sample(
                router,
                "tpuserve_router_kv_events_skipped_total",
                {"worker": worker, "reason": reason},
            )
            for worker in feeds
            for reason in KV_EVENT_SKIP_REASONS
        }
        assert set(skipped.values()) == {0}, f"the router reads every event: {skipped}"
        holders = [w for w in feeds if prefix_pages(router, tokenizer, shared, w)[0]]
        assert len(holders) == 1, f"the shared prefix is on one engine, not {holders}"
        held, pages = prefix_pages(router, tokenizer, shared, holders[0])
        assert held == pages
        measured(
            "blocks in the router's index / published by the engine",
            {
                w: f"{len(index.engine_hashes(w))} / {len(f.held())} "
                f"({f.kinds().count('BlockStored')} BlockStored events)"
                for w, f in feeds.items()
            },
        )


async def test_a_router_started_late_learns_what_an_engine_cached_before_it_by_replay(
    engines: list[RealEngine], tokenizer: Tokenizer
) -> None:
    for engine in engines:
        engine.flush_cache()
    # The module's own engine: its replay buffer holds this module's events only.
    early, other = engines
    prompt = text_of_tokens(tokenizer, random.Random(4), 400)
    async with client_of(early.url) as direct:
        await direct.completions.create(model=early.model, prompt=prompt, max_tokens=4)
    app = await router_in_front_of(engines)
    try:

        def knows_the_prompt() -> bool:
            held, pages = prefix_pages(app, tokenizer, prompt, early.url)
            return held == pages

        await eventually_async(
            knows_the_prompt,
            what="the late router's index to hold the prompt the engine cached before it",
            timeout_seconds=INDEX_SECONDS,
        )
        assert prefix_pages(app, tokenizer, prompt, other.url)[0] == 0
        async with client_of(app.base_url) as api:
            completion = await api.completions.create(
                model=early.model, prompt=prompt + "Continue.", max_tokens=4
            )
        assert served_by(app, "/v1/completions") == {early.url: 1}
        assert completion.usage is not None
        fraction = cached_tokens(completion.usage) / completion.usage.prompt_tokens
        measured("late router, first request on the replayed prefix", f"{fraction:.1%} cached")
        assert fraction >= MIN_CACHED_FRACTION
    finally:
        await app.stop()


async def test_flush_cache_through_the_router_empties_the_index_and_the_engines(
    router: RouterApp, client: openai.AsyncOpenAI, tokenizer: Tokenizer, engines: list[RealEngine]
) -> None:
    index = router.block_index
    assert index is not None
    rng = random.Random(5)
    prompts = [text_of_tokens(tokenizer, rng, 200) for _ in range(LOAD_CONCURRENCY)]
    await asyncio.gather(
        *(
            client.completions.create(model=engines[0].model, prompt=p, max_tokens=4)
            for p in prompts
        )
    )
    await eventually_async(
        lambda: all(index.worker_blocks(e.url) for e in engines),
        what="blocks on both engines in the index",
        timeout_seconds=INDEX_SECONDS,
    )

    def cleared_events() -> list[float]:
        return [
            sample(
                router,
                "tpuserve_router_kv_events_total",
                {"worker": e.url, "type": "AllBlocksCleared"},
            )
            for e in engines
        ]

    cleared_before = cleared_events()
    answers: list[tuple[int, object]] = []

    async def flushed() -> bool:
        """SGLang refuses a flush (400, "check back") while a request is still running on it,
        e.g. one of the pooled engine's earlier tests finishing: a client asks again."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{router.base_url}/flush_cache") as response,
        ):
            answers.append((response.status, await response.json()))
        return response.status == 200

    await eventually_async(
        flushed, what="the router's flush_cache to answer 200", timeout_seconds=FLUSH_SECONDS
    )
    status, body = answers[-1]
    assert status == 200, answers
    assert isinstance(body, dict)
    assert body["flushed"] is True
    assert [index.worker_blocks(e.url) for e in engines] == [0, 0]
    await eventually_async(
        lambda: all(a > b for a, b in zip(cleared_events(), cleared_before, strict=True)),
        what="each engine's AllBlocksCleared to reach the router",
        timeout_seconds=INDEX_SECONDS,
    )
    assert [index.worker_blocks(e.url) for e in engines] == [0, 0]
    again = await client.completions.create(model=engines[0].model, prompt=prompts[0], max_tokens=4)
    assert cached_tokens(again.usage) == 0, "the engine's cache was flushed too"
    await eventually_async(
        lambda: sum(index.worker_blocks(e.url) for e in engines) > 0,
        what="the index to fill again from the engines' events after the flush",
        timeout_seconds=INDEX_SECONDS,
    )


# ---------------------------------------------------------------------------- streaming


async def test_streamed_completions_pass_through_with_usage_in_the_last_chunk(
    router: RouterApp, client: openai.AsyncOpenAI, tokenizer: Tokenizer, engines: list[RealEngine]
) -> None:
    prompt = text_of_tokens(tokenizer, random.Random(6), 120)
    stream = await client.completions.create(
        model=engines[0].model,
        prompt=prompt,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) >= 2, "streamed in several chunks"
    last = chunks[-1]
    assert last.usage is not None
    assert last.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert last.usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])
    (worker,) = served_by(router, "/v1/completions")
    counted = {"model": engines[0].model, "worker": worker}
    assert sample(router, "tpuserve_router_prompt_tokens_total", counted) == (
        last.usage.prompt_tokens
    )  # the router read the usage from the stream's last chunk
    assert sample(router, "tpuserve_router_completion_tokens_total", counted) == 8


async def test_streamed_chats_pass_through_and_share_their_system_prompt_on_one_engine(
    router: RouterApp, client: openai.AsyncOpenAI, tokenizer: Tokenizer, engines: list[RealEngine]
) -> None:
    system = text_of_tokens(tokenizer, random.Random(7), 400)
    usages = []
    for question in ("Who are you?", "What do you know?"):
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]
        stream = await client.chat.completions.create(
            model=engines[0].model,
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = [chunk async for chunk in stream]
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert deltas, "content chunks came through"
        assert chunks[-1].usage is not None
        usage = chunks[-1].usage
        assert usage.completion_tokens == 8
        # The router tokenizes a chat as the engine does (its index keys depend on it).
        assert usage.prompt_tokens == len(tokenizer.encode(render_chatml(list(messages))))
        usages.append(usage)
    served = served_by(router, "/v1/chat/completions")
    assert list(served.values()) == [2], f"both chats on one engine, not {served}"
    fraction = cached_tokens(usages[1]) / usages[1].prompt_tokens
    measured("streamed chat sharing a 400-token system prompt", f"{fraction:.1%} cached")
    assert fraction >= MIN_CACHED_FRACTION


# ---------------------------------------------------------------------------- losing an engine


async def test_killing_an_engine_under_load_fails_no_non_streaming_request(
    router: RouterApp, tokenizer: Tokenizer, engines: list[RealEngine]
) -> None:
    """Runs last: the killed engine stays dead for the rest of the module."""
    victim, survivor = engines
    rng = random.Random(8)
    prompts = [text_of_tokens(tokenizer, rng, 150) for _ in range(64)]
    outcomes: list[str] = []
    errors: list[str] = []
    killed_at: list[int] = []  # how many requests had finished when the engine was killed

    async def load(api: openai.AsyncOpenAI, worker: int) -> None:
        i = worker
        while not killed_at or len(outcomes) < killed_at[0] + REQUESTS_AFTER_KILL:
            try:
                completion = await api.completions.create(
                    model=survivor.model,
                    prompt=prompts[i % len(prompts)],
                    max_tokens=32,
                    extra_body={"ignore_eos": True},
                )
                assert completion.usage is not None
                assert completion.usage.completion_tokens == 32
                outcomes.append("ok")
            except openai.OpenAIError as err:
                outcomes.append("failed")
                errors.append(f"{type(err).__name__}: {err}")
            i += LOAD_CONCURRENCY

    victim_worker = router.registry.get(victim.url)
    assert victim_worker is not None
    async with client_of(router.base_url) as api:
        tasks = [asyncio.create_task(load(api, n)) for n in range(LOAD_CONCURRENCY)]
        try:

            def loaded() -> int | None:  # in steady state, with requests on the victim
                busy = victim_worker.in_flight
                return busy if busy >= 2 and len(outcomes) >= LOAD_CONCURRENCY else None

            in_flight = await eventually_async(
                loaded,
                what="requests in flight on the engine about to be killed",
                timeout_seconds=CLIENT_TIMEOUT_SECONDS,
            )
            os.kill(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            killed_at.append(len(outcomes))
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=CLIENT_TIMEOUT_SECONDS)
        finally:
            for task in tasks:
                task.cancel()
    await asyncio.to_thread(victim.wait_stopped)
    retries = sample(router, "tpuserve_router_retries_total", {"route": "/v1/completions"})
    upstream = {
        reason: sample(
            router,
            "tpuserve_router_upstream_errors_total",
            {"worker": victim.url, "reason": reason},
        )
        for reason in ("connect_error", "reset_before_response", "retryable_status")
    }
    measured(
        "SIGKILL of one engine under non-streaming load",
        f"concurrency {LOAD_CONCURRENCY}, {in_flight} in flight on it when killed; "
        f"{len(outcomes)} requests, {outcomes.count('ok')} ok, {outcomes.count('failed')} failed, "
        f"{len(outcomes) - killed_at[0]} finished after the kill "
        f"(within {time.monotonic() - killed:.1f} s); router retries {retries:g}, "
        f"upstream errors on the killed engine {upstream}; "
        f"healthy afterwards: {victim_worker.healthy}",
    )
    assert errors == []
    assert retries >= 1, "requests in flight on the killed engine were retried"
    index = router.block_index
    assert index is not None
    await eventually_async(
        lambda: index.worker_blocks(victim.url) == 0,
        what="the killed engine's blocks to leave the index (its publisher disconnected)",
        timeout_seconds=INDEX_SECONDS,
    )
    assert index.worker_blocks(survivor.url) > 0
    assert len(outcomes) - killed_at[0] >= REQUESTS_AFTER_KILL
    survivor_worker = router.registry.get(survivor.url)
    assert survivor_worker is not None
    assert survivor_worker.healthy
