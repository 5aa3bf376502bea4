"""PodMonitors, ServiceMonitors and PrometheusRules as a Prometheus configuration.

What the Prometheus Operator generates from them, for the fields the tpuserve chart and
operator use. Debian's Prometheus is built without Kubernetes service discovery, so discovery
is done here: `pod_targets` turns the apiserver's pods into target groups carrying the labels
Kubernetes discovery (`role: pod`) gives (`__meta_kubernetes_pod_*`, one target per container
port), written as one `file_sd` file per job with the pods of the job's namespaces; the jobs'
relabelings are the operator's, over those labels:

- PodMonitor endpoint -> one job `podMonitor/NS/NAME/I`: pods in the selected namespaces,
  kept when they match the selector (`matchLabels`, `matchExpressions` In, NotIn, Exists,
  DoesNotExist) and have the container port (`port` by name, `portNumber`); labels
  `namespace`, `pod`, `container`, `endpoint`, `job` = `NS/NAME`, the `podTargetLabels`;
  `interval`, `scrapeTimeout`, `path`, `scheme`, `relabelings`, `metricRelabelings`.
- ServiceMonitor endpoint -> the same over the pods each selected Service selects (the local
  cluster has no EndpointSlices: pods have loopback addresses), the Service's port resolved to
  the pods' container port; `job` = the Service's name, label `service`.
- PrometheusRule -> one rule file with its `spec.groups`.

Terminated pods (Succeeded, Failed) are dropped, as the operator drops them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

JSON = dict[str, Any]
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")
# The Prometheus Operator's relabel field names, camelCase -> prometheus.yml snake_case.
_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "targetLabel": "target_label",
    "separator": "separator",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


def sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus service discovery spells it."""
    return _UNSAFE.sub("_", name)


def relabelings(items: Iterable[Mapping[str, Any]]) -> list[JSON]:
    return [
        {
            _RELABEL_KEYS[k]: (v.lower() if k == "action" else v)
            for k, v in item.items()
            if k in _RELABEL_KEYS
        }
        for item in items
    ]


def _label(name: str) -> str:
    return f"__meta_kubernetes_pod_label_{sanitize(name)}"


def _present(name: str) -> str:
    return f"__meta_kubernetes_pod_labelpresent_{sanitize(name)}"


def selector_relabelings(selector: Mapping[str, Any]) -> list[JSON]:
    """`keep`/`drop` rules selecting pods by a label selector."""
    rules: list[JSON] = []
    for key, value in sorted((selector.get("matchLabels") or {}).items()):
        rules.append(
            {
                "action": "keep",
                "source_labels": [_label(key), _present(key)],
                "regex": f"({re.escape(str(value))});true",
            }
        )
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = "|".join(re.escape(str(v)) for v in expression.get("values") or [])
        if operator == "In":
            rule = {"action": "keep", "source_labels": [_label(key), _present(key)]}
            rules.append({**rule, "regex": f"({values});true"})
        elif operator == "NotIn":
            rule = {"action": "drop", "source_labels": [_label(key), _present(key)]}
            rules.append({**rule, "regex": f"({values});true"})
        elif operator == "Exists":
            rules.append({"action": "keep", "source_labels": [_present(key)], "regex": "true"})
        elif operator == "DoesNotExist":
            rules.append({"action": "drop", "source_labels": [_present(key)], "regex": "true"})
    return rules


def _namespaces(monitor: Mapping[str, Any]) -> list[str] | None:
    selector = (monitor.get("spec") or {}).get("namespaceSelector") or {}
    if selector.get("any"):
        return None
    return list(selector.get("matchNames") or [monitor["metadata"]["namespace"]])


def sd_file(job_name: str) -> str:
    """The file_sd file of a job: `<namespaces key>.json` so jobs over the same namespaces
    share one file."""
    return sanitize(job_name) + ".json"


def _job(
    name: str,
    sd_dir: Path,
    namespaces: list[str] | None,
    endpoint: Mapping[str, Any],
    relabel: list[JSON],
) -> JSON:
    job: JSON = {
        "job_name": name,
        "file_sd_configs": [{"files": [str(sd_dir / sd_file(name))], "refresh_interval": "5s"}],
        # Which pods this job discovers (not a Prometheus field: popped before writing).
        "_namespaces": namespaces,
        "metrics_path": endpoint.get("path") or "/metrics",
        "scheme": endpoint.get("scheme") or "http",
        "relabel_configs": [
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            *relabel,
            *relabelings(endpoint.get("relabelings") or []),
        ],
    }
    for source, target in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout")):
        if endpoint.get(source):
            job[target] = endpoint[source]
    if endpoint.get("metricRelabelings"):
        job["metric_relabel_configs"] = relabelings(endpoint["metricRelabelings"])
    if endpoint.get("honorLabels"):
        job["honor_labels"] = True
    return job


def _target_labels(job: str, port_label: str, pod_labels: Iterable[str]) -> list[JSON]:
    rules: list[JSON] = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    ]
    for name in pod_labels:
        rules.append({"source_labels": [_label(name)], "target_label": sanitize(name)})
    rules.append({"target_label": "job", "replacement": job})
    rules.append({"target_label": "endpoint", "replacement": port_label})
    return rules


def _port_rule(port: str | int) -> JSON:
    if isinstance(port, int) or str(port).isdigit():
        meta = "__meta_kubernetes_pod_container_port_number"
    else:
        meta = "__meta_kubernetes_pod_container_port_name"
    return {"action": "keep", "source_labels": [meta], "regex": re.escape(str(port))}


def pod_monitor_jobs(monitor: Mapping[str, Any], sd_dir: Path) -> list[JSON]:
    metadata, spec = monitor["metadata"], monitor.get("spec") or {}
    job = f"{metadata['namespace']}/{metadata['name']}"
    jobs = []
    for i, endpoint in enumerate(spec.get("podMetricsEndpoints") or []):
        port = endpoint.get("port") or endpoint.get("portNumber") or endpoint.get("targetPort")
        if port is None:
            continue
        relabel = [
            *selector_relabelings(spec.get("selector") or {}),
            _port_rule(port),
            *_target_labels(job, str(port), spec.get("podTargetLabels") or []),
        ]
        jobs.append(_job(f"podMonitor/{job}/{i}", sd_dir, _namespaces(monitor), endpoint, relabel))
    return jobs


def _service_port(service: Mapping[str, Any], port: str | int | None) -> str | int | None:
    """The pods' container port behind a Service port given by name or number."""
    for declared in (service.get("spec") or {}).get("ports") or []:
        if port in (declared.get("name"), declared.get("port"), str(declared.get("port"))):
            target = declared.get("targetPort", declared["port"])
            return int(target) if str(target).isdigit() else str(target)
    return None


def service_monitor_jobs(
    monitor: Mapping[str, Any], services: Iterable[Mapping[str, Any]], sd_dir: Path
) -> list[JSON]:
    metadata, spec = monitor["metadata"], monitor.get("spec") or {}
    namespaces = _namespaces(monitor)
    wanted = spec.get("selector") or {}
    jobs = []
    for service in services:
        service_meta = service["metadata"]
        if namespaces is not None and service_meta.get("namespace") not in namespaces:
            continue
        if not _matches(wanted, service_meta.get("labels") or {}):
            continue
        pod_selector = (service.get("spec") or {}).get("selector") or {}
        if not pod_selector:
            continue
        for i, endpoint in enumerate(spec.get("endpoints") or []):
            port = _service_port(service, endpoint.get("port") or endpoint.get("targetPort"))
            if port is None:
                continue
            name = str(service_meta["name"])
            relabel = [
                *selector_relabelings({"matchLabels": pod_selector}),
                _port_rule(port),
                *_target_labels(name, str(endpoint.get("port") or port), ()),
                {"target_label": "service", "replacement": name},
            ]
            job_name = (
                f"serviceMonitor/{metadata['namespace']}/{metadata['name']}/"
                f"{service_meta.get('namespace')}/{name}/{i}"
            )
            jobs.append(
                _job(job_name, sd_dir, [str(service_meta.get("namespace"))], endpoint, relabel)
            )
    return jobs


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def prometheus_config(
    pod_monitors: Iterable[Mapping[str, Any]],
    service_monitors: Iterable[Mapping[str, Any]],
    services: list[Mapping[str, Any]],
    sd_dir: Path,
    *,
    interval: str,
    rules_glob: str,
) -> JSON:
    jobs: list[JSON] = []
    for monitor in sorted(pod_monitors, key=_key):
        jobs += pod_monitor_jobs(monitor, sd_dir)
    for monitor in sorted(service_monitors, key=_key):
        jobs += service_monitor_jobs(monitor, services, sd_dir)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [rules_glob],
        "scrape_configs": jobs,
    }


def pod_targets(pods: Iterable[Mapping[str, Any]]) -> list[JSON]:
    """Kubernetes discovery's `role: pod` target groups: one per container port (or per
    container without ports), for pods that have an address."""
    groups: list[JSON] = []
    for pod in pods:
        metadata, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        common = {
            "__meta_kubernetes_namespace": str(metadata.get("namespace", "")),
            "__meta_kubernetes_pod_name": str(metadata["name"]),
            "__meta_kubernetes_pod_ip": str(ip),
            "__meta_kubernetes_pod_node_name": str(spec.get("nodeName", "")),
            "__meta_kubernetes_pod_phase": str(status.get("phase", "")),
            "__meta_kubernetes_pod_ready": "true" if ready else "false",
            "__meta_kubernetes_pod_uid": str(metadata.get("uid", "")),
        }
        for key, value in (metadata.get("labels") or {}).items():
            common[_label(key)] = str(value)
            common[_present(key)] = "true"
        for key, value in (metadata.get("annotations") or {}).items():
            common[f"__meta_kubernetes_pod_annotation_{sanitize(key)}"] = str(value)
        for container in spec.get("containers") or []:
            base = {**common, "__meta_kubernetes_pod_container_name": str(container["name"])}
            ports = container.get("ports") or []
            if not ports:
                groups.append({"targets": [str(ip)], "labels": base})
            for port in ports:
                number = int(port["containerPort"])
                labels = {
                    **base,
                    "__meta_kubernetes_pod_container_port_name": str(port.get("name", "")),
                    "__meta_kubernetes_pod_container_port_number": str(number),
                    "__meta_kubernetes_pod_container_port_protocol": str(
                        port.get("protocol", "TCP")
                    ),
                }
                groups.append({"targets": [f"{ip}:{number}"], "labels": labels})
    return groups


def rule_file(rule: Mapping[str, Any]) -> JSON:
    return {"groups": list((rule.get("spec") or {}).get("groups") or [])}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return (str(obj["metadata"].get("namespace")), str(obj["metadata"]["name"]))
