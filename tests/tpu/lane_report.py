"""The TPU lane's result file: a pytest plugin (`-p tests.tpu.lane_report --lane-json PATH`).

It writes one JSON object: when the lane ran (UTC), on which machine and chip, the versions
of Python, torch, torch-tpu, libtpu (as the shim reports it and as the machine has it) and
JAX, and each test's outcome, duration, failure message and measurements (what a test gave
`record_property`). Nothing here opens the chip: the chip's name comes from what a test
recorded as `chip`. Standard library and pytest only, as the TPU machine has them.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import pytest

LONGREPR_CHARS = 4000


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane-json", default=None, help="Write the lane's results here (JSON).")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--lane-json")
    if path:
        config.pluginmanager.register(LaneReport(Path(path)), "tpu-lane-report")


def dist_version(name: str, exclude: str | None = None) -> str | None:
    """A distribution's version on sys.path, or on sys.path without `exclude` (the shim)."""
    paths = [p for p in sys.path if not exclude or os.path.abspath(p) != os.path.abspath(exclude)]
    for dist in importlib.metadata.distributions(path=paths):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") == name:
            return str(dist.version)
    return None


def versions() -> dict[str, str | None]:
    shim = os.environ.get("TPU_LANE_SHIM")
    return {
        "python": platform.python_version(),
        "torch": dist_version("torch"),
        "torch-tpu": dist_version("torch-tpu"),
        "libtpu (as the lane's shim reports it)": dist_version("libtpu"),
        "libtpu (the machine's)": dist_version("libtpu", exclude=shim),
        "jax": dist_version("jax"),
        "jaxlib": dist_version("jaxlib"),
        "pytest": pytest.__version__,
    }


class LaneReport:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = datetime.datetime.now(datetime.UTC)
        self.tests: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(
            report.nodeid, {"test": report.nodeid, "outcome": "passed", "duration_s": 0.0}
        )
        entry["duration_s"] = round(entry["duration_s"] + report.duration, 3)
        if report.failed:
            entry["outcome"] = "failed" if report.when == "call" else f"error ({report.when})"
            entry["message"] = str(report.longreprtext)[-LONGREPR_CHARS:]
        elif report.skipped:
            entry["outcome"] = "skipped"
            longrepr = report.longrepr
            entry["message"] = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
        if report.when == "call" or report.failed:
            properties = {k: v for k, v in report.user_properties}
            if properties:
                entry["recorded"] = properties

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        chip = next(
            (t["recorded"]["chip"] for t in self.tests.values() if "chip" in t.get("recorded", {})),
            None,
        )
        result = {
            "date": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "finished": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": {
                "platform": platform.platform(),
                "TPU_ACCELERATOR_TYPE": os.environ.get("TPU_ACCELERATOR_TYPE"),
                "TPU_TOPOLOGY": os.environ.get("TPU_TOPOLOGY"),
            },
            "chip": chip,
            "versions": versions(),
            "pytest_exit_status": int(exitstatus),
            "tests": list(self.tests.values()),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
