"""SGLang's PD contract as tpuserve spells it: rooms and DP ranks, the three request fields,
the engine timeouts, the KV link's timing, and the twin's decode admission of a transferred
request."""

from __future__ import annotations

import pytest

from sglang_tpu import disaggregation as pd
from sglang_tpu.perf_model import StepTimer, get_profile
from sglang_tpu.sim.engine import EngineConfig, EngineCore
from sglang_tpu.sim.output_text import OutputPalette
from sglang_tpu.sim.pd import Bootstrap, parse_bootstrap
from sglang_tpu.sim.request import Request
from sglang_tpu.tokenizer import load_tokenizer
from sglang_tpu.topology import lookup

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("dp_size", [1, 2, 3, 8])
def test_a_room_lands_on_the_rank_asked_for(dp_size: int) -> None:
    for rank in range(dp_size):
        for bits in (0, 1, 12345, pd.MAX_ROOM, pd.MAX_ROOM - 1):
            room = pd.room_for_rank(rank, dp_size, random_bits=bits)
            assert 0 <= room <= pd.MAX_ROOM
            assert pd.dp_rank_of(room, dp_size) == rank


def test_random_rooms_are_63_bit_and_differ() -> None:
    rooms = {pd.room_for_rank(0, 1) for _ in range(64)}
    assert len(rooms) == 64
    assert all(0 <= r <= pd.MAX_ROOM for r in rooms)


def test_a_rank_outside_the_dp_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"allowed: 0\.\.1"):
        pd.room_for_rank(2, 2)


def test_batched_fields_are_lists_with_consecutive_rooms() -> None:
    assert pd.bootstrap_fields("10.0.0.1", 8998, 7, None) == {
        "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 7,
    }  # fmt: skip
    fields = pd.bootstrap_fields("10.0.0.1", None, 7, 3)
    assert fields["bootstrap_room"] == [7, 8, 9]
    assert fields["bootstrap_host"] == ["10.0.0.1"] * 3
    assert fields["bootstrap_port"] == [None] * 3


def test_timeouts_come_from_sglangs_environment_variables() -> None:
    env = pd.BOOTSTRAP_TIMEOUT_ENV
    assert pd.timeout_seconds(env, 300.0, {}) == 300.0
    assert pd.timeout_seconds(env, 300.0, {env: "7"}) == 7.0
    with pytest.raises(ValueError, match=f"{env}: 'soon' is not allowed"):
        pd.timeout_seconds(env, 300.0, {env: "soon"})


def test_the_kv_of_a_long_prompt_takes_longer_over_dcn_than_ici() -> None:
    per_token = get_profile("llama-3.1-8b").kv_bytes_per_token()
    dcn = pd.kv_transfer_seconds(10_000, per_token, "dcn")
    ici = pd.kv_transfer_seconds(10_000, per_token, "ici")
    assert ici < dcn
    # 10k tokens of Llama-3.1-8B KV (128 KiB a token, 1.3 GB) over one host's 200 Gbps
    assert dcn == pytest.approx(1e-3 + 10_000 * per_token / 25e9)
    assert pd.kv_transfer_seconds(10_000, per_token, "dcn", hosts=2) < dcn


def test_parse_bootstrap_reads_scalars_and_one_element_lists() -> None:
    assert parse_bootstrap({}) is None
    assert parse_bootstrap({"bootstrap_host": "h", "bootstrap_room": 5}) == Bootstrap("h", None, 5)
    listed = {"bootstrap_host": ["h"], "bootstrap_port": [9], "bootstrap_room": [5]}
    assert parse_bootstrap(listed) == Bootstrap("h", 9, 5)
    with pytest.raises(ValueError, match="bootstrap_room: -1 is not allowed"):
        parse_bootstrap({"bootstrap_room": -1})
    with pytest.raises(ValueError, match="bootstrap_room: a list of 2"):
        parse_bootstrap({"bootstrap_room": [1, 2]})


def test_a_transferred_request_decodes_without_prefilling_and_starts_with_its_token() -> None:
    """The decode twin admits a request whose KV arrived: no prefill step, its first token at
    once, the same pseudo-text a colocated engine makes."""
    palette = OutputPalette(load_tokenizer())
    timer = StepTimer(lookup("v6e", "1x1"), get_profile("llama-3.1-8b"))
    prompt = list(range(1000, 1500))

    colocated = EngineCore(EngineConfig(cache_tokens=100_000), timer, palette)
    reference = Request("a", prompt, 4)
    colocated.add_request(reference, 0.0)
    now = 0.0
    while colocated.has_work():
        step = colocated.begin_step(now)
        assert step is not None
        now += step.duration
        colocated.finish_step(step, now)

    decode = EngineCore(EngineConfig(cache_tokens=100_000), timer, palette)
    req = Request("a", prompt, 4)
    decode.add_transferred(req, arrived=0.0, now=0.5)
    assert req.output_ids == reference.output_ids[:1]
    assert req.first_token_time == 0.5
    kinds = []
    now = 0.5
    while decode.has_work():
        step = decode.begin_step(now)
        assert step is not None
        kinds.append(step.kind)
        now += step.duration
        decode.finish_step(step, now)
    assert set(kinds) == {"decode"}
    assert req.output_ids == reference.output_ids
    assert decode.private_tokens == 0  # its KV went to the cache on finishing
