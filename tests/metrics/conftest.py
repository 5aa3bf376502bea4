"""The metrics tests reuse the chart tests' helm helpers (tests/chart/chart_helpers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))
