"""Workload generators are seeded and shaped as documented; traces round-trip; bad lines fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from sglang_tpu.tokenizer import load_tokenizer
from tpuserve.bench import traces, workloads
from tpuserve.bench.traces import TraceError, TraceRequest, token_ids_of
from tpuserve.bench.workloads import generate

pytestmark = pytest.mark.unit


def test_same_seed_gives_the_same_trace_and_another_seed_a_different_one() -> None:
    a = [r.to_json() for r in generate("W2", seed=3, requests=50)]
    b = [r.to_json() for r in generate("W2", seed=3, requests=50)]
    c = [r.to_json() for r in generate("W2", seed=4, requests=50)]
    assert a == b
    assert a != c


@pytest.mark.parametrize("name", workloads.workload_names())
def test_every_workload_yields_the_requests_asked_for_in_arrival_order(name: str) -> None:
    trace = generate(name, seed=0, requests=40)
    assert len(trace) == 40
    assert [r.t for r in trace] == sorted(r.t for r in trace)
    assert [r.id for r in trace] == [f"r{i}" for i in range(40)]
    assert all(r.max_tokens >= 1 for r in trace)


def test_word_text_and_token_ids_agree_with_the_shared_tokenizer() -> None:
    tok = load_tokenizer()
    for req in generate("W1", seed=0, requests=5):
        assert req.prompt is not None
        assert req.token_ids is not None
        assert tok.encode(req.prompt) == req.token_ids
        assert len(req.prompt) == 4 * len(req.token_ids)  # 4 characters per token


def test_w1_groups_share_a_1024_token_system_prompt_with_64_token_questions() -> None:
    trace = generate("W1", seed=0, requests=400)
    by_group: dict[str, list[TraceRequest]] = {}
    for r in trace:
        assert r.session is not None
        by_group.setdefault(r.session, []).append(r)
    assert len(by_group) == 32
    for group in by_group.values():
        ids = [r.token_ids for r in group]
        assert all(x is not None and len(x) == 1024 + 64 for x in ids)
        first = ids[0]
        assert first is not None
        assert all(x is not None and x[:1024] == first[:1024] for x in ids)
    assert {r.max_tokens for r in trace} == {64}


def test_w1_zipf_parameter_skews_group_popularity() -> None:
    uniform = generate("W1", seed=0, requests=2000)
    skewed = generate("W1", seed=0, requests=2000, zipf=1.0)

    def top_share(trace: list[TraceRequest]) -> float:
        counts: dict[str | None, int] = {}
        for r in trace:
            counts[r.session] = counts.get(r.session, 0) + 1
        return max(counts.values()) / len(trace)

    assert top_share(skewed) > 2 * top_share(uniform)


def test_w2_tool_templates_and_output_lengths_are_in_range() -> None:
    trace = generate("W2", seed=0, requests=300)
    assert len({r.session for r in trace}) <= 60
    for r in trace:
        assert r.token_ids is not None
        assert 1500 + 50 <= len(r.token_ids) <= 3000 + 150
        assert 30 <= r.max_tokens <= 120


def test_w4_turns_extend_the_previous_context_as_chat_messages() -> None:
    trace = generate("W4", seed=0, requests=64)
    sessions: dict[str, list[TraceRequest]] = {}
    for r in trace:
        assert r.messages is not None
        assert r.session is not None
        sessions.setdefault(r.session, []).append(r)
    turns = next(s for s in sessions.values() if len(s) >= 2)
    earlier, later = turns[0].messages, turns[1].messages
    assert earlier is not None
    assert later is not None
    assert later[: len(earlier)] == earlier
    tok = load_tokenizer()
    assert token_ids_of(turns[0], tok) == tok.encode(tok.apply_chat_template(earlier))


def test_w5_documents_are_6_to_8k_tokens_and_w8_hot_prefix_takes_about_80_percent() -> None:
    for r in generate("W5", seed=0, requests=30):
        assert r.token_ids is not None
        assert 6000 + 20 <= len(r.token_ids) <= 8000 + 60
    w8 = generate("W8", seed=0, requests=1000)
    hot = sum(1 for r in w8 if r.session == "hot") / len(w8)
    assert 0.75 < hot < 0.85


def test_w8b_sends_sibling_bursts_of_16_prompts_times_4_samples() -> None:
    trace = generate("W8b", seed=0, requests=64)
    assert len({r.session for r in trace}) == 1
    assert len({r.prompt for r in trace}) == 16


def test_trace_round_trips_through_jsonl(tmp_path: Path) -> None:
    w7 = generate("W7", seed=1, requests=5)
    for r in w7:
        r.id = f"w7-{r.id}"  # ids are unique in a file (read_trace renames repeats)
    trace = generate("W3", seed=1, requests=20) + w7
    trace.sort(key=lambda r: r.t)
    path = tmp_path / "trace.jsonl"
    assert traces.write_trace(trace, path) == 25
    back = traces.read_trace(path)
    assert [r.to_json() for r in back] == [r.to_json() for r in trace]


def test_mooncake_lines_become_prompt_token_ids(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 700, "output_length": 20, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2, 3]},
    ]
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines))
    a, b = traces.read_trace(path)
    assert a.prompt_token_ids is not None
    assert b.prompt_token_ids is not None
    assert len(a.prompt_token_ids) == 700
    assert len(b.prompt_token_ids) == 1024
    assert b.prompt_token_ids[:700] == a.prompt_token_ids  # shared hash ids, shared tokens
    assert (a.t, b.t, a.max_tokens) == (0.0, 0.5, 20)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"t": 0, "prompt": "x", "max_tokens": 1}, "id must be"),
        ({"id": "a", "t": -1, "prompt": "x", "max_tokens": 1}, "t must be"),
        ({"id": "a", "t": 0, "prompt": "x", "max_tokens": 0}, "max_tokens must be"),
        ({"id": "a", "t": 0, "max_tokens": 1}, "exactly one of prompt, messages"),
        ({"id": "a", "t": 0, "prompt": "x", "messages": [], "max_tokens": 1}, "exactly one"),
        ({"id": "a", "t": 0, "messages": [{"role": 1}], "max_tokens": 1}, "messages[0]"),
        ({"id": "a", "t": 0, "prompt_token_ids": [1, -2], "max_tokens": 1}, "prompt_token_ids"),
    ],
)
def test_bad_trace_lines_name_the_line_and_field(
    tmp_path: Path, line: dict[str, object], message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(orjson.dumps({"id": "ok", "t": 0, "prompt": "y", "max_tokens": 1}) + b"\n"
                     + orjson.dumps(line) + b"\n")  # fmt: skip
    with pytest.raises(TraceError) as err:
        traces.read_trace(path)
    assert f"{path}:2" in str(err.value)
    assert message in str(err.value)


def test_unknown_workload_and_parameter_are_refused_with_the_allowed_values() -> None:
    with pytest.raises(TraceError, match="allowed: W0, W1"):
        generate("W42")
    with pytest.raises(TraceError, match="allowed: groups, system"):
        generate("W1", bogus=1.0)


def test_rescale_sets_the_mean_rate_and_keeps_order() -> None:
    trace = generate("W1", seed=0, requests=100)
    scaled = traces.rescale_to_rate(trace, 50.0)
    assert traces.mean_rate(scaled) == pytest.approx(50.0)
    assert [r.id for r in scaled] == [r.id for r in trace]
    assert scaled[0].t == 0.0
    with pytest.raises(TraceError, match="--rate"):
        traces.rescale_to_rate(trace, 0.0)


def test_checked_in_sample_trace_is_what_the_generator_writes() -> None:
    """bench/traces/w1-small.jsonl is generated; regenerate it when the generator changes:
    ``generate("W1", seed=0, requests=24, groups=4, system=256, question=32, output=32)``."""
    path = Path(__file__).resolve().parents[4] / "bench" / "traces" / "w1-small.jsonl"
    expected = generate("W1", seed=0, requests=24, groups=4, system=256, question=32, output=32)
    assert [r.to_json() for r in traces.read_trace(path)] == [r.to_json() for r in expected]


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    return path


def test_mooncake_lines_without_ids_become_requests_named_by_line(tmp_path: Path) -> None:
    line = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
    path = write_lines(tmp_path / "m.jsonl", [line, line, dict(line, timestamp=3000), line])
    trace = traces.read_trace(path)
    assert [r.id for r in trace] == ["L1", "L2", "L4", "L3"]  # sorted by arrival, stable
    assert len({r.id for r in trace}) == 4


def test_repeated_ids_are_made_unique_whatever_the_format(tmp_path: Path) -> None:
    ours = {"id": "a", "t": 0, "prompt": "x", "max_tokens": 1}
    moon = {"id": "a", "timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [7]}
    path = write_lines(tmp_path / "m.jsonl", [ours, ours, moon, dict(ours, id="a#2")])
    ids = [r.id for r in traces.read_trace(path)]
    assert len(set(ids)) == 4
    assert ids[0] == "a"


def test_mooncake_prompt_longer_than_its_blocks_is_padded_privately(tmp_path: Path) -> None:
    lines = [
        {"timestamp": 0, "input_length": 1000, "output_length": 0, "hash_ids": [3]},
        {"timestamp": 0, "input_length": 1000, "output_length": 2, "hash_ids": [3]},
        {"timestamp": 0, "input_length": 300, "output_length": 2},
    ]
    a, b, c = traces.read_trace(write_lines(tmp_path / "m.jsonl", lines))
    assert a.prompt_token_ids is not None
    assert b.prompt_token_ids is not None
    assert c.prompt_token_ids is not None
    assert len(a.prompt_token_ids) == len(b.prompt_token_ids) == 1000
    assert a.prompt_token_ids[:512] == b.prompt_token_ids[:512]  # the shared block
    assert a.prompt_token_ids[512:] != b.prompt_token_ids[512:]  # each its own tail
    assert len(c.prompt_token_ids) == 300  # no hash_ids: a prompt nobody shares
    assert a.max_tokens == 1  # output_length 0 is sent as 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"input_length": 10, "hash_ids": [1]}, "timestamp"),
        ({"timestamp": 0, "hash_ids": [1]}, "input_length"),
        ({"timestamp": 0, "input_length": 0, "hash_ids": [1]}, "input_length must be >= 1"),
        ({"timestamp": -5, "input_length": 4, "hash_ids": [1]}, "timestamp must be"),
        ({"timestamp": 0, "input_length": 4, "hash_ids": ["x"]}, "hash_ids"),
        ({"timestamp": 0, "input_length": 4, "output_length": -1}, "output_length must be"),
    ],
)
def test_bad_mooncake_lines_name_the_line_and_field(
    tmp_path: Path, line: dict[str, object], message: str
) -> None:
    path = write_lines(tmp_path / "bad.jsonl", [line])
    with pytest.raises(TraceError) as err:
        traces.read_trace(path)
    assert f"{path}:1" in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize("name", ["W9", "W10"])
def test_long_context_workloads_share_a_system_block_and_extend_their_sessions(
    name: str,
) -> None:
    trace = generate(name, seed=0, requests=300)
    ids = [r.token_ids for r in trace]
    assert all(x is not None for x in ids)
    lengths = [len(x) for x in ids if x is not None]
    assert min(lengths) < 4000 < 20_000 < max(lengths) <= 92_000
    first = ids[0]
    assert first is not None
    assert all(x is not None and x[:512] == first[:512] for x in ids)  # one shared block
    sessions: dict[str, list[TraceRequest]] = {}
    for r in trace:
        assert r.prompt is not None
        assert r.session is not None
        sessions.setdefault(r.session, []).append(r)
    multi = [turns for turns in sessions.values() if len(turns) > 1]
    assert len(multi) > 10
    for turns in multi:
        earlier, later = turns[0].token_ids, turns[1].token_ids
        assert earlier is not None
        assert later is not None
        whole = len(earlier) // 512 * 512  # whole Mooncake blocks are shared
        assert later[:whole] == earlier[:whole]


@pytest.mark.parametrize(
    ("name", "prompt", "output"), [("1k1k", 1024, 1024), ("1k8k", 1024, 8192), ("8k1k", 8192, 1024)]
)
def test_fixed_shapes_send_unique_prompts_of_exact_lengths(
    name: str, prompt: int, output: int
) -> None:
    trace = generate(name, seed=0, requests=30)
    assert {len(r.token_ids or []) for r in trace} == {prompt}
    assert {r.max_tokens for r in trace} == {output}
    firsts = {tuple((r.token_ids or [])[:16]) for r in trace}
    assert len(firsts) == len(trace)  # nothing shared, not even the first page
