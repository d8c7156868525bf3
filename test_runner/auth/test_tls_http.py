"""The HTTP APIs with TLS on: the pageserver's management API and a safekeeper's API are
https only. A request over https with the cluster CA works; a plaintext request gets a 400
saying https is required and the service goes on serving; a client that trusts another CA,
and one that dials a name the certificate does not carry, are refused with clear errors
(Python's ssl for the test's own requests, compute_ctl's words for fjord's client).

The certificates are made here with `cryptography`, independently of the services' Rust
code, so the test also checks that the services take a standard CA and certificates."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fixtures import https
from fixtures.pageserver import Pageserver
from fixtures.paths import fjord_bin_dir, pg_bin_dir
from fixtures.safekeeper import Safekeeper

# What the services log for the clients this test sends them on purpose.
REFUSALS = [r"refused a plaintext HTTP request from 127\.0\.0\.1:\d+: the API requires https",
            r"TLS handshake with HTTP client 127\.0\.0\.1:\d+ failed"]


class Ca:
    """A CA in `directory` (`ca.crt`, `ca.key`) that issues service certificates."""

    def __init__(self, directory: Path, name: str):
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_path = directory / "ca.crt"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: list[str]) -> tuple[Path, Path]:
        """A certificate for `name` naming `hosts` (IP addresses as IP SANs), as files."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_path, key_path = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        key_path.chmod(0o600)
        return cert_path, key_path


@pytest.fixture
def cas(tmp_path) -> tuple[Ca, Ca]:
    """The cluster's CA, and another one."""
    return Ca(tmp_path / "tls", "test cluster CA"), Ca(tmp_path / "other-tls", "another CA")


def start(kind: str, tmp_path: Path, ca: Ca) -> Pageserver | Safekeeper:
    service = Pageserver(tmp_path) if kind == "pageserver" else Safekeeper(tmp_path, 1)
    service.tls_cert, service.tls_key = ca.issue(kind, ["localhost", "127.0.0.1"])
    service.tls_ca = ca.cert_path
    service.allowed_errors += REFUSALS
    return service.start()


def status(service: Pageserver | Safekeeper, ca: Path) -> dict:
    with https.urlopen(f"{service.http_url}/v1/status", ca, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("kind", ["pageserver", "safekeeper"])
def test_the_api_is_https_only_and_refuses_what_is_not_trusted(kind, tmp_path, cas):
    ca, other_ca = cas
    service = start(kind, tmp_path, ca)
    assert service.http_url.startswith("https://127.0.0.1:")
    assert status(service, ca.cert_path)  # also what the fixture itself does to see it up
    assert "# TYPE" in service.http("GET", "/metrics")

    # Plaintext on the https port: a 400 in the API's own error shape, saying why.
    plain = f"http://127.0.0.1:{service.http_port}/v1/status"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(plain, timeout=30)
    assert e.value.code == 400
    assert "requires https" in json.loads(e.value.read())["error"]

    # A client that trusts another CA.
    with pytest.raises(urllib.error.URLError) as e:
        status(service, other_ca.cert_path)
    assert isinstance(e.value.reason, ssl.SSLCertVerificationError), e.value
    assert "unable to get local issuer certificate" in str(e.value.reason)

    # A client that dials a name the certificate does not carry (over the same address).
    with socket.create_connection(("127.0.0.1", service.http_port), timeout=30) as tcp:
        with pytest.raises(ssl.SSLCertVerificationError) as e:
            https.ssl_context(ca.cert_path).wrap_socket(tcp, server_hostname="elsewhere.example")
    assert "Hostname mismatch" in str(e.value)

    # The service goes on serving, and said what it refused.
    assert status(service, ca.cert_path)
    log = service.log_text()
    assert "refused a plaintext HTTP request" in log
    assert log.count("TLS handshake with HTTP client") >= 2, log


def compute_ctl_error(ps: Pageserver, tmp_path: Path, *tls_args: str) -> str:
    """compute_ctl against `ps`'s https API: its exit and the error it ends with."""
    r = subprocess.run(
        [str(fjord_bin_dir() / "compute_ctl"), "--pgdata", str(tmp_path / "pgdata"), "--pg-bin-dir", str(pg_bin_dir()),
         "--pageserver-http", ps.http_url, "--pageserver-pg", f"127.0.0.1:{ps.pg_port}",
         "--tenant", "11" * 16, "--timeline", "22" * 16, *tls_args],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 1, r.stderr
    return r.stderr


def test_compute_ctl_names_a_tls_failure_as_such(tmp_path, cas):
    ca, other_ca = cas
    ps = start("pageserver", tmp_path, ca)
    err = compute_ctl_error(ps, tmp_path, "--tls-ca", str(other_ca.cert_path))
    assert f"TLS with the pageserver at {ps.http_url}" in err, err
    assert f"not signed by the cluster CA (--tls-ca {other_ca.cert_path})" in err, err
    err = compute_ctl_error(ps, tmp_path, "--no-tls")
    assert "none was given (--tls-ca FILE)" in err, err
    # With the cluster's CA it gets past TLS to the pageserver's own answer.
    err = compute_ctl_error(ps, tmp_path, "--tls-ca", str(ca.cert_path))
    assert "HTTP 404" in err, err
