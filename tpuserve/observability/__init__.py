"""Observability as code: recording rules, alerts, Grafana dashboards and their generator.

`python -m tpuserve.observability.generate` writes every generated file (chart rules, dashboard
JSON, chart README, the tables of docs/observability.md); `--check` fails when one is stale.
"""
