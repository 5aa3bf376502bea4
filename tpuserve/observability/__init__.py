"""Observability as code: recording rules, alerts, Grafana dashboards and their generator.

`python -m tpuserve.observability.generate` writes every generated file (chart rules, dashboard
JSON, promtool tests, chart README); `--check` fails when one is stale.
"""
