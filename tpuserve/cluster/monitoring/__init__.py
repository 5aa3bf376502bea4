"""Prometheus in the local cluster: the chart's monitors really scraped (a small Prometheus
Operator: `translate.py` turns monitors into configuration, `controller.py` runs Prometheus)."""
