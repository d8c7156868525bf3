"""The HTTP APIs with TLS on: the pageserver's management API and a safekeeper's API are
https only. A request over https with the cluster CA works; a plaintext request gets a 400
saying https is required and the service goes on serving; a client that trusts another CA,
and one that dials a name the certificate does not carry, are refused with clear errors
(Python's ssl for the test's own requests, compute_ctl's words for fjord's client)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fixtures import https
from fixtures.pageserver import Pageserver
from fixtures.paths import fjord_bin_dir, pg_bin_dir
from fixtures.postgres import wait_until
from fixtures.safekeeper import Safekeeper
from fixtures.tls import Ca

# What the services log for the clients this test sends them on purpose.
REFUSALS = [r"refused a plaintext HTTP request from 127\.0\.0\.1:\d+: the API requires https",
            r"TLS handshake with HTTP client 127\.0\.0\.1:\d+ failed"]


def start(kind: str, tmp_path: Path) -> Pageserver | Safekeeper:
    """The service with TLS on (the fixtures' default: a certificate of the session's CA)."""
    service = Pageserver(tmp_path) if kind == "pageserver" else Safekeeper(tmp_path, 1)
    service.allowed_errors += REFUSALS
    return service.start()


def status(service: Pageserver | Safekeeper, ca: Path) -> dict:
    with https.urlopen(f"{service.http_url}/v1/status", ca, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize("kind", ["pageserver", "safekeeper"])
def test_the_api_is_https_only_and_refuses_what_is_not_trusted(kind, tmp_path):
    service = start(kind, tmp_path)
    other_ca = Ca(tmp_path / "other-ca")
    assert service.http_url.startswith("https://127.0.0.1:")
    assert status(service, service.tls)  # also what the fixture itself does to see it up
    assert "# TYPE" in service.http("GET", "/metrics")

    # Plaintext on the https port: a 400 in the API's own error shape, saying why.
    plain = f"http://127.0.0.1:{service.http_port}/v1/status"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(plain, timeout=30)
    assert e.value.code == 400
    assert "requires https" in json.loads(e.value.read())["error"]

    # A client that trusts another CA.
    with pytest.raises(urllib.error.URLError) as e:
        status(service, other_ca.cert)
    assert isinstance(e.value.reason, ssl.SSLCertVerificationError), e.value
    assert "unable to get local issuer certificate" in str(e.value.reason)

    # A client that dials a name the certificate does not carry (over the same address).
    with socket.create_connection(("127.0.0.1", service.http_port), timeout=30) as tcp:
        with pytest.raises(ssl.SSLCertVerificationError) as e:
            https.ssl_context(service.tls).wrap_socket(tcp, server_hostname="elsewhere.example")
    assert "Hostname mismatch" in str(e.value)

    # The service goes on serving, and said what it refused.
    assert status(service, service.tls)
    # (The server logs and counts a refusal after the client has seen it: wait for both.)
    wait_until("the refusals logged", lambda: "refused a plaintext HTTP request" in service.log_text()
               and service.log_text().count("TLS handshake with HTTP client") >= 2)
    # ... and counted them.
    metric = ('pageserver_tls_handshake_failures_total{reason="%s",service="http"}' if kind == "pageserver"
              else 'safekeeper_http_tls_failures_total{reason="%s"}')

    def counts() -> dict:
        out = {}
        for line in service.http("GET", "/metrics").splitlines():
            for reason in ("plaintext", "handshake"):
                if line.startswith(metric % reason + " "):
                    out[reason] = float(line.split()[-1])
        return out
    wait_until("the refusals counted", lambda: counts().get("plaintext", 0) >= 1 and counts().get("handshake", 0) >= 2)


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


def test_compute_ctl_names_a_tls_failure_as_such(tmp_path):
    ps = start("pageserver", tmp_path)
    other_ca = Ca(tmp_path / "other-ca")
    err = compute_ctl_error(ps, tmp_path, "--tls-ca", str(other_ca.cert))
    assert f"TLS with the pageserver at {ps.http_url}" in err, err
    assert f"not signed by the cluster CA (--tls-ca {other_ca.cert})" in err, err
    err = compute_ctl_error(ps, tmp_path, "--no-tls")
    assert "none was given (--tls-ca FILE)" in err, err
    # With the cluster's CA it gets past TLS to the pageserver's own answer.
    err = compute_ctl_error(ps, tmp_path, "--tls-ca", str(ps.tls))
    assert "HTTP 404" in err, err
