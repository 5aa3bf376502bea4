"""Kubernetes discovery talks to the API as the kubeconfig's user: its bearer token goes on
every list and watch (without it the API server answers 403 and no worker is ever found)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from tpuserve_router.engines.discovery.kubernetes import ApiServer, PodRules, PodWatcher
from tpuserve_router.engines.workers import WorkerSpec

pytestmark = pytest.mark.unit

TOKEN = "e2e-secret-token"
POD = {
    "metadata": {
        "name": "sim-r0-0",
        "uid": "u1",
        "labels": {"serving.tpuserve.dev/role": "leader"},
        "annotations": {"serving.tpuserve.dev/worker-url": "http://127.0.0.1:4000"},
    },
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def write_kubeconfig(path: Path, server: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(config))


async def test_the_kubeconfig_token_is_sent_on_list_and_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aiohttp_server: Any
) -> None:
    seen: list[tuple[str, str | None]] = []
    watched = asyncio.Event()

    async def pods(request: web.Request) -> web.StreamResponse:
        kind = "watch" if request.query.get("watch") else "list"
        seen.append((kind, request.headers.get("Authorization")))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"kind": "Status", "code": 403}, status=403)
        if kind == "list":
            return web.json_response({"items": [POD], "metadata": {"resourceVersion": "7"}})
        watched.set()
        return web.Response(body=b"")  # the watch ends at once; the watcher lists again

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods", pods)
    server: TestServer = await aiohttp_server(app)
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, f"http://127.0.0.1:{server.port}")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    api = ApiServer.load()
    assert api.request_headers() == {"Authorization": f"Bearer {TOKEN}"}
    published: list[list[WorkerSpec]] = []
    rules = PodRules(("serving.tpuserve.dev/role", "leader"))
    watcher = PodWatcher(api, "ns", {"app": "sim"}, rules, published.append)
    watcher.start()
    try:
        await asyncio.wait_for(watched.wait(), timeout=10)
    finally:
        await watcher.stop()
    assert {token for _, token in seen} == {f"Bearer {TOKEN}"}
    assert [s.url for s in published[0]] == ["http://127.0.0.1:4000"]
