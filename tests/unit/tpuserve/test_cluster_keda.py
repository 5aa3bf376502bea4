"""KEDA on the local cluster (`tpuserve.cluster.keda`): the command lines, the registration as
the external metrics API, and the one certificate both ends of KEDA's gRPC link present."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tpuserve.cluster import keda
from tpuserve.cluster.components import Ports
from tpuserve.cluster.pki import create_pki, issue_serving_cert

pytestmark = pytest.mark.unit


def test_the_operator_and_the_metrics_apiserver_meet_on_loopback(tmp_path: Path) -> None:
    op = keda.operator_argv(Path("/b/keda-operator"), cert_dir=tmp_path, grpc_port=9666,
                            metrics_port=8080, health_port=8081)  # fmt: skip
    assert "--metrics-service-bind-address=127.0.0.1:9666" in op
    assert "--enable-cert-rotation=false" in op
    assert "--enable-apiservice-patching=false" in op  # the local cluster registers it
    adapter = keda.adapter_argv(Path("/b/keda-adapter"), cert_dir=tmp_path,
                                kubeconfig=tmp_path / "k", secure_port=6443, metrics_port=9022,
                                grpc_port=9666)  # fmt: skip
    assert "--metrics-service-address=127.0.0.1:9666" in adapter
    assert "--bind-address=127.0.0.1" in adapter
    assert f"--cert-dir={tmp_path}" in adapter  # where the gRPC client reads ca.crt, tls.*
    env = keda.operator_env(tmp_path / "k")
    assert env["WATCH_NAMESPACE"] == ""  # every namespace
    assert env["KEDA_CLUSTER_OBJECT_NAMESPACE"] == keda.NAMESPACE


def test_keda_takes_the_external_metrics_api_through_a_loopback_service() -> None:
    manifest = keda.api_service(7443, b"CA")
    assert manifest["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert manifest["spec"]["service"] == {
        "name": keda.SERVICE, "namespace": keda.NAMESPACE, "port": 7443
    }  # fmt: skip
    assert keda.service(7443)["spec"]["externalName"] == "localhost"


def test_one_certificate_serves_and_authenticates_both_ends(tmp_path: Path) -> None:
    pki = create_pki(tmp_path / "pki")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    issue_serving_cert(pki.ca_cert, pki.ca_key, cert, key, keda.OPERATOR_SERVICE,
                       keda.SERVING_NAMES, server_and_client=True)  # fmt: skip
    parsed = x509.load_pem_x509_certificate(cert.read_bytes())
    usages = parsed.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    names = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "keda-metrics-apiserver.keda.svc" in names.get_values_for_type(x509.DNSName)


def test_ports_for_keda_are_allocated_apart() -> None:
    ports = Ports.allocate()
    keda_ports = {ports.keda_grpc, ports.keda_metrics, ports.keda_health, ports.keda_adapter,
                  ports.keda_adapter_metrics}  # fmt: skip
    assert len(keda_ports) == 5
    assert 0 not in keda_ports
