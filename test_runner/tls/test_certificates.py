"""Service certificates on real processes: the expiry on `/metrics`, a certificate replaced
on disk reloaded without a restart (a pair that does not match is refused and the old one
kept), the WARN line for a certificate that expires within 30 days, and a service given
neither TLS nor --no-tls refusing to start."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509

from fixtures.pageserver import Pageserver
from fixtures.paths import fjord_bin_dir
from fixtures.postgres import wait_until
from fixtures.safekeeper import Safekeeper
from fixtures.tls import service_hosts, session_ca

METRIC = "fjord_tls_certificate_expiry_timestamp_seconds"


def expiry(service) -> int:
    """The expiry gauge on a service's /metrics."""
    for line in service.http("GET", "/metrics").splitlines():
        if line.startswith(METRIC + " "):
            return int(line.split()[1])
    raise KeyError(f"no {METRIC} in {service.service_name}'s metrics")


def not_after(cert: Path) -> int:
    return int(x509.load_pem_x509_certificate(cert.read_bytes()).not_valid_after_utc.timestamp())


def replace(src: Path, dst: Path) -> None:
    """As an operator should: a copy renamed over the old file."""
    tmp = dst.with_suffix(".new")
    shutil.copyfile(src, tmp)
    tmp.rename(dst)


# The warning says whole days left: 9 or 10, depending on where in the second the
# certificate was issued and read.
@pytest.mark.allowed_errors(r"expires in (9|10) days", r"does not belong to the certificate")
def test_expiry_is_exported_and_a_replaced_certificate_is_reloaded(tmp_path):
    ps = Pageserver(tmp_path).start()
    sk = Safekeeper(tmp_path, 1).start()
    for service, cert in [(ps, ps.tls_cert), (sk, sk.tls_cert)]:
        assert expiry(service) == not_after(cert)

    # A certificate that expires in ten days replaces the pageserver's: the metric follows
    # within seconds, and the log warns.
    short_cert, short_key = session_ca().issue("pageserver", service_hosts(ps.host), tmp_path / "short", days=10)
    replace(short_key, ps.tls_key)
    replace(short_cert, ps.tls_cert)
    wait_until("the pageserver to reload its certificate", lambda: expiry(ps) == not_after(short_cert))
    assert re.search(r"expires in (9|10) days", ps.logfile.read_text())

    # Another certificate without its key is refused and the current pair stays.
    other_cert, _ = session_ca().issue("other", service_hosts(ps.host), tmp_path / "other")
    replace(other_cert, ps.tls_cert)
    wait_until("the pageserver to refuse the mismatched pair",
               lambda: "does not belong to the certificate" in ps.logfile.read_text())
    assert expiry(ps) == not_after(short_cert)


def test_a_service_without_a_tls_choice_refuses_to_start(tmp_path):
    r = subprocess.run([str(fjord_bin_dir() / "safekeeper"), "--id", "1", "--data-dir", str(tmp_path / "sk"),
                        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "TLS is required: give --tls-cert FILE and --tls-key FILE" in r.stderr and "--no-tls" in r.stderr, r.stderr
