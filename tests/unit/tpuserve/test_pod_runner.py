"""The pod runner's pure parts: how a container becomes a process (argv, environment, paths,
addresses), which images it knows, the loopback addresses, pod phases, and the local
addresses `tpuserve cluster services` prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fakes import pod_manifest
from tpuserve.cluster.cli_services import local_url, rows
from tpuserve.cluster.pods import images
from tpuserve.cluster.pods.addresses import Network, PodAddresses, local_service_address
from tpuserve.cluster.pods.container import backoff_seconds
from tpuserve.cluster.pods.container_spec import (
    ContainerConfigError,
    PodContext,
    expand,
    localize,
    pod_link,
    process_spec,
    short_path,
)
from tpuserve.cluster.pods.services import local_address, selects
from tpuserve.cluster.pods.status import ContainerState, phase
from tpuserve_operator.render.context import (
    DEFAULT_ENGINE_IMAGE,
    DEFAULT_IMAGE,
    DEFAULT_SGLANG_JAX_IMAGE,
)

pytestmark = pytest.mark.unit

POD_IP = "127.244.0.9"


def context(tmp_path: Path, pod: dict[str, Any], **volumes: Path) -> PodContext:
    return PodContext(
        pod=pod,
        pod_ip=POD_IP,
        host_ip="10.255.0.1",
        pod_dir=tmp_path / "pod",
        volumes=volumes,
        kubeconfig=tmp_path / "kubeconfig",
        base_env={"PYTHONPATH": "/src"},
    )


def test_expansion_follows_kubernetes() -> None:
    env = {"A": "1", "B": "x"}
    assert expand("$(A)-$(B)-$(MISSING)", env) == "1-x-$(MISSING)"
    assert expand("$$(A) costs $$5", env) == "$(A) costs $5"


def test_wildcards_become_the_pod_address_and_mount_paths_its_directories(tmp_path: Path) -> None:
    mounts = [("/var/cache/tpuserve/weights", tmp_path / "w"), ("/tmp", tmp_path / "t")]
    assert localize("0.0.0.0", POD_IP, mounts) == POD_IP
    assert localize("--host=0.0.0.0", POD_IP, mounts) == f"--host={POD_IP}"
    assert localize("tcp://0.0.0.0:5557", POD_IP, mounts) == f"tcp://{POD_IP}:5557"
    assert localize("::", POD_IP, mounts) == POD_IP
    assert localize("10.0.0.0", POD_IP, mounts) == "10.0.0.0"
    assert localize("/tmp", POD_IP, mounts) == str(tmp_path / "t")
    assert localize("--dir=/tmp/x/y", POD_IP, mounts) == f"--dir={tmp_path / 't' / 'x' / 'y'}"
    assert localize("/tmpfoo", POD_IP, mounts) == "/tmpfoo"
    assert localize("/var/cache/tpuserve/weights/m", POD_IP, mounts) == str(tmp_path / "w" / "m")
    assert localize("http://host/tmp", POD_IP, mounts) == "http://host/tmp"


def test_a_container_becomes_a_process(tmp_path: Path) -> None:
    container = {
        "name": "engine",
        "image": "ghcr.io/tpuserve/tpuserve:1.2.3",
        "command": ["tpuserve", "engine", "launch"],
        "args": ["--port=$(PORT)", "--cache=/cache"],
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [
            {"name": "PORT", "value": "30000"},
            {"name": "BIND", "value": "0.0.0.0"},
            {"name": "URL", "value": "http://$(BIND):$(PORT)"},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
        "resources": {"limits": {"cpu": "2"}},
        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
    }
    pod = pod_manifest("p", [container])
    objects = {("ConfigMap", "ns", "cfg"): {"MODE": "fast"}, ("Secret", "ns", "s"): {"t": "tok"}}
    spec = process_spec(
        context(tmp_path, pod, cache=tmp_path / "cache"),
        container,
        images.local_image("ghcr.io/tpuserve/tpuserve:1.2.3"),
        lambda kind, ns, name: objects.get((kind, ns, name)),
    )
    assert Path(spec.argv[0]).name == "tpuserve"
    assert spec.argv[1:] == ["engine", "launch", "--port=30000", f"--cache={tmp_path / 'cache'}"]
    env = spec.env
    assert env["BIND"] == POD_IP
    assert env["URL"] == f"http://{POD_IP}:30000"
    assert (env["IP"], env["ROLE"], env["TOKEN"], env["CPU"]) == (POD_IP, "p", "tok", "2")
    assert env["CFG_MODE"] == "fast"
    assert env["KUBECONFIG"] == str(tmp_path / "kubeconfig")  # the runner's paths stay as they are
    assert env["PYTHONPATH"] == "/src"
    assert spec.cwd == tmp_path / "pod"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}, 'configmap "nope"'),
        ({"valueFrom": {"secretKeyRef": {"name": "s", "key": "other"}}}, "couldn't find key"),
    ],
)
def test_a_missing_reference_is_a_config_error(
    tmp_path: Path, env: dict[str, Any], message: str
) -> None:
    container = {"name": "c", "image": DEFAULT_IMAGE, "env": [{"name": "X", **env}]}
    with pytest.raises(ContainerConfigError, match=message):
        process_spec(
            context(tmp_path, pod_manifest("p", [container])),
            container,
            images.local_image(DEFAULT_IMAGE),
            lambda kind, ns, name: {"t": "1"} if kind == "Secret" else None,
        )


def test_an_optional_missing_reference_is_left_out(tmp_path: Path) -> None:
    ref = {"name": "nope", "key": "k", "optional": True}
    container = {
        "name": "c",
        "image": DEFAULT_IMAGE,
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": ref}}],
    }
    spec = process_spec(
        context(tmp_path, pod_manifest("p", [container])),
        container,
        images.local_image(DEFAULT_IMAGE),
        lambda *_: None,
    )
    assert "X" not in spec.env


def test_images_are_known_by_repository_and_run_like_docker() -> None:
    plain = images.local_image(DEFAULT_IMAGE)
    assert plain.argv(None, None) == ["tpuserve", "--help"]
    assert plain.argv(None, ["operator"]) == ["tpuserve", "operator"]
    assert plain.argv(["python"], ["-V"]) == ["python", "-V"]
    engine = images.local_image(DEFAULT_ENGINE_IMAGE.split(":")[0] + "@sha256:abc")
    assert engine.argv(None, None) == ["tpuserve", "engine", "launch"]
    assert images.repository("localhost:5000/x/y:tag") == "localhost:5000/x/y"
    with pytest.raises(images.UnknownImage, match="has no local command"):
        images.local_image("nginx:1.27")


def test_the_sglang_jax_image_runs_the_launcher_on_cpu_with_the_opt_in_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "sglang-jax" / "venv-x"
    python = venv / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("TPUSERVE_SGLANG_JAX_PYTHON", str(python))
    monkeypatch.setenv("TPUSERVE_SGLANG_JAX_MODEL", str(model))
    image = images.local_image(DEFAULT_SGLANG_JAX_IMAGE)
    container = {
        "name": "engine",
        "image": DEFAULT_SGLANG_JAX_IMAGE,
        "command": ["tpuserve", "engine", "launch"],
        "env": [
            {"name": "TPUSERVE_DEVICE", "value": "tpu"},
            {"name": "TPUSERVE_MODEL", "value": "pvc://weights/tiny"},
            {"name": "TPUSERVE_SPECULATIVE_DRAFT_MODEL", "value": "hf://org/draft"},
        ],
        "volumeMounts": [{"name": "model-0", "mountPath": "/mnt/tpuserve/pvc/weights"}],
    }
    claim = tmp_path / "claims" / "ns" / "weights"
    spec = process_spec(
        context(tmp_path, pod_manifest("p", [container]), **{"model-0": claim}),
        container,
        image,
        lambda *_: None,
    )
    assert spec.argv[1:] == ["engine", "launch"]
    # the pod asks for the TPU; the machine has none: the build's CPU device stands in for it
    assert spec.env["TPUSERVE_DEVICE"] == "cpu"
    assert spec.env["TPUSERVE_SGLANG_PYTHON"] == str(python)
    # the launcher reads a claim in place at its mountPath: here, the claim's directory
    assert spec.env["TPUSERVE_MODEL"] == str(claim / "tiny")
    assert spec.env["TPUSERVE_SPECULATIVE_DRAFT_MODEL"] == "hf://org/draft"
    assert spec.env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "sglang-jax" / "jax-cache")


def test_without_the_build_the_sglang_jax_image_is_unknown_and_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TPUSERVE_CACHE", str(tmp_path))
    monkeypatch.delenv("TPUSERVE_SGLANG_JAX_PYTHON", raising=False)
    monkeypatch.delenv("TPUSERVE_SGLANG_JAX_MODEL", raising=False)
    with pytest.raises(images.UnknownImage, match=r"scripts/build-sglang-jax\.sh") as raised:
        images.local_image(DEFAULT_SGLANG_JAX_IMAGE)
    assert str(tmp_path / "sglang-jax") in str(raised.value)


def test_a_tmpdir_too_long_for_unix_sockets_is_reached_through_a_short_link(
    tmp_path: Path,
) -> None:
    pod_dir = tmp_path / ("deep-" * 12) / "pod"
    tmp = pod_dir / "volumes" / "tmp"
    tmp.mkdir(parents=True)
    try:
        short = short_path(tmp, pod_dir)
        assert short == pod_link(pod_dir) / "volumes" / "tmp"
        assert len(str(short / "tmpk2_lnfd2")) < 107  # room for a socket's name
        assert short.resolve() == tmp.resolve()
        assert short_path(Path("/tmp/p/tmp"), Path("/tmp/p")) == Path("/tmp/p/tmp")  # short
    finally:
        pod_link(pod_dir).unlink(missing_ok=True)


def test_pod_addresses_are_loopback_unique_and_reused_last() -> None:
    pool = PodAddresses()
    first, second = pool.allocate(), pool.allocate()
    assert first.startswith("127.244.")
    assert first != second
    pool.release(first)
    assert pool.allocate() not in (first, second)
    assert local_service_address("10.96.63.36") == "127.96.63.36"
    assert local_service_address("None") is None
    assert local_service_address("10.104.0.1") is None  # no network's Service range


def test_clusters_on_other_networks_share_no_address() -> None:
    second = Network(1)
    assert second.service_cluster_ip_range == "10.97.0.0/16"
    assert PodAddresses(second.pods).allocate().startswith("127.245.")
    assert not second.pods.overlaps(Network().pods)
    assert local_service_address("10.97.0.1") == "127.97.0.1"
    with pytest.raises(ValueError, match="cluster network: 8 is not allowed; allowed: 0 to 7"):
        Network(8)


def test_back_off_doubles_to_five_minutes() -> None:
    assert [backoff_seconds(n, 10) for n in (1, 2, 3, 6, 20)] == [10, 20, 40, 300, 300]


def test_phases_follow_the_kubelet() -> None:
    def state(**kwargs: Any) -> ContainerState:
        made = ContainerState("c", "i")
        for key, value in kwargs.items():
            setattr(made, key, value)
        return made

    done = {"terminated": {"exitCode": 0}}
    failed = {"terminated": {"exitCode": 1}}
    assert phase([state()], []) == "Pending"
    assert phase([state(state={"running": {}})], []) == "Running"
    assert phase([state(state=failed, restart_count=1)], []) == "Running"  # back-off
    assert phase([state(state=done, will_restart=False)], []) == "Succeeded"
    assert phase([state(state=failed, will_restart=False)], []) == "Failed"
    assert phase([state(state={"running": {}})], [state()]) == "Pending"  # init not done
    assert phase([state()], [state(state=failed, will_restart=False)]) == "Failed"


def test_services_answer_locally_when_they_have_a_cluster_ip_and_a_selector() -> None:
    def service(ip: str, selector: dict[str, str] | None) -> dict[str, Any]:
        return {
            "metadata": {"name": "qwen", "namespace": "ml", "uid": "u"},
            "spec": {
                "clusterIP": ip,
                "selector": selector,
                "ports": [{"name": "http", "port": 8000}],
            },
        }

    router = service("10.96.1.2", {"app": "router"})
    assert local_address(router) == "127.96.1.2"
    assert local_address(service("None", {"app": "x"})) is None
    assert local_address(service("10.96.0.1", None)) is None  # default/kubernetes
    assert selects({"app": "router"}, {"app": "router", "x": "y"})
    assert not selects({}, {"app": "router"})
    assert local_url("http://qwen.ml.svc:8000", [router]) == "http://127.96.1.2:8000"
    server = {
        "metadata": {"name": "qwen", "namespace": "ml"},
        "status": {"endpoint": "http://qwen.ml.svc:8000"},
    }
    assert rows([router], [server])[0] == (
        "tpumodelserver ml/qwen",
        "http://qwen.ml.svc:8000",
        "http://127.96.1.2:8000",
    )
