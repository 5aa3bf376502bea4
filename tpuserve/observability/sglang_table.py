"""The table of SGLang metrics for docs/observability.md and the chart README: each metric of
`sglang_tpu.metric_names` (what SGLang 0.5.23 and the engine twin expose), its type, labels, and
what in tpuserve reads it (recording rules and alerts, dashboards, the autoscaler)."""

from __future__ import annotations

import json
import re

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from sglang_tpu import metric_names as sg
from tpuserve.observability import catalog, rules
from tpuserve.observability.dashboards import DASHBOARDS
from tpuserve_operator.render.autoscaler import QUEUE_METRIC, TOKENS_IN_FLIGHT_METRIC

SGLANG_NAME = re.compile(r"(?<![\w:])sglang:[A-Za-z_]\w*")


def readers() -> dict[str, list[str]]:
    """SGLang metric name -> what reads it: `rules`, `dashboards`, `autoscaling`."""
    selected: dict[str, set[str]] = {"rules": set(), "dashboards": set(), "autoscaling": set()}
    exprs = [r.expr for r in rules.recording_rules()] + [a.expr for a in rules.alerts()]
    for expr in exprs:
        selected["rules"] |= catalog.selected_names(expr)
    for build in DASHBOARDS.values():  # panel queries and the model variable's label_values()
        text = json.dumps(build().build(), cls=JSONEncoder)
        selected["dashboards"] |= set(SGLANG_NAME.findall(text))
    selected["autoscaling"] = {QUEUE_METRIC, TOKENS_IN_FLIGHT_METRIC}
    return {
        spec.name: [what for what, names in selected.items() if names & set(spec.series)]
        for spec in sg.ALL_METRICS
    }


def table(read_only: bool = False) -> str:
    """Markdown rows for every twin metric, or only those tpuserve reads (`read_only`)."""
    read = readers()
    rows = [
        "| metric | type | collector | labels besides the collector's | read by |",
        "|---|---|---|---|---|",
    ]
    for spec in sg.ALL_METRICS:
        if read_only and not read[spec.name]:
            continue
        extra = ", ".join(f"`{label}`" for label in spec.extra_labels)
        rows.append(
            f"| `{spec.name}` | {spec.kind} | {spec.collector} | {extra} | "
            f"{', '.join(read[spec.name]) or '–'} |"
        )
    return "\n".join(rows) + "\n"


def collector_labels() -> str:
    """One sentence naming each collector's labels."""

    def spell(labels: tuple[str, ...]) -> str:
        return ", ".join(f"`{label}`" for label in labels)

    return (
        f"SGLang's tokenizer collector labels its series {spell(sg.TOKENIZER_LABELS)}; its "
        f"scheduler collector {spell(sg.SCHEDULER_LABELS)}."
    )
