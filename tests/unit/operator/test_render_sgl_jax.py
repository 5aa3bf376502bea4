"""The rendered pods of a multi-host v5e 4x4 TPUModelServer with engine.type sglang-jax.

`tpuserve render` of charts/tpuserve/examples/v5e-4x4-sglang-jax.yaml (a LeaderWorkerSet of
one leader and three workers), then the launcher's own plan for the leader's and a worker's
environment as the kubelet would fill it in (the LeaderWorkerSet's worker-index label for a
worker's host index): each host starts `python -m sgl_jax.launch_server` with tensor
parallelism 16 over the slice and SGLang-JAX's distributed initialisation towards the
leader, with libtpu's and JAX's environment.

docs/sglang-jax.md shows the leader's pod, the worker's difference and each host's command
between the `sgl-jax-rendered-pod` markers, generated here (`rendered_pod_section`); after a
change to the renderer or the launcher, regenerate and review:

    TPUSERVE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/operator/test_render_sgl_jax.py
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_tpu import launch
from sglang_tpu.contract.launch_contract import LaunchContract
from tpuserve.cli import main

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "tpuserve"
EXAMPLE = CHART / "examples" / "v5e-4x4-sglang-jax.yaml"
DOC = REPO / "docs" / "sglang-jax.md"
DOC_MARK = "sgl-jax-rendered-pod"
UPDATE = os.environ.get("TPUSERVE_UPDATE_GOLDEN") == "1"
PRINT_LEADER = (
    "tpuserve render -f charts/tpuserve/examples/v5e-4x4-sglang-jax.yaml --leaderworkerset \\\n"
    '  | python3 -c \'import sys, yaml; [print(yaml.safe_dump(d["spec"]["leaderWorkerTemplate"]'
    '["leaderTemplate"], sort_keys=False)) for d in yaml.safe_load_all(sys.stdin) '
    'if d and d["kind"] == "LeaderWorkerSet"]\''
)
WORKER_INDEX = "metadata.labels['leaderworkerset.sigs.k8s.io/worker-index']"


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["render", "-f", str(EXAMPLE), "--leaderworkerset"]) == 0
    return [d for d in yaml.safe_load_all(out.getvalue()) if d]


@pytest.fixture(scope="module")
def lws(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [d for d in rendered if d["kind"] == "LeaderWorkerSet"]
    return found


def engine(template: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = template["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "engine"]
    return container


def pod_env(template: dict[str, Any], worker_index: int) -> dict[str, str]:
    """The container's environment as the kubelet fills it in (fieldRefs resolved; the
    LeaderWorkerSet sets the worker-index label; secrets left out)."""
    env = {}
    for entry in engine(template)["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif entry["valueFrom"].get("fieldRef", {}).get("fieldPath") == WORKER_INDEX:
            env[entry["name"]] = str(worker_index)
    return env


def planned(template: dict[str, Any], worker_index: int) -> launch.LaunchPlan:
    return launch.plan(LaunchContract.from_env(pod_env(template, worker_index)))


def value(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_group_is_four_hosts_of_four_chips_on_v5e_nodes(lws: dict[str, Any]) -> None:
    spec = lws["spec"]["leaderWorkerTemplate"]
    assert spec["size"] == 4
    for role in ("leaderTemplate", "workerTemplate"):
        template = spec[role]
        container = engine(template)
        assert container["image"].startswith("ghcr.io/tpuserve/tpuserve-sglang-jax:")
        assert container["resources"]["limits"]["google.com/tpu"] == "4"
        assert template["spec"]["nodeSelector"] == {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
            "cloud.google.com/gke-tpu-topology": "4x4",
        }
    leader = engine(spec["leaderTemplate"])
    assert leader["startupProbe"]["httpGet"]["path"] == "/health"  # SGLang-JAX answers it
    # TorchTPU's handshake port is SGLang's, not SGLang-JAX's
    assert "tpu-handshake" not in {p["name"] for p in leader["ports"]}


def test_the_leader_runs_sgl_jax_as_rank_0_of_4_with_tp_16(lws: dict[str, Any]) -> None:
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    plan = planned(leader, 0)
    command, env = plan.command, plan.env
    assert command[:3] == ["python3", "-m", "sgl_jax.launch_server"]
    assert value(command, "--tp-size") == "16"
    assert value(command, "--nnodes") == "4"
    assert value(command, "--node-rank") == "0"
    hosts = env["TPU_WORKER_HOSTNAMES"].split(",")
    assert len(hosts) == 4
    assert hosts[0].startswith("qwen3-8b-jax-r0-0.qwen3-8b-jax-r0.")
    assert value(command, "--dist-init-addr") == f"{hosts[0]}:20000"
    assert value(command, "--device") == "tpu"
    assert command[-6:] == ["--mem-fraction-static", "0.8", "--chunked-prefill-size", "2048",
                            "--max-running-requests", "64"]  # fmt: skip
    assert (env["JAX_PLATFORMS"], env["TPU_WORKER_ID"]) == ("tpu", "0")
    assert env["TPU_ACCELERATOR_TYPE"] == "v5litepod-16"


def test_a_worker_joins_the_leader_with_its_own_rank(lws: dict[str, Any]) -> None:
    template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    leader = planned(lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"], 0)
    plan = planned(template, 2)
    command = plan.command
    assert value(command, "--node-rank") == "2"
    assert plan.env["TPU_WORKER_ID"] == "2"
    assert value(command, "--dist-init-addr") == value(leader.command, "--dist-init-addr")
    assert plan.env["TPU_WORKER_HOSTNAMES"] == leader.env["TPU_WORKER_HOSTNAMES"]
    # a worker's rank is the LeaderWorkerSet's worker index, read from its label
    from_lws = {"fieldRef": {"fieldPath": WORKER_INDEX}}
    env = {e["name"]: e.get("valueFrom") for e in engine(template)["env"]}
    assert env["TPUSERVE_HOST_INDEX"] == env["TPU_WORKER_ID"] == from_lws
    assert "ports" not in engine(template)  # only the leader serves


def test_the_router_is_told_its_workers_run_sgl_jax(rendered: list[dict[str, Any]]) -> None:
    (router,) = [
        d for d in rendered if d["kind"] == "Deployment" and "router" in d["metadata"]["name"]
    ]
    (container,) = router["spec"]["template"]["spec"]["containers"]
    import argparse  # the router's own parser reads what the operator renders

    from tpuserve_router.cli import build_config, configure
    from tpuserve_router.validation import validate

    args = [
        a for a in container["args"] if a.startswith(("--engine-type", "--kv-events", "--no-kv"))
    ]
    parser = argparse.ArgumentParser()
    configure(parser)
    config = validate(build_config(parser.parse_args(args), environ={}))
    assert config.engine_type == "sglang-jax"
    assert "--no-kv-events" in args  # the example's router.kvEvents: false


def rendered_pod_section(lws: dict[str, Any]) -> str:
    """docs/sglang-jax.md's block: the leader's pod as rendered, the worker's difference, and
    what `tpuserve engine launch` runs on host 0 and host 1 (its plan, `--dry-run`)."""
    spec = lws["spec"]["leaderWorkerTemplate"]
    leader = yaml.safe_dump(spec["leaderTemplate"], sort_keys=False)
    worker = yaml.safe_dump(spec["workerTemplate"], sort_keys=False)
    diff = difflib.unified_diff(
        leader.splitlines(), worker.splitlines(), "leaderTemplate", "workerTemplate", n=1,
        lineterm="",
    )  # fmt: skip
    hosts = []
    for rank in (0, 1):
        template = spec["leaderTemplate" if rank == 0 else "workerTemplate"]
        plan = planned(template, rank)
        env = " \\\n  ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
        hosts.append(f"# host {rank}\n{env} \\\n  {shlex.join(plan.command)}")
    name = lws["metadata"]["name"]
    return "\n".join(
        [
            f"LeaderWorkerSet `{name}`, size {spec['size']}: the leader's pod (host 0), printed by",
            "",
            "```sh",
            PRINT_LEADER,
            "```",
            "",
            "<details><summary>the leader's pod template</summary>",
            "",
            "```yaml",
            leader.rstrip("\n"),
            "```",
            "",
            "</details>",
            "",
            "The workers' pods (hosts 1 to 3) differ from it in these lines:",
            "",
            "```diff",
            *diff,
            "```",
            "",
            "What `tpuserve engine launch` runs on host 0 and host 1 (its plan: `--dry-run` prints",
            "it as JSON from the pod's environment; weights fetched to the cache first):",
            "",
            "```sh",
            "\n\n".join(hosts),
            "```",
        ]
    )


def test_the_docs_show_the_rendered_pod(lws: dict[str, Any]) -> None:
    text = DOC.read_text()
    pattern = rf"(<!-- {DOC_MARK}: generated.*?-->\n)(.*?)(\n?<!-- /{DOC_MARK} -->)"
    match = re.search(pattern, text, re.DOTALL)
    assert match, f"docs/sglang-jax.md lacks the {DOC_MARK} markers"
    expected = rendered_pod_section(lws)
    if UPDATE and match.group(2) != expected:
        DOC.write_text(text[: match.start(2)] + expected + "\n" + text[match.start(3) :])
        match = re.search(pattern, DOC.read_text(), re.DOTALL)
        assert match
    assert match.group(2) == expected, "stale rendered pod; see this module's docstring"
