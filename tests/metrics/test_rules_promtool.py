"""The rules the chart renders pass `promtool check rules`, and `promtool test rules` passes the
unit tests of `promtool/rule_tests.py`, which cover every recording rule and every alert."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chart_helpers import VALUES_DIR, find_tool, make_renderer
from tests.metrics.promtool import fleet_series, rule_tests
from tpuserve.observability import generate, rules

pytestmark = pytest.mark.component


def rendered_groups(values: list[Path], kind: str) -> list[dict[str, Any]]:
    objects = make_renderer(find_tool("helm"))(values)
    (rule,) = [o for o in objects if o["kind"] == kind]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


PARTS = sorted(rule_tests.promtool_test_files())


def run_promtool_tests(
    promtool: Path, folder: Path, groups: list[dict[str, Any]], part: str
) -> str:
    """`promtool test rules` on `groups` with one part of rule_tests' file; its output, failing
    or not."""
    (folder / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    test_file = yaml.safe_dump(rule_tests.promtool_test_files()[part], sort_keys=False)
    (folder / "tpuserve.test.yaml").write_text(test_file)
    done = subprocess.run(
        [str(promtool), "test", "rules", "tpuserve.test.yaml"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,  # ~5-10 s of CPU a part; the wait is for a loaded machine
    )
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def promtool() -> Path:
    return find_tool("promtool")


@pytest.mark.parametrize(
    ("values", "kind"),
    [([], "PrometheusRule"), ([VALUES_DIR / "gmp.yaml"], "ClusterRules")],
    ids=["prometheus-operator", "gmp"],
)
def test_promtool_check_rules_accepts_rendered_rules(
    promtool: Path, tmp_path: Path, values: list[Path], kind: str
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rendered_groups(values, kind)}))
    done = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    chart_values = yaml.safe_load(
        (generate.REPO_ROOT / generate.CHART_DIR / "values.yaml").read_text()
    )
    expected = len(rules.recording_rules()) + len(rules.alerts()) + len(chart_values["pricing"])
    assert f"SUCCESS: {expected} rules found" in done.stdout


@pytest.mark.parametrize("part", PARTS)
def test_promtool_unit_tests_pass_on_rendered_rules(
    promtool: Path, tmp_path: Path, part: str
) -> None:
    groups = rendered_groups([fleet_series.VALUES], "PrometheusRule")
    output = run_promtool_tests(promtool, tmp_path, groups, part)
    assert output.startswith("exit 0\n"), output
    assert "SUCCESS" in output


def test_promtool_unit_tests_catch_a_wrong_rule(promtool: Path, tmp_path: Path) -> None:
    """The unit tests can fail: a rule that double counts TP ranks is caught."""
    groups = rendered_groups([fleet_series.VALUES], "PrometheusRule")
    for group in groups:
        for rule in group["rules"]:
            rule["expr"] = rule["expr"].replace(', tp_rank="0", pp_rank="0"', "")
    output = run_promtool_tests(promtool, tmp_path, groups, "every-15s")  # the fleet case's
    assert not output.startswith("exit 0\n")
    assert "pod:sglang_decode_tokens:rate1m" in output


def test_the_parts_hold_every_case_once_at_its_own_interval() -> None:
    whole = rule_tests.promtool_test_file()["tests"]
    parts = rule_tests.promtool_test_files()
    assert sorted(c["name"] for p in parts.values() for c in p["tests"]) == sorted(
        c["name"] for c in whole
    )
    for part in parts.values():
        assert {c.get("interval", "1m") for c in part["tests"]} == {part["evaluation_interval"]}
