"""PD mode's pieces without a network: the --prefill/--decode flags and their checks, the
threshold from the performance model, the disaggregation decision, the DP rank a prompt's
room is drawn for, and the logprob merge."""

from __future__ import annotations

import argparse
import asyncio

import orjson
import pytest

from sglang_tpu import disaggregation
from tpuserve_router.cli import build_config, configure, env_name
from tpuserve_router.config import ConfigError, RouterConfig
from tpuserve_router.engines.proxy import UpstreamConnection, UpstreamError
from tpuserve_router.engines.workers import Worker, WorkerSpec
from tpuserve_router.pipeline.pair_relay import (
    LegFailed,
    PairRelay,
    _batch,
    _failure_kind,
    _transfer_seconds,
)
from tpuserve_router.pipeline.pd_settings import (
    PdSettings,
    parse_prefill_flag,
    pd_settings,
    pd_workers,
)
from tpuserve_router.pipeline.selection import Disaggregation, pairable, pairs
from tpuserve_router.policies.base import Decision, RouteRequest
from tpuserve_router.validation import validate

pytestmark = pytest.mark.unit

P = "http://127.0.0.1:30001"
D = "http://127.0.0.1:30002"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(argv)


def test_prefill_and_decode_flags_as_sglang_router_spells_them() -> None:
    config = build_config(parse("--prefill", P, "8998", "--prefill", P[:-1] + "3", "--decode", D))
    assert config.prefill == (f"{P} 8998", P[:-1] + "3")
    assert config.decode == (D,)
    specs = pd_workers(config.prefill, config.decode)
    assert [(s.role, s.bootstrap_port) for s in specs] == [
        ("prefill", 8998), ("prefill", None), ("decode", None),
    ]  # fmt: skip


def test_environment_lists_pd_workers() -> None:
    env = {env_name("--prefill"): f"{P} 9000", env_name("--decode"): D}
    config = build_config(parse(), environ=env)
    assert (config.prefill, config.decode) == ((f"{P} 9000",), (D,))


def test_a_bad_bootstrap_port_is_named() -> None:
    with pytest.raises(ValueError, match=r"bootstrap port 'x' is not allowed; allowed: 1\.\.65535"):
        parse_prefill_flag(f"{P} x")
    assert parse_prefill_flag(f"{P} none").bootstrap_port is None


def test_prefill_without_decode_is_refused() -> None:
    with pytest.raises(ConfigError, match="PD mode needs both prefill and decode workers"):
        validate(RouterConfig(prefill=(P,)))


def test_pd_settings_are_named_when_wrong() -> None:
    with pytest.raises(ConfigError) as err:
        validate(RouterConfig(
            prefill=(P,), decode=(D,), pd_policy="sometimes", pd_perf_model="v6e:9x9:nope",
            pd_itl_budget_seconds=0,
        ))  # fmt: skip
    text = str(err.value)
    assert "pd_policy='sometimes': allowed conditional, always" in text
    assert "pd_perf_model" in text
    assert "pd_itl_budget_seconds=0: allowed > 0" in text


def test_the_threshold_comes_from_the_performance_model() -> None:
    config = RouterConfig(prefill=(P,), decode=(D,), pd_perf_model="v6e:1x1:llama-3.1-8b")
    settings = pd_settings(config)
    assert settings is not None
    timer = disaggregation.timer_for("v6e:1x1:llama-3.1-8b")
    n = settings.threshold_tokens
    assert timer.prefill_seconds(n) >= config.pd_itl_budget_seconds
    assert timer.prefill_seconds(n - 1) < config.pd_itl_budget_seconds
    # a bigger slice prefills faster: a longer prompt before it pays to disaggregate
    bigger = pd_settings(config.replace(pd_perf_model="v6e:2x4:llama-3.1-8b"))
    assert bigger is not None
    assert bigger.threshold_tokens > n
    fixed = pd_settings(config.replace(pd_threshold_tokens=123))
    assert fixed is not None
    assert fixed.threshold_tokens == 123
    assert pd_settings(RouterConfig()) is None


class FakeWorker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.healthy = True
        self.in_flight = 0
        self.peer_prefill_tokens = 0


def router_with(policy: str, threshold: int) -> object:
    router = object.__new__(Disaggregation)
    router.settings = PdSettings(policy, threshold, 300.0)
    return router


@pytest.mark.parametrize(
    ("ratio", "prompt", "expected"),
    [(None, 1000, True), (0.0, 999, False), (0.9, 5000, False), (0.5, 4000, True)],
)
def test_a_request_is_disaggregated_when_its_uncached_tokens_reach_the_threshold(
    ratio: float | None, prompt: int, expected: bool
) -> None:
    router = router_with("conditional", 1000)
    decision = Decision(FakeWorker("c"), "miss", ratio)
    assert router.disaggregates(decision, prompt) is expected  # type: ignore[attr-defined]
    always = router_with("always", 1000)
    assert always.disaggregates(decision, 1) is True  # type: ignore[attr-defined]


def test_a_short_suffix_after_a_long_cached_prefix_stalls_by_the_performance_model() -> None:
    config = RouterConfig(prefill=(P,), decode=(D,), pd_perf_model="v6e:1x1:llama-3.1-8b")
    settings = pd_settings(config)
    assert settings is not None
    assert settings.timer is not None
    router = object.__new__(Disaggregation)
    router.settings = settings
    n = settings.threshold_tokens
    assert router.stalls(n, n)
    assert not router.stalls(n - 1, n - 1)
    # 1,000 new tokens: under the threshold, but after 60,000 cached ones the attention
    # over them takes the prefill past the ITL budget
    assert not router.stalls(1000, 1000)
    assert router.stalls(1000, 61_000)
    assert settings.timer.prefill_seconds(1000, 60_000) >= settings.itl_budget_seconds
    chosen = Decision(FakeWorker("c"), "prefix_hit", 60_000 / 61_000)
    assert router.disaggregates(chosen, 61_000)  # type: ignore[arg-type]
    # a threshold given as a number is the rule alone
    fixed = pd_settings(config.replace(pd_threshold_tokens=n))
    assert fixed is not None
    assert fixed.timer is None
    router.settings = fixed
    assert not router.stalls(1000, 61_000)
    assert router.stalls(n, n)


def test_a_conversation_keeps_its_dp_rank_and_the_room_lands_there() -> None:
    first = RouteRequest("m", "system prompt and turn one", list(range(500)))
    later = RouteRequest("m", "system prompt and turn one, two", [*range(500), 7, 8, 9])
    for dp in (2, 4, 8):
        rank = PairRelay.rank_for(first, dp)
        assert PairRelay.rank_for(later, dp) == rank
        room = disaggregation.room_for_rank(rank, dp)
        assert disaggregation.dp_rank_of(room, dp) == rank
    ranks = {PairRelay.rank_for(RouteRequest("m", f"user {i} " * 40), 4) for i in range(40)}
    assert len(ranks) > 1  # different conversations spread over the ranks
    assert PairRelay.rank_for(first, 1) == 0


def test_batches_carry_lists_and_single_prompts_scalars() -> None:
    assert _batch("/generate", {"text": ["a", "b", "c"]}) == 3
    assert _batch("/generate", {"input_ids": [[1], [2]]}) == 2
    assert _batch("/generate", {"input_ids": [1, 2]}) is None
    assert _batch("/v1/completions", {"prompt": ["a", "b"]}) is None


def test_engine_failures_are_told_apart_by_sglangs_messages() -> None:
    assert _failure_kind(b'{"error": "timed out in KVPoll.Bootstrapping"}') == "bootstrap"
    assert _failure_kind(b'{"error": "KV transfer of room 5 failed"}') == "transfer"
    assert _failure_kind(b'{"error": "bad input"}') == "status"


def test_the_transfer_time_is_read_from_the_prefills_meta_info() -> None:
    body = orjson.dumps(
        {"meta_info": {"prefill_finished_time": 10.0, "response_sent_to_client_ts": 10.25}}
    )
    assert _transfer_seconds(body) == pytest.approx(0.25)
    assert _transfer_seconds(b'{"choices": []}') is None


def test_prefill_logprobs_are_merged_into_the_decode_answer() -> None:
    router = object.__new__(PairRelay)

    async def merged() -> dict[str, object]:
        prefill: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        prefill.set_result(orjson.dumps({"meta_info": {"input_token_logprobs": [[-0.5, 1, None]]}}))
        decode = orjson.dumps({"text": "x", "meta_info": {"output_token_logprobs": []}})
        result: dict[str, object] = orjson.loads(await router._merge_logprobs(decode, prefill))
        return result

    answer = asyncio.run(merged())
    assert answer["meta_info"] == {
        "output_token_logprobs": [], "input_token_logprobs": [[-0.5, 1, None]],
    }  # fmt: skip


def pd_worker(url: str, role: str, contract: str | None, *, healthy: bool = True) -> Worker:
    worker = Worker(WorkerSpec(url, role=role, pd_contract=contract))
    worker.healthy = healthy
    return worker


def test_a_prefill_pairs_only_with_a_decode_of_its_contract() -> None:
    """Mid-rollout, old engines pair with old and new with new; a worker registered by a
    flag (no contract) pairs with any."""
    old_p, new_p = (
        pd_worker(P, "prefill", "old"),
        pd_worker("http://127.0.0.1:30011", "prefill", "new"),
    )
    old_d, new_d = (
        pd_worker(D, "decode", "old"),
        pd_worker("http://127.0.0.1:30012", "decode", "new"),
    )
    assert pairs(old_p, old_d)
    assert pairs(new_p, new_d)
    assert not pairs(old_p, new_d)
    assert not pairs(new_p, old_d)
    flagged = pd_worker("http://127.0.0.1:30022", "decode", None)
    assert pairs(old_p, flagged)
    assert pairs(pd_worker("http://127.0.0.1:30021", "prefill", None), new_d)
    # the only decode of the new contract: only the new prefill can take a request
    assert pairable([old_p, new_p], [new_d]) == [new_p]
    assert pairable([old_p], [new_d]) == []
    assert (
        pairable(
            [old_p, new_p], [pd_worker("http://127.0.0.1:30032", "decode", "new", healthy=False)]
        )
        == []
    )


def test_the_rank_holding_the_longest_prefix_takes_the_turn_else_the_hash() -> None:
    turn = RouteRequest("m", "turn", list(range(300)))
    hashed = PairRelay.rank_for(turn, 4)
    other = (hashed + 1) % 4
    assert PairRelay.rank_for(turn, 4, [(other, 3), (hashed, 1)]) == other
    assert PairRelay.rank_for(turn, 4, [(other, 3), (hashed, 3)]) == hashed  # a tie: the hash
    assert PairRelay.rank_for(turn, 4, [(other, 0)]) == hashed  # nothing held: the hash
    assert PairRelay.rank_for(turn, 4, [(9, 5)]) == hashed  # a rank the engine no longer has
    assert PairRelay.rank_for(turn, 1, [(0, 5)]) == 0


def test_prefills_already_waiting_on_the_colocated_worker_count_toward_the_stall() -> None:
    router = router_with("conditional", 1000)
    decision = Decision(FakeWorker("c"), "miss", 0.0)
    assert router.disaggregates(decision, 400) is False  # type: ignore[attr-defined]
    assert router.disaggregates(decision, 400, 600) is True  # type: ignore[attr-defined]


async def decode_head_failure(
    decode_alive: bool | None, prefill: str, stream: bool = False
) -> LegFailed:
    """How `PairRelay._decode_head` fails when the decode's leg timed out before its first
    token (its head, or a stream's first chunk), with the prefill ``pending``, ``answered``
    or ``failed``, and the decode's health verdict ``decode_alive``."""
    loop = asyncio.get_running_loop()
    timeout = UpstreamError("first_byte_timeout", "no answer within 15 s")
    p_task: asyncio.Future[bytes] = loop.create_future()
    if prefill == "answered":
        p_task.set_result(b"{}")
    d_task: asyncio.Future[UpstreamConnection] = loop.create_future()
    if stream:  # the head came, its first chunk did not
        conn = UpstreamConnection(loop, 1 << 16, 1 << 20)
        conn.status, conn.head_ready = 200, True
        conn.error = timeout
        d_task.set_result(conn)
    else:
        d_task.set_exception(timeout)
    with pytest.raises(LegFailed) as caught:
        await PairRelay._decode_head(
            None,  # type: ignore[arg-type]
            d_task, p_task, stream, lambda: decode_alive,
        )  # fmt: skip
    if not p_task.done():
        p_task.cancel()
    return caught.value


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_decode_whose_kv_never_came_counts_against_the_prefill(stream: bool) -> None:
    """Issue 57 item 9: the decode's leg timed out while its prefill had not answered (the
    prefill answers once its KV is sent) and the decode's probes passed or said nothing: the
    KV never came, the prefill's failure, whichever leg's equal deadline fired first."""
    for alive in (True, None):
        failed = await decode_head_failure(alive, "pending", stream)
        assert (failed.leg, failed.kind) == ("prefill", "timeout")
        assert "no KV" in str(failed)
    # a decode whose probes failed meanwhile is the hung one; after the prefill answered
    # (its KV sent), a decode that times out is at fault itself
    failed = await decode_head_failure(False, "pending", stream)
    assert failed.leg == "decode"
    failed = await decode_head_failure(True, "answered", stream)
    assert failed.leg == "decode"
