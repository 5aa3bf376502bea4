"""The PromQL the operator renders into KEDA's triggers, evaluated by the real Prometheus
engine (`promtool test rules`): the predictive floor's query is the rule of
`tpuserve_operator.predictive_floor` (the larger of the trend and the rate now carried along
yesterday's shape), and the backlog query reads the chart's recording rule."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_tpu import metric_names as sg
from tests.chart.chart_helpers import find_tool
from tpuserve_operator.render import RenderConfig, build_children

pytestmark = pytest.mark.component

STEP = 15
# a counter at 10 requests/s for 25 hours, except 20/s over (3600 s, 3900 s]: "yesterday",
# one 300-s horizon after the evaluation time's time of day (25 h - 24 h = 3600 s)
COUNTER = "0+150x240 36300+300x19 42150+150x5739"
LABELS = (
    'namespace="ml", model_name="qwen3-8b", engine_type="unified", is_streaming="false", '
    'instance="a", job="engines"'
)


def triggers(requests_per_replica: float, **floor: Any) -> dict[str, str]:
    spec = {
        "model": {"source": "hf://Qwen/Qwen3-8B"},
        "tpu": {"generation": "v6e", "topology": "2x4"},
        "autoscaling": {
            "engine": "keda", "maxReplicas": 8, "metric": "backlogSeconds", "target": 1,
            "keda": {"predictiveFloor": {"requestsPerReplica": requests_per_replica, **floor}},
        },
    }  # fmt: skip
    children = build_children({"name": "qwen", "namespace": "ml"}, spec, RenderConfig(keda=True))
    (scaled,) = [c for c in children if c["kind"] == "ScaledObject"]
    return {t["name"]: t["metadata"]["query"] for t in scaled["spec"]["triggers"]}


def run(
    promtool: Path, folder: Path, alerts: dict[str, str], firing: list[str], counter: str = COUNTER
) -> str:
    rules = {"groups": [{"name": "keda", "rules": [
        {"alert": name, "expr": expr} for name, expr in alerts.items()
    ]}]}  # fmt: skip
    (folder / "rules.yaml").write_text(yaml.safe_dump(rules))
    test: dict[str, Any] = {
        "rule_files": ["rules.yaml"],
        # the alerts have no `for`: only the evaluation at 25 h matters, so the rules are
        # evaluated hourly (every 15 s, promtool evaluated each range query 6,000 times, and
        # the file took minutes on a busy machine); the series and the queries' own
        # subquery steps keep their 15-s resolution
        "evaluation_interval": "1h",
        "tests": [{
            "interval": f"{STEP}s",
            "input_series": [
                {"series": f"{sg.NUM_REQUESTS.name}{{{LABELS}}}", "values": counter}
            ],
            "alert_rule_test": [
                {"eval_time": "25h", "alertname": name,
                 "exp_alerts": [{"exp_labels": {}}] if name in firing else []}
                for name in alerts
            ],
        }],
    }  # fmt: skip
    (folder / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [str(promtool), "test", "rules", "test.yaml"],
        cwd=folder, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


def test_the_floor_query_follows_yesterdays_shape_above_a_flat_trend(tmp_path: Path) -> None:
    floor = triggers(5)["predictive-floor"]
    alerts = {
        # 10 req/s now, flat; yesterday the rate doubled one horizon later: forecast 20
        "ForecastIsTwenty": f"({floor}) > 19.9 < 20.1",
        "ForecastIsTheFlatTrend": f"({floor}) > 9.9 < 10.1",
    }
    output = run(find_tool("promtool"), tmp_path, alerts, firing=["ForecastIsTwenty"])
    assert output.startswith("exit 0\n"), output


# 10 requests/s for 25 hours except 40/s over the 5 minutes from 24:30 (steps 5881-5900): a
# burst half an hour before the evaluation; yesterday flat, so the shape's ratio is 1
BURST_HALF_AN_HOUR_AGO = "0+150x5880 882600+600x19 894150+150x99"


def test_the_floor_holds_the_last_hours_peak_only_when_asked_for(tmp_path: Path) -> None:
    held = triggers(5, peakWindowSeconds=3600)["predictive-floor"]
    plain = triggers(5)["predictive-floor"]
    short = triggers(5, peakWindowSeconds=900)["predictive-floor"]
    alerts = {
        "HeldIsTheBurst": f"({held}) > 39.9 < 40.1",
        "PlainIsTheFlatRate": f"({plain}) > 9.9 < 10.1",
        "ShortWindowMissesIt": f"({short}) > 9.9 < 10.1",  # 15 minutes back: before the burst
        "HeldIsFlat": f"({held}) > 9.9 < 10.1",
    }
    output = run(
        find_tool("promtool"), tmp_path, alerts,
        firing=["HeldIsTheBurst", "PlainIsTheFlatRate", "ShortWindowMissesIt"],
        counter=BURST_HALF_AN_HOUR_AGO,
    )  # fmt: skip
    assert output.startswith("exit 0\n"), output


# 10 requests/s for 25 hours except 20/s over the last 60 s before the evaluation (steps
# 5997-6000): a one-minute burst at 2x, the planner's day's; yesterday flat
BURST_IN_THE_LAST_MINUTE = "0+150x5996 899550+300x3"
# a ramp: 10 requests/s for 24 h 50 min, then +1 request/s every 15 s (steps 5961-6000)
RAMP_IN_THE_LAST_TEN_MINUTES = "0+150x5960 " + " ".join(
    str(894000 + sum(150 + 15 * k for k in range(1, j + 1))) for j in range(1, 41)
)


def test_the_floor_reads_a_one_minute_burst_as_no_ramp_but_follows_a_ramp(
    tmp_path: Path,
) -> None:
    """The trend is the line through the medians of the window's halves
    (`predictive_floor.trend_forecast`): a 60-s burst at the end of the window moves neither
    median (least squares, `predict_linear`, read it as a ramp), a sustained ramp moves both."""
    floor = triggers(5, horizonSeconds=300, windowSeconds=600)["predictive-floor"]
    alerts = {"FlatAtTen": f"({floor}) > 9.9 < 10.1"}
    output = run(
        find_tool("promtool"), tmp_path, alerts, firing=["FlatAtTen"],
        counter=BURST_IN_THE_LAST_MINUTE,
    )  # fmt: skip
    assert output.startswith("exit 0\n"), output
    # the ramp: +1/15 req/s per second from 24:50, so 10 + 40 = 50 at 25:00 (the one-minute
    # rate lags 30 s: ~48); 300 s later the line says about 68-70
    alerts = {"RampAhead": f"({floor}) > 60 < 75", "FlatAtTen": f"({floor}) > 9.9 < 10.1"}
    output = run(
        find_tool("promtool"), tmp_path, alerts, firing=["RampAhead"],
        counter=RAMP_IN_THE_LAST_TEN_MINUTES,
    )  # fmt: skip
    assert output.startswith("exit 0\n"), output
