"""The engine twin's live /metrics matches what the pinned SGLang declares: every `sglang:`
family it exposes is one SGLang declares, with the same type, label names, buckets and help
text. The differences we keep on purpose are listed in `tests/twin_differences.py` (with the
differences a live real engine shows, tests/component/differential/), nowhere else."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_tpu import metric_names
from tests import sglang_metrics as sm
from tests.component.engine.engine_process import running_engine
from tests.sglang_wheel import pinned_version, unpacked_wheel
from tests.twin_differences import DECLARATION_ASPECTS, metric_differences
from tpuserve.observability import local_prometheus

pytestmark = pytest.mark.component

# (family, aspect) -> why the twin differs from SGLang's declarations there. The test fails on
# any difference not listed and on a listed one that is gone.
TWIN_DIFFERENCES: Mapping[tuple[str, str], str] = metric_differences(*DECLARATION_ASPECTS)


def differences(exposition: str) -> dict[tuple[str, str], str]:
    """How the `sglang:` families of a /metrics text differ from the pinned SGLang's."""
    declared = {m.family: m for m in sm.declared_metrics().values()}
    parsed = list(text_string_to_metric_families(exposition))
    help_texts = {family.name: family.documentation for family in parsed}
    found: dict[tuple[str, str], str] = {}
    for name, family in sm.exposed_families(parsed).items():
        spec = declared.get(name)
        if spec is None:
            found[name, "declared"] = "SGLang declares no such metric"
            continue
        if family.kind != spec.kind:
            found[name, "type"] = f"{family.kind}, SGLang: {spec.kind}"
        if spec.labels is not None and family.labels != set(spec.labels):
            found[name, "labels"] = f"{sorted(family.labels)}, SGLang: {sorted(spec.labels)}"
        buckets = family.buckets
        if buckets is not None and spec.buckets is not None and buckets != spec.buckets:
            found[name, "buckets"] = f"{buckets}, SGLang: {spec.buckets}"
        if spec.documentation is not None and help_texts[name] != spec.documentation:
            found[name, "help"] = f"{help_texts[name]!r}, SGLang: {spec.documentation!r}"
    return found


def scrape_after_traffic(url: str) -> str:
    """/metrics after one streaming and one non-streaming request (every child has samples)."""

    async def go() -> str:
        async with aiohttp.ClientSession() as session:
            for stream in (False, True):
                body = {"prompt": "metric families " * 20, "max_tokens": 4, "stream": stream}
                async with session.post(url + "/v1/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
            async with session.get(url + "/metrics") as response:
                return await response.text()

    return asyncio.run(go())


@pytest.mark.parametrize("host_tier", [False, True], ids=["hbm", "host-tier"])
def test_the_twin_exposes_only_what_sglang_declares_as_sglang_declares_it(host_tier: bool) -> None:
    tier = ["--enable-hierarchical-cache"] if host_tier else []
    with running_engine(["--time-scale", "0", *tier]) as engine:
        exposition = scrape_after_traffic(engine.url)
    found = differences(exposition)
    unlisted = {k: v for k, v in found.items() if k not in TWIN_DIFFERENCES}
    gone = set(TWIN_DIFFERENCES) - set(found)
    assert not unlisted, f"the twin differs from SGLang {pinned_version()}: {unlisted}"
    assert not gone, f"listed in TWIN_DIFFERENCES but no longer different: {sorted(gone)}"
    exposed = {f.name for f in text_string_to_metric_families(exposition)}
    assert {m.family for m in metric_names.ALL_METRICS} <= exposed
    hicache = {m.family for m in metric_names.HICACHE_METRICS}
    assert hicache <= exposed if host_tier else not hicache & exposed


def test_the_comparison_catches_a_renamed_metric_and_a_missing_label() -> None:
    old = sm.PREFIX + "num_requests_received"  # a counter the twin exposed before 0.5.23
    exposition = "\n".join(
        [
            f"# HELP {old}_total Number of requests received.",
            f"# TYPE {old}_total counter",
            f'{old}_total{{model_name="m"}} 1.0',
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
            "# TYPE sglang:num_queue_reqs gauge",
            'sglang:num_queue_reqs{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 0',
            "",
        ]
    )
    found = differences(exposition)
    assert set(found) == {(old, "declared"), ("sglang:num_queue_reqs", "labels")}
    assert "moe_ep_rank" in found["sglang:num_queue_reqs", "labels"]


def test_the_twins_startup_phases_are_sglangs() -> None:
    phases = sm.loop_values(
        sm.COLLECTORS_FILE, "TokenizerMetricsCollector.emit_startup_time", "phase"
    )
    assert phases == metric_names.STARTUP_PHASES


def test_sglang_declares_no_name_the_colon_restoring_relabeling_could_clash_with() -> None:
    """The local Prometheus turns an escaped `sglang_token_usage` back into `sglang:token_usage`
    (`metric_names.RESTORE_SGLANG_COLON`): lossless only while SGLang declares no
    `sglang_` name of its own."""
    package = unpacked_wheel()
    clashing = [
        metric
        for path in sorted((package / "srt").rglob("*.py"))
        if '"sglang_' in (text := path.read_text(encoding="utf-8"))
        for metric in sm.declarations_in(text, str(path), {}, prefix="sglang_")
    ]
    assert not clashing, [m.where for m in clashing]
    rule = metric_names.RESTORE_SGLANG_COLON
    assert re.fullmatch(rule["regex"], "sglang_num_requests_total")
    replacement = str(rule["replacement"])
    assert replacement.replace("${1}", "num_requests_total") == "sglang:num_requests_total"
    job = local_prometheus.config(
        [local_prometheus.ScrapeTarget(local_prometheus.MODEL_SERVER_JOB, "http://127.0.0.1:1")]
    )["scrape_configs"][0]
    assert job["metric_relabel_configs"] == [rule]
