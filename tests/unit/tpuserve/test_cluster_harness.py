"""The control-plane harness's pure parts: PKI, LWS webhook rewrite, kwok config, toolchain
discovery, ports and the `cluster down` command with nothing to stop."""

from __future__ import annotations

import argparse
import base64
import os
import ssl
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tpuserve.cluster import cli_down, kwok, lws
from tpuserve.cluster.pki import ADMIN_GROUP, create_pki, issue_serving_cert, load_pki
from tpuserve.cluster.ports import free_ports
from tpuserve.cluster.process import process_start_time
from tpuserve.cluster.toolchain import (
    Toolchain,
    ToolchainMissing,
    _escape_module_path,
    go_module_dir,
)

pytestmark = pytest.mark.unit

LWS_MANIFESTS = """\
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mleaderworkerset.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-lws}}
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- name: vpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate--v1-pod}}
"""


def test_pki_chain_verifies_for_loopback(tmp_path: Path) -> None:
    pki = create_pki(tmp_path)
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(pki.apiserver_cert, pki.apiserver_key)  # key matches the cert
    cert = x509.load_pem_x509_certificate(pki.apiserver_cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    assert "kubernetes.default.svc" in san.get_values_for_type(x509.DNSName)
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert oct(pki.ca_key.stat().st_mode & 0o777) == "0o600"
    token, _user, _uid, groups = pki.token_file.read_text().strip().split(",", 3)
    assert token == pki.admin_token
    assert len(token) >= 32
    assert groups == f'"{ADMIN_GROUP}"'
    assert load_pki(tmp_path).admin_token == pki.admin_token


def test_serving_cert_for_webhooks_is_signed_by_the_ca(tmp_path: Path) -> None:
    pki = create_pki(tmp_path)
    issue_serving_cert(pki.ca_cert, pki.ca_key, tmp_path / "w.crt", tmp_path / "w.key", "w")
    cert = x509.load_pem_x509_certificate((tmp_path / "w.crt").read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()))


def test_lws_webhooks_call_loopback_with_our_ca_and_only_see_lws_pods() -> None:
    configurations = lws.webhook_configurations(
        LWS_MANIFESTS, webhook_port=9555, ca_bundle_pem=b"PEM"
    )
    assert [c["metadata"]["name"] for c in configurations] == [
        "lws-mutating-webhook-configuration",
        "lws-validating-webhook-configuration",
    ]
    hooks = {h["name"]: h for c in configurations for h in c["webhooks"]}
    assert hooks["mpod.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:9555/mutate--v1-pod",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    for name in ("mpod.kb.io", "vpod.kb.io"):
        assert hooks[name]["objectSelector"] == {
            "matchExpressions": [{"key": lws.LWS_NAME_LABEL, "operator": "Exists"}]
        }
    assert "objectSelector" not in hooks["mleaderworkerset.kb.io"]


def test_lws_config_binds_loopback_and_disables_cert_rotation(tmp_path: Path) -> None:
    config = lws.lws_config(webhook_port=1, health_port=2, cert_dir=tmp_path)
    assert config["webhook"]["host"] == "127.0.0.1"
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:2"
    assert config["internalCertManagement"] == {"enable": False}
    assert config["metrics"]["bindAddress"] == "0"


def test_kwok_config_is_the_fast_stages_and_options_are_flags(tmp_path: Path) -> None:
    for i, name in enumerate(kwok.NODE_STAGE_FILES + kwok.POD_STAGE_FILES):
        path = tmp_path / "kustomize" / "stage" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f"apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata: {{name: s{i}}}\n"
        )
    docs = list(yaml.safe_load_all(kwok.kwok_config(tmp_path)))
    assert [d["metadata"]["name"] for d in docs] == [f"s{i}" for i in range(5)]
    assert f"--cidr={kwok.POD_CIDR}" in kwok.kwok_flags()


def test_kwok_leaves_pods_to_the_pod_runner_when_it_runs(tmp_path: Path) -> None:
    for name in kwok.NODE_STAGE_FILES + kwok.POD_STAGE_FILES:
        path = tmp_path / "kustomize" / "stage" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"kind: Stage\nmetadata: {{name: {Path(name).stem}}}\n")
    docs = list(yaml.safe_load_all(kwok.kwok_config(tmp_path, pod_stages=False)))
    assert [d["metadata"]["name"] for d in docs] == [
        "node-initialize",
        "node-heartbeat-with-lease",
    ]


def test_toolchain_reads_the_tool_paths_environment(tmp_path: Path) -> None:
    env = {
        "TPUSERVE_CACHE": str(tmp_path),
        "TPUSERVE_TOOLS_BIN": str(tmp_path / "tools"),
        "TPUSERVE_K8S_BIN": str(tmp_path / "k8s"),
        "TPUSERVE_K8S_VERSION": "v1.36.3",
        "TPUSERVE_ETCD_VERSION": "v3.6.16",
        "TPUSERVE_KWOK_VERSION": "v0.8.0",
        "TPUSERVE_LWS_VERSION": "v0.9.0",
        "TPUSERVE_PROMETHEUS_OPERATOR_VERSION": "v0.85.0",
    }
    toolchain = Toolchain.discover(env)
    assert toolchain.k8s_bin == tmp_path / "k8s"
    assert "kube-apiserver" in toolchain.missing_binaries()
    with pytest.raises(ToolchainMissing, match=r"etcd not found in .*build-control-plane\.sh"):
        toolchain.binary("etcd")
    with pytest.raises(ToolchainMissing, match=r"helm not found .*install-tools\.sh"):
        toolchain.tool("helm")


def test_toolchain_sources_tool_paths_when_the_environment_lacks_it(tmp_path: Path) -> None:
    toolchain = Toolchain.discover({"HOME": str(tmp_path), "PATH": os.environ["PATH"]})
    assert toolchain.k8s_bin.is_relative_to(tmp_path / ".cache" / "tpuserve")
    assert toolchain.k8s_version.startswith("v1.")


def test_module_cache_path_escaping() -> None:
    assert _escape_module_path("github.com/Azure/go") == "github.com/!azure/go"


def test_free_ports_are_distinct_loopback_ports() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(0 < p < 65536 for p in ports)


def test_process_start_time_identifies_a_live_pid() -> None:
    assert process_start_time(os.getpid()) is not None
    assert process_start_time(2**22 + 12345) is None  # above Linux's pid_max ceiling


def test_cluster_down_with_nothing_running_is_a_no_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(run_dir=tmp_path, keep=False)
    assert cli_down.run(args) == 0
    assert "no cluster running" in capsys.readouterr().out


def test_a_module_go_is_still_extracting_is_not_read_until_go_says_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Go 1.16+ extracts a module in place, with `<version>.partial` in its download cache
    # meanwhile; a cluster started beside another on a fresh machine once read a CRD file of
    # prometheus-operator's module that was not there yet. Such a module goes through
    # `go mod download`, which waits for the other process and answers once it is whole.
    cache = tmp_path / "mod"
    module = cache / "example.com" / "!some@v1.0.0"
    module.mkdir(parents=True)
    marks = cache / "cache" / "download" / "example.com" / "!some" / "@v"
    marks.mkdir(parents=True)
    (marks / "v1.0.0.ziphash").touch()
    partial = marks / "v1.0.0.partial"
    partial.touch()
    calls = tmp_path / "calls"
    fake_go = tmp_path / "bin" / "go"
    fake_go.parent.mkdir()
    fake_go.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        f'[ "$2" = download ] && rm -f {partial} && echo \'{{"Dir": "{module}"}}\'\n'
        "exit 0\n"
    )
    fake_go.chmod(0o755)
    monkeypatch.setenv("GOMODCACHE", str(cache))
    monkeypatch.setenv("PATH", f"{fake_go.parent}{os.pathsep}{os.environ['PATH']}")
    assert go_module_dir("example.com/Some", "v1.0.0") == module
    assert "mod download -json example.com/Some@v1.0.0" in calls.read_text()
    assert not partial.exists()
    calls.unlink()
    assert go_module_dir("example.com/Some", "v1.0.0") == module  # whole: read as it is
    assert not calls.exists()
