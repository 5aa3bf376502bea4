"""The fleet model in parts: each part its own module, the routers' view by the router's own
load-view rule, and `tpuserve.fleet` / `tpuserve.plan` using only public names of the
benchmarks."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from tests.fakes import fake_worker
from tpuserve.fleet import FleetConfig, FleetSim
from tpuserve.fleet.autoscaler import Autoscaler
from tpuserve.fleet.engines import Engines
from tpuserve.fleet.index import KvIndex
from tpuserve.fleet.routers import Routers
from tpuserve.fleet.spot import Spot
from tpuserve.fleet.traffic import Traffic
from tpuserve_router.engines.load_view import announce_peer_request, seen_load, set_peer_load

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[4]


def _private_bench_names(path: Path) -> list[str]:
    """``tpuserve.bench`` names starting with ``_`` that ``path`` imports or reads off a
    ``tpuserve.bench`` module it imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    bench_modules: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("tpuserve.bench")
        ):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
                bench_modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tpuserve.bench"):
                    bench_modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bench_modules
            and node.attr.startswith("_")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("package", ["fleet", "plan"])
def test_fleet_and_plan_use_no_private_name_of_the_benchmarks(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): names
        for path in sorted((ROOT / "tpuserve" / package).rglob("*.py"))
        if (names := _private_bench_names(path))
    }
    assert offenders == {}


def test_the_check_finds_a_private_name(tmp_path: Path) -> None:
    """The scan above can fail: both ways of reaching a private name are caught."""
    module = tmp_path / "m.py"
    module.write_text(
        "from tpuserve.bench import mooncake\nfrom tpuserve.bench.traces import _x\n"
        "y = mooncake._zipf\n"
    )
    assert _private_bench_names(module) == ["tpuserve.bench.traces._x", "mooncake._zipf"]


def test_a_fleet_is_made_of_its_parts() -> None:
    sim = FleetSim(FleetConfig(replicas=4, router_replicas=2, duration_seconds=60.0))
    parts = (sim.traffic, sim.slots, sim.index, sim.routing, sim.autoscaler, sim.spot)
    kinds = (Traffic, Engines, KvIndex, Routers, Autoscaler, Spot)
    assert [type(p) for p in parts] == list(kinds)
    assert len({type(p).__module__ for p in parts}) == len(parts)  # a module each
    # the parts share one clock and one index; the routers read the engines they route to
    assert sim.traffic.clock is sim.slots.clock is sim.routing.clock is sim.spot.clock
    assert sim.routing.index is sim.slots.index is sim.index
    assert sim.routing.engines is sim.slots is sim.autoscaler.engines


def test_a_fleet_router_sees_what_a_router_worker_shows_after_the_same_poll() -> None:
    """The fleet keeps the poll's numbers and computes the view at decision time
    (`seen_load`); the router keeps a `Worker` that `set_peer_load` updates at the poll and
    its requests and peers' announcements update live. Over random polls and changes both
    give the same in-flight count."""
    rng = random.Random(7)
    worker = fake_worker("http://w")
    own_and_announced = 0  # the fleet's ``own``: its requests and its peers' announced ones
    at_poll = (0, 0)  # (engine requests, own_and_announced) at the last poll
    for _ in range(2000):
        event = rng.random()
        if event < 0.2:  # a poll: the engine holds what is known plus others' requests
            engine = max(0, own_and_announced + rng.randint(-3, 6))
            set_peer_load(worker, engine, 0, 0)
            at_poll = (engine, own_and_announced)
        elif event < 0.5:  # this router's own request starts or ends
            delta = 1 if own_and_announced == 0 or rng.random() < 0.6 else -1
            worker.in_flight += delta
            own_and_announced += delta
        elif worker.announced_in_flight or rng.random() < 0.6:  # a peer's, announced
            delta = 1 if worker.announced_in_flight == 0 or rng.random() < 0.6 else -1
            announce_peer_request(worker, delta)
            own_and_announced += delta
        assert worker.in_flight == seen_load(own_and_announced, *at_poll)
