"""Operator metrics are declared once with the names the dashboards use; the CLI builds the
operator's options from its flags."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tpuserve_operator import cli, render_cli
from tpuserve_operator.flags import apply_flags, field_value
from tpuserve_operator.metrics import ReplicaRow, create_operator_metrics
from tpuserve_operator.options import OperatorOptions
from tpuserve_operator.render import RenderConfig

pytestmark = pytest.mark.unit


def test_replica_series_are_labelled_as_the_recording_rules_join_them() -> None:
    registry = CollectorRegistry()
    rows = [ReplicaRow("ml", "qwen-r0-0", "qwen3-8b", "v6e", "4x4", 16)]
    metrics = create_operator_metrics(registry, lambda: rows, lambda: [True, False])
    metrics.reconciles.labels("ok").inc()
    text = generate_latest(registry).decode()
    assert (
        'tpuserve_replica_info{model_name="qwen3-8b",namespace="ml",pod="qwen-r0-0",'
        'tpu_generation="v6e",tpu_topology="4x4"} 1.0'
    ) in text
    assert (
        'tpuserve_replica_tpu_chips{namespace="ml",pod="qwen-r0-0",tpu_generation="v6e"} 16.0'
        in text
    )
    assert 'tpuserve_operator_reconciles_total{result="ok"} 1.0' in text
    assert 'tpuserve_operator_reconciles_total{result="error"} 0.0' in text
    assert 'tpuserve_operator_servers{ready="true"} 1.0' in text
    assert "tpuserve_operator_reconcile_duration_seconds_bucket" in text


def test_replica_series_disappear_with_their_replicas() -> None:
    registry = CollectorRegistry()
    rows: list[ReplicaRow] = [ReplicaRow("ml", "a-r0-0", "m", "v5e", "2x4", 8)]
    create_operator_metrics(registry, lambda: rows)
    assert 'pod="a-r0-0"' in generate_latest(registry).decode()
    rows.clear()
    assert 'pod="a-r0-0"' not in generate_latest(registry).decode()


def test_operator_flags_become_options() -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(
        [
            "--namespace",
            "a",
            "--namespace",
            "b",
            "--router-policy",
            "least_load",
            "--router-resources",
            '{"requests": {"cpu": "1"}}',
            "--workload",
            "statefulset",
            "--peering-priority",
            "7",
        ]
    )
    options = cli.options_from(args)
    assert options.namespaces == ("a", "b")
    assert not options.clusterwide
    assert options.peering_priority == 7
    assert options.reconciler.workload == "statefulset"
    assert options.reconciler.render.router_policy == "least_load"
    assert options.reconciler.render.router_resources == {"requests": {"cpu": "1"}}


def test_default_is_all_namespaces_with_a_random_peering_priority() -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    options = cli.options_from(parser.parse_args([]))
    assert options.clusterwide
    assert options.peering_priority > 0
    assert not options.standalone


@pytest.mark.parametrize("argv", [[], ["--router-policy="]], ids=["unset", "empty"])
def test_no_router_policy_leaves_it_to_the_router(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    assert cli.options_from(parser.parse_args(argv)).reconciler.render.router_policy is None


def test_bad_router_resources_name_the_flag() -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    with pytest.raises(SystemExit, match="--router-resources"):
        cli.options_from(parser.parse_args(["--router-resources", "[1]"]))


def test_unset_flags_leave_every_setting_at_its_dataclass_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI repeats no default: with no flags, the options are the dataclasses' own."""
    monkeypatch.delenv(cli.POD_NAMESPACE_ENV, raising=False)
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    options = cli.options_from(parser.parse_args([]))
    assert options == dataclasses.replace(
        OperatorOptions(), peering_priority=options.peering_priority
    )


def test_engines_admit_the_operator_from_its_own_namespace_only_when_it_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    monkeypatch.delenv(cli.POD_NAMESPACE_ENV, raising=False)
    assert cli.options_from(parser.parse_args([])).reconciler.render.operator_namespace is None
    monkeypatch.setenv(cli.POD_NAMESPACE_ENV, "tpuserve-system")
    options = cli.options_from(parser.parse_args([]))
    assert options.reconciler.render.operator_namespace == "tpuserve-system"
    skipping = cli.options_from(parser.parse_args(["--skip-cold-start-reports"]))
    assert skipping.reconciler.render.operator_namespace is None


def test_every_operator_flag_sets_the_field_it_names() -> None:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    for flag in cli.OPTIONS:
        field_value(OperatorOptions(), flag.field)  # raises AttributeError for a wrong path
    options = cli.options_from(
        parser.parse_args(["--resync-seconds", "7", "--engine-image", "engine:x"])
    )
    assert options.reconciler.resync_seconds == 7.0
    assert options.reconciler.render.engine_image == "engine:x"


def test_render_flags_default_to_the_render_config() -> None:
    parser = argparse.ArgumentParser()
    render_cli.configure(parser)
    assert apply_flags(RenderConfig(), render_cli.OPTIONS, parser.parse_args(["-f", "x"])) == (
        RenderConfig()
    )
    args = parser.parse_args(["-f", "x", "--leaderworkerset", "--router-replicas", "3"])
    config = apply_flags(RenderConfig(), render_cli.OPTIONS, args)
    assert (config.leaderworkerset, config.router_replicas) == (True, 3)
