"""Mode sim end to end on tiny workloads: the JSON summary is complete and sane; controls agree."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tpuserve.bench import sim_runner, sizing, traces, workloads
from tpuserve.bench.report import summarize
from tpuserve.bench.sim_config import Fault, SimConfig
from tpuserve.bench.sim_runner import SimRun, measure_rr_saturation, run_sim
from tpuserve.cli import main
from tpuserve_router.engines.load_view import set_peer_load

pytestmark = pytest.mark.unit

REQUIRED = (
    "policy", "requests", "hit_rate", "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99",
    "e2e_mean", "e2e_p99", "throughput_rps", "output_tokens_per_s", "goodput_rps",
    "imbalance_max_over_mean",
)  # fmt: skip
CONTROL_POLICIES = ("round_robin", "least_load", "cache_aware", "precise", "cost",
                    "sglang_cache_aware_v2", "sglang_cache_aware_v1", "oracle")  # fmt: skip


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["bench", *args, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, "--json prints exactly one line"
    data: dict[str, object] = json.loads(out[0])
    return data


def numbers(data: dict[str, object]) -> dict[str, float]:
    """The summary's numeric fields (booleans are not numbers here)."""
    return {
        k: float(v)
        for k, v in data.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def test_json_summary_has_every_field_and_sane_values(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_cli(capsys, "--workload", "W1", "--requests", "200", "--policy", "precise")
    for key in REQUIRED:
        assert key in data, key
    assert data["policy"] == "precise"
    assert data["requests"] == 180  # 10 % warm-up
    hit = data["hit_rate"]
    assert isinstance(hit, float)
    assert 0.3 < hit <= 1.0
    for key in ("ttft_p50", "ttft_p90", "ttft_p99"):
        assert isinstance(data[key], float)
    n = numbers(data)
    assert n["ttft_p50"] <= n["ttft_p90"] <= n["ttft_p99"]
    assert 0 < n["ttft_mean"] < n["e2e_mean"] <= n["e2e_p99"]
    assert n["goodput_rps"] <= n["throughput_rps"]
    assert n["imbalance_max_over_mean"] >= 1.0
    rate, mu = data["rate"], data["mu_rr"]
    assert isinstance(rate, float)
    assert isinstance(mu, float)
    assert rate == pytest.approx(0.85 * mu)


def test_default_policy_is_the_routers_default(capsys: pytest.CaptureFixture[str]) -> None:
    from tpuserve_router.config import DEFAULT_POLICY

    data = run_cli(capsys, "--workload", "W0", "--requests", "60", "--rate", "5")
    assert data["policy"] == DEFAULT_POLICY
    assert data["rate"] == 5.0


def test_the_same_seed_gives_the_same_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--workload", "W2", "--requests", "120", "--rate", "20", "--policy", "cost")
    a = run_cli(capsys, *args)
    b = run_cli(capsys, *args)
    a.pop("wall_seconds")
    b.pop("wall_seconds")
    assert a == b


def test_trace_file_replay_matches_the_generated_workload(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "w1.jsonl"
    args = ("--requests", "100", "--rate", "10", "--policy", "cache_aware")
    generated = run_cli(capsys, "--workload", "W1", "--write-trace", str(path), *args)
    replayed = run_cli(capsys, "--trace", str(path), *args)
    assert replayed["hit_rate"] == pytest.approx(generated["hit_rate"])
    assert replayed["requests"] == generated["requests"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "W1", "--rate", "0"], "--rate"),
        (["--workload", "W1", "--fault-at", "3"], "--fault-at: needs --fault"),
        (["--workload", "W1", "--fault", "restart", "--fault-worker", "9", "--rate", "5"],
         "--fault-worker"),
        (["--workload", "W1", "--topology", "3x3"], "topology"),
        (["--trace", "/nonexistent/trace.jsonl"], "cannot read"),
        (["--workload", "W1", "--mode", "live", "--policy", "oracle", "--rate", "1",
          "--requests", "2"], "--mode sim"),
    ],
)  # fmt: skip
def test_bad_flags_get_a_clear_error(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    try:
        code = main(["bench", *args])
    except SystemExit as exit_:  # argparse's own checks
        code = int(exit_.code or 0)
    assert code == 2
    assert message in capsys.readouterr().err


def _tiny(name: str, n: int, **params: float) -> list[traces.TraceRequest]:
    return workloads.generate(name, seed=1, requests=n, **params)


def test_control_no_sharing_all_policies_converge() -> None:
    trace = _tiny("W0", 240)
    config = SimConfig(cache_tokens=sizing.cache_tokens_for(sizing.measure_demand(trace), 4))
    trace = traces.rescale_to_rate(trace, 0.5 * measure_rr_saturation(trace, config))
    results = {p: summarize(p, run_sim(trace, p, config).records, None) for p in CONTROL_POLICIES}
    hits = [r["hit_rate"] for r in results.values()]
    e2e = [r["e2e_mean"] for r in results.values()]
    assert max(hits) < 0.02
    assert max(e2e) / min(e2e) < 1.15, results


def test_control_everything_fits_all_policies_converge() -> None:
    trace = _tiny("W1", 600, groups=8)
    config = SimConfig(cache_tokens=sizing.fits_all(sizing.measure_demand(trace)))
    trace = traces.rescale_to_rate(trace, 0.3 * measure_rr_saturation(trace, config))
    results = {p: summarize(p, run_sim(trace, p, config).records, None, warmup_fraction=0.3)
               for p in CONTROL_POLICIES}  # fmt: skip
    hits = [r["hit_rate"] for r in results.values()]
    assert min(hits) > 0.85
    assert max(hits) - min(hits) < 0.05, {p: r["hit_rate"] for p, r in results.items()}


def test_restart_fails_in_flight_requests_and_the_hit_rate_recovers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_cli(capsys, "--workload", "W8", "--requests", "1200", "--rate", "40",
                   "--policy", "precise", "--fault", "restart", "--fault-at", "5")  # fmt: skip
    fault = data["fault"]
    assert isinstance(fault, dict)
    assert fault["kind"] == "restart"
    assert fault["serving_again_at"] == 10.0  # down for the default 5 s
    recovery = fault["fleet"]["recovery_seconds"]
    assert recovery is not None
    assert 0 < recovery < 10


def test_restart_in_the_runner_sends_no_request_to_the_worker_while_it_is_down() -> None:
    trace = traces.rescale_to_rate(_tiny("W1", 300), 30.0)
    config = SimConfig(cache_tokens=20_000, faults=(Fault("restart", 3.0, 0),),
                       restart_down_seconds=2.0)  # fmt: skip
    result = run_sim(trace, "least_load", config)
    down = [r for r in result.records if 3.0 <= r.arrival < 5.0]
    assert down
    assert all(r.worker != "http://127.0.0.1:30000" for r in down)
    assert any(r.error == "worker_restarted" for r in result.records)
    assert all(r.ok or r.error for r in result.records)
    assert not math.isnan(summarize("least_load", result.records, None)["e2e_mean"])


def test_flush_drains_the_worker_then_serves_again_from_an_empty_cache() -> None:
    trace = traces.rescale_to_rate(_tiny("W1", 300), 30.0)
    config = SimConfig(cache_tokens=20_000, faults=(Fault("flush", 3.0, 0),))
    result = run_sim(trace, "cache_aware", config)
    (fault,) = result.faults
    back = fault["serving_again_at"]
    assert back is not None
    assert back > 3.0
    first = "http://127.0.0.1:30000"
    assert all(r.worker != first for r in result.records if 3.0 <= r.arrival < back)
    after = sorted((r for r in result.records if r.worker == first and r.arrival >= back),
                   key=lambda r: r.arrival)  # fmt: skip
    assert after
    assert after[0].cached_tokens == 0
    assert all(r.ok for r in result.records)


def test_without_kv_events_precise_routes_on_its_own_predictions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--workload", "W1", "--requests", "300", "--rate", "20", "--policy", "precise")
    with_events = run_cli(capsys, *args)
    without = run_cli(capsys, *args, "--no-kv-events")
    assert with_events["kv_events"] is True
    assert without["kv_events"] is False
    assert numbers(without)["hit_rate"] > 0.5
    assert without != with_events


MOONCAKE_FIXTURE = (
    Path(__file__).resolve().parents[4] / "bench/traces/mooncake-conversation-small.jsonl"
)


def test_a_mooncake_trace_without_ids_replays_with_no_failed_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The fixture repeats timestamps (3 s steps) and starts every prompt with block 0: the
    two fields the ids used to be made of."""
    records = tmp_path / "records.jsonl"
    data = run_cli(capsys, "--trace", str(MOONCAKE_FIXTURE), "--rate", "2",
                   "--warmup-fraction", "0", "--records", str(records))  # fmt: skip
    assert data["requests"] == 150
    assert data["failed"] == 0
    assert data["failed_by_reason"] == {}
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert len({row["id"] for row in rows}) == 150
    assert all(row["ok"] and row["error"] == "" for row in rows)
    assert data["hit_rate"] > 0.1  # type: ignore[operator]


def test_requests_sharing_an_id_still_run_as_requests_of_their_own() -> None:
    trace = workloads.generate("W1", seed=0, requests=60)
    for r in trace:
        r.id = "same"
    trace = traces.rescale_to_rate(trace, 10.0)
    result = run_sim(trace, "precise", SimConfig(cache_tokens=20_000))
    assert len(result.records) == 60
    assert all(r.ok and r.ttft is not None for r in result.records)


def test_an_injected_failure_carries_its_reason_in_records_and_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    records = tmp_path / "records.jsonl"
    # A context of 4,096 tokens (the KV pool): the fixture's longer prompts cannot run.
    data = run_cli(capsys, "--trace", str(MOONCAKE_FIXTURE), "--rate", "2", "--cache-tokens",
                   "4096", "--warmup-fraction", "0", "--records", str(records))  # fmt: skip
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    failed = [row for row in rows if not row["ok"]]
    assert failed
    assert {row["error"] for row in failed} == {"prompt_too_long"}
    assert all(row["prompt_tokens"] >= 4096 for row in failed)
    assert data["failed"] == len(failed)
    assert data["failed_by_reason"] == {"prompt_too_long": len(failed)}


def test_every_way_a_sim_request_fails_names_its_reason() -> None:
    from tpuserve.bench.sim_config import FAILURE_REASONS

    trace = traces.rescale_to_rate(_tiny("W1", 200), 200.0)
    full = run_sim(trace, "round_robin", SimConfig(cache_tokens=20_000, max_queued_requests=2))
    restarted = run_sim(trace, "least_load", SimConfig(
        cache_tokens=20_000, workers=1, faults=(Fault("restart", 0.3, 0),),
        restart_down_seconds=1e9))  # fmt: skip
    failed = [r for r in full.records + restarted.records if not r.ok]
    reasons = Counter(r.error for r in failed)
    assert {"queue_full", "worker_restarted", "no_healthy_worker"} <= set(reasons)
    assert set(reasons) <= set(FAILURE_REASONS)
    assert full.rejected == sum(1 for r in full.records if r.error == "queue_full")
    assert all(r.failure_reason == r.error for r in failed)


def test_router_replicas_each_route_a_share_with_their_own_in_flight_counts() -> None:
    trace = traces.rescale_to_rate(_tiny("W1", 300), 30.0)
    approximate = SimRun(trace, "cache_aware", SimConfig(cache_tokens=20_000, router_replicas=3))
    result = approximate.run()
    assert all(r.ok for r in result.records)
    # Each replica's tree holds only what it routed itself: all learned something, all differ.
    trees = [replica.policy.index_sizes()["tree_chars"] for replica in approximate.replicas]
    assert min(trees) > 0
    assert len(set(trees)) == 3
    assert all(v.in_flight == 0 for replica in approximate.replicas for v in replica.views)
    precise = SimRun(trace, "precise", SimConfig(cache_tokens=20_000, router_replicas=3))
    result = precise.run()
    # Every replica subscribes to every engine: the same confirmed blocks in each index.
    blocks = {replica.policy.index_sizes()["confirmed_blocks"] for replica in precise.replicas}
    assert len(blocks) == 1
    assert blocks.pop() > 0
    assert summarize("precise", result.records, None)["hit_rate"] > 0.5


def test_one_router_replica_is_the_plain_run(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--workload", "W1", "--requests", "200", "--rate", "20", "--policy", "cache_aware")
    one = run_cli(capsys, *args)
    also_one = run_cli(capsys, *args, "--router-replicas", "1")
    two = run_cli(capsys, *args, "--router-replicas", "2")
    for data in (one, also_one, two):
        data.pop("wall_seconds")
    assert one == also_one
    assert two["router_replicas"] == 2
    assert two["failed"] == 0


@pytest.mark.parametrize(
    ("policy", "poll_seconds", "polls"),
    [("precise", 0.1, True), ("precise", 0.0, False), ("sglang_cache_aware_v2", 0.1, False)],
)
def test_tpuserve_replicas_poll_the_engines_load_and_see_each_others_requests(
    monkeypatch: pytest.MonkeyPatch, policy: str, poll_seconds: float, polls: bool
) -> None:
    """As `tpuserve router --load-poll-interval` does; an anchor (sglang-router) keeps its own
    counts only, and an interval of 0 turns polling off."""
    peers: list[int] = []

    def recording(view: Any, requests: int, prefill: int, own_prefill: int) -> bool:
        news = set_peer_load(view, requests, prefill, own_prefill)
        peers.append(view.peer_in_flight)
        return news

    monkeypatch.setattr(sim_runner, "set_peer_load", recording)
    trace = traces.rescale_to_rate(_tiny("W1", 200), 30.0)
    config = SimConfig(cache_tokens=20_000, router_replicas=2, load_poll_seconds=poll_seconds)
    result = SimRun(trace, policy, config).run()
    assert all(r.ok for r in result.records)
    assert bool(peers) == polls
    if polls:
        assert max(peers) > 0  # the other replica's requests, seen through the engines


@pytest.mark.parametrize(
    ("policy", "delay", "peers"),
    [("precise", 0.001, True), ("precise", None, False), ("sglang_cache_aware_v2", 0.001, False)],
)
def test_peering_replicas_apply_each_others_decisions_as_the_router_does(
    policy: str, delay: float | None, peers: bool
) -> None:
    """As `tpuserve router --peer-port` does (the router's PeerLink and PeerView), a delay
    after each event; without --peer-delay, or for an anchor, the replicas do not peer."""
    trace = traces.rescale_to_rate(_tiny("W1", 200), 30.0)
    config = SimConfig(
        cache_tokens=20_000, router_replicas=2, load_poll_seconds=0.0, peer_delay_seconds=delay
    )
    run = SimRun(trace, policy, config)
    assert all((r.peers is not None) == peers for r in run.replicas)
    announced: list[int] = []
    for replica in run.replicas:
        view = replica.peers
        if view is None:
            continue

        def apply(message: Any, views: Any = replica.views, apply: Any = view.apply) -> bool:
            applied: bool = apply(message)
            announced.append(sum(v.announced_in_flight for v in views))
            return applied

        view.apply = apply  # type: ignore[method-assign]
    result = run.run()
    assert all(r.ok for r in result.records)
    assert bool(announced) == peers
    if peers:
        assert max(announced) > 0  # the other replica's requests, heard from it
        assert all(r.peers is not None and r.peers.open_requests() == 0 for r in run.replicas)
    views = [v for replica in run.replicas for v in replica.views]
    assert all(v.in_flight == v.announced_in_flight == 0 for v in views)


def test_kv_events_reach_each_replica_at_its_next_read_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``kv_event_interval_seconds`` a batch reaches a replica's index at that replica's
    next read (replica r reads at phase r / N of the interval), as the router reads busy
    streams: at every decision the index holds exactly the batches read by then."""
    interval = 0.01
    trace = traces.rescale_to_rate(_tiny("W1", 200), 30.0)
    config = SimConfig(
        cache_tokens=20_000, router_replicas=2, load_poll_seconds=0.0,
        kv_event_interval_seconds=interval,
    )  # fmt: skip
    run = SimRun(trace, "precise", config)
    emitted: list[tuple[list[Any], float]] = []  # each batch, and when its engine emitted it
    for worker in run.workers:
        core = worker.engine.core
        assert core.kv_event_sink is not None

        def record(
            events: Any, sink: Any = core.kv_event_sink, engine: Any = worker.engine
        ) -> None:
            emitted.append((events, engine.now))
            sink(events)

        core.kv_event_sink = record
    applied: dict[int, list[int]] = {id(index): [] for index in run.indexes}
    apply_events = sim_runner.apply_events

    def apply(index: Any, name: str, events: Any, *tiers: bool) -> None:
        applied[id(index)].append(id(events))
        apply_events(index, name, events, *tiers)

    monkeypatch.setattr(sim_runner, "apply_events", apply)
    late: list[int] = []
    for r, replica in enumerate(run.replicas):
        phase = r * interval / len(run.replicas)

        def check(
            request: Any, workers: Any, choose: Any = replica.policy.choose,
            index: Any = replica.index, phase: float = phase,
        ) -> Any:  # fmt: skip
            now = run.now
            read = [
                id(events) for events, at in emitted
                if phase + (math.floor((at - phase) / interval) + 1) * interval <= now
            ]  # fmt: skip
            assert sorted(applied[id(index)]) == sorted(read)
            # what that means: a batch is read after it was emitted, at most an interval late
            emitted_at = {id(events): at for events, at in emitted}
            assert all(emitted_at[batch] < now for batch in read)
            assert {id(e) for e, at in emitted if at <= now - interval} <= set(read)
            late.append(len(emitted) - len(read))
            return choose(request, workers)

        replica.policy.choose = check  # type: ignore[method-assign]
    result = run.run()
    assert all(r.ok for r in result.records)
    assert len(late) == len(trace)
    assert any(late)  # some decisions were made before the last batches were read


def test_kv_event_interval_is_validated() -> None:
    with pytest.raises(ValueError, match=r"--kv-event-interval: -0.5 is not allowed"):
        SimConfig(kv_event_interval_seconds=-0.5).validate()


@pytest.mark.parametrize("first_tokens_reported", [True, False])
def test_peering_replicas_deliver_every_message_and_announce_each_first_byte(
    monkeypatch: pytest.MonkeyPatch, first_tokens_reported: bool
) -> None:
    """Messages still on their way when the trace ends are delivered (a peer's request ends
    everywhere), and a request announces its first byte before its end, as the router does,
    also one whose first token the engine did not report before it finished."""
    if not first_tokens_reported:
        monkeypatch.setattr(SimRun, "_on_update", lambda self, req: None)
    trace = traces.rescale_to_rate(_tiny("W1", 200), 30.0)
    config = SimConfig(
        cache_tokens=20_000, router_replicas=2, load_poll_seconds=0.0, peer_delay_seconds=0.05
    )
    run = SimRun(trace, "precise", config)
    sent: list[tuple[str, str, int]] = []
    for replica in run.replicas:
        link = replica.link
        assert link is not None

        def send(message: Any, publish: Any = link.send) -> None:
            sent.append((message.kind, message.router, message.request))
            publish(message)

        link.send = send
    result = run.run()
    assert all(r.ok for r in result.records)
    ended = {(router, n) for kind, router, n in sent if kind == "end"}
    first_bytes = {(router, n) for kind, router, n in sent if kind == "first_byte"}
    assert len(ended) == len(result.records)
    assert ended == first_bytes
    assert all(r.peers is not None and r.peers.open_requests() == 0 for r in run.replicas)
    views = [v for replica in run.replicas for v in replica.views]
    assert all(v.in_flight == v.announced_in_flight == 0 for v in views)


def test_a_tier_blind_router_forgets_a_demoted_prefix_and_a_tiered_one_keeps_it() -> None:
    """`--tier-blind` models routers that ignore the events' medium (docs/host-kv-tier.md)."""
    from sglang_tpu.sim.radix_cache import RadixCache
    from tpuserve_router.kv.block_index import BlockIndex

    cache = RadixCache(16, emit_events=True, host_tokens=1024)
    tokens = list(range(500, 564))
    cache.insert(tokens)
    cache.evict(64)  # demoted: BlockRemoved GPU, its CPU_PINNED copy kept
    events = cache.take_events()
    for tiers, held in ((True, 4), (False, 0)):
        index = BlockIndex(page_size=16)
        sim_runner.apply_events(index, "w", events, tiers)
        assert index.match(index.keys(tokens), ["w"]) == [held]


def test_precise_with_tiers_beats_the_tier_blind_router_on_a_working_set_beyond_hbm() -> None:
    """The published host-tier configuration (docs/host-kv-tier.md): W4 on four v5e 2x2
    engines with 16,384 tokens of HBM KV each (the distinct prompt tokens are ~10x the fleet's
    HBM) and 262,144 of host memory, at 0.85 x the HBM-only fleet's mu_RR. `precise` reading
    the tiers (HBM room, step 5) reaches 1.1x the goodput of the same engines behind a
    tier-blind router, and its engines report host hits."""
    trace = traces.rescale_to_rate(workloads.generate("W4", 0), 0.85 * 11.121362833437455)
    base = SimConfig(
        workers=4, cache_tokens=16384, tpu="v5e", topology="2x2", host_cache_tokens=262144
    )
    results = {}
    for tiers in (False, True):
        config = dataclasses.replace(base, kv_tiers=tiers)
        result = sim_runner.run_sim(trace, "precise", config)
        results[tiers] = summarize("precise", result.records, result.samples)
    aware, blind = results[True], results[False]
    assert aware["goodput_rps"] >= 1.1 * blind["goodput_rps"], (aware, blind)
    assert aware["host_hit_rate"] > 0.2
    assert 0 < aware["host_hit_rate"] < aware["hit_rate"]
