"""Generated observability files are fresh, and the promtool tests cover every rule and alert."""

from __future__ import annotations

import pytest

from tests.metrics.promtool import rule_tests
from tpuserve.observability import generate, rules

pytestmark = pytest.mark.unit


def test_generated_files_are_not_stale() -> None:
    stale = generate.stale_files()
    assert not stale, f"stale: {stale}; run python -m tpuserve.observability.generate"


def test_every_recording_rule_and_alert_has_a_promtool_test() -> None:
    names = {r.record for r in rules.recording_rules()} | {a.alert for a in rules.alerts()}
    untested = names - rule_tests.tested_names(rule_tests.promtool_test_file())
    assert not untested


def test_rule_names_follow_level_metric_operation() -> None:
    for rule in rules.recording_rules():
        level, metric, operation = rule.record.split(":")
        assert level in {"pod", "model", "model_role", "tpu_generation", "fleet"}, rule.record
        assert metric.startswith(("sglang_", "tpuserve_")), rule.record
        assert operation, rule.record


def test_alerts_carry_severity_and_text() -> None:
    for alert in rules.alerts():
        assert alert.severity in {"critical", "warning", "info"}
        assert alert.summary
        assert alert.description
        assert "$value" not in alert.description  # keeps promtool expectations deterministic
