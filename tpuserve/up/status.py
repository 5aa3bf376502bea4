"""What `tpuserve up` shows: a live rich table on stderr, and with ``--json`` JSON lines on stdout.

Each JSON line is one object with an ``event`` key, written and flushed as it happens:

- ``ready``: the fleet serves. ``base_url`` (the OpenAI base URL, ending in ``/v1``),
  ``router``, ``model``, ``workers`` (engine URLs), ``metrics``, ``prometheus`` (URL or null).
- ``load`` (with ``--load``, every `LOAD_INTERVAL_SECONDS` and once more when the load ends):
  ``load``, ``policy`` and the fields of `LoadSnapshot` (rates over the last 10 s, TTFT in
  seconds or null, counts since the start, ``prefix_hit_rate`` as a fraction).
- ``stopped``: everything is stopped. ``exit_code``, ``exited`` (children that died).
- ``error``: `tpuserve up` gave up (``message``); nothing else follows.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import IO, Any

from tpuserve.up.load_driver import WINDOW_SECONDS, LoadSnapshot

LOAD_INTERVAL_SECONDS = 1.0


def render(snapshot: LoadSnapshot, load: str, policy: str, base_url: str) -> Any:
    """The live table (a rich renderable)."""
    from rich.table import Table

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    s = snapshot
    table = Table(title=f"tpuserve up: load {load}, policy {policy}, {base_url}/v1")
    for column in ("requests/s", "output tokens/s", "prefix hit rate", "TTFT p50",
                   "TTFT p99", "in flight", "done", "failed"):  # fmt: skip
        table.add_column(column, justify="right")
    table.add_row(f"{s.requests_per_second:.1f}", f"{s.output_tokens_per_second:.0f}",
                  f"{s.prefix_hit_rate:.1%}", ms(s.ttft_p50_seconds), ms(s.ttft_p99_seconds),
                  str(s.in_flight), str(s.done), str(s.failed))  # fmt: skip
    if s.last_error:
        table.caption = f"last error: {s.last_error}"
    table.caption = (table.caption or "") + f"  (rates and TTFT over the last {WINDOW_SECONDS:g} s)"
    return table


class StatusLines:
    """``--json``: one JSON object per line on `stream`; does nothing when not enabled."""

    def __init__(self, enabled: bool, stream: IO[str] | None = None) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout

    def emit(self, event: str, **fields: Any) -> None:
        if self.enabled:
            self.stream.write(json.dumps({"event": event, **fields}) + "\n")
            self.stream.flush()

    def ready(self, router: str, model: str, workers: list[str], prometheus: str | None) -> None:
        self.emit(
            "ready",
            base_url=f"{router}/v1",
            router=router,
            model=model,
            workers=workers,
            metrics=f"{router}/metrics",
            prometheus=prometheus,
        )

    def load(self, snapshot: LoadSnapshot, load: str, policy: str) -> None:
        self.emit("load", load=load, policy=policy, **dataclasses.asdict(snapshot))

    def stopped(self, exit_code: int, exited: list[str]) -> None:
        self.emit("stopped", exit_code=exit_code, exited=exited)

    def error(self, message: str) -> None:
        self.emit("error", message=message)
