"""Every `sglang:` name tpuserve writes anywhere is one the pinned SGLang declares.

PromQL (the chart's rules, the local Prometheus's rules, every dashboard query, the promtool
fixtures) is parsed with promql-parser; the autoscaler's metrics come from rendering an HPA for
each `spec.autoscaling.metric`; every other file of the repository (docs, chart, code) is
searched with a regex. A failure names the file and the name. `CHANGELOG.md` is the one file
left out: it records names that were removed.
"""

from __future__ import annotations

import json
import re
import subprocess
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import sglang_metrics as sm
from tests.metrics.promtool import rule_tests
from tests.sglang_wheel import REPO, pinned_version
from tpuserve.observability import catalog, generate, local_prometheus, rules
from tpuserve_operator.api import AutoscalingSpec
from tpuserve_operator.render import RenderConfig, build_children

pytestmark = pytest.mark.component

NAME = re.compile(r"(?<![\w:])" + re.escape(sm.PREFIX) + r"[A-Za-z_]\w*")
# Files that may name what SGLang no longer declares, and why.
HISTORY = {"CHANGELOG.md": "records the names that were removed or renamed"}
EXAMPLE = REPO / "charts" / "tpuserve" / "examples" / "simulated.yaml"

Found = tuple[str, str]  # (where, name)


def in_promql(where: str, expressions: Iterable[str]) -> Iterator[Found]:
    for expr in expressions:
        for name in catalog.selected_names(expr):
            yield where, name


def _rule_exprs(rule_file: dict[str, Any]) -> list[str]:
    return [r["expr"] for g in rule_file["groups"] for r in g["rules"]]


def _dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            else:
                yield from _dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _dashboard_exprs(item)


def promql_names() -> Iterator[Found]:
    for path in sorted((REPO / generate.RULES_PATH.parent).glob("*.yaml")):
        yield from in_promql(
            str(path.relative_to(REPO)), _rule_exprs(yaml.safe_load(path.read_text()))
        )
    yield from in_promql("local Prometheus rules", _rule_exprs(local_prometheus.rule_file()))
    for path in sorted((REPO / generate.DASHBOARD_DIR).glob("*.json")):
        board = json.loads(path.read_text())
        yield from in_promql(str(path.relative_to(REPO)), _dashboard_exprs(board))
    promtool = rule_tests.promtool_test_file()
    for case in promtool["tests"]:
        series = [s["series"] for s in case["input_series"]]
        exprs = [c["expr"] for c in case.get("promql_expr_test", [])]
        yield from in_promql("tests/metrics/promtool/rule_tests.py", [*series, *exprs])


KEDA_ONLY = ("backlogSeconds", "kvCacheUsage")
"""Metrics only KEDA serves (the HPA path's metrics adapter has no rule for them)."""


def autoscaler_names() -> Iterator[Found]:
    """The series each autoscaling metric reads: the HPA's metric (through the metrics
    adapter's rules) where the HPA takes it, and every series of the KEDA ScaledObject's
    Prometheus queries."""
    example = yaml.safe_load(EXAMPLE.read_text())
    for metric in typing.get_args(AutoscalingSpec.model_fields["metric"].annotation):
        autoscaling: dict[str, Any] = {"maxReplicas": 4, "metric": metric}
        if metric == "kvCacheUsage":
            autoscaling["target"] = 0.8  # a share of the pool (the default target is a count)
        if metric not in KEDA_ONLY:
            spec = {**example["spec"], "autoscaling": autoscaling}
            children = build_children(example["metadata"], spec, RenderConfig())
            (hpa,) = [c for c in children if c["kind"] == "HorizontalPodAutoscaler"]
            for source in hpa["spec"]["metrics"]:
                yield f"autoscaler ({metric})", source[source["type"].lower()]["metric"]["name"]
        spec = {**example["spec"], "autoscaling": {**autoscaling, "engine": "keda"}}
        children = build_children(example["metadata"], spec, RenderConfig(keda=True))
        (scaled,) = [c for c in children if c["kind"] == "ScaledObject"]
        queries = [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]
        yield from in_promql(f"KEDA ScaledObject ({metric})", queries)


def text_names(root: Path = REPO) -> Iterator[Found]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.splitlines()  # fmt: skip
    for relative in listed:
        path = root / relative
        if relative in HISTORY or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary
        for name in set(NAME.findall(text)):
            yield relative, name


def undeclared_queries(found: Iterable[Found]) -> list[str]:
    """PromQL and HPA metric names must be series SGLang exposes."""
    return sorted(f"{where}: {name}" for where, name in found if sm.undeclared([name]))


def undeclared_mentions(found: Iterable[Found]) -> list[str]:
    """Prose may also name a metric by its declared or family name (a histogram's base name)."""
    known = {n for m in sm.declared_metrics().values() for n in (m.name, m.family, *m.series)}
    return sorted(f"{where}: {name}" for where, name in found if name not in known)


def test_rules_dashboards_and_promtool_fixtures_select_only_declared_sglang_series() -> None:
    found = list(promql_names())
    assert {name for _, name in found if name.startswith(sm.PREFIX)}  # the walk saw them
    assert not undeclared_queries(found), f"not declared by SGLang {pinned_version()}"


def test_the_autoscaler_reads_declared_sglang_series_or_tpuserve_rules() -> None:
    found = list(autoscaler_names())
    hpa = [where for where, _ in found if where.startswith("autoscaler")]
    keda = {where for where, _ in found if where.startswith("KEDA")}
    assert len(hpa) == 3  # queue, tokensInFlight, ttft
    assert len(keda) == 5  # and KEDA's backlogSeconds and kvCacheUsage
    recorded = {r.record for r in rules.recording_rules()}
    assert not undeclared_queries(found), f"not declared by SGLang {pinned_version()}"
    assert all(name.startswith(sm.PREFIX) or name in recorded for _, name in found), found


def test_docs_chart_and_code_name_only_declared_sglang_metrics() -> None:
    found = list(text_names())
    assert ("docs/operator.md", "sglang:num_queue_reqs") in found  # the walk reads docs
    assert not undeclared_mentions(found), f"not declared by SGLang {pinned_version()}"


def test_the_checks_name_the_file_and_the_undeclared_name(tmp_path: Path) -> None:
    removed = sm.PREFIX + "num_requests_received_total"
    query = f'sum(rate({removed}{{model_name=~"$model_name"}}[$__rate_interval]))'
    assert undeclared_queries(in_promql("board.json", [query])) == [f"board.json: {removed}"]
    # A histogram's bare name is prose, not a series a query can select.
    bare = "sglang:time_to_first_token_seconds"
    assert undeclared_queries([("rules.yaml", bare)]) == [f"rules.yaml: {bare}"]
    assert undeclared_mentions([("docs/x.md", bare)]) == []
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, timeout=60)
    (tmp_path / "docs.md").write_text(f"Chart `{sm.PREFIX}engine_startup_time` and `{bare}`.\n")
    assert undeclared_mentions(text_names(tmp_path)) == [f"docs.md: {sm.PREFIX}engine_startup_time"]
