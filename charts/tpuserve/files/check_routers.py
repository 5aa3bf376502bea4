"""`helm test` check: every tpuserve router answers `/health` and `/v1/models`.

Runs inside the tpuserve image (Python + the `kubernetes` client). Routers come from the
ROUTER_URLS environment variable (space-separated), or else from the router Services the
operator created (label app.kubernetes.io/component=router) in WATCH_NAMESPACES (space-separated;
empty means all namespaces). Exits 0 when every router answers, 1 otherwise, printing one line
per router. Kept to the standard library plus `kubernetes` so it runs as a plain script.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

ROUTER_SELECTOR = "app.kubernetes.io/name=tpuserve,app.kubernetes.io/component=router"
TIMEOUT_SECONDS = 10.0


def discover_router_urls(namespaces: list[str]) -> list[str]:
    from kubernetes import client, config

    config.load_incluster_config()
    core = client.CoreV1Api()
    if namespaces:
        items = []
        for ns in namespaces:
            items += core.list_namespaced_service(ns, label_selector=ROUTER_SELECTOR).items
    else:
        items = core.list_service_for_all_namespaces(label_selector=ROUTER_SELECTOR).items
    urls = []
    for svc in items:
        ports = svc.spec.ports or []
        port = next((p for p in ports if p.name == "http"), ports[0] if ports else None)
        if port is not None:
            urls.append(f"http://{svc.metadata.name}.{svc.metadata.namespace}.svc:{port.port}")
    return sorted(urls)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def check_router(base_url: str) -> str | None:
    """None when the router answers; otherwise what went wrong, in one sentence."""
    base = base_url.rstrip("/")
    try:
        status, _ = get(f"{base}/health")
        if status != 200:
            return f"GET {base}/health answered {status}, expected 200"
        status, body = get(f"{base}/v1/models")
        if status != 200:
            return f"GET {base}/v1/models answered {status}, expected 200"
        models = json.loads(body).get("data")
        if not isinstance(models, list):
            return f"GET {base}/v1/models has no `data` list"
    except (OSError, ValueError) as err:
        return f"{base} did not answer: {err}"
    return None


def main() -> int:
    urls = os.environ.get("ROUTER_URLS", "").split()
    if not urls:
        urls = discover_router_urls(os.environ.get("WATCH_NAMESPACES", "").split())
    if not urls:
        print("no tpuserve router found: apply a TPUModelServer first, or set tests.routerUrls")
        return 1
    failures = 0
    for url in urls:
        problem = check_router(url)
        print(f"{'FAIL' if problem else 'ok  '} {url}{': ' + problem if problem else ''}")
        failures += problem is not None
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
