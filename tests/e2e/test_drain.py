"""Rollouts, scale-down, maintenance and Spot preemption under steady load lose nothing.

On the module's `living_cluster` (pods run), with the chart's operator: a TPUModelServer of
2 replicas (the engine twin; `rollout: {maxUnavailable: 0, maxSurge: 1}`; `tpu.spot: true`)
on a fake v6e 2x4 pool of 4 nodes, one slice per node, with room for a surge slice. Steady
load goes through the router with the official `openai` client, streaming and not, every
request's outcome recorded (`fleet_harness.Load`):

- a rollout (the restartedAt annotation rolls every group) and a scale-down 2 -> 1: not one
  failed request, not one broken stream (routers drop a terminating leader first, engines
  drain within the grace period set from router.maxRequestSeconds);
- `tpuserve cluster maintenance` on the node of group 0: not one failed request; the surge
  slice is Ready before group 0 drains (the order read from the server's status and the
  operator's Events, not from wall-clock durations);
- `tpuserve cluster preempt --notice 15`: the operator replaces the group at once
  (`NodeTerminating`) and it drains within the notice: not one failed request or stream;
- `tpuserve cluster preempt --no-notice` on a node with a group: no non-streaming request
  fails (those cut before their answer are retried on the other group), and a stream cut
  mid-way ends with an error event (the `openai` client raises APIError), never silently.

Each test prints its timeline (`-s`); docs/operator.md records one run.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.e2e.fleet_harness import (
    NAMESPACE,
    Load,
    get,
    install_chart,
    local_base_url,
    pods,
    wait,
)
from tests.e2e.tms_harness import condition
from tpuserve.cluster import Cluster, NodePool
from tpuserve.cluster.kube import client as kube_client
from tpuserve_operator import labels

pytestmark = pytest.mark.e2e

NAME = "drain"
POOL = "drain"
POOL_NODES = 4  # 2 groups, 1 surge slice, 1 spare
SETTLE_SECONDS = 240.0
PLAIN_CLIENTS = 3
STREAM_CLIENTS = 3
PROMPT_WORDS = 60
MAX_TOKENS = 48
MAINTENANCE_IN_SECONDS = 90
SERVER: dict[str, Any] = {
    "apiVersion": f"{labels.GROUP}/{labels.VERSION}",
    "kind": labels.KIND,
    "metadata": {"name": NAME},
    "spec": {
        "model": {"source": "hf://Qwen/Qwen3-8B", "contextLength": 8192},
        "tpu": {"generation": "v6e", "topology": "2x4", "spot": True},
        "replicas": 2,
        # 6 of a node's 8 CPUs: one engine per node, as one slice per TPU node.
        "engine": {"type": "simulated", "resources": {"requests": {"cpu": "6"}}},
        "router": {"replicas": 1, "maxRequestSeconds": 60},
        "rollout": {"maxUnavailable": 0, "maxSurge": 1},
        "template": {
            "nodeSelector": {"cloud.google.com/gke-nodepool": POOL},
            "tolerations": [
                {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
    },
}


@dataclass
class Fleet:
    cluster: Cluster
    base_url: str
    model: str

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = get(self.cluster, "tpumodelserver", NAME, "-n", NAMESPACE)[
            "status"
        ]
        return status

    def settled(self, replicas: int) -> bool:
        """Ready, rolled out, exactly `replicas` groups (surge groups gone)."""
        status = self.status()
        groups = status.get("groups") or []
        return (
            condition({"status": status}, "Progressing").get("reason") == "Complete"
            and int(status.get("readyReplicas", 0)) == replicas
            and len(groups) == replicas
            and all(g["state"] == "Ready" and g["updated"] for g in groups)
        )

    def leader_node(self, replica: int) -> str:
        selector = (
            f"app.kubernetes.io/instance={NAME},{labels.ROLE}={labels.ROLE_LEADER},"
            f"{labels.REPLICA}={replica}"
        )
        (leader,) = [
            p for p in pods(self.cluster, selector) if not p["metadata"].get("deletionTimestamp")
        ]
        return str(leader["spec"]["nodeName"])

    def events(self, since: datetime.datetime) -> list[tuple[datetime.datetime, str, str]]:
        """(time, reason, message) of the server's Events from `since` on, oldest first."""
        listing = get(
            self.cluster, "events", "-n", NAMESPACE,
            "--field-selector", f"involvedObject.name={NAME},involvedObject.kind={labels.KIND}",
        )  # fmt: skip
        out = []
        for event in listing.get("items") or []:
            stamp = (
                event.get("eventTime") or event.get("lastTimestamp") or event.get("firstTimestamp")
            )
            out.append((parse(str(stamp)), str(event.get("reason")), str(event.get("message"))))
        return sorted(e for e in out if e[0] >= since.replace(microsecond=0))

    def command(self, *args: str) -> subprocess.Popen[str]:
        """`tpuserve cluster ...` on this cluster, in the background, output captured."""
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tpuserve",
                "cluster",
                *args,
                "--run-dir",
                str(self.cluster.run_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ},
        )


def parse(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


class GroupWatch:
    """Polls the server's status in a thread: when (status `since`) each group was Ready."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.ready_since: dict[int, list[datetime.datetime]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with contextlib.closing(self.fleet.cluster.api_client()) as api:
            custom = kube_client().CustomObjectsApi(api)
            while not self.stop.wait(0.5):
                with contextlib.suppress(Exception):
                    body = custom.get_namespaced_custom_object(
                        labels.GROUP, labels.VERSION, NAMESPACE, labels.PLURAL, NAME
                    )
                    for group in (body.get("status") or {}).get("groups") or []:
                        if group["state"] == "Ready":
                            seen = self.ready_since.setdefault(group["index"], [])
                            since = parse(group["since"])
                            if since not in seen:
                                seen.append(since)

    def __enter__(self) -> GroupWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@contextlib.contextmanager
def steady_load(fleet: Fleet) -> Iterator[tuple[Load, Load]]:
    """Non-streaming and streaming clients through the router, for the block's duration."""
    plain, streams = Load(fleet.base_url, fleet.model), Load(fleet.base_url, fleet.model)
    plain.run(PLAIN_CLIENTS, PROMPT_WORDS, MAX_TOKENS)
    streams.run(STREAM_CLIENTS, PROMPT_WORDS, MAX_TOKENS, stream=True)
    try:
        wait("requests answered", lambda: plain.ok > 2 and streams.ok > 2)
        yield plain, streams
    finally:
        plain.halt()
        streams.halt()


def print_timeline(title: str, rows: list[tuple[datetime.datetime, str]]) -> None:
    rows = sorted(rows)
    t0 = rows[0][0] if rows else datetime.datetime.now(datetime.UTC)
    lines = [f"  {(t - t0).total_seconds():7.1f} s  {t:%H:%M:%S}  {what}" for t, what in rows]
    print(f"\n{title}:\n" + "\n".join(lines))


def event_rows(
    events: list[tuple[datetime.datetime, str, str]],
) -> list[tuple[datetime.datetime, str]]:
    return [(t, f"event {reason}: {message}") for t, reason, message in events]


def group_rows(groups: GroupWatch, since: datetime.datetime) -> list[tuple[datetime.datetime, str]]:
    return [
        (t, f"group {k} Ready (status since)")
        for k, times in groups.ready_since.items()
        for t in times
        if t >= since.replace(microsecond=0)
    ]


def print_outcomes(plain: Load, streams: Load) -> None:
    print(
        f"{plain.ok} requests ok, {len(plain.failed)} failed; {streams.ok} streams ok, "
        f"{len(streams.failed)} broken: {streams.failed[:3]}"
    )


def command_lines(
    process: subprocess.Popen[str], timeout_seconds: float
) -> list[tuple[datetime.datetime, str]]:
    """Wait for a `tpuserve cluster` command; its timeline lines (`HH:MM:SS.mmm what`)."""
    out, _ = process.communicate(timeout=timeout_seconds)
    assert process.returncode == 0, out
    today = datetime.datetime.now(datetime.UTC).date()
    rows = []
    for line in out.splitlines():
        stamp, _, what = line.partition(" ")
        with contextlib.suppress(ValueError):
            clock = datetime.time.fromisoformat(stamp)
            rows.append((datetime.datetime.combine(today, clock, datetime.UTC), f"command: {what}"))
    return rows


@pytest.fixture(scope="module")
def fleet(living_cluster: Cluster) -> Iterator[Fleet]:
    cluster = living_cluster
    install_chart(cluster, verb="upgrade")
    cluster.add_node_pool(NodePool.tpu(POOL, "v6e", "2x4", nodes=POOL_NODES, cpu="8"))
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(SERVER))
    base_url = local_base_url_when_ready(cluster)
    model = get(cluster, "tpumodelserver", NAME, "-n", NAMESPACE)["status"]["servedName"]
    fleet = Fleet(cluster, base_url, model)
    wait(f"{NAME} settled on 2 groups", lambda: fleet.settled(2), SETTLE_SECONDS)
    yield fleet
    cluster.kubectl("delete", "tpumodelserver", NAME, "-n", NAMESPACE, "--wait=false")
    wait(f"{NAME}'s pods gone", lambda: not pods(cluster, f"app.kubernetes.io/instance={NAME}"))
    cluster.remove_node_pool(POOL)


def local_base_url_when_ready(cluster: Cluster) -> str:
    def ready() -> bool:
        server = get(cluster, "tpumodelserver", NAME, "-n", NAMESPACE)
        return condition(server, "Ready").get("status") == "True"

    wait(f"{NAME} Ready", ready, SETTLE_SECONDS)
    return local_base_url(cluster, NAME)


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def test_a_rollout_and_a_scale_down_fail_no_request_and_break_no_stream(fleet: Fleet) -> None:
    cluster = fleet.cluster
    start = now()
    rows: list[tuple[datetime.datetime, str]] = []

    def mark(what: str) -> None:
        rows.append((now(), what))

    with GroupWatch(fleet) as groups, steady_load(fleet) as (plain, streams):
        mark("load running")
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cluster.kubectl(
            "annotate", "tpumodelserver", NAME, "-n", NAMESPACE, "--overwrite",
            f"{labels.RESTARTED_AT}={stamp}",
        )  # fmt: skip
        mark("rollout asked (restartedAt)")
        wait("the rollout started", lambda: not fleet.settled(2))
        wait("the rollout done", lambda: fleet.settled(2), SETTLE_SECONDS)
        mark("rollout done: 2 groups Ready, surge gone")
        cluster.kubectl(
            "patch", "tpumodelserver", NAME, "-n", NAMESPACE, "--type=merge",
            "-p", '{"spec": {"replicas": 1}}',
        )  # fmt: skip
        mark("scale-down asked (replicas 1)")
        wait("scaled down to 1 group", lambda: fleet.settled(1), SETTLE_SECONDS)
        leaders = f"app.kubernetes.io/instance={NAME},{labels.ROLE}={labels.ROLE_LEADER}"
        wait("the removed group's pods gone", lambda: len(pods(cluster, leaders)) == 1)
        mark("scale-down done")
        settled_ok = plain.ok + streams.ok
        wait("answers after the scale-down", lambda: plain.ok + streams.ok > settled_ok + 4)
    rows += event_rows(fleet.events(start)) + group_rows(groups, start)
    print_timeline("rollout and scale-down", rows)
    print_outcomes(plain, streams)
    assert plain.failed == [], plain.failed[:5]
    assert streams.failed == [], streams.failed[:5]
    cluster.kubectl(
        "patch", "tpumodelserver", NAME, "-n", NAMESPACE, "--type=merge",
        "-p", '{"spec": {"replicas": 2}}',
    )  # fmt: skip
    wait(f"{NAME} back on 2 groups", lambda: fleet.settled(2), SETTLE_SECONDS)


def test_maintenance_surges_a_replacement_before_the_group_drains(fleet: Fleet) -> None:
    node = fleet.leader_node(0)
    start = now()
    with GroupWatch(fleet) as groups, steady_load(fleet) as (plain, streams):
        maintenance = fleet.command(
            "maintenance", "--node", node, "--in", str(MAINTENANCE_IN_SECONDS), "--duration", "5"
        )
        rows = command_lines(maintenance, MAINTENANCE_IN_SECONDS + 120)
        wait(f"{NAME} settled on 2 groups", lambda: fleet.settled(2), SETTLE_SECONDS)
    events = fleet.events(start)
    rows += event_rows(events) + group_rows(groups, start)
    print_timeline(f"maintenance on {node}", rows)
    print_outcomes(plain, streams)
    assert plain.failed == [], plain.failed[:5]
    assert streams.failed == [], streams.failed[:5]
    (drained,) = [
        t for t, reason, message in events if reason == "GroupDraining" and node in message
    ][-1:]
    assert any(r == "NodeMaintenanceScheduled" for _, r, _ in events)
    surge_ready = groups.ready_since.get(2)
    assert surge_ready, f"the surge group was never seen Ready: {groups.ready_since}"
    assert min(surge_ready) <= drained, (surge_ready, drained)
    assert fleet.leader_node(0) != node


def preempt_under_load(
    fleet: Fleet, replica: int, *flags: str
) -> tuple[Load, Load, list[tuple[datetime.datetime, str, str]], str]:
    """Preempt the node of `replica`'s leader under load, wait until the fleet settles."""
    node = fleet.leader_node(replica)
    start = now()
    with steady_load(fleet) as (plain, streams):
        preempt = fleet.command("preempt", "--node", node, *flags, "--return-after", "5")
        rows = command_lines(preempt, 180)
        wait(f"{NAME} settled on 2 groups", lambda: fleet.settled(2), SETTLE_SECONDS)
        settled_ok = plain.ok + streams.ok
        wait("answers after the preemption", lambda: plain.ok + streams.ok > settled_ok + 4)
    events = fleet.events(start)
    print_timeline(f"preemption of {node} ({' '.join(flags)})", rows + event_rows(events))
    print_outcomes(plain, streams)
    return plain, streams, events, node


def test_spot_preemption_with_notice_drains_the_group_in_time(fleet: Fleet) -> None:
    plain, streams, events, node = preempt_under_load(fleet, 0, "--notice", "15")
    assert plain.failed == [], plain.failed[:5]
    assert streams.failed == [], streams.failed[:5]
    assert any(r == "NodeTerminating" and node in m for _, r, m in events), events


def test_spot_preemption_without_notice_loses_no_unstarted_request(fleet: Fleet) -> None:
    plain, streams, events, node = preempt_under_load(fleet, 1, "--no-notice")
    assert plain.failed == [], plain.failed[:5]
    broken = streams.failed
    assert all(reason.startswith("APIError") for reason in broken), broken
    assert any(r == "NodeLost" and node in m for _, r, m in events), events
