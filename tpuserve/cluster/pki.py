"""Certificates and tokens for the local control plane: a throwaway CA, the apiserver's and
webhooks' serving certificates, the front-proxy client certificate the apiserver presents to
aggregated APIs (a metrics adapter), the service-account signing key and a static admin token.

Everything is valid for loopback only and for a few days; keys are written 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 7
LOOPBACK_SANS: tuple[str, ...] = ("127.0.0.1", "localhost")
# The in-cluster names the apiserver's certificate also covers, as a real cluster's does.
APISERVER_SANS: tuple[str, ...] = (
    *LOOPBACK_SANS,
    "10.96.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
ADMIN_USER = "tpuserve-admin"
ADMIN_GROUP = "system:masters"  # bypasses RBAC, like kind's and envtest's admin
# The name kube-apiserver's front-proxy client certificate carries (--requestheader-allowed-names).
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True, slots=True)
class PKI:
    """Paths of the files `create_pki` wrote."""

    dir: Path
    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    service_account_key: Path
    token_file: Path
    admin_token: str

    @classmethod
    def in_directory(cls, directory: Path, admin_token: str) -> PKI:
        """The file layout `create_pki` writes into `directory`."""
        return cls(
            dir=directory,
            ca_cert=directory / "ca.crt",
            ca_key=directory / "ca.key",
            apiserver_cert=directory / "apiserver.crt",
            apiserver_key=directory / "apiserver.key",
            service_account_key=directory / "sa.key",
            token_file=directory / "tokens.csv",
            admin_token=admin_token,
        )

    @property
    def front_proxy_cert(self) -> Path:
        return self.dir / "front-proxy-client.crt"

    @property
    def front_proxy_key(self) -> Path:
        return self.dir / "front-proxy-client.key"


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _san(names: tuple[str, ...]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=VALID_DAYS)


def _create_ca(cert_path: Path, key_path: Path) -> None:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpuserve-local-ca")])
    not_before, not_after = _validity()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)


def issue_serving_cert(
    ca_cert: Path,
    ca_key: Path,
    cert_path: Path,
    key_path: Path,
    common_name: str,
    sans: tuple[str, ...] = LOOPBACK_SANS,
    *,
    client: bool = False,
    server_and_client: bool = False,
) -> None:
    """A TLS server certificate for `sans` (or, `client`, a client certificate for
    `common_name`; `server_and_client`, one for both ends of a mutual-TLS link, as KEDA's
    operator and metrics apiserver share), signed by the local CA."""
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
    if server_and_client:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    assert isinstance(signer, rsa.RSAPrivateKey)
    key = _key()
    not_before, not_after = _validity()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(usages),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(_san(sans), critical=False)
    cert = builder.sign(signer, hashes.SHA256())
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)


def create_pki(directory: Path) -> PKI:
    """Write a fresh CA, apiserver certificate, SA key and admin token file into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = PKI.in_directory(directory, secrets.token_hex(24))
    _create_ca(pki.ca_cert, pki.ca_key)
    issue_serving_cert(
        pki.ca_cert,
        pki.ca_key,
        pki.apiserver_cert,
        pki.apiserver_key,
        "kube-apiserver",
        APISERVER_SANS,
    )
    issue_serving_cert(
        pki.ca_cert,
        pki.ca_key,
        pki.front_proxy_cert,
        pki.front_proxy_key,
        FRONT_PROXY_CLIENT,
        (),
        client=True,
    )
    # One key both signs and verifies service-account tokens (the apiserver accepts a private
    # key for --service-account-key-file).
    _write_key(pki.service_account_key, _key())
    # Static token file: token,user,uid,"group1,group2" (kube-apiserver --token-auth-file).
    pki.token_file.write_text(f'{pki.admin_token},{ADMIN_USER},{ADMIN_USER},"{ADMIN_GROUP}"\n')
    pki.token_file.chmod(0o600)
    return pki


def load_pki(directory: Path) -> PKI:
    """The PKI an earlier `create_pki` wrote (used when re-attaching to a running cluster)."""
    layout = PKI.in_directory(directory, admin_token="")
    token = layout.token_file.read_text().split(",", 1)[0]
    return replace(layout, admin_token=token)
